"""Argument checks that raise ``ValueError`` naming the argument, the value and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NoReturn

import torch


def fail(arg: str, value: object, problem: str, fix: str) -> NoReturn:
    """Raise a ``ValueError`` of the form ``arg=value problem. Fix: fix``."""
    raise ValueError(f"{arg}={value!r} {problem}. Fix: {fix}")


def check_choice(arg: str, value: str, choices: Iterable[str]) -> None:
    """Fail unless ``value`` is one of ``choices``."""
    allowed = tuple(choices)
    if value not in allowed:
        fail(arg, value, "is not supported", f"use one of {', '.join(allowed)}")


def check_positive(arg: str, value: float, fix: str) -> None:
    """Fail unless ``value > 0``."""
    if not value > 0:
        fail(arg, value, "must be > 0", fix)


def check_in_unit_interval(arg: str, value: float) -> None:
    """Fail unless ``0 <= value <= 1`` (discount factors, GAE lambda)."""
    if not 0.0 <= value <= 1.0:
        fail(arg, value, "must be in [0, 1]", f"set {arg} to a value such as 0.99")


def _shape(t: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t)


def check_same_shape(arg: str, tensor: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """Fail unless ``tensor`` has exactly the shape of ``ref``."""
    if tensor.shape != ref.shape:
        fail(
            f"{arg}.shape",
            _shape(tensor),
            f"does not match {ref_arg}.shape={_shape(ref)}",
            f"pass {arg} with shape {_shape(ref)}",
        )


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast of two shapes (numpy rules), or None if they do not broadcast."""
    out: list[int] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def check_broadcast(arg: str, tensor: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """Fail unless ``tensor`` broadcasts to ``ref``'s shape without changing it."""
    if broadcast_shape(tensor.shape, ref.shape) != tuple(ref.shape):
        fail(
            f"{arg}.shape",
            _shape(tensor),
            f"does not broadcast to {ref_arg}.shape={_shape(ref)}",
            f"pass {arg} with shape {_shape(ref)} or one that broadcasts to it "
            "(size-1 dims or missing leading dims)",
        )


def as_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` as float32, unless it already is float32 or float64 (kept as is)."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.to(torch.float32)
