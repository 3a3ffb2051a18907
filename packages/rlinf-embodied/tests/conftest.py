"""Fixtures shared by the embodied tests: offline VLAs, worker groups on a local Ray."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from rlinf.embodied.config import EmbodiedConfig
    from rlinf.sched import Worker, WorkerGroup

_LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "", None})


def _refuse_remote(host: Any) -> None:
    if host not in _LOCAL_HOSTS:
        raise OSError(
            f"a VLA test tried to reach {host!r}: models and tokenizers must come from "
            "local directories (the tests run offline)"
        )


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread avoids OpenMP oversubscription on busy 2-core machines.

    Use with ``pytestmark = pytest.mark.usefixtures("single_torch_thread")``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vla_offline() -> Iterator[None]:
    """One torch thread, the Hugging Face hub offline, and no connection beyond localhost.

    Any ``socket`` connect or name lookup of a remote host raises ``OSError``, so a
    test fails if loading a model or tokenizer tries the network.
    """
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> None:
        _refuse_remote(address[0] if isinstance(address, tuple) else None)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _refuse_remote(address[0] if isinstance(address, tuple) else None)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse_remote(host)
        return real_getaddrinfo(host, *args, **kwargs)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(socket, "getaddrinfo", getaddrinfo)
        yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def _launched_groups(
    cfg: EmbodiedConfig,
    prefix: str,
    actor: type[Worker],
    env: type[Worker] | None = None,
    slots: int = 2,
) -> Iterator[list[WorkerGroup]]:
    """Actor, rollout and env groups on ``cfg``'s placement in a fresh local Ray (2 CPUs).

    The groups are named ``{prefix}-actor`` etc. and shut down on exit; ``env``
    defaults to :class:`EnvWorker`.
    """
    import ray

    from rlinf.embodied.workers import EnvWorker, MultiStepRolloutWorker
    from rlinf.sched import Cluster, HybridComponentPlacement

    assert not ray.is_initialized()
    cluster_cfg = {"cpu_slots_per_node": slots}
    with Cluster(num_nodes=1, cluster_cfg=cluster_cfg, num_cpus=2) as cluster:
        placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
        launched: list[WorkerGroup] = []
        try:
            for cls, role in (
                (actor, "actor"),
                (MultiStepRolloutWorker, "rollout"),
                (env or EnvWorker, "env"),
            ):
                launched.append(
                    cls.create_group(cfg).launch(
                        cluster,
                        placement_strategy=placement.get_strategy(role),
                        name=f"{prefix}-{role}",
                        timeout=300,
                    )
                )
            yield launched
        finally:
            for group in launched:
                group.close()


@pytest.fixture(scope="session")
def embodied_groups() -> Callable[..., contextlib.AbstractContextManager[list[WorkerGroup]]]:
    """``with embodied_groups(cfg, prefix, ActorClass) as [actor, rollout, env]:``."""
    return _launched_groups
