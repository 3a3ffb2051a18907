"""Tools for agentic reasoning.

:mod:`.parsing` finds tool calls in model output, :mod:`.registry` holds tools
by name and runs calls so that every failure becomes an observation, and
:mod:`.sandbox` runs model-written code (the ``python`` tool) in isolation,
and :mod:`.search` is the ``search`` tool (BM25 over a local corpus);
:mod:`.factory` builds a run's tools from its ``agent`` config. The
multi-turn agent loop that calls them is :mod:`rlinf.reasoning.agent`.
"""
