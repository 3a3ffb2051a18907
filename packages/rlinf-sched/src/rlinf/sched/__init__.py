"""RLinf scheduler: Cluster, Worker, WorkerGroup, placement and p2p communication on Ray.

Available now: :class:`Cluster` (start or attach to Ray, node ranks,
accelerators), the placement layer (:mod:`rlinf.sched.placement`, pure
logic over :class:`ClusterInfo`), and :class:`Worker` / :class:`WorkerGroup`
(one actor per placement, group calls returning futures, errors naming the
rank), :func:`launch_groups` (several groups at once, all or none),
:func:`wait_all` (one fail-fast wait for several calls), :func:`wait_for_progress`,
point-to-point ``send``/``recv``/``broadcast`` between workers of any groups
(:mod:`rlinf.sched.comm`), channels found by name across nodes, device locks
and offload/onload hooks for collocated phases, and the placement side of
online scaling (:mod:`rlinf.sched.scaling`), and per-group Python
environments (:mod:`rlinf.sched.python_env`).
"""

from importlib.metadata import PackageNotFoundError, version

from rlinf.sched.cluster import NODE_RANK_ENV, Cluster, ClusterError
from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo
from rlinf.sched.comm import CommError, CommTimeoutError, CommWork, PeerDiedError
from rlinf.sched.launch import launch_groups
from rlinf.sched.placement import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    NodePlacementStrategy,
    PackedPlacementStrategy,
)
from rlinf.sched.python_env import PythonEnvConfig, PythonEnvError
from rlinf.sched.scaling import ScalingError, grown_actor_strategy, scale_actor
from rlinf.sched.wait import wait_all, wait_for_progress
from rlinf.sched.worker import GroupFuture, Worker, WorkerDiedError, WorkerError, WorkerGroup

try:
    __version__ = version("rlinf-sched")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "NODE_RANK_ENV",
    "Cluster",
    "ClusterError",
    "ClusterInfo",
    "CommError",
    "CommTimeoutError",
    "CommWork",
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "GroupFuture",
    "HybridComponentPlacement",
    "NodeGroupInfo",
    "NodeInfo",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "PeerDiedError",
    "PythonEnvConfig",
    "PythonEnvError",
    "ScalingError",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "__version__",
    "grown_actor_strategy",
    "launch_groups",
    "scale_actor",
    "wait_all",
    "wait_for_progress",
]
