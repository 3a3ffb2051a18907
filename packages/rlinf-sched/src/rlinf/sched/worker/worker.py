"""``Worker``: the base class of every RLinf worker process (a Ray actor).

Subclass it, add methods, and launch a group with
``MyWorker.create_group(cfg).launch(cluster, placement_strategy=...)``. The
scheduler sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``GROUP_NAME`` (plus
``CUDA_VISIBLE_DEVICES`` on accelerators) before the worker's process starts,
so ``torch.distributed.init_process_group()`` works with no arguments.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

from rlinf.core._native import release_all_names
from rlinf.core.channel import Channel, default_namespace
from rlinf.core.heap import freeze_heap, frozen_objects
from rlinf.core.logging import get_worker_logger
from rlinf.sched.comm import CommWork, P2PEndpoint, install_resolver
from rlinf.sched.worker.device_lock import DEVICES_ENV, DeviceLock

if TYPE_CHECKING:
    from rlinf.sched.worker.group import WorkerGroup

__all__ = ["Worker"]

_REQUIRED_ENV = ("GROUP_NAME", "RANK", "WORLD_SIZE")


class Worker:
    """Base class of worker processes; one instance per rank of a group.

    Inside a worker, ``self.rank``, ``self.world_size``, ``self.local_rank``,
    ``self.node_rank`` and ``self.group_name`` describe its place, ``self.log_info``
    and friends log with a ``[group rank]`` prefix, and ``with
    self.worker_timer("tag"):`` times a section (the driver collects the times
    with ``group.pop_timings()``).

    Raises:
        RuntimeError: If instantiated outside a launched group (the
            scheduler's environment variables are missing).
    """

    max_concurrent_calls: ClassVar[int] = 8
    """How many calls into one rank may run at once (Ray's ``max_concurrency``).

    Above 1, each call runs on a thread of a pool, so a ``ping`` or a
    ``teardown`` is answered while a long call runs; but the process's main
    thread then wakes every 10 ms to check for signals and takes the GIL from
    the running call each time (about 30 context switches per 100 ms, counted in
    an env worker). 1 runs every call on the main thread, one after another:
    for workers whose calls are hot loops and that are never sent a second call
    while one runs (the embodied env and rollout workers). A liveness check counts
    a busy rank as alive, and ``close`` kills a rank whose ``teardown`` does
    not come in time.
    """

    def __init__(self) -> None:
        """Reads the placement the scheduler put in the environment."""
        missing = [k for k in _REQUIRED_ENV if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} is a Worker: create it with "
                f"{type(self).__name__}.create_group(...).launch(cluster), not directly "
                f"(missing environment: {', '.join(missing)})"
            )
        self.group_name = os.environ["GROUP_NAME"]
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.node_rank = int(os.environ.get("NODE_RANK", "0"))
        self._logger = get_worker_logger(self.group_name, self.rank)
        self._timings: dict[str, list[float]] = defaultdict(list)
        install_resolver()
        self._p2p = P2PEndpoint(self.group_name, self.rank)
        self._channels: list[Channel] = []
        devices = os.environ.get(DEVICES_ENV, "")
        kind, _, ranks = devices.partition(":")
        self._device_lock = DeviceLock(
            [f"{kind}:{r}" for r in ranks.split(",") if r], default_namespace()
        )

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup:
        """An unlaunched group whose ranks will be built with ``cls(*args, **kwargs)``."""
        from rlinf.sched.worker.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

    # ----- logging ------------------------------------------------------------------
    def log_debug(self, msg: str, *args: Any) -> None:
        """Logs at DEBUG with the ``[group rank]`` prefix."""
        self._logger.debug(msg, *args)

    def log_info(self, msg: str, *args: Any) -> None:
        """Logs at INFO with the ``[group rank]`` prefix."""
        self._logger.info(msg, *args)

    def log_warning(self, msg: str, *args: Any) -> None:
        """Logs at WARNING with the ``[group rank]`` prefix."""
        self._logger.warning(msg, *args)

    def log_error(self, msg: str, *args: Any) -> None:
        """Logs at ERROR with the ``[group rank]`` prefix."""
        self._logger.error(msg, *args)

    # ----- timing -------------------------------------------------------------------
    @contextmanager
    def worker_timer(self, tag: str) -> Iterator[None]:
        """Times the ``with`` block under ``tag`` (seconds)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timings[tag].append(time.perf_counter() - start)

    def pop_timings(self) -> dict[str, float]:
        """Total seconds per tag since the last call; clears them."""
        out = {tag: sum(v) for tag, v in self._timings.items()}
        self._timings.clear()
        return out

    def ping(self) -> int:
        """Returns this worker's rank (a liveness check)."""
        return self.rank

    def pid(self) -> int:
        """This worker's OS process id (for tools and tests that signal it)."""
        return os.getpid()

    def freeze_heap(self) -> int:
        """Freezes every object alive in this process out of Python's cyclic collector.

        Runners call it once the worker is set up (and after rebuilding its
        envs or models), so the collector's full passes skip the imported
        modules, envs and models (:mod:`rlinf.core.heap`).

        Returns:
            How many objects are frozen now.
        """
        return freeze_heap()

    def frozen_objects(self) -> int:
        """How many objects :meth:`freeze_heap` has frozen in this process (0 if none)."""
        return frozen_objects()

    def teardown(self) -> None:
        """Releases this worker's channels and locks; the scheduler calls it before killing it."""
        self._p2p.close()
        for channel in self._channels:
            channel.unlink()
        self._device_lock.release()
        release_all_names()

    # ----- point-to-point communication ---------------------------------------------
    @overload
    def send(
        self,
        obj: Any,
        dst_group_name: str,
        dst_rank: int,
        async_op: Literal[False] = False,
        timeout: float | None = None,
    ) -> None: ...

    @overload
    def send(
        self,
        obj: Any,
        dst_group_name: str,
        dst_rank: int,
        async_op: Literal[True],
        timeout: float | None = None,
    ) -> CommWork: ...

    @overload
    def send(
        self,
        obj: Any,
        dst_group_name: str,
        dst_rank: int,
        async_op: bool = False,
        timeout: float | None = None,
    ) -> CommWork | None: ...

    def send(
        self,
        obj: Any,
        dst_group_name: str,
        dst_rank: int,
        async_op: bool = False,
        timeout: float | None = None,
    ) -> CommWork | None:
        """Sends ``obj`` to rank ``dst_rank`` of group ``dst_group_name``.

        Any picklable object works; numpy arrays and CPU tensors (also inside
        dicts, lists and dataclasses) travel without pickling their data.
        Messages of one (sender, receiver) pair arrive in send order.

        Args:
            obj: What to send.
            dst_group_name: Receiving group.
            dst_rank: Receiving rank.
            async_op: Return a :class:`CommWork` at once instead of waiting.
            timeout: Seconds before giving up (default ``$RLINF_COMM_TIMEOUT_S``
                or 1800); the receiver's liveness is checked while waiting.

        Returns:
            None, or the :class:`CommWork` when ``async_op``.

        Raises:
            PeerDiedError: The receiver died.
            CommTimeoutError: The timeout passed.
        """
        return self._p2p.send(obj, (dst_group_name, dst_rank), async_op, timeout)

    def recv(
        self,
        src_group_name: str,
        src_rank: int,
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Receives the next object sent by rank ``src_rank`` of ``src_group_name``.

        May be called before the matching send. Returns the object, or a
        :class:`CommWork` whose ``wait()`` returns it when ``async_op``.

        Raises:
            PeerDiedError: The sender died and nothing more from it is queued.
            CommTimeoutError: The timeout passed.
        """
        return self._p2p.recv((src_group_name, src_rank), async_op, timeout)

    def broadcast(
        self,
        obj: Any,
        groups: list[tuple[str, int | list[int]]],
        src: tuple[str, int] | None = None,
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Broadcasts ``obj`` from ``src`` to every participant; every participant calls it.

        Args:
            obj: The object (ignored on non-source ranks; pass None).
            groups: Participants as ``(group_name, rank or ranks)`` pairs,
                identical on every participant.
            src: ``(group_name, rank)`` of the source; default the first participant.
            async_op: Return a :class:`CommWork` instead of waiting.
            timeout: As for :meth:`send`.

        Returns:
            The broadcast object (on every participant), or a :class:`CommWork`.

        Raises:
            ValueError: This worker is not a participant, or ``src`` is not.
        """
        return self._p2p.broadcast(obj, groups, src, async_op, timeout)

    def broadcast_sender(
        self, group: str, world_size: int, timeout: float | None = None
    ) -> Callable[[Any], None]:
        """A sender from this group's rank 0 to every rank of ``group`` (weight sync).

        Each call of the sender is one :meth:`broadcast` of its argument over
        ``(this group, 0)`` and ranks ``0..world_size-1`` of ``group``; the
        receivers call :meth:`broadcast` with the same participants.
        """
        groups: list[tuple[str, int | list[int]]] = [
            (self.group_name, 0),
            (group, list(range(world_size))),
        ]

        def send(obj: Any) -> None:
            self.broadcast(obj, groups, src=(self.group_name, 0), timeout=timeout)

        return send

    def create_channel(self, name: str, maxsize: int = 0, **kwargs: Any) -> Channel:
        """Creates a channel on this worker's node, reachable by name from the whole cluster.

        The channel lives as long as this worker (or any other process that
        holds it), even if the caller drops the returned object.
        """
        channel = Channel.create(name, maxsize, **kwargs)
        self._channels.append(channel)
        return channel

    def connect_channel(self, name: str, timeout: float = 60.0) -> Channel:
        """Connects to a channel created anywhere in the cluster (shm or TCP, as needed)."""
        return Channel.connect(name, timeout=timeout)

    # ----- collocated phases ---------------------------------------------------------
    @property
    def device_lock(self) -> DeviceLock:
        """The lock of the devices this worker owns (shared with collocated workers)."""
        return self._device_lock

    def acquire_device_lock(self, timeout: float = 600.0) -> None:
        """Takes the device lock (a runner calls this before a collocated phase)."""
        self._device_lock.acquire(timeout, holder=f"{self.group_name}[{self.rank}]")

    def release_device_lock(self) -> None:
        """Releases the device lock (idempotent)."""
        self._device_lock.release()

    @contextmanager
    def device_phase(self, *, lock: bool, offload: bool, timeout: float = 600.0) -> Iterator[None]:
        """One phase on the devices: lock, :meth:`onload`, the block, :meth:`offload`, release.

        Example::

            with self.device_phase(lock=self.collocated, offload=self.collocated):
                metrics = self._train(batch)

        The offload and the release also run when the block raises, so a failed
        phase leaves neither memory on the device nor the lock taken.

        Args:
            lock: Take this worker's device lock for the phase (groups that share
                devices take turns); False only onloads and offloads.
            offload: Offload when the phase ends; False keeps the state on the
                device (the next phase on these devices is this worker's again).
            timeout: Seconds to wait for the lock.

        Raises:
            DeviceLockTimeout: The lock was not free within ``timeout`` s.
        """
        if lock:
            self.acquire_device_lock(timeout)
        try:
            self.onload()
            yield
        finally:
            try:
                if offload:
                    self.offload()
            finally:
                if lock:
                    self.release_device_lock()

    def offload(self) -> None:
        """Frees device memory (weights, optimizer state) before another group's phase.

        The default does nothing; workers that hold device memory override
        it. Runners call ``offload``/``onload`` around phases in collocated mode.
        """

    def onload(self) -> None:
        """Restores what :meth:`offload` moved off the device. The default does nothing."""
