"""``Channel``: a named, keyed, zero-copy queue in shared memory.

Semantics follow ``asyncio.Queue`` per key: FIFO within a key, ``maxsize``
per key (0 = bounded only by ``max_items`` and ``capacity_bytes``),
``put_nowait``/``get_nowait`` raise ``asyncio.QueueFull``/``QueueEmpty``. Any
process on the node can ``connect`` by name; a ``Channel`` pickles as its name,
so passing one to a Ray actor connects there.
"""

from __future__ import annotations

import asyncio
import atexit
import numbers
import os
import pickle
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rlinf.core import _native
from rlinf.core.channel.resolver import get_resolver
from rlinf.core.channel.serialization import dumps, loads

__all__ = [
    "AGENT_ENV",
    "DEFAULT_KEY",
    "NAMESPACE_ENV",
    "Channel",
    "ChannelClosed",
    "ChannelNotFound",
]

DEFAULT_KEY = "default_queue"
"""Key used when none is given."""

NAMESPACE_ENV = "RLINF_CHANNEL_NAMESPACE"
"""Environment variable holding the default namespace (one per run)."""

AGENT_ENV = "RLINF_CHANNEL_AGENT"
"""If set (``host:port``), ``Channel.connect`` goes through that agent over TCP."""

_Core = _native.ChannelCore | _native.RemoteCore

ChannelClosed = _native.ChannelClosed
ChannelNotFound = _native.ChannelNotFound

# Blocking native calls run in slices so Ctrl-C is honoured between them.
_SLICE_S = 0.25
# Payloads smaller than this are put from the event loop thread directly.
_ASYNC_INLINE_BYTES = 1 << 20

_T = TypeVar("_T")
_executor: ThreadPoolExecutor | None = None

# Objects alive at interpreter exit are not always destroyed, so release the
# names of this process's segments explicitly (the last holder unlinks).
atexit.register(_native.release_all_names)


def _print_wait_stats() -> None:
    print(f"[rlinf.channel pid {os.getpid()}] waits: {_native.wait_stats()}")


if os.environ.get("RLINF_CHANNEL_DEBUG_WAITS"):
    atexit.register(_print_wait_stats)


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="rlinf-channel")
    return _executor


def default_namespace() -> str:
    """The namespace channels live in unless told otherwise (``$RLINF_CHANNEL_NAMESPACE``)."""
    return os.environ.get(NAMESPACE_ENV, "default")


def _encode_key(key: Any) -> bytes:
    if isinstance(key, str):
        return b"s" + key.encode()
    if isinstance(key, bool) or not isinstance(key, int | bytes):
        try:
            return b"p" + pickle.dumps(key, protocol=5)
        except Exception as err:
            raise TypeError(f"channel key {key!r} is not picklable: {err}") from err
    if isinstance(key, int):
        return b"i" + str(key).encode()
    return b"b" + key


_SIZE_LIMITS = {
    "maxsize": (0, 1 << 24),
    "max_keys": (1, 1 << 16),
    "max_items": (1, 1 << 24),
    "capacity_bytes": (1 << 16, 1 << 46),
}


def _check_sizes(**sizes: int) -> None:
    for arg, value in sizes.items():
        low, high = _SIZE_LIMITS[arg]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{arg} must be an integer in [{low}, {high}], got {value!r}")


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return timeout


def _sliced(call: Callable[[float], _T], timeout: float | None) -> _T:
    """Runs a blocking native call in slices of at most ``_SLICE_S`` seconds.

    Each slice either completes or times out without side effects, so
    retrying is safe; between slices Python can deliver KeyboardInterrupt.
    A timeout of at most one slice is a single call. Invalid timeouts raise
    ``ValueError``.
    """
    if timeout is not None and type(timeout) in (float, int) and 0 <= timeout <= _SLICE_S:
        try:
            return call(timeout)
        except TimeoutError:
            raise TimeoutError(_timed_out(timeout)) from None
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = _SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return call(min(remaining, _SLICE_S))
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(_timed_out(timeout)) from None


def _timed_out(timeout: float | None) -> str:
    return f"timed out after {timeout} s waiting on the channel"


class Channel:
    """A named queue in shared memory with one FIFO lane per key.

    Create it once (usually in the driver), connect from anywhere on the node::

        ch = Channel.create("rollout", maxsize=8)
        ch.put({"obs": np.zeros((64, 84, 84), np.uint8)}, key="stage0", weight=1)
        item = Channel.connect("rollout").get(key="stage0")   # arrays are zero-copy views

    Numpy arrays and CPU torch tensors anywhere in an item travel out of band
    and arrive as writable views into shared memory; the memory returns to the
    channel when the last view is garbage collected.
    """

    def __init__(self, core: _Core, name: str, namespace: str, address: str | None = None) -> None:
        """Wraps a native handle; use :meth:`create` or :meth:`connect` instead."""
        self._core = core
        self._name = name
        self._namespace = namespace
        self._address = address
        # Lane cache: str keys by value (the common case, no encoding cost);
        # other keys by their encoding, so 1, True and 1.0 stay distinct keys.
        self._str_lanes: dict[str, int] = {}
        self._lanes: dict[bytes, int] = {}

    # ----- creation -------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        *,
        namespace: str | None = None,
        max_keys: int = 64,
        max_items: int = 4096,
        capacity_bytes: int = 1 << 30,
        exist_ok: bool = False,
        address: str | None = None,
    ) -> Channel:
        """Creates a channel.

        Args:
            name: Channel name: letters, digits, ``_``, ``-``, ``.``.
            maxsize: Items per key before ``put`` blocks; 0 means no per-key
                bound (``max_items`` and ``capacity_bytes`` still apply).
            namespace: Run namespace; defaults to ``$RLINF_CHANNEL_NAMESPACE``
                or ``"default"``.
            max_keys: Distinct keys the channel can hold.
            max_items: Items alive at once across keys (queued plus held by
                consumers as views).
            capacity_bytes: Shared-memory bytes for payloads (reserved lazily:
                only pages actually used take memory).
            exist_ok: Connect instead of failing if the channel exists.
            address: ``host:port`` of the channel agent of another node: create
                the channel there (its home) and reach it over TCP.

        Returns:
            The channel.

        Raises:
            ValueError: For bad names or sizes (the message names the argument).
            rlinf.core._native.ChannelExists: If it exists and not ``exist_ok``.
        """
        _check_sizes(
            maxsize=maxsize, max_keys=max_keys, max_items=max_items, capacity_bytes=capacity_bytes
        )
        namespace = namespace or default_namespace()
        lane_capacity = maxsize if maxsize > 0 else max_items
        sizes = (max_keys, lane_capacity, max(max_items, maxsize), capacity_bytes, maxsize)
        try:
            core: _Core
            if address is None:
                core = _native.ChannelCore.create(namespace, name, *sizes)
            else:
                core = _native.RemoteCore.connect(address, namespace, name, True, *sizes)
        except _native.ChannelExists:
            if not exist_ok:
                raise
            return cls.connect(name, namespace=namespace, address=address)
        resolver = get_resolver()
        if address is None and resolver is not None:
            resolver.on_create(namespace, name)
        return cls(core, name, namespace, address)

    @classmethod
    def connect(
        cls,
        name: str,
        *,
        namespace: str | None = None,
        timeout: float = 0.0,
        address: str | None = None,
    ) -> Channel:
        """Connects to an existing channel, waiting up to ``timeout`` s for it to appear.

        Args:
            name: Channel name.
            namespace: Run namespace (default: ``$RLINF_CHANNEL_NAMESPACE``).
            timeout: Seconds to wait for the channel to be created.
            address: ``host:port`` of the agent on the channel's home node, for
                a channel on another node (payloads then travel over TCP).
                Defaults to ``$RLINF_CHANNEL_AGENT`` if set, else shared memory.

        Raises:
            rlinf.core._native.ChannelNotFound: If it does not exist in time.
        """
        namespace = namespace or default_namespace()
        explicit = address or os.environ.get(AGENT_ENV) or None
        resolver = None if explicit else get_resolver()
        deadline = time.monotonic() + _check_timeout(timeout)  # type: ignore[operator]
        while True:
            address = explicit
            if resolver is not None:
                home = resolver.locate(namespace, name)
                if home is not None and home != resolver.node_key():
                    address = resolver.agent_address(home)
            try:
                core: _Core
                if address is None:
                    core = _native.ChannelCore.attach(namespace, name)
                else:
                    core = _native.RemoteCore.connect(address, namespace, name)
                return cls(core, name, namespace, address)
            except _native.ChannelNotFound:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def __reduce__(self) -> tuple[Any, ...]:
        # A shared-memory channel travels with its home node, so a process on
        # another node reconnects through that node's agent.
        resolver = get_resolver()
        home = resolver.node_key() if resolver is not None and self._address is None else None
        return (_connect, (self._name, self._namespace, self._address, home))

    def __repr__(self) -> str:
        where = "shm" if self._address is None else f"tcp://{self._address}"
        return (
            f"Channel({self._name!r}, namespace={self._namespace!r}, maxsize={self.maxsize}, "
            f"via={where})"
        )

    # ----- properties -----------------------------------------------------------
    @property
    def name(self) -> str:
        """Channel name."""
        return self._name

    @property
    def namespace(self) -> str:
        """Run namespace."""
        return self._namespace

    @property
    def address(self) -> str | None:
        """Agent address when the channel is reached over TCP, else None (shared memory)."""
        return self._address

    @property
    def maxsize(self) -> int:
        """Items per key before ``put`` blocks (0 = no per-key bound)."""
        return int(self._core.user_tag)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (by any process)."""
        return bool(self._core.closed)

    def _lane(self, key: Any) -> int:
        if type(key) is str:
            lane = self._str_lanes.get(key)
            if lane is None:
                lane = self._str_lanes[key] = self._core.lane(_encode_key(key))
            return lane
        encoded = _encode_key(key)
        lane = self._lanes.get(encoded)
        if lane is None:
            lane = self._lanes[encoded] = self._core.lane(encoded)
        return lane

    # ----- put ------------------------------------------------------------------
    def put(
        self, item: Any, key: Any = DEFAULT_KEY, weight: int = 0, timeout: float | None = None
    ) -> None:
        """Puts ``item`` under ``key``, blocking while the key (or the channel) is full.

        Backpressure happens before any payload byte moves.

        Raises:
            TimeoutError: If there is no room within ``timeout`` seconds.
            ChannelClosed: If the channel is closed.
        """
        header, buffers = dumps(item)
        lane = self._lane(key)
        if timeout is None:  # the hot path: no deadline bookkeeping
            put = self._core.put
            while True:
                try:
                    return put(lane, header, buffers, weight, _SLICE_S, False)
                except TimeoutError:
                    continue
        _sliced(lambda t: self._core.put(lane, header, buffers, weight, t, False), timeout)

    def put_nowait(self, item: Any, key: Any = DEFAULT_KEY, weight: int = 0) -> None:
        """Puts without waiting.

        Raises:
            asyncio.QueueFull: If the key or the channel is full.
        """
        header, buffers = dumps(item)
        try:
            self._core.put(self._lane(key), header, buffers, weight, None, True)
        except _native.ChannelFull:
            raise asyncio.QueueFull from None

    # ----- get ------------------------------------------------------------------
    def get(self, key: Any = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Takes the next item of ``key``, waiting for one.

        Raises:
            TimeoutError: If none arrives within ``timeout`` seconds.
            ChannelClosed: If the channel is closed and the key drained.
        """
        lane = self._lane(key)
        if timeout is None:  # the hot path: no deadline bookkeeping
            get = self._core.get
            while True:
                try:
                    message = get(lane, _SLICE_S, False)
                except TimeoutError:
                    continue
                return loads(*message)
        header, views = _sliced(lambda t: self._core.get(lane, t, False), timeout)
        return loads(header, views)

    def get_nowait(self, key: Any = DEFAULT_KEY) -> Any:
        """Takes the next item without waiting.

        Raises:
            asyncio.QueueEmpty: If the key has no item ready.
        """
        try:
            header, views = self._core.get(self._lane(key), None, True)
        except _native.ChannelEmpty:
            raise asyncio.QueueEmpty from None
        return loads(header, views)

    def get_batch(
        self, target_weight: int, key: Any = DEFAULT_KEY, timeout: float | None = None
    ) -> list[Any]:
        """Takes items in FIFO order while their weights sum to at most ``target_weight``.

        Stops once the sum reaches the target; waits (without taking) until
        enough weight has arrived. Example: weights 1, 2, 3 and target 3 give
        the first two items.

        Raises:
            ValueError: If ``target_weight`` <= 0, or the next item's weight
                would overshoot the target before it is reached.
            TimeoutError: If the target is not reached within ``timeout``.
        """
        if target_weight <= 0:
            raise ValueError(f"target_weight must be > 0, got {target_weight}")
        lane = self._lane(key)
        batch = _sliced(lambda t: self._core.get_batch(lane, target_weight, t), timeout)
        return [loads(header, views) for header, views in batch]

    # ----- asyncio --------------------------------------------------------------
    async def aput(
        self, item: Any, key: Any = DEFAULT_KEY, weight: int = 0, timeout: float | None = None
    ) -> None:
        """Async ``put``: never blocks the event loop.

        Small items are put from the loop thread when there is room; large
        items and waits for room run in a worker thread. A cancelled ``aput``
        may still complete.
        """
        header, buffers = dumps(item)
        lane = self._lane(key)
        if sum(len(b) for b in buffers) + len(header) < _ASYNC_INLINE_BYTES:
            try:
                self._core.put(lane, header, buffers, weight, None, True)
                return
            except _native.ChannelFull:
                pass
        loop = asyncio.get_running_loop()
        timeout = _check_timeout(timeout)
        await loop.run_in_executor(
            _pool(),
            lambda: _sliced(
                lambda t: self._core.put(lane, header, buffers, weight, t, False), timeout
            ),
        )

    async def aget(self, key: Any = DEFAULT_KEY, timeout: float | None = None) -> Any:
        """Async ``get``: never blocks the event loop, and is safe to cancel.

        Waiting happens in a worker thread that never takes an item; the item
        is taken on the loop thread, so a cancelled ``aget`` loses nothing and
        sync and async getters never swap replies.
        """
        lane = self._lane(key)
        deadline = None if timeout is None else time.monotonic() + _check_timeout(timeout)  # type: ignore[operator]
        loop = asyncio.get_running_loop()
        while True:
            try:
                header, views = self._core.get(lane, None, True)
                return loads(header, views)
            except _native.ChannelEmpty:
                pass
            wait = _SLICE_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(f"timed out after {timeout} s waiting on the channel")
            await loop.run_in_executor(_pool(), self._core.wait_readable, lane, wait)

    async def aget_batch(
        self, target_weight: int, key: Any = DEFAULT_KEY, timeout: float | None = None
    ) -> list[Any]:
        """Async ``get_batch`` (runs in a worker thread)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _pool(), lambda: self.get_batch(target_weight, key, timeout)
        )

    # ----- introspection and lifetime --------------------------------------------
    def qsize(self, key: Any = DEFAULT_KEY) -> int:
        """Items under ``key`` (put or being put, not yet taken)."""
        return int(self._core.qsize(self._lane(key)))

    def empty(self, key: Any = DEFAULT_KEY) -> bool:
        """Whether ``key`` holds no item."""
        return self.qsize(key) == 0

    def full(self, key: Any = DEFAULT_KEY) -> bool:
        """Whether ``key`` holds ``maxsize`` items (never true when ``maxsize`` is 0)."""
        return self.maxsize > 0 and self.qsize(key) >= self.maxsize

    def close(self) -> None:
        """Closes the channel for every process and wakes all waiters. Idempotent.

        Later puts raise ``ChannelClosed``; gets drain what is queued, then raise it.
        """
        self._core.close()

    def unlink(self) -> bool:
        """Removes the channel's name now; returns whether a name was removed.

        Processes that hold the channel keep using it; new ``connect`` calls
        fail. The memory is freed when the last holder lets go. The owner of
        a channel (e.g. a worker, for its inbox) calls this at shutdown so the
        name never outlives it, even if a peer still holds the channel.
        """
        if self._address is not None:
            return False  # the home node's processes own the name
        try:
            os.unlink(os.path.join("/dev/shm", _native.segment_name(self._namespace, self._name)))
        except FileNotFoundError:
            return False
        return True

    def reclaim(self) -> int:
        """Returns memory held by dead processes to the channel; returns the block count."""
        return int(self._core.reclaim())

    def stats(self) -> dict[str, int]:
        """Arena and lane counters (blocks free/leased/queued, bytes used)."""
        return dict(self._core.stats())


def _connect(
    name: str, namespace: str, address: str | None = None, home: str | None = None
) -> Channel:
    resolver = get_resolver()
    remote_home = resolver is not None and home is not None and home != resolver.node_key()
    if address is None and remote_home:
        address = resolver.agent_address(home)  # type: ignore[union-attr, arg-type]
    return Channel.connect(name, namespace=namespace, timeout=10.0, address=address)
