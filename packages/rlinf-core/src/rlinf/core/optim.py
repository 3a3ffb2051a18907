"""Learning-rate schedules and optimizer-state moves shared by the actors.

The schedule is pure Python; :func:`move_optimizer_state` takes a torch
optimizer (torch is the ``rl`` extra of rlinf-core) but does not import torch.

The multiplier is ours but runs in torch's ``LambdaLR``, not ``LinearLR``/``CosineAnnealingLR``
in a ``SequentialLR``: ``CosineAnnealingLR`` takes one absolute ``eta_min`` for every param
group (the actor and critic groups have different LRs; ``min_lr_ratio`` is relative) and
climbs back up after ``T_max`` instead of holding the floor, and a ``SequentialLR`` state
would not load the ``LambdaLR`` scheduler state saved in existing checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["LRSchedule", "lr_lambda", "move_optimizer_state"]

LRSchedule = Literal["constant", "linear", "cosine"]


def lr_lambda(
    kind: LRSchedule, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> Callable[[int], float]:
    """The LR multiplier per optimizer step, for ``torch.optim.lr_scheduler.LambdaLR``.

    A linear warm-up from ``1/warmup_steps`` to 1 over the first ``warmup_steps``
    steps, then ``constant`` (1), ``linear`` (down to ``min_lr_ratio`` at
    ``total_steps``) or ``cosine`` (half a cosine down to ``min_lr_ratio``);
    steps past ``total_steps`` keep the final value.

    Args:
        kind: ``constant``, ``linear`` or ``cosine``.
        warmup_steps: Warm-up length in optimizer steps (0: none).
        total_steps: Optimizer steps of the whole run.
        min_lr_ratio: Final LR / peak LR for ``linear`` and ``cosine``.

    Returns:
        ``step -> factor``.

    Raises:
        ValueError: On an unknown ``kind`` or a ratio outside [0, 1].
    """
    if kind not in ("constant", "linear", "cosine"):
        raise ValueError(f"lr_scheduler={kind!r} is not one of 'constant', 'linear', 'cosine'")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio} must be within [0, 1]")
    span = max(1, total_steps - warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / span)
        linear = kind == "linear"
        shape = 1.0 - progress if linear else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * shape

    return factor


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Moves every tensor of the optimizer's state (not the ``step`` counters) to ``device``."""
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if key != "step" and hasattr(value, "to") and hasattr(value, "device"):
                state[key] = value.to(device)  # blocking: offload must be complete
