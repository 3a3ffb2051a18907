"""RLinf scheduler: Cluster, Worker, WorkerGroup, placement and p2p communication on Ray.

Available now: :class:`Cluster` (start or attach to Ray, node ranks,
accelerators) and the placement layer (:mod:`rlinf.sched.placement`, pure
logic over :class:`ClusterInfo`). Workers, groups and point-to-point
communication land with the rest of the scheduler issue.
"""

from importlib.metadata import PackageNotFoundError, version

from rlinf.sched.cluster import NODE_RANK_ENV, Cluster, ClusterError
from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo

try:
    __version__ = version("rlinf-sched")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "NODE_RANK_ENV",
    "Cluster",
    "ClusterError",
    "ClusterInfo",
    "NodeGroupInfo",
    "NodeInfo",
    "__version__",
]
