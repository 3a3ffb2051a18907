"""Point-to-point send/recv and broadcast between workers of any groups.

Every worker owns an *inbox*: a channel on its own node named after its
group and rank. ``send(obj, "actor", 0)`` puts ``obj`` into ``actor[0]``'s
inbox under the sender's key; ``recv("env", 1)`` takes the next item under
``env[1]``'s key. So each (sender, receiver) pair is one FIFO lane, a recv
may be posted before the matching send, and the transport follows from the
channel: shared memory on one node, TCP through the receiving node's agent
across nodes. Broadcasts use a separate key per source, so they never
interleave with point-to-point traffic of the same pair.

Blocking waits run in slices; between slices the peer's liveness is
checked, so a peer that dies is reported within seconds (``PeerDiedError``)
instead of hanging. CUDA tensors are staged through host memory and land on
the receiver's current CUDA device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import ray

from rlinf.core.channel import Channel
from rlinf.sched.comm.errors import CommTimeoutError, PeerDiedError
from rlinf.sched.comm.work import CommWork

__all__ = ["COMM_TIMEOUT_ENV", "P2PEndpoint", "inbox_name"]

COMM_TIMEOUT_ENV = "RLINF_COMM_TIMEOUT_S"
"""Default timeout (seconds) of send/recv/broadcast; 1800 when unset."""

_DEFAULT_TIMEOUT_S = 1800.0
_SLICE_S = 1.0
# The first wait of an operation is one channel slice (no deadline loop on
# the hot path); later ones are _SLICE_S long, with a liveness check between.
_FIRST_TRY_S = 0.25
_PING_WAIT_S = 2.0
_RAY_NAMESPACE = "rlinf"

Address = tuple[str, int]


def default_timeout() -> float:
    """The default bound of a send/recv (``$RLINF_COMM_TIMEOUT_S`` or 1800 s)."""
    raw = os.environ.get(COMM_TIMEOUT_ENV)
    if raw is None:
        return _DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{COMM_TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{COMM_TIMEOUT_ENV} must be > 0, got {raw!r}")
    return value


def inbox_name(group: str, rank: int) -> str:
    """Name of the inbox channel of ``group[rank]`` (a valid channel name for any group)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", group)
    if safe != group:
        safe += "-" + hashlib.sha1(group.encode()).hexdigest()[:8]
    return f"p2p-{safe}-{rank}"


class _CudaStaged:
    """A CUDA tensor copied to host memory for the trip (restored on arrival)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _map_tensors(obj: Any, fn: Callable[[Any], Any], torch: Any) -> Any:
    """Applies ``fn`` to every tensor in nested dicts, lists, tuples and dataclasses."""
    if isinstance(obj, torch.Tensor | _CudaStaged):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn, torch) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_tensors(v, fn, torch) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_tensors(v, fn, torch) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _map_tensors(getattr(obj, f.name), fn, torch)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    return obj


_cuda_available: bool | None = None


def _stage_out(obj: Any) -> Any:
    global _cuda_available
    torch = sys.modules.get("torch")
    if torch is None or isinstance(obj, bytes | str | int | float) or obj is None:
        return obj
    if _cuda_available is None:
        _cuda_available = bool(torch.cuda.is_available())
    if not _cuda_available:
        return obj

    def stage(t: Any) -> Any:
        return _CudaStaged(t.detach().cpu()) if isinstance(t, torch.Tensor) and t.is_cuda else t

    return _map_tensors(obj, stage, torch)


def _stage_in(obj: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return obj
    if isinstance(obj, torch.Tensor | int | float | str | bytes) or obj is None:
        return obj

    def restore(t: Any) -> Any:
        if isinstance(t, _CudaStaged):
            return t.tensor.to(f"cuda:{torch.cuda.current_device()}")
        return t

    return _map_tensors(obj, restore, torch)


class P2PEndpoint:
    """One worker's side of point-to-point communication (used through ``Worker``)."""

    def __init__(self, group: str, rank: int) -> None:
        self._me: Address = (group, rank)
        self._key = f"{group}:{rank}"
        self._inbox = Channel.create(inbox_name(group, rank), max_keys=1024, exist_ok=True)
        self._outboxes: dict[Address, Channel] = {}
        self._executors: dict[tuple[str, Address], ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._peers: dict[Address, Any] = {}
        self._pings: dict[Address, Any] = {}
        self._last: dict[tuple[str, Address], Future[Any]] = {}
        self._default_timeout = default_timeout()  # read once, when the worker starts
        self._descs: dict[tuple[str, Address], str] = {}

    # ----- public operations ----------------------------------------------------------
    def send(
        self,
        obj: Any,
        dst: Address,
        async_op: bool = False,
        timeout: float | None = None,
        key: str | None = None,
    ) -> CommWork | None:
        """Sends ``obj`` to ``dst``; see :meth:`rlinf.sched.Worker.send`."""
        dst = _check_address(dst, "dst")
        bound = self._default_timeout if timeout is None else timeout
        desc = self._desc("send", dst)
        work = self._run(
            ("send", dst), async_op, desc, self._do_send, obj, dst, key or self._key, bound, desc
        )
        return work if isinstance(work, CommWork) else None

    def recv(
        self,
        src: Address,
        async_op: bool = False,
        timeout: float | None = None,
        key: str | None = None,
    ) -> Any:
        """Receives the next object from ``src``; see :meth:`rlinf.sched.Worker.recv`."""
        src = _check_address(src, "src")
        bound = self._default_timeout if timeout is None else timeout
        desc = self._desc("recv", src)
        lane = key or f"{src[0]}:{src[1]}"
        return self._run(("recv", src), async_op, desc, self._do_recv, src, lane, bound, desc)

    def broadcast(
        self,
        obj: Any,
        groups: Sequence[tuple[str, int | Sequence[int]]],
        src: Address | None = None,
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Broadcasts from ``src`` to every other member of ``groups``; returns the object."""
        members = _expand(groups)
        source = _check_address(src, "src") if src is not None else members[0]
        if source not in members:
            raise ValueError(f"broadcast src {source} is not among the participants {members}")
        if self._me not in members:
            raise ValueError(
                f"{self._me[0]}[{self._me[1]}] called broadcast but is not among the "
                f"participants {members}; only participants may call it"
            )
        lane = f"bcast:{source[0]}:{source[1]}"
        if self._me != source:
            return self.recv(source, async_op=async_op, timeout=timeout, key=lane)
        works = [
            self.send(obj, m, async_op=True, timeout=timeout, key=lane)
            for m in members
            if m != source
        ]
        if async_op:
            return _Gather([w for w in works if w is not None], obj, f"broadcast from {source}")
        for w in works:
            if w is not None:
                w.wait()
        return obj

    def close(self) -> None:
        """Stops the endpoint's threads (pending operations are cancelled); removes the inbox."""
        self._inbox.unlink()
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for ex in executors:
            ex.shutdown(wait=False, cancel_futures=True)

    # ----- internals ------------------------------------------------------------------
    def _desc(self, direction: str, peer: Address) -> str:
        """``"send a:0 -> b[1]"``: names an operation in errors (cached per peer)."""
        desc = self._descs.get((direction, peer))
        if desc is None:
            arrow = "->" if direction == "send" else "<-"
            desc = f"{direction} {self._key} {arrow} {peer[0]}[{peer[1]}]"
            self._descs[(direction, peer)] = desc
        return desc

    def _run(
        self,
        queue: tuple[str, Address],
        async_op: bool,
        desc: str,
        fn: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """Runs one operation in order with the others of its (direction, peer) queue.

        An asynchronous operation goes to the queue's thread. A synchronous
        one waits for the queue's last asynchronous operation (order), then
        runs in the caller's thread: no thread hand-off on the common path.
        """
        if async_op:
            with self._lock:
                ex = self._executors.get(queue)
                if ex is None:
                    name = f"rlinf-{queue[0]}-{queue[1][0]}"
                    ex = self._executors[queue] = ThreadPoolExecutor(1, thread_name_prefix=name)
                future = ex.submit(fn, *args)
                self._last[queue] = future
            return CommWork(future, desc)
        if self._last:  # only after asynchronous operations: skip the lock otherwise
            with self._lock:
                last = self._last.pop(queue, None)
            if last is not None:
                wait_futures([last])
        return fn(*args)

    def _do_send(self, obj: Any, dst: Address, lane: str, bound: float, desc: str) -> None:
        deadline = time.monotonic() + bound
        outbox = self._outbox(dst, deadline, desc)
        payload = _stage_out(obj)
        wait = min(_FIRST_TRY_S, bound)
        while True:
            try:
                outbox.put(payload, key=lane, timeout=wait)
                return
            except TimeoutError:
                self._check_alive(dst, desc, deadline, bound, "the receiver's inbox is full")
            wait = _slice(deadline)

    def _do_recv(self, src: Address, lane: str, bound: float, desc: str) -> Any:
        deadline = time.monotonic() + bound
        wait = min(_FIRST_TRY_S, bound)
        while True:
            try:
                return _stage_in(self._inbox.get(key=lane, timeout=wait))
            except TimeoutError:
                self._check_alive(src, desc, deadline, bound, "nothing arrived")
            wait = _slice(deadline)

    def _outbox(self, dst: Address, deadline: float, desc: str) -> Channel:
        outbox = self._outboxes.get(dst)
        while outbox is None:
            try:
                outbox = Channel.connect(inbox_name(*dst), timeout=_slice(deadline))
            except Exception as err:  # ChannelNotFound: the peer has not started (yet)
                self._check_alive(dst, desc, deadline, None, f"no inbox yet ({err})")
            else:
                self._outboxes[dst] = outbox
        return outbox

    def _check_alive(
        self, peer: Address, desc: str, deadline: float, bound: float | None, why: str
    ) -> None:
        """Raises if ``peer`` died or the deadline passed; returns to keep waiting."""
        handle = self._peers.get(peer)
        if handle is None:
            try:
                handle = ray.get_actor(f"{peer[0]}:{peer[1]}", namespace=_RAY_NAMESPACE)
            except ValueError:
                handle = None  # not launched yet, or already gone without a trace
            if handle is not None:
                self._peers[peer] = handle
        if handle is not None:
            ping = self._pings.pop(peer, None) or handle.ping.remote()
            ready, _ = ray.wait([ping], timeout=_PING_WAIT_S)
            if ready:
                try:
                    ray.get(ready[0])
                except ray.exceptions.RayActorError as err:
                    raise PeerDiedError(desc, peer[0], peer[1], str(err).splitlines()[0]) from None
            else:
                self._pings[peer] = ping  # busy, not dead: reuse this ping next time
        if time.monotonic() >= deadline:
            if handle is None and peer not in self._peers:
                why += f"; no worker named {peer[0]}[{peer[1]}] is running"
            limit = f"{bound:g} s" if bound is not None else "the timeout"
            raise CommTimeoutError(
                f"{desc} timed out after {limit} ({why}); pass timeout= or set {COMM_TIMEOUT_ENV}"
            )


class _Gather(CommWork):
    """Completion of several sends (an asynchronous broadcast from its source)."""

    def __init__(self, works: list[CommWork], result: Any, description: str) -> None:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        remaining = [len(works)]
        lock = threading.Lock()

        def finished(done: Future[Any]) -> None:
            err = done.exception()
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if err is not None and not future.done():
                future.set_exception(err)
            elif last and not future.done():
                future.set_result(result)

        if not works:
            future.set_result(result)
        for w in works:
            w._future.add_done_callback(finished)
        super().__init__(future, description)


def _slice(deadline: float) -> float:
    return max(0.0, min(_SLICE_S, deadline - time.monotonic()))


def _check_address(address: Any, arg: str) -> Address:
    # Exact types first: the common call costs a few type checks.
    if (
        type(address) is tuple
        and len(address) == 2
        and type(address[0]) is str
        and type(address[1]) is int
    ):
        return address
    if (
        isinstance(address, tuple)
        and len(address) == 2
        and isinstance(address[0], str)
        and isinstance(address[1], int)
    ):
        return address
    raise ValueError(f"{arg} must be a (group_name, rank) pair, got {address!r}")


def _expand(groups: Sequence[tuple[str, int | Sequence[int]]]) -> list[Address]:
    members: list[Address] = []
    for entry in groups:
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise ValueError(
                f"broadcast groups entries must be (group_name, ranks) pairs, got {entry!r}"
            )
        name, ranks = entry
        for r in [ranks] if isinstance(ranks, int) else list(ranks):
            if (name, r) not in members:
                members.append((name, int(r)))
    if len(members) < 2:
        raise ValueError(f"broadcast needs at least 2 participants, got {members}")
    return members
