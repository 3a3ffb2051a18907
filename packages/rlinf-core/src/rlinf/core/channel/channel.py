"""``Channel``: a named, keyed, zero-copy queue in shared memory.

Semantics follow ``asyncio.Queue`` per key: FIFO within a key, ``maxsize``
per key (0 = bounded only by ``max_items`` and ``capacity_bytes``),
``put_nowait``/``get_nowait`` raise ``asyncio.QueueFull``/``QueueEmpty``. Any
process on the node can ``connect`` by name; a ``Channel`` pickles as its name,
so passing one to a Ray actor connects there.

Lifetime. A channel made by :meth:`Channel.create` belongs to the process that
created it, not to the returned object: dropping every handle keeps it, by
name and contents, until

(a) the creating process ends: at a normal exit (``atexit``) its names are
    given up and each goes at once if no other process holds the channel,
    else with its last holder; a creator killed by a signal keeps nothing
    either, its last surviving holder or ``cleanup_stale_segments`` removes it;
(b) anyone calls :meth:`Channel.unlink` (the memory is freed when the last
    process holding the channel lets go; the creator pins nothing);
(c) the creating process calls :func:`release_created_channels`
    (``rlinf.sched.Cluster.close()`` does, in the driver, for the run's
    namespace); the names then go as in (a).

Handles from :meth:`Channel.connect` (or from ``create(exist_ok=True)`` finding
the channel there) keep the channel only while they live, as before.

Why the claim is kept in the segment, not in a registry here. The simpler
design, a module-level registry of the created handles, keeps each channel
alive through an open descriptor and a mapping in the creator: after an
``unlink()`` by another process the memory would stay pinned until the
creator noticed, and the registry's handles would hold the ``flock`` that
marks a live holder. Instead the segment header records its creator (pid and
start time, the liveness test leases already use) and whether the creator
still claims the name; the last-holder rule (a handle's ``Drop``,
``release_all_names``, ``cleanup_stale_segments``) skips a name whose creator
is alive and claims it. So nothing in the creator pins memory, crash safety is
unchanged (a dead creator is detected as any dead peer is), and the rule holds
in Rust as well (``Channel::create_owned``); see ``crates/channel/README.md``,
"Cleanup".

A channel created with ``address=`` lives on another node, where this
process's liveness cannot be seen: there the creator keeps its connection to
the home node's agent open (the agent holds the channel for it) until this
process ends (the kernel closes the socket even on SIGKILL), it calls
:func:`release_created_channels`, or it calls ``unlink()`` on the channel.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing.util
import numbers
import os
import pickle
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rlinf.core import _native
from rlinf.core.channel.resolver import get_resolver
from rlinf.core.channel.serialization import RestrictedLoader, dumps, loads

__all__ = [
    "AGENT_ENV",
    "DEFAULT_KEY",
    "NAMESPACE_ENV",
    "Channel",
    "ChannelClosed",
    "ChannelNotFound",
    "release_created_channels",
]

DEFAULT_KEY = "default_queue"
"""Key used when none is given."""

NAMESPACE_ENV = "RLINF_CHANNEL_NAMESPACE"
"""Environment variable holding the default namespace (one per run)."""

AGENT_ENV = "RLINF_CHANNEL_AGENT"
"""If set (``host:port``), ``Channel.connect`` goes through that agent (another node's path)."""

TRANSPORT_ENV = "RLINF_CHANNEL_TRANSPORT"
"""How payloads reach another node's agent: ``auto`` (default), ``tcp`` or ``ucx``.

``auto`` uses UCX when the extension was built with it (``UCX_COMPILED``),
UCX starts here, the agent serves it and this host has an RDMA device (an
entry under ``/sys/class/infiniband``), else TCP: without RDMA our TCP
backend is faster than UCX over TCP (docs/channel.md). ``UCX_TLS`` and the other
``UCX_*`` variables pass through to UCX. Read at each ``connect``; an invalid
value raises ``ValueError`` naming the variable, the value and the choices.
"""

TLS_ENV = "RLINF_CHANNEL_TLS"
"""Set to ``1`` on a client to encrypt its agent connections with TLS (``0`` or unset: plain TCP).

Read at each ``connect``. Agents serve plain and TLS clients on the same
port. The channel secret still authenticates (inside TLS, bound to it); TLS
encrypts. UCX is refused over TLS: ``RLINF_CHANNEL_TRANSPORT=ucx`` together
with ``RLINF_CHANNEL_TLS=1`` raises ``ValueError``, and ``auto`` picks TCP.
See docs/channel.md, "Who can reach a channel".
"""

TLS_COMPILED: bool = _native.TLS_COMPILED
"""Whether this build of the extension includes TLS (the ``tls`` cargo feature)."""

UCX_COMPILED: bool = _native.UCX_COMPILED
"""Whether this build of the extension includes the UCX transport.

UCX itself is loaded when first used (``libucp.so.0``, or the path in
``$RLINF_UCX_LIBRARY``), so a build with UCX also runs where libucx is not
installed; :func:`ucx_unavailable_reason` says whether UCX works here.
"""


def ucx_unavailable_reason() -> str | None:
    """Why the UCX transport cannot be used in this process, or None when it can.

    Loads UCX's runtime library on first call (once per process).

    Returns:
        None if UCX can be used; else the reason, with the fix: this build has
        no UCX (rebuild where libucx-dev is installed), or ``libucp.so.0``
        cannot be loaded (``apt-get install libucx0``; ``ucx_info -d`` lists
        what UCX finds).
    """
    return _native.ucx_unavailable_reason()


_ucx_fallback_logged = False


def _note_transport(core: Any, address: str) -> None:
    """Logs once per process (INFO) when ``auto`` fell back to TCP because UCX is unusable here."""
    global _ucx_fallback_logged
    if _ucx_fallback_logged or core.transport != "tcp":
        return
    if os.environ.get(TRANSPORT_ENV, "").strip() not in ("", "auto"):
        return
    _ucx_fallback_logged = True
    reason = ucx_unavailable_reason()
    if reason is not None and UCX_COMPILED:
        from rlinf.core.logging import get_logger

        get_logger(__name__).info(
            "channel agent %s: %s=auto uses TCP, since UCX is not usable here: %s",
            address,
            TRANSPORT_ENV,
            reason,
        )


ChannelClosed = _native.ChannelClosed
ChannelNotFound = _native.ChannelNotFound

# Blocking native calls run in slices so Ctrl-C is honoured between them.
_SLICE_S = 0.25
# Payloads smaller than this are put from the event loop thread directly.
_ASYNC_INLINE_BYTES = 1 << 20

_T = TypeVar("_T")
_executor: ThreadPoolExecutor | None = None

# Connections to other nodes' agents that keep the channels this process
# created there, by (address, namespace, name); see the module docstring.
_remote_created: dict[tuple[str, str, str], _native.ChannelCore] = {}


def release_created_channels(namespace: str | None = None) -> int:
    """Gives up the channels this process created (in ``namespace``, or all).

    What the end of this process does, earlier: each shared-memory channel
    this process created with :meth:`Channel.create` goes at once if no
    process holds it, else when its last holder lets go; the connections that
    keep channels created on other nodes (``address=``) are closed. Handles
    still in use keep working. ``rlinf.sched.Cluster.close()`` calls this
    for the run's namespace.

    Returns:
        The number of shared-memory names removed at once.
    """
    for key in [k for k in _remote_created if namespace is None or k[1] == namespace]:
        del _remote_created[key]
    return int(_native.release_owned_names(namespace))


def _release_at_exit() -> None:
    _remote_created.clear()
    _native.release_all_names()


_exit_hooks_registered = False


def _register_exit_hooks() -> None:
    """Registers the exit hooks once, when this process first makes a channel handle.

    Objects alive at interpreter exit are not always destroyed, so the process
    gives up its names explicitly at exit (the last holder unlinks). Importing
    the module registers nothing.
    """
    global _exit_hooks_registered
    if _exit_hooks_registered:
        return
    _exit_hooks_registered = True
    atexit.register(_release_at_exit)
    if os.environ.get("RLINF_CHANNEL_DEBUG_WAITS"):
        atexit.register(_print_wait_stats)


def _after_fork_in_multiprocessing_child(_: object) -> None:
    # multiprocessing ends fork and forkserver children with os._exit, which
    # skips atexit; its own exit finalizers still run, so a child's normal
    # exit gives up the names it created too. (Other os._exit calls count as
    # a kill: the last holder or the janitor removes the names.)
    multiprocessing.util.Finalize(None, _release_at_exit, exitpriority=-100)


class _AfterForkToken:
    """A weak-referenceable key for ``multiprocessing.util.register_after_fork``."""


_AFTER_FORK_TOKEN = _AfterForkToken()
multiprocessing.util.register_after_fork(_AFTER_FORK_TOKEN, _after_fork_in_multiprocessing_child)


def _print_wait_stats() -> None:
    print(f"[rlinf.channel pid {os.getpid()}] waits: {_native.wait_stats()}")


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


DECODE_MODES = ("pickle", "restricted")
"""How a channel handle decodes the items it takes (``decode=``); see :class:`Channel`."""


def _decoder(decode: str, allowed_classes: Iterable[Any]) -> RestrictedLoader | None:
    """The restricted loader for ``decode="restricted"``, None for ``"pickle"``; checks both."""
    if decode == "restricted":
        return RestrictedLoader(allowed_classes)
    if decode != "pickle":
        choices = ", ".join(repr(m) for m in DECODE_MODES)
        raise ValueError(f"decode must be one of {choices}, got {decode!r}")
    if isinstance(allowed_classes, str | bytes) or tuple(allowed_classes):
        raise ValueError(
            f"allowed_classes applies to decode='restricted' only, got {allowed_classes!r} "
            "with decode='pickle' (which accepts every class)"
        )
    return None


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

    Decoding. Items are pickles, and unpickling runs whatever code the item
    names. The default, ``decode="pickle"``, therefore trusts every process
    that can put into the channel: those on this node, and peers on other
    nodes that authenticated to the channel agent with the run's secret. A
    handle made with ``decode="restricted"`` (a per-handle, reader-side
    option of :meth:`create` and :meth:`connect`) accepts only torch tensors,
    numpy arrays and numeric scalars, and plain containers and values (dict,
    list, tuple, set, OrderedDict, str, bytes, numbers, None), plus the
    classes named in ``allowed_classes``; any other item raises
    ``pickle.UnpicklingError`` naming what was refused, before anything in it
    is imported or called
    (:class:`~rlinf.core.channel.serialization.RestrictedLoader`). A ``get``
    then takes about 1.2x as long (10-30 us more per item: a dict of eight
    4 KiB tensors and five scalars, or one 16 MiB tensor; the rows of
    ``benchmarks/test_channel_decode.py``). A refused item is taken from the
    channel and dropped, so it cannot block its key: the ``get`` that took it
    raises, and the item's memory returns to the channel once that exception
    is released. Restricted handles pickle (to Ray actors) with their mode
    and allowed classes.

    A created channel belongs to the creating process, not to the object: it
    stays until that process ends, someone calls :meth:`unlink`, or the
    process calls :func:`release_created_channels` (see the module docstring).
    """

    def __init__(
        self,
        core: _native.ChannelCore,
        name: str,
        namespace: str,
        address: str | None = None,
        *,
        decoder: RestrictedLoader | None = None,
    ) -> None:
        """Wraps a native handle; use :meth:`create` or :meth:`connect` instead."""
        _register_exit_hooks()
        self._core = core
        self._name = name
        self._namespace = namespace
        self._address = address
        self._decoder = decoder
        self._loads: Callable[[Any, Any], Any] = loads if decoder is None else decoder.loads
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
        decode: str = "pickle",
        allowed_classes: Iterable[Any] = (),
    ) -> Channel:
        """Creates a channel that lives until this process ends, not just this object.

        The channel outlives the returned object: other processes can connect
        by name after it is dropped. It goes when this process ends (normally
        or killed), when anyone calls :meth:`unlink`, or when this process
        calls :func:`release_created_channels`; see the module docstring.

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
                the channel there (its home) and reach it over TCP. This
                process then keeps its connection to that agent open until it
                ends, calls :func:`release_created_channels` or :meth:`unlink`.
            decode: How this handle decodes what it takes, ``"pickle"``
                (default: trusts every writer) or ``"restricted"`` (tensors,
                arrays and plain data only); see :meth:`connect`.
            allowed_classes: With ``decode="restricted"``, further classes
                or functions to accept; see :meth:`connect`.

        Returns:
            The channel.

        Raises:
            ValueError: For bad names, sizes, ``decode`` values (one of
                ``DECODE_MODES``) or ``allowed_classes`` entries (the message
                names the argument); nothing is created then.
            rlinf.core._native.ChannelExists: If it exists and not ``exist_ok``.
        """
        decoder = _decoder(decode, allowed_classes)
        _check_sizes(
            maxsize=maxsize, max_keys=max_keys, max_items=max_items, capacity_bytes=capacity_bytes
        )
        namespace = namespace or default_namespace()
        lane_capacity = maxsize if maxsize > 0 else max_items
        sizes = (max_keys, lane_capacity, max(max_items, maxsize), capacity_bytes, maxsize)
        try:
            if address is None:
                core = _native.ChannelCore.create(namespace, name, *sizes, owned=True)
            else:
                core = _native.ChannelCore.connect_remote(address, namespace, name, True, *sizes)
                _remote_created[(address, namespace, name)] = core
        except _native.ChannelExists:
            if not exist_ok:
                raise
            allowed = () if decoder is None else decoder.allowed_classes
            return cls.connect(
                name, namespace=namespace, address=address, decode=decode, allowed_classes=allowed
            )
        resolver = get_resolver()
        if address is None and resolver is not None:
            resolver.on_create(namespace, name)
        return cls(core, name, namespace, address, decoder=decoder)

    @classmethod
    def connect(
        cls,
        name: str,
        *,
        namespace: str | None = None,
        timeout: float = 0.0,
        address: str | None = None,
        decode: str = "pickle",
        allowed_classes: Iterable[Any] = (),
    ) -> Channel:
        """Connects to an existing channel, waiting up to ``timeout`` s for it to appear.

        Args:
            name: Channel name.
            namespace: Run namespace (default: ``$RLINF_CHANNEL_NAMESPACE``).
            timeout: Seconds to wait for the channel to be created.
            address: ``host:port`` of the agent on the channel's home node, for
                a channel on another node (payloads then travel over TCP).
                Defaults to ``$RLINF_CHANNEL_AGENT`` if set, else shared memory.
            decode: How this handle decodes the items it takes (the
                channel and its writers are unaffected): ``"pickle"`` (the
                default) unpickles anything, so it trusts every writer: the
                processes of this node and the peers authenticated to the
                channel agent. ``"restricted"`` accepts tensors, numpy arrays
                and scalars and plain containers only (and ``allowed_classes``),
                and refuses any other item with ``pickle.UnpicklingError``
                before running any of it; a ``get`` then takes about 1.2x as
                long (see :class:`Channel`).
            allowed_classes: With ``decode="restricted"``: further classes or
                functions to accept, as objects or ``"module:qualname"``
                strings, matched exactly by module and qualified name. Allow
                only what is safe to construct from untrusted data (a plain
                dataclass is; anything whose ``__init__``, ``__new__`` or
                ``__setstate__`` acts on its arguments may not be).

        Raises:
            ValueError: For a bad ``decode`` value (one of ``DECODE_MODES``)
                or ``allowed_classes`` entry (the message names the argument).
            rlinf.core._native.ChannelNotFound: If it does not exist in time.
        """
        decoder = _decoder(decode, allowed_classes)
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
                if address is None:
                    core = _native.ChannelCore.attach(namespace, name)
                else:
                    core = _native.ChannelCore.connect_remote(address, namespace, name)
                    _note_transport(core, address)
                return cls(core, name, namespace, address, decoder=decoder)
            except _native.ChannelNotFound:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def __reduce__(self) -> tuple[Any, ...]:
        # A shared-memory channel travels with its home node, so a process on
        # another node reconnects through that node's agent.
        resolver = get_resolver()
        home = resolver.node_key() if resolver is not None and self._address is None else None
        args: tuple[Any, ...] = (self._name, self._namespace, self._address, home)
        if self._decoder is not None:  # the allowed classes by name: importable there
            args += ("restricted", self._decoder.allowed_classes)
        return (_connect, args)

    def __repr__(self) -> str:
        where = "shm" if self._address is None else f"tcp://{self._address}"
        decode = "" if self._decoder is None else ", decode='restricted'"
        return (
            f"Channel({self._name!r}, namespace={self._namespace!r}, maxsize={self.maxsize}, "
            f"via={where}{decode})"
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
        """Agent address when the channel is reached through an agent, else None (shared memory)."""
        return self._address

    @property
    def decode(self) -> str:
        """How this handle decodes items, ``"pickle"`` or ``"restricted"`` (:class:`Channel`)."""
        return "pickle" if self._decoder is None else "restricted"

    @property
    def allowed_classes(self) -> tuple[str, ...]:
        """Extra classes a restricted handle accepts, as ``"module:qualname"`` (else empty)."""
        return () if self._decoder is None else self._decoder.allowed_classes

    @property
    def transport(self) -> str:
        """What moves payloads: ``"shm"`` on this node, else ``"tcp"``, ``"tcp+tls"``, ``"ucx"``."""
        return self._core.transport

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
            pickle.UnpicklingError: With ``decode="restricted"``, if the item
                is refused (it is taken and dropped).
        """
        lane = self._lane(key)
        if timeout is None:  # the hot path: no deadline bookkeeping
            get = self._core.get
            while True:
                try:
                    message = get(lane, _SLICE_S, False)
                except TimeoutError:
                    continue
                return self._loads(*message)
        header, views = _sliced(lambda t: self._core.get(lane, t, False), timeout)
        return self._loads(header, views)

    def get_nowait(self, key: Any = DEFAULT_KEY) -> Any:
        """Takes the next item without waiting.

        Raises:
            asyncio.QueueEmpty: If the key has no item ready.
            pickle.UnpicklingError: With ``decode="restricted"``, if the item
                is refused (it is taken and dropped).
        """
        try:
            header, views = self._core.get(self._lane(key), None, True)
        except _native.ChannelEmpty:
            raise asyncio.QueueEmpty from None
        return self._loads(header, views)

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
            pickle.UnpicklingError: With ``decode="restricted"``, if an item
                is refused: the whole batch was taken and is dropped (the
                error's note says which item).
        """
        if target_weight <= 0:
            raise ValueError(f"target_weight must be > 0, got {target_weight}")
        lane = self._lane(key)
        batch = _sliced(lambda t: self._core.get_batch(lane, target_weight, t), timeout)
        if self._decoder is not None:
            return self._decode_batch(batch)
        return [loads(header, views) for header, views in batch]

    def _decode_batch(self, batch: list[Any]) -> list[Any]:
        """Decodes a batch with the restricted loader; a refused item drops the whole batch."""
        loads_restricted = self._loads
        items: list[Any] = []
        for index, (header, views) in enumerate(batch):
            try:
                items.append(loads_restricted(header, views))
            except pickle.UnpicklingError as err:
                err.add_note(
                    f"item {index} of a batch of {len(batch)} was refused; the whole batch "
                    "was taken from the channel and is dropped"
                )
                raise
        return items

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
                return self._loads(header, views)
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
        """Async ``get_batch`` (runs in a worker thread; decodes as ``get_batch`` does)."""
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

        Any process holding the channel may call it, whoever created it.
        Processes that hold the channel keep using it; new ``connect`` calls
        fail. The memory is freed when the last holder lets go (the creating
        process keeps nothing of it). The owner of a channel (e.g. a worker,
        for its inbox) calls this at shutdown so the name never outlives it,
        even if a peer still holds the channel.

        For a channel reached over TCP the name belongs to its home node:
        nothing is removed there (returns False), but if this process created
        the channel it stops keeping it, so the channel goes with its last
        holder.
        """
        if self._address is not None:
            _remote_created.pop((self._address, self._namespace, self._name), None)
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
    name: str,
    namespace: str,
    address: str | None = None,
    home: str | None = None,
    decode: str = "pickle",
    allowed_classes: tuple[str, ...] = (),
) -> Channel:
    resolver = get_resolver()
    remote_home = resolver is not None and home is not None and home != resolver.node_key()
    if address is None and remote_home:
        address = resolver.agent_address(home)  # type: ignore[union-attr, arg-type]
    return Channel.connect(
        name,
        namespace=namespace,
        timeout=10.0,
        address=address,
        decode=decode,
        allowed_classes=allowed_classes,
    )
