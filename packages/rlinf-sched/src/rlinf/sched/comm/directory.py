"""The cluster's directory: channel homes, node agents and launched groups.

One named actor (``rlinf:directory``) per Ray cluster, started by the first
:class:`~rlinf.sched.Cluster`. It records which node each channel was
created on, starts a channel agent on a node the first time a process on
another node needs to reach that node's channels, and remembers launched
worker groups so :meth:`WorkerGroup.from_group_name` can reattach to them.
Every process of the cluster installs a :class:`SchedulerResolver` that asks
it, so ``Channel.create`` / ``Channel.connect`` work across nodes by name.
"""

from __future__ import annotations

import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf.core.channel import ChannelAgent, set_resolver

__all__ = ["DIRECTORY_NAME", "SchedulerResolver", "get_directory", "install_resolver"]

DIRECTORY_NAME = "rlinf:directory"
_RAY_NAMESPACE = "rlinf"
_CALL_TIMEOUT_S = 60.0


class _NodeAgent:
    """Serves its node's channels to other nodes over TCP (one per node, on demand)."""

    def __init__(self) -> None:
        self._agent = ChannelAgent("0.0.0.0:0")
        port = self._agent.address.rsplit(":", 1)[1]
        self._address = f"{ray.util.get_node_ip_address()}:{port}"  # type: ignore[no-untyped-call]

    def address(self) -> str:
        return self._address


_NodeAgentActor: Any = ray.remote(num_cpus=0)(_NodeAgent)


class _Directory:
    """Bookkeeping actor; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agent_locks: dict[str, threading.Lock] = {}
        self._agents: dict[str, Any] = {}
        self._agent_addresses: dict[str, str] = {}
        self._channels: dict[tuple[str, str], str] = {}
        self._groups: dict[str, dict[str, Any]] = {}

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
    """Installs a :class:`SchedulerResolver` in this process (None if no directory exists)."""
    directory = directory if directory is not None else get_directory()
    if directory is None:
        return None
    resolver = SchedulerResolver(directory)
    set_resolver(resolver)
    return resolver
