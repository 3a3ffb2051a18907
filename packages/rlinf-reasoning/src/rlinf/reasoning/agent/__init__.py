"""Agentic RL: multi-turn rollouts with tool calls.

* :mod:`.config`: the ``agent`` config section;
* :mod:`.loop`: :class:`AgentLoop`, trajectories of turns and tool answers on any engine;
* :mod:`.executor`: where tool calls run (the rollout worker, or the tool worker group);
* :mod:`.observation`: tool answers as tokens, in the model's chat template;
* :mod:`.rewards`: per-trajectory penalties and the answer a trajectory gives.

The tools themselves live in :mod:`rlinf.reasoning.tools`.
"""

from rlinf.reasoning.agent.config import AgentConfig, AgentPenalties

__all__ = ["AgentConfig", "AgentPenalties"]
