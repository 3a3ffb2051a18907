"""RLinf embodied RL: envs, policies, workers and the EmbodiedRunner.

The embodied stack lands with its own issue; this release ships the package
skeleton and version only.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlinf-embodied")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
