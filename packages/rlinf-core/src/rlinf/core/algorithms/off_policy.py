"""Corrections for the gap between the sampling engine and the trained policy.

* :func:`truncated_is_weights`: the truncated importance-sampling fix. The
  engine samples with its own numerics (another kernel, precision or a stale
  weight version), so its logprobs differ from the actor's recomputation of
  the same policy. Multiplying the advantages by
  ``min(exp(train_logprobs - rollout_logprobs), clip)`` re-weights each token
  towards the trained policy, and the clip bounds the variance.
* :func:`early_stop_ratio_exceeded`: the "minibatch early stop". When the mean
  importance ratio of a micro-batch drifts above a threshold, its loss is
  dropped instead of taking a step on data the policy has moved far from.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlinf.core.algorithms._checks import check_same_shape
from rlinf.core.algorithms.utils import masked_mean

__all__ = ["early_stop_ratio_exceeded", "truncated_is_weights"]


def truncated_is_weights(
    train_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    clip: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights ``min(exp(train_logprobs - rollout_logprobs), clip)``.

    Args:
        train_logprobs: ``[B, T]`` logprobs of the policy being trained, at the step's
            start (the actor's recomputation; no gradient flows through them).
        rollout_logprobs: ``[B, T]`` logprobs the engine reported when sampling.
        clip: Upper bound of a weight (> 0).
        mask: ``[B, T]`` valid tokens; masked positions get weight 0.

    Returns:
        ``[B, T]`` float32 weights.

    Raises:
        ValueError: If ``clip`` is not positive or the shapes differ.
    """
    if not clip > 0:
        raise ValueError(f"importance_sampling_clip={clip} must be > 0")
    check_same_shape("rollout_logprobs", rollout_logprobs, "train_logprobs", train_logprobs)
    log_w = (train_logprobs.detach().float() - rollout_logprobs.detach().float()).clamp(max=20.0)
    weights = torch.exp(log_w).clamp(max=clip)
    if mask is not None:
        weights = torch.where(mask.bool(), weights, torch.zeros_like(weights))
    return weights


def early_stop_ratio_exceeded(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
    all_reduce_mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[bool, float]:
    """Whether the mean importance ratio ``exp(logprobs - old_logprobs)`` exceeds ``threshold``.

    Args:
        logprobs: ``[B, T]`` current logprobs.
        old_logprobs: ``[B, T]`` logprobs of the sampling policy.
        mask: ``[B, T]`` valid tokens.
        threshold: The largest mean ratio still trained on.
        all_reduce_mean: Optional ``f(tensor) -> tensor`` averaging over data-parallel
            ranks, so every rank takes the same decision.

    Returns:
        ``(exceeded, mean_ratio)``.
    """
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    with torch.no_grad():
        ratio = torch.exp((logprobs.float() - old_logprobs.float()).clamp(max=20.0))
        mean = masked_mean(ratio, mask.bool()).reshape(1)
        if all_reduce_mean is not None:
            mean = all_reduce_mean(mean)
        value = float(mean.item())
    return value > threshold, value
