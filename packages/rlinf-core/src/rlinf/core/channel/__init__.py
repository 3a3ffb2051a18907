"""The shared-memory channel (``rlinf.core.channel``).

See :class:`Channel`. Items are serialised with pickle protocol 5; numpy
arrays and torch tensors travel out of band and arrive as zero-copy views
(:mod:`rlinf.core.channel.serialization`).
"""

from rlinf.core._native import (
    CHANNEL_SECRET_ENV,
    ChannelAgent,
    ChannelAuthError,
    ChannelClosed,
    ChannelCorrupt,
    ChannelError,
    ChannelExists,
    ChannelNotFound,
    cleanup_stale_segments,
    set_channel_secret,
)
from rlinf.core.channel.channel import (
    AGENT_ENV,
    DEFAULT_KEY,
    NAMESPACE_ENV,
    TLS_COMPILED,
    TLS_ENV,
    TRANSPORT_ENV,
    UCX_COMPILED,
    Channel,
    default_namespace,
    release_created_channels,
    ucx_unavailable_reason,
)
from rlinf.core.channel.resolver import ChannelResolver, get_resolver, set_resolver

__all__ = [
    "AGENT_ENV",
    "CHANNEL_SECRET_ENV",
    "DEFAULT_KEY",
    "NAMESPACE_ENV",
    "TLS_COMPILED",
    "TLS_ENV",
    "TRANSPORT_ENV",
    "UCX_COMPILED",
    "Channel",
    "ChannelAgent",
    "ChannelAuthError",
    "ChannelClosed",
    "ChannelCorrupt",
    "ChannelError",
    "ChannelExists",
    "ChannelNotFound",
    "ChannelResolver",
    "cleanup_stale_segments",
    "default_namespace",
    "get_resolver",
    "release_created_channels",
    "set_channel_secret",
    "set_resolver",
    "ucx_unavailable_reason",
]
