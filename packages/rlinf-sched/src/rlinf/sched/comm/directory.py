"""The cluster's directory: channel homes, node agents and launched groups.

One named actor (``rlinf:directory``) per Ray cluster, started by the first
:class:`~rlinf.sched.Cluster`. It records which node each channel was
created on, starts a channel agent on a node the first time a process on
another node needs to reach that node's channels, and remembers launched
worker groups so :meth:`WorkerGroup.from_group_name` can reattach to them.
Every process of the cluster installs a :class:`SchedulerResolver` that asks
it, so ``Channel.create`` / ``Channel.connect`` work across nodes by name.

The directory also holds the cluster's channel secret (``RLINF_CHANNEL_SECRET``
of the directory's process if set, else a random one): every process that
installs the resolver, and every node agent, takes it from the directory over
Ray's own authenticated connection, so agents only serve processes of this
cluster. Node agents listen on the node's cluster address (the one Ray uses);
``RLINF_CHANNEL_AGENT_BIND=0.0.0.0`` in a node's environment makes its agent
listen on every interface instead, with a warning.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf.core.channel import (
    CHANNEL_SECRET_ENV,
    ChannelAgent,
    set_channel_secret,
    set_resolver,
)

__all__ = [
    "AGENT_BIND_ENV",
    "DIRECTORY_NAME",
    "SchedulerResolver",
    "get_directory",
    "install_resolver",
]

DIRECTORY_NAME = "rlinf:directory"
AGENT_BIND_ENV = "RLINF_CHANNEL_AGENT_BIND"
"""Host a node agent listens on instead of the node's cluster address (e.g. ``0.0.0.0``)."""
_RAY_NAMESPACE = "rlinf"
_CALL_TIMEOUT_S = 60.0
_log = logging.getLogger(__name__)


def _use_cluster_secret(directory: Any) -> None:
    """Makes this process's channel agents and connections use the cluster's secret.

    Also exported as ``RLINF_CHANNEL_SECRET`` for processes this one starts.
    """
    secret: str = ray.get(directory.channel_secret.remote(), timeout=_CALL_TIMEOUT_S)
    set_channel_secret(secret)
    os.environ[CHANNEL_SECRET_ENV] = secret


class _NodeAgent:
    """Serves its node's channels to other nodes over TCP (one per node, on demand)."""

    def __init__(self) -> None:
        _use_cluster_secret(get_directory())
        node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        host = os.environ.get(AGENT_BIND_ENV, "").strip() or node_ip
        if host in ("0.0.0.0", "::"):
            _log.warning(
                "%s=%s: this node's channel agent listens on every interface; only peers "
                "holding the cluster's channel secret are served, but the port is reachable "
                "from every network this node is on",
                AGENT_BIND_ENV,
                host,
            )
        bind = f"[{host}]:0" if ":" in host else f"{host}:0"
        self._agent = ChannelAgent(bind)
        port = self._agent.address.rsplit(":", 1)[1]
        advertised = node_ip if host in ("0.0.0.0", "::") else host
        self._address = f"[{advertised}]:{port}" if ":" in advertised else f"{advertised}:{port}"

    def address(self) -> str:
        """The ``host:port`` other nodes connect to."""
        return self._address

    def bound_address(self) -> str:
        """The ``host:port`` the agent's socket is bound to."""
        return str(self._agent.address)


_NodeAgentActor: Any = ray.remote(num_cpus=0)(_NodeAgent)


class _Directory:
    """Bookkeeping actor; see the module docstring."""

    def __init__(self) -> None:
        self._channel_secret = os.environ.get(CHANNEL_SECRET_ENV) or secrets.token_hex(32)
        self._lock = threading.Lock()
        self._agent_locks: dict[str, threading.Lock] = {}
        self._agents: dict[str, Any] = {}
        self._agent_addresses: dict[str, str] = {}
        self._channels: dict[tuple[str, str], str] = {}
        self._groups: dict[str, dict[str, Any]] = {}

    def channel_secret(self) -> str:
        return self._channel_secret

    def agent_handle(self, node_key: str) -> Any:
        """The node agent actor of ``node_key`` (None before its first use)."""
        with self._lock:
            return self._agents.get(node_key)

    def register_channel(self, namespace: str, name: str, node_key: str) -> None:
        with self._lock:
            self._channels[(namespace, name)] = node_key

    def locate(self, namespace: str, name: str) -> str | None:
        with self._lock:
            return self._channels.get((namespace, name))

    def agent_address(self, node_key: str) -> str:
        with self._lock:
            lock = self._agent_locks.setdefault(node_key, threading.Lock())
        with lock:
            if node_key not in self._agent_addresses:
                agent = _NodeAgentActor.options(
                    name=f"rlinf:agent:{node_key}",
                    namespace=_RAY_NAMESPACE,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_key, soft=False),
                ).remote()
                self._agent_addresses[node_key] = ray.get(
                    agent.address.remote(), timeout=_CALL_TIMEOUT_S
                )
                self._agents[node_key] = agent
            return self._agent_addresses[node_key]

    def register_group(self, name: str, info: dict[str, Any]) -> None:
        with self._lock:
            self._groups[name] = info

    def unregister_group(self, name: str) -> None:
        with self._lock:
            self._groups.pop(name, None)

    def group(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._groups.get(name)

    def stop_agents(self) -> int:
        with self._lock:
            agents, self._agents = list(self._agents.values()), {}
            self._agent_addresses.clear()
        for agent in agents:
            ray.kill(agent)
        return len(agents)

    def group_names(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)


_DirectoryActor: Any = ray.remote(_Directory)


def get_directory(create: bool = False) -> Any:
    """The directory actor's handle, or None if there is none (and ``create`` is False)."""
    if create:
        return _DirectoryActor.options(
            name=DIRECTORY_NAME,
            namespace=_RAY_NAMESPACE,
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=64,
        ).remote()
    try:
        return ray.get_actor(DIRECTORY_NAME, namespace=_RAY_NAMESPACE)
    except ValueError:
        return None


class SchedulerResolver:
    """Finds channels' home nodes through the directory (installed in every RLinf process)."""

    def __init__(self, directory: Any) -> None:
        self._directory = directory
        self._node_key = ray.get_runtime_context().get_node_id()
        self._homes: dict[tuple[str, str], str] = {}
        self._addresses: dict[str, str] = {}

    def node_key(self) -> str:
        """This process's Ray node id."""
        return self._node_key

    def on_create(self, namespace: str, name: str) -> None:
        """Records this node as the home of a channel just created here."""
        self._homes[(namespace, name)] = self._node_key
        ray.get(
            self._directory.register_channel.remote(namespace, name, self._node_key),
            timeout=_CALL_TIMEOUT_S,
        )

    def locate(self, namespace: str, name: str) -> str | None:
        """The home node of a channel (None if nobody registered it yet)."""
        home = self._homes.get((namespace, name))
        if home is None:
            home = ray.get(self._directory.locate.remote(namespace, name), timeout=_CALL_TIMEOUT_S)
            if home is not None:
                self._homes[(namespace, name)] = home
        return home

    def agent_address(self, node_key: str) -> str:
        """The channel agent of ``node_key`` (started on first use)."""
        address = self._addresses.get(node_key)
        if address is None:
            address = ray.get(
                self._directory.agent_address.remote(node_key), timeout=_CALL_TIMEOUT_S
            )
            self._addresses[node_key] = address
        return address


def install_resolver(directory: Any = None) -> SchedulerResolver | None:
    """Installs a :class:`SchedulerResolver` and the cluster's channel secret in this process.

    Returns:
        The resolver (None if no directory exists).
    """
    directory = directory if directory is not None else get_directory()
    if directory is None:
        return None
    _use_cluster_secret(directory)
    resolver = SchedulerResolver(directory)
    set_resolver(resolver)
    return resolver
