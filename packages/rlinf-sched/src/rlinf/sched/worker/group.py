"""``WorkerGroup``: one Ray actor per placement, and group calls with futures."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import warnings
from collections.abc import Generator, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf.core._native import segment_name
from rlinf.core.channel import NAMESPACE_ENV, default_namespace
from rlinf.core.logging import get_logger
from rlinf.sched.cluster import RAY_NAMESPACE, Cluster
from rlinf.sched.cluster_info import NodeInfo
from rlinf.sched.comm.directory import get_directory
from rlinf.sched.comm.p2p import inbox_name
from rlinf.sched.placement import NodePlacementStrategy, PackedPlacementStrategy, Placement
from rlinf.sched.python_env import PythonEnvConfig, check_python_env
from rlinf.sched.worker.device_lock import DEVICES_ENV
from rlinf.sched.worker.worker import Worker

__all__ = ["GroupFuture", "WorkerDiedError", "WorkerError", "WorkerGroup"]

_DEFAULT_TIMEOUT_S = 600.0
"""Default bound of ``GroupFuture.wait()`` when no timeout is given."""

_LAUNCH_REPORT_S = 20.0
"""While a launch waits for its ranks, a "still waiting" line this often."""

_log = get_logger("rlinf.sched.group")

_RAY_WORKER_ERRORS = (ray.exceptions.RayTaskError, ray.exceptions.RayActorError)
"""What Ray raises for a rank that raised or died (mapped to WorkerError / WorkerDiedError)."""


class WorkerError(RuntimeError):
    """A rank raised: the message names the group, the rank and the remote traceback."""

    def __init__(self, group: str, rank: int, detail: str) -> None:
        super().__init__(f"{group}[rank {rank}] raised:\n{detail}")
        self.group, self.rank = group, rank


class WorkerDiedError(WorkerError):
    """A rank's process died (killed, crashed or out of memory)."""

    def __init__(self, group: str, rank: int, detail: str) -> None:
        RuntimeError.__init__(self, f"{group}[rank {rank}] died: {detail}")
        self.group, self.rank = group, rank


class GroupFuture:
    """The pending results of one group call, one per rank (in rank order).

    Wait for it with :meth:`wait`, ``await`` it in a coroutine, or wait for
    several at once with :func:`rlinf.sched.wait_all`.
    """

    def __init__(self, group: str, ranks: Sequence[int], refs: Sequence[Any], method: str) -> None:
        self._group, self._ranks, self._refs, self._method = group, list(ranks), list(refs), method

    @property
    def group(self) -> str:
        """Name of the group that runs the call."""
        return self._group

    @property
    def method(self) -> str:
        """The worker method called."""
        return self._method

    @property
    def ranks(self) -> list[int]:
        """The ranks that run the call, in order."""
        return list(self._ranks)

    @property
    def refs(self) -> list[Any]:
        """Ray ``ObjectRef`` of each rank's result, in the order of :attr:`ranks`."""
        return list(self._refs)

    def done(self, timeout: float = 0.0) -> bool:
        """Whether every rank has finished (successfully or not).

        Args:
            timeout: Seconds to wait for that (returns as soon as every rank
                has finished); 0 only looks.
        """
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=timeout)
        return len(ready) == len(self._refs)

    def wait(self, timeout: float | None = _DEFAULT_TIMEOUT_S) -> list[Any]:
        """Results in rank order; :func:`rlinf.sched.wait_all` of this one future.

        Args:
            timeout: Seconds to wait; None waits without a bound (a dead rank
                still ends the wait: Ray reports it within seconds).

        Raises:
            WorkerError: The first rank to fail (at once, not after the slowest rank).
            WorkerDiedError: A rank whose process died.
            TimeoutError: Naming the ranks still running.
        """
        from rlinf.sched.wait import wait_all  # wait.py builds on this module

        return wait_all([self], timeout)[0]

    def result(self, index: int) -> Any:
        """The result of the ``index``-th rank of the call, blocking until it is there.

        Raises:
            WorkerError: That rank raised (the message names group, rank and traceback).
            WorkerDiedError: That rank's process died.
        """
        try:
            return ray.get(self._refs[index])
        except _RAY_WORKER_ERRORS as err:
            raise self._error(index, err) from None

    def _error(self, index: int, err: Exception) -> WorkerError:
        rank = self._ranks[index]
        if isinstance(err, ray.exceptions.RayActorError) and not err.actor_init_failed:
            return WorkerDiedError(self._group, rank, str(err).splitlines()[0])
        # A constructor that raised is an error of the rank, with its traceback.
        return WorkerError(self._group, rank, str(err))

    def __await__(self) -> Generator[Any, None, list[Any]]:
        """``await future``: the results in rank order; the first failure raises at once."""

        async def one(index: int, ref: Any) -> Any:
            try:
                return await ref  # Ray's ObjectRefs are awaitable: no polling
            except _RAY_WORKER_ERRORS as err:
                raise self._error(index, err) from None

        async def gather() -> list[Any]:
            return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(self._refs))))

        return gather().__await__()


def _default_placement(num_accelerators: int) -> Any:
    """One rank per accelerator, or one rank on node 0 of a CPU cluster."""
    if num_accelerators:
        return PackedPlacementStrategy(0, num_accelerators - 1)
    return NodePlacementStrategy([0])


def _rank_env(
    name: str,
    p: Placement,
    world_size: int,
    group_nodes: list[int],
    master_ip: str,
    master_port: int,
    node: NodeInfo,
) -> dict[str, str]:
    """The environment a rank starts with: its rank, world, rendezvous and devices."""
    env = {
        "GROUP_NAME": name,
        "RANK": str(p.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(p.local_rank),
        "LOCAL_WORLD_SIZE": str(p.local_world_size),
        "NODE_RANK": str(group_nodes.index(p.node_rank)),
        "CLUSTER_NODE_RANK": str(p.node_rank),
        "MASTER_ADDR": master_ip,
        "MASTER_PORT": str(master_port),
        NAMESPACE_ENV: default_namespace(),
        DEVICES_ENV: f"{p.resource_kind}:{','.join(map(str, p.resource_ranks))}",
        **node.env_vars,
    }
    if p.local_accelerator_ids:
        env["CUDA_VISIBLE_DEVICES"] = p.visible_devices
        env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    return env


class WorkerGroup:
    """Ranks of one worker class; calling a worker method runs it on every rank.

    ``group.method(*args)`` returns a :class:`GroupFuture` at once;
    ``group.execute_on(0, 2).method(...)`` limits that one call to ranks 0 and 2.
    """

    def __init__(self, cls: type[Worker], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An unlaunched group; see :meth:`Worker.create_group`."""
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} must be a subclass of rlinf.sched.Worker")
        calls = cls.max_concurrent_calls
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(
                f"{cls.__name__}.max_concurrent_calls = {calls!r}: must be an int >= 1 "
                "(1 runs the worker's calls one at a time on its main thread)"
            )
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self._actors: list[Any] = []
        self._placements: list[Placement] = []
        self._name = ""
        self._node_ids: list[str] = []
        self._only: list[int] | None = None
        self._launch_options: dict[str, Any] | None = None
        self._python_env: tuple[PythonEnvConfig, str] | None = None
        self._interpreter: str | None = None

    def use_python_env(self, spec: PythonEnvConfig | None, key: str) -> WorkerGroup:
        """Runs this group's ranks with another Python environment's interpreter.

        It takes precedence over the nodes' ``python_interpreter_path``; the
        environment is checked when the group launches
        (:func:`rlinf.sched.python_env.check_python_env`).

        Args:
            spec: The environment; None keeps the driver's (or the node's) interpreter.
            key: The config key ``spec`` came from, named in errors
                (e.g. ``env.python_env``).

        Returns:
            This group, for chaining.
        """
        if self._actors:
            raise RuntimeError(f"group {self._name!r} is already launched")
        self._python_env = None if spec is None else (spec, key)
        return self

    def launch(
        self,
        cluster: Cluster,
        placement_strategy: Any = None,
        name: str | None = None,
        num_cpus: float = 0.0,
        timeout: float = 120.0,
    ) -> WorkerGroup:
        """Starts one actor per placement, pinned to its node; waits until all are up.

        Args:
            cluster: The cluster.
            placement_strategy: Where the ranks go; default one rank per
                accelerator, or one rank on node 0 of a CPU cluster.
            name: Group name (unique; no ``:``); default ``<ClassName>``.
            num_cpus: CPUs Ray reserves per rank. 0 (default) lets many light
                workers share a small machine; reserve CPUs for heavy ones.
            timeout: Seconds to wait for every rank's constructor.

        Raises:
            ValueError: Bad name or empty placement.
            WorkerError: A constructor raised (names the rank).
        """
        name = name or self._cls.__name__
        if ":" in name or not name:
            raise ValueError(f"group name {name!r} must be non-empty and contain no ':'")
        if self._actors:
            raise RuntimeError(f"group {self._name!r} is already launched")
        info = cluster.info
        if placement_strategy is None:
            placement_strategy = _default_placement(info.num_accelerators)
        placements = placement_strategy.get_placement(info)
        if not placements:
            raise ValueError(f"placement strategy {placement_strategy!r} gave no placements")
        self._launch_options = {
            "cluster": cluster,
            "placement_strategy": placement_strategy,
            "name": name,
            "num_cpus": num_cpus,
            "timeout": timeout,
        }
        started = time.monotonic()
        if self._python_env is not None:
            spec, key = self._python_env
            self._interpreter = check_python_env(spec, self._cls.__module__, key)
            _log.info("%s runs with %s (%s)", name, self._interpreter, key)
        _log.info("launching %s x%d ...", name, len(placements))
        master = info.nodes[placements[0].node_rank]
        master_port = _free_port_on(master, timeout)
        group_nodes = sorted({p.node_rank for p in placements})
        actors = []
        for p in placements:
            node = info.nodes[p.node_rank]
            env = _rank_env(name, p, len(placements), group_nodes, master.ip, master_port, node)
            options = self._actor_options(f"{name}:{p.rank}", node, env, num_cpus)
            actor_cls = ray.remote(self._cls)
            actors.append(actor_cls.options(**options).remote(*self._args, **self._kwargs))
        self._actors, self._placements, self._name = actors, placements, name
        self._node_ids = [info.nodes[p.node_rank].ray_node_id for p in placements]
        self._wait_ready(timeout, started)
        directory = get_directory()
        if directory is not None:
            record = {"cls": self._cls, "placements": placements, "node_ids": self._node_ids}
            ray.get(directory.register_group.remote(name, record), timeout=timeout)
        n = len(actors)
        _log.info("%s: %d/%d ready in %.1f s", name, n, n, time.monotonic() - started)
        return self

    def _actor_options(
        self, actor_name: str, node: NodeInfo, env: dict[str, str], num_cpus: float
    ) -> dict[str, Any]:
        """Ray options of one rank's actor: its name, environment and node pin."""
        runtime_env: dict[str, Any] = {"env_vars": env}
        interpreter = self._interpreter or node.python_interpreter_path
        if interpreter:
            runtime_env["py_executable"] = interpreter
        options: dict[str, Any] = {
            "name": actor_name,
            "namespace": RAY_NAMESPACE,
            "num_cpus": num_cpus,
            "num_gpus": 0,
            "runtime_env": runtime_env,
            "max_concurrency": self._cls.max_concurrent_calls,
        }
        if node.ray_node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node.ray_node_id, soft=False
            )
        return options

    def _wait_ready(self, timeout: float, started: float) -> None:
        """Waits until every rank's constructor ran; says so now and then while it takes long."""
        from rlinf.sched.wait import wait_all  # wait.py builds on this module

        name, total = self._name, len(self._actors)

        def report(ready: int, _total: int, _waited: float) -> None:
            _log.info(
                "still waiting for %s: %d/%d ready after %.0f s",
                name,
                ready,
                total,
                time.monotonic() - started,
            )

        wait_all(
            [self._call("ping", (), {}, list(range(total)))],
            timeout,
            hint="is the machine overloaded? pass a larger timeout to launch()",
            progress=report,
            progress_every=_LAUNCH_REPORT_S,
        )

    @classmethod
    def from_group_name(cls, name: str, timeout: float = 60.0) -> WorkerGroup:
        """Reattaches to a group launched elsewhere (another driver or a worker) by name.

        Raises:
            ValueError: If no group of that name was launched on this cluster;
                the message lists the launched groups.
        """
        directory = get_directory()
        record = None
        if directory is not None:
            record = ray.get(directory.group.remote(name), timeout=timeout)
        if record is None:
            known = ray.get(directory.group_names.remote(), timeout=timeout) if directory else []
            raise ValueError(
                f"no worker group named {name!r} is running on this cluster "
                f"(launched groups: {known or 'none'}); launch it first or check the name"
            )
        group = cls(record["cls"], (), {})
        group._actors = [
            ray.get_actor(f"{name}:{rank}", namespace=RAY_NAMESPACE)
            for rank in range(len(record["placements"]))
        ]
        group._placements, group._name = list(record["placements"]), name
        group._node_ids = list(record["node_ids"])
        return group

    def relaunch(self, timeout: float | None = None) -> WorkerGroup:
        """Shuts every rank down and starts the group again with the same placement.

        The new ranks are built from the same constructor arguments, under the
        same name, on the same nodes and devices; they start with fresh state
        (the caller restores it, e.g. from a checkpoint). Used by the runners'
        ``runner.max_restarts`` to recover from a dead rank.

        Args:
            timeout: Seconds to wait for every rank's constructor (default: the
                ``timeout`` the group was launched with).

        Returns:
            This group, launched again.

        Raises:
            RuntimeError: The group was never launched (nothing to relaunch).
        """
        if self._launch_options is None:
            raise RuntimeError("relaunch() needs a group that was launched before")
        options = dict(self._launch_options)
        if timeout is not None:
            options["timeout"] = timeout
        world_size = len(self._placements)
        self.close()
        _wait_until_names_free(options["name"], world_size, options["timeout"])
        return self.launch(**options)

    def dead_ranks(self, timeout: float = 10.0) -> list[int]:
        """Ranks whose process is gone (killed, crashed, out of memory).

        A rank that is alive but does not answer within ``timeout`` (busy in a
        long native call) counts as alive.

        Args:
            timeout: Seconds to wait for the ranks' answers, all together.
        """
        refs = [actor.ping.remote() for actor in self._actors]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        dead = []
        for rank, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    dead.append(rank)
                except ray.exceptions.RayTaskError:
                    pass  # alive: ping raised, which a live process reports
        return dead

    # ----- calls --------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Group name."""
        return self._name

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self._actors)

    @property
    def placements(self) -> list[Placement]:
        """Where each rank runs."""
        return list(self._placements)

    @property
    def worker_cls(self) -> type[Worker]:
        """The :class:`Worker` subclass every rank runs."""
        return self._cls

    def execute_on(self, *ranks: int) -> WorkerGroup:
        """Limits the next call to ``ranks``."""
        bad = [r for r in ranks if not 0 <= r < len(self._actors)]
        if bad or not ranks:
            raise ValueError(
                f"execute_on ranks {list(ranks)} must be in 0..{len(self._actors) - 1}"
            )
        self._only = list(ranks)
        return self

    def _call(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], ranks: list[int]
    ) -> GroupFuture:
        refs = [getattr(self._actors[r], method).remote(*args, **kwargs) for r in ranks]
        return GroupFuture(self._name, ranks, refs, method)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        if not callable(getattr(self._cls, method, None)):
            raise AttributeError(f"{self._cls.__name__} has no method {method!r}")
        if not self._actors:
            raise RuntimeError(f"launch the group before calling {method}()")

        def call(*args: Any, **kwargs: Any) -> GroupFuture:
            ranks = self._only if self._only is not None else list(range(len(self._actors)))
            self._only = None
            return self._call(method, args, kwargs, ranks)

        return call

    def shutdown(self, timeout: float = 10.0) -> None:
        """Deprecated name of :meth:`close`."""
        warnings.warn(
            "WorkerGroup.shutdown is deprecated; use WorkerGroup.close",
            DeprecationWarning,
            stacklevel=2,
        )
        self.close(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Lets every rank release its channels, then kills its actor (idempotent).

        Args:
            timeout: Seconds to wait for the ranks' ``teardown``; ranks that
                do not answer (dead or stuck) are killed anyway.
        """
        refs = []
        for actor in self._actors:
            with contextlib.suppress(Exception):
                refs.append(actor.teardown.remote())
        torn_down: set[int] = set()
        if refs:
            with contextlib.suppress(Exception):
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
                for rank, ref in enumerate(refs):
                    if ref in ready:
                        with contextlib.suppress(Exception):
                            ray.get(ref)
                            torn_down.add(rank)
        # A rank that could not tear down (it died) leaves its inbox name
        # behind; remove it if it lives on this node.
        here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        for rank, node_id in enumerate(self._node_ids):
            if rank not in torn_down and node_id == here:
                _unlink_segment(inbox_name(self._name, rank))
        for actor in self._actors:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(actor)
        if self._actors:
            directory = get_directory()
            if directory is not None:
                with contextlib.suppress(Exception):
                    ray.get(directory.unregister_group.remote(self._name), timeout=timeout)
        self._actors = []


def _wait_until_names_free(name: str, world_size: int, timeout: float) -> None:
    """Waits until no live actor holds the names ``name:0..`` (a relaunch right after a kill).

    Ray frees the name of a killed actor asynchronously; creating an actor under
    that name before then fails.
    """
    deadline = time.monotonic() + timeout
    for rank in range(world_size):
        while True:
            try:
                ray.get_actor(f"{name}:{rank}", namespace=RAY_NAMESPACE)
            except ValueError:
                break  # no actor of that name
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"worker {name}:{rank} was killed but Ray still holds its name after "
                    f"{timeout:g} s; is the cluster overloaded?"
                )
            time.sleep(0.05)


def _unlink_segment(channel: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.unlink(os.path.join("/dev/shm", segment_name(default_namespace(), channel)))


_RAY_WORKER_PORTS_END = 19999
"""Last port of Ray's default worker port range (``--max-worker-port``)."""


def _free_port() -> int:
    """A port free on this node, outside the kernel's ephemeral range when possible.

    ``MASTER_PORT`` is chosen when a group launches but bound by rank 0's
    process-group store only at its first ``init_worker``, which may be minutes
    later. A port from the ephemeral range (what ``bind(("", 0))`` returns) can
    be taken in between by any socket bound to port 0 on the node: gloo's pair
    listeners of another group did exactly that in a test run (EADDRINUSE on
    rank 0; rank 1 pinged a gloo socket). The kernel never hands out ports
    below ``ip_local_port_range``, so a random free port between Ray's worker
    ports and that range can only collide with another explicit choice. Falls
    back to an ephemeral port when that band is empty. Self-contained (imports
    inside), so a Ray task can run it on another node.
    """
    import random
    import socket as socket_module

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768
    low, high = _RAY_WORKER_PORTS_END + 1, ephemeral_start - 1
    rng = random.SystemRandom()
    for _ in range(64 if high > low else 0):
        port = rng.randint(low, high)
        with socket_module.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    with socket_module.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _free_port_on(node: NodeInfo, timeout: float) -> int:
    """A port that is free on the node of rank 0 (``MASTER_PORT``): see :func:`_free_port`.

    On the driver's node (or in fakes without a node id) the driver probes
    itself; on another node a small task pinned there does, so the port is
    checked where the process group's store will listen. The task runs with the
    node's interpreter and environment, like the workers.
    """
    if not node.ray_node_id or node.ray_node_id == ray.get_runtime_context().get_node_id():
        return _free_port()
    runtime_env: dict[str, Any] = {"env_vars": dict(node.env_vars)}
    if node.python_interpreter_path:
        runtime_env["py_executable"] = node.python_interpreter_path
    task = ray.remote(num_cpus=0)(_free_port).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.ray_node_id, soft=False),
        runtime_env=runtime_env,
    )
    return int(ray.get(task.remote(), timeout=timeout))
