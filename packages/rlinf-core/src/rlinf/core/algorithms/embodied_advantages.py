"""Embodied advantage estimators on chunked trajectories (T+1 convention).

Sub-step treatment (``reward_type``):

* ``action_level``: the trajectory is flattened to T*C sub-steps, time-major
  within a chunk (sub-step ``s = t * C + c``), and the recursion runs per
  sub-step with ``gamma`` per sub-step. Sub-step ``c`` of chunk ``t`` uses
  ``values[t, :, c]``: with an action-level head (V == C) that is the c-th
  output of the head at the chunk's first observation; a chunk-level head
  (V == 1) is broadcast, so all C sub-steps share ``values[t, :, 0]``. The
  bootstrap value after the last sub-step is ``values[T, :, 0]``. Outputs are
  [T, B, C].
* ``chunk_level``: rewards are summed over the chunk, a chunk is done iff any
  of its sub-steps is, and the recursion runs per chunk with ``gamma`` per
  chunk. Values use column 0 (an action-level head's value of the chunk's
  first observation). Outputs are [T, B, 1].
"""

from __future__ import annotations

from typing import get_args

import torch

from rlinf.core.algorithms._checks import (
    as_float,
    check_choice,
    check_in_unit_interval,
    fail,
)
from rlinf.core.algorithms.inputs import RewardType
from rlinf.core.algorithms.loss_mask import check_dones, compute_loss_mask, substep_flags
from rlinf.core.algorithms.utils import group_normalize

__all__ = ["compute_embodied_gae", "compute_embodied_grpo", "resize_loss_mask"]


def _check_rewards_dones(rewards: torch.Tensor, dones: torch.Tensor) -> tuple[int, int, int]:
    if rewards.dim() != 3:
        fail(
            "rewards.shape",
            tuple(rewards.shape),
            "must be [T, B, C]",
            "pass per-sub-step rewards of the trajectory",
        )
    check_dones(dones)
    t, b, c = rewards.shape
    if tuple(dones.shape) != (t + 1, b, c):
        fail(
            "dones.shape",
            tuple(dones.shape),
            f"must be [T + 1, B, C] = {(t + 1, b, c)} for rewards.shape={(t, b, c)}",
            "include the leading all-false bootstrap row in dones",
        )
    return t, b, c


def resize_loss_mask(
    loss_mask: torch.Tensor, shape: tuple[int, int, int], reward_type: RewardType
) -> torch.Tensor:
    """A [T, B, C] or [T, B, 1] loss mask as the bool mask for ``reward_type``.

    Args:
        loss_mask: [T, B, C] or [T, B, 1].
        shape: ``(T, B, C)`` of the rewards.
        reward_type: "chunk_level" gives [T, B, 1] (any sub-step valid);
            "action_level" gives [T, B, C] (a [T, B, 1] mask is broadcast).

    Returns:
        The bool mask.

    Raises:
        ValueError: If ``loss_mask`` is neither [T, B, C] nor [T, B, 1].
    """
    t, b, c = shape
    if tuple(loss_mask.shape) not in ((t, b, c), (t, b, 1)):
        fail(
            "loss_mask.shape",
            tuple(loss_mask.shape),
            f"must be [T, B, C] = {(t, b, c)} or [T, B, 1]",
            "pass compute_loss_mask(dones).mask",
        )
    mask = loss_mask.bool()
    if reward_type == "chunk_level":
        return mask.any(dim=-1, keepdim=True)
    return mask.expand(t, b, c)


def _gae_recursion(
    rewards: torch.Tensor,
    values: torch.Tensor,
    done_after: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward GAE over steps: rewards [S, B], values [S + 1, B], done_after [S, B]."""
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    not_done = 1.0 - done_after.to(rewards.dtype)
    running = torch.zeros_like(rewards[0])
    for s in reversed(range(steps)):
        delta = rewards[s] + gamma * values[s + 1] * not_done[s] - values[s]
        running = delta + gamma * gae_lambda * not_done[s] * running
        advantages[s] = running
    return advantages, advantages + values[:-1]


def compute_embodied_gae(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    values: torch.Tensor | None = None,
    *,
    gamma: float,
    gae_lambda: float,
    reward_type: RewardType = "action_level",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a chunked trajectory.

    Per step s (a sub-step, or a chunk for chunk_level), with ``d`` the done flag
    of step s and ``V`` the values described in the module docstring::

        delta_s = r_s + gamma * V_{s+1} * (1 - d_s) - V_s
        A_s     = delta_s + gamma * lambda * (1 - d_s) * A_{s+1}
        R_s     = A_s + V_s

    A done cuts both the bootstrap and the recursion, so nothing after an
    episode's end (the next episode's values and rewards) leaks into it. A
    truncated episode is cut the same way: its bootstrap value must already be
    in its last reward (the env worker adds it).

    Args:
        rewards: [T, B, C] float.
        dones: [T + 1, B, C] bool; row 0 is not read.
        values: [T + 1, B, V] with V in {1, C}. None (no critic) means zero
            values and lambda = 1: returns are the discounted rewards-to-go
            within each episode and advantages equal them.
        gamma: Discount in [0, 1].
        gae_lambda: Lambda in [0, 1].
        reward_type: "action_level" or "chunk_level".

    Returns:
        ``(advantages, returns)``, both [T, B, C] (action_level) or [T, B, 1]
        (chunk_level), in the rewards' float dtype. Not normalised.

    Raises:
        ValueError: For malformed shapes or out-of-range arguments.
    """
    check_choice("reward_type", reward_type, get_args(RewardType))
    check_in_unit_interval("gamma", gamma)
    check_in_unit_interval("gae_lambda", gae_lambda)
    t, b, c = _check_rewards_dones(rewards, dones)
    r = as_float(rewards)
    if values is None:
        v = torch.zeros(t + 1, b, 1, dtype=r.dtype, device=r.device)
        gae_lambda = 1.0
    else:
        v_ok = values.dim() == 3 and tuple(values.shape[:2]) == (t + 1, b)
        if not v_ok or values.shape[-1] not in (1, c):
            fail(
                "values.shape",
                tuple(values.shape),
                f"must be [T + 1, B, V] = {(t + 1, b)} + (V,) with V == C ({c}) or V == 1",
                "include the value of the final state as the last row",
            )
        v = values.to(r.dtype)

    if reward_type == "chunk_level":
        adv, ret = _gae_recursion(
            r.sum(dim=-1).contiguous(),
            v[..., 0].contiguous(),
            dones[1:].bool().any(dim=-1),
            gamma,
            gae_lambda,
        )
        return adv.unsqueeze(-1), ret.unsqueeze(-1)

    # action_level: flatten to sub-steps s = t * C + c.
    r_flat = r.permute(0, 2, 1).reshape(t * c, b)
    v_full = v.expand(t + 1, b, c)
    v_flat = torch.cat([v_full[:t].permute(0, 2, 1).reshape(t * c, b), v_full[t, :, 0][None]])
    adv, ret = _gae_recursion(r_flat, v_flat, substep_flags(dones), gamma, gae_lambda)

    def unflatten(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(t, c, b).permute(0, 2, 1).contiguous()

    return unflatten(adv), unflatten(ret)


def compute_embodied_grpo(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    *,
    group_size: int,
    loss_mask: torch.Tensor | None = None,
    reward_type: RewardType = "action_level",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages from each env's episode return.

    The score of env b is the sum of its rewards over the valid sub-steps (the
    loss mask; by default :func:`compute_loss_mask` of ``dones``, i.e. the
    undiscounted return of the first episode of the epoch, up to and including
    its done). Envs ``[k*G, (k+1)*G)`` form group k; the advantage is
    ``(score - group mean) / (group std + eps)`` (unbiased std), broadcast over
    time and multiplied by the loss mask. A group whose scores are all equal
    gets advantage 0 everywhere.

    Args:
        rewards: [T, B, C] float.
        dones: [T + 1, B, C] bool; row 0 is not read.
        group_size: G >= 2, dividing B.
        loss_mask: [T, B, C] or [T, B, 1]; None derives it from ``dones``.
        reward_type: Output [T, B, C] ("action_level") or [T, B, 1] ("chunk_level").
        eps: Added to the group std.

    Returns:
        Advantages [T, B, C] or [T, B, 1], zero outside the loss mask.

    Raises:
        ValueError: For malformed shapes, G < 2 or B not a multiple of G.
    """
    check_choice("reward_type", reward_type, get_args(RewardType))
    t, b, c = _check_rewards_dones(rewards, dones)
    r = as_float(rewards)
    if loss_mask is None:
        loss_mask = compute_loss_mask(dones).mask
    substep_mask = resize_loss_mask(loss_mask, (t, b, c), "action_level")
    scores = (r * substep_mask.to(r.dtype)).sum(dim=(0, 2))
    adv = group_normalize(scores, group_size, eps=eps)
    out_mask = resize_loss_mask(loss_mask, (t, b, c), reward_type)
    return adv.view(1, b, 1) * out_mask.to(r.dtype)
