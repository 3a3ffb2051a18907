"""Type stubs for the compiled extension built from ``crates/channel``."""

from collections.abc import Sequence
from typing import Any, Self, final

__all__ = [
    "CHANNEL_SECRET_ENV",
    "SEGMENT_PREFIX",
    "TLS_COMPILED",
    "UCX_COMPILED",
    "ChannelAgent",
    "ChannelAuthError",
    "ChannelClosed",
    "ChannelCore",
    "ChannelCorrupt",
    "ChannelEmpty",
    "ChannelError",
    "ChannelExists",
    "ChannelFull",
    "ChannelNotFound",
    "ShmView",
    "cleanup_stale_segments",
    "parse_segment_name",
    "release_all_names",
    "release_owned_names",
    "segment_name",
    "set_channel_secret",
    "ucx_home_main",
    "ucx_unavailable_reason",
    "version",
    "wait_stats",
]

SEGMENT_PREFIX: str
UCX_COMPILED: bool
TLS_COMPILED: bool
CHANNEL_SECRET_ENV: str

class ChannelError(Exception): ...
class ChannelClosed(ChannelError): ...
class ChannelFull(ChannelError): ...
class ChannelEmpty(ChannelError): ...
class ChannelExists(ChannelError): ...
class ChannelNotFound(ChannelError): ...
class ChannelCorrupt(ChannelError): ...
class ChannelAuthError(ChannelError): ...

@final
class ShmView:
    """Writable zero-copy view of bytes in a channel block (buffer protocol)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

_Message = tuple[bytes | ShmView, list[ShmView]]

@final
class ChannelCore:
    """Native handle on one channel, local (shared memory) or remote (TCP agent).

    ``create``/``attach`` give a shared-memory segment of this node,
    ``connect_remote`` a channel of another node reached through its agent.
    Both offer the same methods, except ``segment_name`` (local only;
    ``AttributeError`` on a remote channel).
    """

    @staticmethod
    def create(
        namespace: str,
        name: str,
        max_lanes: int,
        lane_capacity: int,
        max_blocks: int,
        arena_bytes: int,
        user_tag: int = 0,
        owned: bool = False,
    ) -> ChannelCore: ...
    @staticmethod
    def attach(namespace: str, name: str) -> ChannelCore: ...
    @staticmethod
    def connect_remote(
        address: str,
        namespace: str,
        name: str,
        create: bool = False,
        max_lanes: int = 64,
        lane_capacity: int = 4096,
        max_blocks: int = 4096,
        arena_bytes: int = 1 << 30,
        user_tag: int = 0,
    ) -> ChannelCore: ...
    @property
    def transport(self) -> str: ...
    @property
    def remote(self) -> bool: ...
    def lane(self, key: bytes) -> int: ...
    def put(
        self,
        lane: int,
        header: Any,
        buffers: Sequence[Any],
        weight: int = 0,
        timeout: float | None = None,
        nonblocking: bool = False,
    ) -> None: ...
    def get(
        self, lane: int, timeout: float | None = None, nonblocking: bool = False
    ) -> _Message: ...
    def get_batch(self, lane: int, target: int, timeout: float | None = None) -> list[_Message]: ...
    def wait_readable(self, lane: int, timeout: float) -> bool: ...
    def qsize(self, lane: int) -> int: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def reclaim(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    @property
    def segment_name(self) -> str: ...
    @property
    def user_tag(self) -> int: ...
    @property
    def lane_capacity(self) -> int: ...
    @property
    def arena_size(self) -> int: ...

@final
class ChannelAgent:
    """Serves this node's channels to other nodes over TCP."""

    def __new__(
        cls,
        bind: str = "127.0.0.1:0",
        *,
        max_connections: int = 1024,
        handshake_timeout: float = 5.0,
    ) -> Self: ...
    @property
    def address(self) -> str: ...
    def stop(self) -> None: ...

def set_channel_secret(secret: str) -> None:
    """Sets this process's channel secret (wins over ``RLINF_CHANNEL_SECRET``)."""

def version() -> str:
    """Version of the native extension (the ``rlinf-channel`` crate)."""

def segment_name(namespace: str, channel: str) -> str:
    """Shared-memory segment name for ``channel`` in run ``namespace``; ValueError if invalid."""

def parse_segment_name(name: str) -> tuple[str, str] | None:
    """``(namespace, channel)`` of a name built by :func:`segment_name`, else None."""

def cleanup_stale_segments(namespace: str | None = None) -> list[str]:
    """Removes segments no live process holds nor live creator keeps; returns their names."""

def release_all_names() -> int:
    """Gives up the names this process created; unlinks those of its channels nobody holds."""

def release_owned_names(namespace: str | None = None) -> int:
    """Gives up the names of channels this process created owned; returns how many went at once."""

def wait_stats() -> dict[str, int]:
    """Counters of this process's channel waits: spin hits/misses, skips, sleeps."""

def ucx_home_main() -> int:
    """Runs the UCX home helper of one agent connection on stdin/stdout; returns the exit code."""

def ucx_unavailable_reason() -> str | None:
    """Why UCX cannot be used here (no UCX in this build, or libucp.so.0 missing), else None."""
