"""RLinf embodied RL: envs, policies, workers and the EmbodiedRunner.

The envs (gymnasium, ManiSkill, robosuite) live in :mod:`rlinf.embodied.envs`,
policies in :mod:`rlinf.embodied.models`, the env/rollout/actor workers in
:mod:`rlinf.embodied.workers`, the training loop in :mod:`rlinf.embodied.runner`
and the config schema in :mod:`rlinf.embodied.config`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlinf-embodied")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
