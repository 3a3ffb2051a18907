"""One weight-sync protocol for every stack: bucketed, versioned, verified.

The actor's ranks walk the same bucket plan (the full tensors of a bucket are
gathered collectively, so every rank must take part); the source rank sends
each bucket as a :class:`WeightBucket`, and every rollout rank receives the
buckets in order and loads them until the last (``index == count - 1``). The
transport is the caller's (the workers' ``broadcast``), so this module needs
nothing from the scheduler. After a sync the receiver knows every name it was
sent, and :func:`check_complete` names what was never sent.

A bucket holds at most ``cap_bytes`` of tensors (one larger tensor makes a
bucket of its own), which bounds the host memory a sync needs on both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "WeightBucket",
    "check_complete",
    "plan_buckets",
    "receive_weights",
    "send_weights",
]

DEFAULT_BUCKET_BYTES = 256 << 20
"""Bucket size for stacks without a setting of their own (small policies: one bucket)."""

Named = Sequence[tuple[str, torch.Tensor]]


@dataclass
class WeightBucket:
    """One bucket of a weight sync: names and full (unsharded) CPU tensors.

    Attributes:
        version: Weight version being synced.
        index: Position of this bucket, ``0..count-1``.
        count: Buckets in this sync.
        tensors: ``(name, tensor)`` pairs.
    """

    version: int
    index: int
    count: int
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Payload bytes."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors)


def plan_buckets(named: Named, cap_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Splits ``named`` in order into buckets of at most ``cap_bytes`` (at least one)."""
    plan: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if plan[-1] and size + nbytes > cap_bytes:
            plan.append([])
            size = 0
        plan[-1].append((name, tensor))
        size += nbytes
    return plan


def send_weights(
    named: Named,
    version: int,
    cap_bytes: int,
    send: Callable[[WeightBucket], object] | None,
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> tuple[int, int]:
    """Walks the bucket plan of ``named``; the source rank sends each bucket.

    Args:
        named: ``(name, tensor)`` of every weight, the same on every actor rank.
        version: The version the receivers will hold.
        cap_bytes: Bucket size bound.
        send: Sends one bucket (the source rank), or None (the other ranks, which
            only take part in ``gather``).
        gather: Turns a local tensor into the full one (e.g. an all-gather of a
            shard; collective, so every rank calls it for every tensor).

    Returns:
        ``(buckets, bytes)`` of the sync.
    """
    plan = plan_buckets(named, cap_bytes)
    total = 0
    with torch.no_grad():
        for index, entries in enumerate(plan):
            full = [(n, gather(t).detach()) for n, t in entries]
            total += sum(t.numel() * t.element_size() for _, t in full)
            if send is not None:
                tensors = [(n, t.to("cpu", copy=True)) for n, t in full]
                send(WeightBucket(version, index, len(plan), tensors))
    return len(plan), total


def receive_weights(
    receive: Callable[[], WeightBucket], load: Callable[[WeightBucket], None]
) -> tuple[int, int, set[str]]:
    """Receives and loads the buckets of one sync, up to its last.

    Args:
        receive: Returns the next bucket (blocking).
        load: Loads one bucket into the receiver's model or engine.

    Returns:
        ``(version, buckets, names received)``.

    Raises:
        RuntimeError: If buckets arrive out of order or with mixed versions.
    """
    names: set[str] = set()
    first: WeightBucket | None = None
    index = 0
    while True:
        bucket = receive()
        first = first or bucket
        if bucket.index != index or bucket.version != first.version:
            raise RuntimeError(
                f"weight sync: expected bucket {index} of version {first.version}, got bucket "
                f"{bucket.index} of version {bucket.version} (two syncs interleaved?)"
            )
        load(bucket)
        names.update(n for n, _ in bucket.tensors)
        index += 1
        if bucket.index == bucket.count - 1:
            return bucket.version, index, names


def check_complete(expected: Iterable[str], received: set[str], version: int, hint: str) -> None:
    """Raises if a weight the receiver has was not sent by the actor.

    Args:
        expected: Names the receiver holds.
        received: Names received in the sync.
        version: The sync's version (for the message).
        hint: What to check (names the config keys of the stack).

    Raises:
        RuntimeError: Naming up to five missing weights.
    """
    missing = sorted(n for n in expected if n not in received)
    if missing:
        more = "..." if len(missing) > 5 else ""
        raise RuntimeError(
            f"weight sync v{version}: the actor sent no value for {missing[:5]}{more}; {hint}"
        )
