"""RLinf scheduler: Cluster, Worker, WorkerGroup, placement and p2p communication on Ray.

The scheduler API lands with its own issue; this release ships the package
skeleton and version only.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlinf-sched")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
