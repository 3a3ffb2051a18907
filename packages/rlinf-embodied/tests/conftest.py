"""Fixtures shared by the embodied tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch

_LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "", None})


def _refuse_remote(host: Any) -> None:
    if host not in _LOCAL_HOSTS:
        raise OSError(
            f"a VLA test tried to reach {host!r}: models and tokenizers must come from "
            "local directories (the tests run offline)"
        )


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
