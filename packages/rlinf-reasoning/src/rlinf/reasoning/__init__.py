"""RLinf reasoning RL: math data, rollout engines, rewards, actor and the ReasoningRunner.

Data in :mod:`rlinf.reasoning.data`, rollout engines in
:mod:`rlinf.reasoning.engines`, the math reward in :mod:`rlinf.reasoning.reward`,
workers in :mod:`rlinf.reasoning.workers`, the GRPO loop in
:mod:`rlinf.reasoning.runner` and the config schema in :mod:`rlinf.reasoning.config`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlinf-reasoning")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
