"""What travels through the transports, and how the consumer touches it.

Every payload kind is built for a byte size (except ``meta``, a small RL
metadata dict whose size does not depend on the size parameter). The
consumer *touches* every item the same way for every transport: it reads one
byte per 4 KiB page of every array, tensor and bytes object in the item
(``view(uint8)[::4096].sum()``). That forces the data to be mapped and
readable in the consumer (a transport cannot cheat by never delivering the
pages) while costing far less than the transfer itself.

torch is imported only when a torch payload is built or received, so tiers
that do not use torch (the smoke tier) never pay its ~5 s import.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

KiB = 1 << 10
MiB = 1 << 20

SIZES = [64, 1 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
SIZED_KINDS = ["bytes", "numpy", "torch", "tensor_dict"]
KINDS = [*SIZED_KINDS, "meta"]
PAGE = 4096


def fmt_size(size: int | None) -> str:
    if size is None:
        return "-"
    if size >= MiB:
        return f"{size // MiB}MiB"
    if size >= KiB:
        return f"{size // KiB}KiB"
    return f"{size}B"


def cases(kinds: list[str] | None = None, sizes: list[int] | None = None):
    """(kind, size) pairs of the matrix; ``meta`` appears once with size None."""
    kinds = KINDS if kinds is None else kinds
    sizes = SIZES if sizes is None else sizes
    out: list[tuple[str, int | None]] = []
    for kind in kinds:
        if kind == "meta":
            out.append(("meta", None))
        else:
            out.extend((kind, size) for size in sizes)
    return out


def make_payload(kind: str, size: int | None) -> Any:
    """Builds one item. ``size`` is its total array/bytes payload in bytes."""
    if kind == "meta":
        return {
            "id": 1234,
            "step": 56,
            "reward": 0.5,
            "done": False,
            "policy_version": 7,
            "env": "maniskill/PickCube-v1",
            "rank": "rollout-3",
            "advantage": -0.25,
        }
    assert size is not None and size % 16 == 0, size
    if kind == "bytes":
        return np.full(size, 7, dtype=np.uint8).tobytes()
    if kind == "numpy":
        return np.full(size // 4, 1.5, dtype=np.float32)
    import torch

    if kind == "torch":
        return torch.full((size // 4,), 1.5, dtype=torch.float32)
    if kind == "tensor_dict":
        # An RL batch: four tensors splitting the size evenly.
        n = size // 16
        return {
            "obs": torch.full((n,), 1.5, dtype=torch.float32),
            "actions": torch.full((n,), 2.0, dtype=torch.float32),
            "rewards": torch.full((n,), 0.5, dtype=torch.float32),
            "logprobs": torch.full((n,), -1.0, dtype=torch.float32),
        }
    raise ValueError(f"unknown payload kind {kind!r}; expected one of {KINDS}")


def payload_nbytes(kind: str, size: int | None) -> int:
    """Bytes counted for throughput (``meta``: 0, reported as messages/s)."""
    return 0 if kind == "meta" or size is None else size


def _touch_buffer(buf: Any) -> int:
    view = memoryview(buf)
    if view.nbytes <= 16 * PAGE:
        # Small: a few bytes read in Python cost less than building numpy views.
        return sum(view.cast("B")[::PAGE]) if view.nbytes else 0
    return int(np.frombuffer(view, dtype=np.uint8)[::PAGE].sum())


_BUFFERS = (np.ndarray, bytes, bytearray, memoryview)
_CONTAINERS = (list, tuple)
_NUMBERS = (int, float)


def touch(item: Any) -> int:
    """Reads one byte per 4 KiB page of every buffer in ``item``; returns a checksum."""
    if isinstance(item, _BUFFERS):
        return _touch_buffer(item)
    if isinstance(item, dict):
        return sum(touch(v) for v in item.values())
    if isinstance(item, _CONTAINERS):
        return sum(touch(v) for v in item)
    if isinstance(item, _NUMBERS):
        return int(item)
    if isinstance(item, str):
        return len(item)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        return _touch_buffer(item.numpy())
    return 0
