"""Masked reductions, whitening, group normalisation and loss aggregation.

Masks are bool (or 0/1) tensors that broadcast to the values' shape; an entry
counts iff its mask is true. ``None`` means every entry counts.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from rlinf.core.algorithms._checks import check_broadcast, check_choice, fail
from rlinf.core.algorithms.inputs import AllReduce

__all__ = [
    "LOSS_AGG_MODES",
    "LossAggMode",
    "agg_loss",
    "group_normalize",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "episode-length-norm"
]
"""How a per-token loss is reduced to a scalar (see :func:`agg_loss`)."""

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def _mask_as(values: torch.Tensor, mask: torch.Tensor | None, arg: str = "mask") -> torch.Tensor:
    """``mask`` as a 0/1 tensor of ``values``' dtype and shape."""
    if mask is None:
        return torch.ones_like(values)
    check_broadcast(arg, mask, "values", values)
    return mask.to(values.dtype).expand_as(values)


def _masked(values: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``values * m`` that is exactly 0 where ``m == 0``, even for inf/nan padding."""
    return torch.where(m != 0, values * m, torch.zeros_like(values))


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """Sum of the valid entries.

    Args:
        values: Any shape.
        mask: Broadcasts to ``values``; None means all valid.
        dim: Reduce only this dim; None reduces everything to a scalar.

    Returns:
        The sum (a scalar, or ``values`` with ``dim`` removed).
    """
    vm = _masked(values, _mask_as(values, mask))
    return vm.sum() if dim is None else vm.sum(dim=dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """Mean of the valid entries; 0 where there are none.

    Args:
        values: Any shape.
        mask: Broadcasts to ``values``; None means all valid.
        dim: Reduce only this dim; None reduces everything to a scalar.

    Returns:
        The mean (a scalar, or ``values`` with ``dim`` removed).
    """
    m = _mask_as(values, mask)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, m, dim) / count.clamp(min=1)


def _mean_var(
    values: torch.Tensor,
    mask: torch.Tensor | None,
    unbiased: bool,
    all_reduce: AllReduce | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of the valid entries as float64 scalars, without gradient."""
    v64 = values.detach().to(torch.float64)
    m = _mask_as(v64, mask)
    v = _masked(v64, m)
    stats = torch.stack([m.sum(), (v * m).sum(), (v * v * m).sum()])
    if all_reduce is not None:
        stats = all_reduce(stats)
    count, total, total_sq = stats.unbind()
    n = count.clamp(min=1)
    mean = total / n
    var = (total_sq / n - mean * mean).clamp(min=0)
    if unbiased:
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), 0.0)
    return mean, var


def masked_var(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    unbiased: bool = False,
    all_reduce: AllReduce | None = None,
) -> torch.Tensor:
    """Variance of the valid entries (a float64 scalar, no gradient).

    Args:
        values: Any shape.
        mask: Broadcasts to ``values``; None means all valid.
        unbiased: Divide by ``n - 1`` instead of ``n`` (0 when n <= 1).
        all_reduce: Sums the statistics over ranks for a global variance.

    Returns:
        The variance.
    """
    return _mean_var(values, mask, unbiased, all_reduce)[1]


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    shift_mean: bool = True,
    unbiased: bool = False,
    eps: float = 1e-5,
    all_reduce: AllReduce | None = None,
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with mean and std over the valid entries.

    Every entry is transformed (invalid ones too); only valid ones enter the
    statistics. The statistics carry no gradient.

    Args:
        values: Any shape.
        mask: Broadcasts to ``values``; None means all valid.
        shift_mean: False adds the mean back (only rescales).
        unbiased: Use the ``n - 1`` variance.
        eps: Added to the standard deviation.
        all_reduce: Sums the statistics over ranks (global whitening).

    Returns:
        A tensor like ``values``.
    """
    mean, var = _mean_var(values, mask, unbiased, all_reduce)
    mean_t = mean.to(values.dtype)
    out = (values - mean_t) / (var.sqrt().to(values.dtype) + eps)
    return out if shift_mean else out + mean_t


def group_normalize(
    scores: torch.Tensor, group_size: int, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative scores: ``(s - group mean) / (group std + eps)``.

    Groups are ``group_size`` consecutive entries. The std is the unbiased
    (``n - 1``) one. A group whose scores are all equal gets exactly 0 (no
    learning signal, and no eps-amplified rounding noise).

    Args:
        scores: [M] with M a multiple of ``group_size``.
        group_size: G >= 2.
        norm_by_std: False only subtracts the group mean.
        eps: Added to the std.

    Returns:
        [M], same dtype as ``scores``.

    Raises:
        ValueError: If G < 2, M is not a multiple of G, or ``scores`` is not 1-D.
    """
    if scores.dim() != 1:
        fail("scores.shape", tuple(scores.shape), "must be 1-D [M]", "pass one score per sample")
    if group_size < 2:
        fail(
            "group_size",
            group_size,
            "is too small: a group-relative baseline needs >= 2 samples per group",
            "set algorithm.group_size (and the env/rollout group size) to 2 or more",
        )
    if scores.shape[0] % group_size != 0:
        fail(
            "group_size",
            group_size,
            f"does not divide the number of samples {scores.shape[0]}",
            "make the batch hold whole groups (a multiple of group_size samples)",
        )
    s = scores.to(torch.float64).view(-1, group_size)
    centered = s - s.mean(dim=1, keepdim=True)
    if norm_by_std:
        centered = centered / (s.std(dim=1, keepdim=True) + eps)
    constant = s.amax(dim=1, keepdim=True) == s.amin(dim=1, keepdim=True)
    out = torch.where(constant, torch.zeros_like(centered), centered)
    return out.reshape(-1).to(scores.dtype)


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    mode: str = "token-mean",
    *,
    mask_sum: torch.Tensor | None = None,
    max_episode_steps: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Dim 0 indexes sequences (rows); all other dims are that sequence's tokens.

    * ``token-mean``: ``sum(l * m) / sum(m)`` over everything (0 if no valid token).
    * ``seq-mean-token-sum``: per-row sum of valid tokens, averaged over rows
      that have at least one valid token.
    * ``seq-mean-token-mean``: per-row mean of valid tokens, averaged over rows
      that have at least one valid token.
    * ``episode-length-norm`` (embodied, no auto-reset): the mean over *all*
      entries of ``l * m * max_episode_steps / mask_sum``, i.e. each episode is
      weighted by ``max_episode_steps / its valid length``.

    Args:
        values: [N, ...] per-token losses.
        mask: Broadcasts to ``values``; None means all valid.
        mode: One of :data:`LOSS_AGG_MODES`.
        mask_sum: ``episode-length-norm`` only: per-entry valid length of the
            entry's episode (``compute_loss_mask(...).mask_sum``), broadcasting to
            ``values``.
        max_episode_steps: ``episode-length-norm`` only: the env's step limit.

    Returns:
        A scalar tensor (differentiable w.r.t. ``values``).

    Raises:
        ValueError: For an unknown mode, a mask that does not broadcast, a 0-d
            ``values``, or missing ``mask_sum``/``max_episode_steps``.
    """
    check_choice("loss_agg_mode", mode, LOSS_AGG_MODES)
    m = _mask_as(values, mask)
    vm = _masked(values, m)
    if mode == "token-mean":
        return vm.sum() / m.sum().clamp(min=1)
    if mode == "episode-length-norm":
        if mask_sum is None or max_episode_steps is None:
            fail(
                "loss_agg_mode",
                mode,
                "needs mask_sum and max_episode_steps",
                "pass mask_sum=compute_loss_mask(dones).mask_sum and the env's "
                "max_episode_steps, or use 'token-mean'",
            )
        if max_episode_steps <= 0:
            fail("max_episode_steps", max_episode_steps, "must be > 0", "pass the env's limit")
        check_broadcast("mask_sum", mask_sum, "values", values)
        weight = max_episode_steps / mask_sum.to(values.dtype).clamp(min=1)
        return (vm * weight).mean()
    if values.dim() == 0:
        fail("values.shape", (), f"has no sequence dim for mode {mode!r}", "pass [N, ...] losses")
    n = values.shape[0]
    row_sum = vm.reshape(n, -1).sum(dim=1)
    row_count = m.reshape(n, -1).sum(dim=1)
    if mode == "seq-mean-token-mean":
        row_sum = row_sum / row_count.clamp(min=1)
    nonempty = (row_count > 0).to(values.dtype)
    return (row_sum * nonempty).sum() / nonempty.sum().clamp(min=1)
