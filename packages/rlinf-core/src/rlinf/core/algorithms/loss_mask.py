"""The embodied loss mask: valid until and including the first done of the epoch."""

from __future__ import annotations

from typing import NamedTuple, get_args

import torch

from rlinf.core.algorithms._checks import check_choice, fail
from rlinf.core.algorithms.inputs import RewardType

__all__ = ["LossMask", "check_dones", "compute_loss_mask", "substep_flags"]


class LossMask(NamedTuple):
    """Result of :func:`compute_loss_mask`; unpacks as ``mask, mask_sum``.

    Attributes:
        mask: [T, B, C] bool (action_level) or [T, B, 1] (chunk_level).
        mask_sum: int64, same shape as ``mask``: the number of valid sub-steps
            of the entry's env in this epoch (the same value along T and C).
    """

    mask: torch.Tensor
    mask_sum: torch.Tensor


def check_dones(dones: torch.Tensor) -> None:
    """Fail unless ``dones`` is [T + 1, B, C] with T >= 1."""
    if dones.dim() != 3 or dones.shape[0] < 2:
        fail(
            "dones.shape",
            tuple(dones.shape),
            "must be [T + 1, B, C] with T >= 1",
            "pass the trajectory's dones including the leading all-false bootstrap row",
        )


def substep_flags(dones: torch.Tensor) -> torch.Tensor:
    """Done flags per sub-step, flattened time-major: [T * C, B] bool.

    Entry ``t * C + c`` is true iff sub-step ``c`` of chunk step ``t`` ended an
    episode, i.e. ``dones[t + 1, :, c]``. Row 0 of ``dones`` is not read.
    """
    check_dones(dones)
    flags = dones[1:].bool()
    t, b, c = flags.shape
    return flags.permute(0, 2, 1).reshape(t * c, b)


def compute_loss_mask(dones: torch.Tensor, reward_type: RewardType = "action_level") -> LossMask:
    """Mask of the sub-steps that belong to each env's first episode in the epoch.

    A sub-step is valid iff no done occurred strictly before it within the
    epoch; the sub-step that ends the episode is itself valid. Use it when
    envs do not auto-reset (otherwise every step is valid).

    Args:
        dones: [T + 1, B, C] bool in the T+1 convention (row 0 is not read).
        reward_type: "chunk_level" reduces the mask to [T, B, 1] (a chunk is
            valid iff any of its sub-steps is).

    Returns:
        A :class:`LossMask` with ``mask`` and ``mask_sum`` (valid sub-steps per
        env, broadcast to the mask's shape).

    Raises:
        ValueError: For a malformed ``dones`` or an unknown ``reward_type``.
    """
    check_choice("reward_type", reward_type, get_args(RewardType))
    flags = substep_flags(dones).long()
    t, b, c = dones.shape[0] - 1, dones.shape[1], dones.shape[2]
    before = torch.cumsum(flags, dim=0) - flags
    mask = (before == 0).reshape(t, c, b).permute(0, 2, 1)
    if reward_type == "chunk_level":
        mask = mask.any(dim=-1, keepdim=True)
    counts = (before == 0).sum(dim=0)
    mask_sum = counts.view(1, b, 1).expand(mask.shape).contiguous()
    return LossMask(mask.contiguous(), mask_sum)
