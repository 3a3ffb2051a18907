"""PPO policy loss (clip, asymmetric clip, dual clip), clipped value loss, explained variance."""

from __future__ import annotations

import math

import torch

from rlinf.core.algorithms._checks import (
    as_float,
    broadcast_shape,
    check_broadcast,
    check_positive,
    check_same_shape,
    fail,
)
from rlinf.core.algorithms.inputs import AllReduce
from rlinf.core.algorithms.registry import register_policy_loss
from rlinf.core.algorithms.utils import agg_loss, masked_mean

__all__ = ["explained_variance", "ppo_policy_loss", "value_loss"]


def _bool_mask(
    mask: torch.Tensor | None, arg: str, ref_arg: str, ref: torch.Tensor
) -> torch.Tensor:
    """``mask`` as a bool tensor of ``ref``'s shape (all true when None)."""
    if mask is None:
        return torch.ones_like(ref, dtype=torch.bool)
    check_broadcast(arg, mask, ref_arg, ref)
    return mask.bool().expand_as(ref)


def _values_returns_shape(values: torch.Tensor, returns: torch.Tensor) -> tuple[int, ...]:
    """The broadcast shape of ``values`` and ``returns``; raises ``ValueError`` if none."""
    shape = broadcast_shape(values.shape, returns.shape)
    if shape is None:
        fail(
            "returns.shape",
            tuple(returns.shape),
            f"does not broadcast with values.shape={tuple(values.shape)}",
            "pass returns with the values' shape (or size-1 dims)",
        )
    return shape


def _check_clip_args(
    clip_ratio_low: float, clip_ratio_high: float | None, dual_clip_c: float | None
) -> float:
    """Validates the clip arguments; returns the upper clip (``clip_ratio_low`` if None)."""
    check_positive("clip_ratio_low", clip_ratio_low, "set algorithm.clip_ratio_low to e.g. 0.2")
    if clip_ratio_low >= 1:
        fail(
            "clip_ratio_low",
            clip_ratio_low,
            "must be < 1 (the lower ratio bound 1 - clip_ratio_low would be <= 0)",
            "set algorithm.clip_ratio_low to e.g. 0.2",
        )
    high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    check_positive("clip_ratio_high", high, "set algorithm.clip_ratio_high to e.g. 0.28")
    if dual_clip_c is not None and not dual_clip_c > 1:
        fail(
            "dual_clip_c",
            dual_clip_c,
            "must be > 1",
            "set algorithm.clip_ratio_c to e.g. 3.0, or null to disable dual clip",
        )
    return high


def _masked_log_ratio(
    logp: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """``logp - old_logprobs``, optionally clamped, and 0 where ``mask`` is false."""
    log_ratio = logp - as_float(old_logprobs).to(logp.dtype)
    if clip_min is not None or clip_max is not None:
        log_ratio = log_ratio.clamp(min=clip_min, max=clip_max)
    return torch.where(mask, log_ratio, torch.zeros_like(log_ratio))


def _clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    dual_clip_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-entry PPO losses and where the ratio clip and the dual clip are active."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    if dual_clip_c is not None:
        cap = dual_clip_c * adv.abs()
        dual_active = (adv < 0) & (losses > cap)
        losses = torch.where(dual_active, cap, losses)
    else:
        dual_active = torch.zeros_like(mask)
    return losses, clip_active, dual_active


@register_policy_loss("ppo", aliases=("actor", "actor_critic"))
def ppo_policy_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    dual_clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    clip_log_ratio_min: float | None = None,
    clip_log_ratio_max: float | None = None,
    loss_mask_sum: torch.Tensor | None = None,
    max_episode_steps: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss with asymmetric and optional dual clipping.

    With ``ratio = exp(logprobs - old_logprobs)`` on valid entries::

        loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
        loss_t = min(loss_t, dual_clip_c * |A|)        # dual clip, binds only for A < 0

    then ``agg_loss(loss_t, loss_mask, loss_agg_mode)``. Low-precision inputs
    are computed in float32.

    Args:
        logprobs: Log-probs under the current policy, e.g. [N, L] tokens or
            [T*B, C] embodied entries (requires grad).
        old_logprobs: Same shape, under the sampling policy.
        advantages: Broadcasts to ``logprobs`` (e.g. [N, L], or [bsz, C, 1]
            against [bsz, C, A]).
        loss_mask: Broadcasts to ``logprobs``; None means all valid.
        clip_ratio_low: epsilon_low in (0, 1).
        clip_ratio_high: epsilon_high > 0; None means ``clip_ratio_low``.
        dual_clip_c: Dual-clip constant c > 1, or None to disable.
        loss_agg_mode: See :func:`agg_loss`.
        clip_log_ratio_min: Optional lower clamp of the log-ratio.
        clip_log_ratio_max: Optional upper clamp of the log-ratio.
        loss_mask_sum: For ``episode-length-norm``.
        max_episode_steps: For ``episode-length-norm``.

    Returns:
        ``(loss, metrics)``: a scalar tensor and detached 0-d tensors (on the
        inputs' device, so computing them never waits for the device; read
        them with :class:`~rlinf.core.algorithms.MetricMeans`) for
        ``actor/ratio`` (mean ratio), ``actor/clip_fraction`` (share of valid
        entries where the ratio clip is active), ``actor/dual_clip_fraction``,
        ``actor/approx_kl`` (mean of ``old_logprobs - logprobs``) and
        ``actor/policy_loss``; all means over valid entries.

    Raises:
        ValueError: For invalid clip values, unknown ``loss_agg_mode`` or
            mismatched shapes.
    """
    high = _check_clip_args(clip_ratio_low, clip_ratio_high, dual_clip_c)
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    check_broadcast("advantages", advantages, "logprobs", logprobs)
    mask = _bool_mask(loss_mask, "loss_mask", "logprobs", logprobs)

    logp = as_float(logprobs)
    log_ratio = _masked_log_ratio(logp, old_logprobs, mask, clip_log_ratio_min, clip_log_ratio_max)
    adv = as_float(advantages).to(logp.dtype).expand_as(logp)
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    ratio = torch.exp(log_ratio)
    losses, clip_active, dual_active = _clipped_surrogate(
        ratio, adv, mask, clip_ratio_low, high, dual_clip_c
    )
    loss = agg_loss(
        losses, mask, loss_agg_mode, mask_sum=loss_mask_sum, max_episode_steps=max_episode_steps
    )
    with torch.no_grad():  # 0-d tensors: no host sync here (see step_metrics)
        metrics = {
            "actor/ratio": masked_mean(ratio.detach(), mask),
            "actor/clip_fraction": masked_mean(clip_active.to(logp.dtype), mask),
            "actor/dual_clip_fraction": masked_mean(dual_active.to(logp.dtype), mask),
            "actor/approx_kl": masked_mean(-log_ratio.detach(), mask),
            "actor/policy_loss": loss.detach(),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_range_value: float | None = None,
    loss_agg_mode: str = "token-mean",
    *,
    huber_delta: float | None = None,
    mask_sum: torch.Tensor | None = None,
    max_episode_steps: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``max(l(R - v), l(R - v_clip))``.

    ``v_clip = old_values + clamp(values - old_values, -c, c)`` with
    ``c = clip_range_value``; ``l(x) = 0.5 * x**2``, or the Huber loss with
    ``huber_delta`` (which equals ``0.5 * x**2`` for ``|x| <= delta``). Without a
    clip range the loss is just ``l(R - v)``.

    Args:
        values: Current value predictions, e.g. [T*B, V] or [N, L].
        old_values: Predictions at rollout time, same shape as ``values``.
        returns: Targets, broadcast-compatible with ``values`` (e.g. [T*B, C]
            returns with [T*B, 1] chunk-level values); the loss has the
            broadcast shape.
        mask: Broadcasts to that shape; None means all valid.
        clip_range_value: c > 0, or None for no clipping.
        loss_agg_mode: See :func:`agg_loss`.
        huber_delta: delta > 0 for a Huber loss, None for 0.5 * MSE.
        mask_sum: For ``episode-length-norm``.
        max_episode_steps: For ``episode-length-norm``.

    Returns:
        ``(loss, metrics)`` with ``critic/value_loss`` and
        ``critic/value_clip_fraction`` (share of valid entries where the
        clipped term is the larger one), as detached 0-d tensors.

    Raises:
        ValueError: For invalid clip/delta values or mismatched shapes.
    """
    check_same_shape("old_values", old_values, "values", values)
    if clip_range_value is not None:
        check_positive(
            "clip_range_value", clip_range_value, "set it to e.g. 0.2, or None to disable"
        )
    if huber_delta is not None:
        check_positive("huber_delta", huber_delta, "set it to e.g. 10.0, or None for 0.5 * MSE")
    shape = _values_returns_shape(values, returns)
    v = as_float(values).expand(shape)
    v_old = as_float(old_values).to(v.dtype).expand(shape)
    ret = as_float(returns).to(v.dtype).expand(shape)
    m = _bool_mask(mask, "mask", "values", v)

    def elementwise(err: torch.Tensor) -> torch.Tensor:
        if huber_delta is None:
            return 0.5 * err.square()
        return torch.nn.functional.huber_loss(
            err, torch.zeros_like(err), reduction="none", delta=huber_delta
        )

    loss_unclipped = elementwise(ret - v)
    if clip_range_value is not None:
        v_clip = v_old + (v - v_old).clamp(-clip_range_value, clip_range_value)
        loss_clipped = elementwise(ret - v_clip)
        losses = torch.maximum(loss_unclipped, loss_clipped)
        clip_active = loss_clipped > loss_unclipped
    else:
        losses = loss_unclipped
        clip_active = torch.zeros_like(m)
    loss = agg_loss(
        losses, m, loss_agg_mode, mask_sum=mask_sum, max_episode_steps=max_episode_steps
    )
    with torch.no_grad():  # 0-d tensors: no host sync here (see step_metrics)
        metrics = {
            "critic/value_loss": loss.detach(),
            "critic/value_clip_fraction": masked_mean(clip_active.to(v.dtype), m),
        }
    return loss, metrics


def explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    all_reduce: AllReduce | None = None,
) -> float:
    """``1 - Var[returns - values] / Var[returns]`` over the valid entries.

    1 is a perfect critic, 0 is no better than a constant, negative is worse.

    Args:
        values: Value predictions.
        returns: Targets, broadcast-compatible with ``values``.
        mask: Broadcasts to the common shape; None means all valid.
        all_reduce: Sums the sufficient statistics over ranks (global value).

    Returns:
        The explained variance, or NaN when ``Var[returns]`` is 0 or there is no
        valid entry (undefined).
    """
    shape = _values_returns_shape(values, returns)
    y = returns.detach().to(torch.float64).expand(shape)
    err = y - values.detach().to(torch.float64).expand(shape)
    if mask is None:
        m = torch.ones(shape, dtype=torch.float64, device=y.device)
    else:
        check_broadcast("mask", mask, "values", y)
        m = mask.to(torch.float64).expand(shape)
    y = torch.where(m != 0, y, torch.zeros_like(y))
    err = torch.where(m != 0, err, torch.zeros_like(err))
    stats = torch.stack(
        [m.sum(), (y * m).sum(), (y * y * m).sum(), (err * m).sum(), (err * err * m).sum()]
    )
    if all_reduce is not None:
        stats = all_reduce(stats)
    n, sy, syy, se, see = (float(s) for s in stats)
    if n <= 0:
        return math.nan
    var_y = syy / n - (sy / n) ** 2
    var_e = see / n - (se / n) ** 2
    if var_y <= 0:
        return math.nan
    return 1.0 - var_e / var_y
