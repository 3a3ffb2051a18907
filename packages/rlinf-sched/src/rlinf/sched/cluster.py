"""``Cluster``: attach to (or start) Ray, find the nodes, their ranks and accelerators.

A user program builds one ``Cluster``; worker groups are then placed on it.
The same call in a worker process attaches to the running cluster instead
of starting one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile
import time
import warnings
from typing import Any

# Under `uv run`, Ray starts every worker through `uv run` with the project as
# working_dir, which costs ~25 s per worker process. RLinf workers use this
# interpreter and environment instead. Ray reads the switch when it is first
# imported, so set it before that; export RAY_ENABLE_UV_RUN_RUNTIME_ENV=1 to
# get Ray's behaviour.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import ray

from rlinf.core._native import parse_segment_name
from rlinf.core.channel import (
    NAMESPACE_ENV,
    cleanup_stale_segments,
    default_namespace,
    release_created_channels,
    set_resolver,
)
from rlinf.core.closing import ClosesOnExit
from rlinf.core.logging import get_logger
from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo
from rlinf.sched.comm.directory import get_directory, install_resolver
from rlinf.sched.node_groups import parse_node_groups

__all__ = ["NODE_RANK_ENV", "RAY_NAMESPACE", "Cluster", "ClusterError"]

NODE_RANK_ENV = "RLINF_NODE_RANK"
"""Set before ``ray start`` on each node to fix its node rank."""

RAY_NAMESPACE = "rlinf"
"""Ray namespace of RLinf's named actors."""

_log = get_logger("rlinf.sched.cluster")


class ClusterError(RuntimeError):
    """The cluster is not what the program asked for (nodes missing, bad ranks...)."""


@ray.remote(num_cpus=0)
def _probe_node() -> dict[str, Any]:
    """Runs on one node: reports what the node's workers will see."""
    return {
        "node_rank": os.environ.get(NODE_RANK_ENV),
        "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "node_id": ray.get_runtime_context().get_node_id(),
    }


class Cluster(ClosesOnExit):
    """The Ray cluster an RLinf program runs on.

    Args:
        num_nodes: Nodes the program needs; waits (up to ``timeout``) until
            that many have joined. None = whatever is there.
        cluster_cfg: The ``cluster`` config section (a mapping or model with
            optional ``cpu_slots_per_node``); None for defaults.
        address: Ray address to attach to; default ``$RAY_ADDRESS``, then
            ``"auto"`` (a cluster started with ``ray start`` on this machine),
            else a new local cluster is started.
        timeout: Seconds to wait for nodes and probes.
        num_cpus: CPUs of a newly started local cluster (default: all).

    The driver's ``Cluster`` also picks the run's channel namespace when
    ``$RLINF_CHANNEL_NAMESPACE`` is unset (``run-<pid>-<random>``, handed to every
    worker and dropped again on :meth:`close`): shared-memory channel names are
    machine-wide, so two runs on one machine never reach each other's channels.

    Raises:
        ClusterError: If nodes are missing after ``timeout``, or node ranks
            are duplicated or out of range.

    Example::

        with Cluster(num_nodes=1) as cluster:
            print(cluster.info.num_nodes, cluster.info.num_accelerators)
    """

    def __init__(
        self,
        num_nodes: int | None = None,
        cluster_cfg: Any = None,
        *,
        address: str | None = None,
        timeout: float = 60.0,
        num_cpus: int | None = None,
    ) -> None:
        if num_nodes is not None and num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1 (or None), got {num_nodes}")
        self._owns_ray = False
        self._closed = False
        self._own_namespace = False
        if not ray.is_initialized():
            started = time.monotonic()
            self._owns_ray = _connect_or_start(address, num_cpus)
            _log.info(
                "Ray %s in %.1f s",
                "started" if self._owns_ray else "attached",
                time.monotonic() - started,
            )
        self._timeout = timeout
        nodes = self._wait_for_nodes(num_nodes, timeout)
        slots = int(_get(cluster_cfg, "cpu_slots_per_node", 0) or 0)
        if slots < 0:
            raise ValueError(f"cluster.cpu_slots_per_node must be >= 0, got {slots}")
        self.info = _build_info(nodes, slots, _get(cluster_cfg, "node_groups", None))
        # The directory lets channels and point-to-point traffic find their
        # home nodes; a Cluster in a worker process reuses the driver's.
        self._owns_directory = get_directory() is None
        # Shared-memory channel names are machine-wide: a run that names no namespace
        # gets its own, so two runs on one machine never open each other's channels.
        self._own_namespace = self._owns_directory and NAMESPACE_ENV not in os.environ
        if self._own_namespace:
            os.environ[NAMESPACE_ENV] = f"run-{os.getpid()}-{secrets.token_hex(4)}"
        self._directory = get_directory(create=True)
        install_resolver(self._directory)
        _log.info(
            "cluster: %d node(s), %d accelerator(s)%s",
            self.info.num_nodes,
            self.info.num_accelerators,
            " (started locally)" if self._owns_ray else "",
        )

    # ----- discovery --------------------------------------------------------------
    def _wait_for_nodes(self, num_nodes: int | None, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
            if num_nodes is None or len(alive) >= num_nodes:
                break
            if time.monotonic() >= deadline:
                ips = ", ".join(sorted(n.get("NodeManagerAddress", "?") for n in alive))
                raise ClusterError(
                    f"waited {timeout:.0f} s for {num_nodes} nodes but {len(alive)} joined "
                    f"({ips}); start the others with `{NODE_RANK_ENV}=<rank> ray start "
                    f"--address=<head>:6379`, or lower cluster.num_nodes"
                )
            time.sleep(0.5)
        probes = self._probe(alive, deadline)
        return _assign_ranks(alive, probes, num_nodes)

    def _probe(self, alive: list[dict[str, Any]], deadline: float) -> dict[str, dict[str, Any]]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = {
            n["NodeID"]: _probe_node.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in alive
        }
        remaining = max(1.0, deadline - time.monotonic())
        try:
            results = ray.get(list(refs.values()), timeout=remaining)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(
                f"could not run a probe on every node within {remaining:.0f} s "
                "(is a node out of resources or unreachable?)"
            ) from None
        return dict(zip(refs, results, strict=True))

    # ----- lifetime ---------------------------------------------------------------
    @property
    def owns_ray(self) -> bool:
        """Whether this object started Ray (and so stops it on :meth:`close`)."""
        return self._owns_ray

    def close(self) -> None:
        """Stops Ray if this object started it, releases the driver's channels, removes stale ones.

        In the driver (the process whose ``Cluster`` made the run's directory)
        this also gives up the channels the driver created in the run's
        namespace (:func:`rlinf.core.channel.release_created_channels`): a
        channel made with ``Channel.create`` lives until its creator ends, and
        for the driver the run ends here. Then segments nobody holds are
        removed (killed workers' included).

        Idempotent. A ``Cluster`` that attached to a running Ray leaves it running.
        """
        if self._closed:
            return
        self._closed = True
        if self._owns_directory and ray.is_initialized():
            # Agents hold the channels they served; stop them before cleaning up.
            with contextlib.suppress(Exception):
                ray.get(self._directory.stop_agents.remote(), timeout=10)
                ray.kill(self._directory)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        set_resolver(None)
        released = release_created_channels(default_namespace()) if self._owns_directory else 0
        removed = cleanup_stale_segments(default_namespace())
        if self._owns_ray or self._owns_directory:
            # Killed workers may still be exiting (and holding segments).
            deadline = time.monotonic() + 3.0
            while _segments_left(default_namespace()) and time.monotonic() < deadline:
                time.sleep(0.1)
                removed += cleanup_stale_segments(default_namespace())
        if released:
            _log.info("released %d channel(s) created by this process", released)
        if removed:
            _log.info("removed %d stale channel segment(s)", len(removed))
        if self._own_namespace:
            os.environ.pop(NAMESPACE_ENV, None)

    def shutdown(self) -> None:
        """Deprecated name of :meth:`close`."""
        warnings.warn(
            "Cluster.shutdown is deprecated; use Cluster.close (or a with block)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.close()

    def __repr__(self) -> str:
        return (
            f"Cluster(num_nodes={self.info.num_nodes}, "
            f"accelerators={self.info.num_accelerators}, owns_ray={self._owns_ray})"
        )


def _segments_left(namespace: str) -> bool:
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return False
    return any((parse_segment_name(n) or ("",))[0] == namespace for n in names)


def _get(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _connect_or_start(address: str | None, num_cpus: int | None) -> bool:
    """Attaches to a running Ray or starts a local one; returns True if started."""
    address = address or os.environ.get("RAY_ADDRESS")
    if os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV") == "0":
        # Ray was imported before this module: apply the switch (see the top).
        from ray._private import ray_constants

        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    common: dict[str, Any] = {"namespace": RAY_NAMESPACE, "log_to_driver": True}
    if address:
        _log.info("attaching to Ray at %s ...", address)
        ray.init(address=address, **common)
        return False
    # `ray start` on this machine records its address in this file; "auto"
    # is only worth trying if that address answers (otherwise it retries
    # for ~20 s, and the file outlives the cluster).
    if _local_ray_running():
        _log.info("attaching to the Ray cluster running on this machine ...")
        try:
            ray.init(address="auto", **common)
            return False
        except ConnectionError:
            pass
    # Ray starts workers at nice 15 by default, so that the driver stays
    # responsive; here the workers do the training, and on a busy machine nice
    # 15 starves them (launches and steps slow down ~40x beside two busy loops
    # on two cores). Our workers run at the driver's priority.
    _log.info("starting a local Ray (%s CPUs) ...", num_cpus or "all")
    ray.init(
        include_dashboard=False,
        num_cpus=num_cpus,
        _system_config={"worker_niceness": 0},
        **common,
    )
    return True


def _local_ray_running() -> bool:
    path = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
    try:
        with open(path) as f:
            host, _, port = f.read().strip().rpartition(":")
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


def _assign_ranks(
    alive: list[dict[str, Any]], probes: dict[str, dict[str, Any]], num_nodes: int | None
) -> list[dict[str, Any]]:
    """Orders nodes by ``RLINF_NODE_RANK``, or derives ranks (head first, then by IP)."""
    nodes = []
    for n in alive:
        p = probes[n["NodeID"]]
        nodes.append({**n, "probe": p})
    given = [n["probe"]["node_rank"] for n in nodes]
    if any(r is not None for r in given):
        if any(r is None for r in given):
            missing = [n["NodeManagerAddress"] for n in nodes if n["probe"]["node_rank"] is None]
            raise ClusterError(
                f"{NODE_RANK_ENV} is set on some nodes but not on {', '.join(missing)}; "
                "set it on every node before `ray start`, or on none"
            )
        try:
            ranks = [int(r) for r in given]
        except ValueError:
            raise ClusterError(
                f"{NODE_RANK_ENV} must be an integer on every node, got {given}"
            ) from None
        if sorted(ranks) != list(range(len(ranks))):
            raise ClusterError(
                f"{NODE_RANK_ENV} values {sorted(ranks)} must be 0..{len(ranks) - 1}, "
                "each exactly once"
            )
        nodes.sort(key=lambda n: int(n["probe"]["node_rank"]))
    else:
        head = ray.get_runtime_context().get_node_id()
        nodes.sort(key=lambda n: (n["NodeID"] != head, n["NodeManagerAddress"], n["NodeID"]))
    if num_nodes is not None and len(nodes) > num_nodes:
        _log.warning("cluster has %d nodes; using the first %d", len(nodes), num_nodes)
        nodes = nodes[:num_nodes]
    return nodes


def _build_info(
    nodes: list[dict[str, Any]], cpu_slots_per_node: int, node_groups: Any = None
) -> ClusterInfo:
    specs, node_envs = parse_node_groups(node_groups, len(nodes))
    infos = []
    for rank, n in enumerate(nodes):
        node_env = node_envs.get(rank)
        res = n.get("Resources", {})
        model = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), "")
        gpus = int(res.get("GPU", 0))
        infos.append(
            NodeInfo(
                node_rank=rank,
                num_accelerators=gpus,
                accelerator_model=f"NV_GPU:{model}" if gpus else "",
                num_cpus=int(res.get("CPU", 0)),
                ip=n["probe"]["ip"],
                ray_node_id=n["NodeID"],
                env_vars=dict(node_env.env_vars) if node_env else {},
                python_interpreter_path=node_env.python_interpreter_path if node_env else None,
            )
        )
    all_ranks = tuple(range(len(infos)))
    has_acc = any(i.num_accelerators for i in infos)
    groups = {
        "cluster": NodeGroupInfo(
            "cluster", all_ranks, hardware_type="Accelerator" if has_acc else None
        ),
        "node": NodeGroupInfo("node", all_ranks, ignore_hardware=True),
    }
    for spec in specs:
        with_acc = any(infos[r].num_accelerators for r in spec.node_ranks)
        groups[spec.label] = NodeGroupInfo(
            spec.label,
            spec.node_ranks,
            ignore_hardware=spec.ignore_hardware,
            hardware_type="Accelerator" if with_acc and not spec.ignore_hardware else None,
        )
    return ClusterInfo(
        nodes=tuple(infos), node_groups=groups, cpu_slots_per_node=cpu_slots_per_node
    )
