"""Where a channel lives: the hook a scheduler installs to find channels across nodes.

A channel's segment lives in shared memory on its *home* node. Processes on
that node attach to it directly; processes elsewhere reach it over TCP
through the home node's channel agent. The core does not know the cluster,
so a scheduler (``rlinf.sched``) installs a :class:`ChannelResolver` in each
of its processes; without one, every channel is local.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ChannelResolver", "get_resolver", "set_resolver"]


class ChannelResolver(Protocol):
    """Maps channel names to home nodes and home nodes to agent addresses."""

    def node_key(self) -> str:
        """An identifier of this process's node (equal for processes on one node)."""

    def on_create(self, namespace: str, name: str) -> None:
        """Records that ``name`` was just created on this node."""

    def locate(self, namespace: str, name: str) -> str | None:
        """The node key of ``name``'s home, or None if it is not known (yet)."""

    def agent_address(self, node_key: str) -> str:
        """``host:port`` of the channel agent serving the node ``node_key``."""


_resolver: ChannelResolver | None = None


def set_resolver(resolver: ChannelResolver | None) -> None:
    """Installs (or, with None, removes) this process's resolver."""
    global _resolver
    _resolver = resolver


def get_resolver() -> ChannelResolver | None:
    """This process's resolver, if a scheduler installed one."""
    return _resolver
