"""Per-token KL estimators between the policy and a reference policy."""

from __future__ import annotations

import torch

from rlinf.core.algorithms._checks import check_choice, check_same_shape

__all__ = ["KL_KINDS", "kl_penalty"]

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "abs", *_ALIASES)
"""Accepted ``kind`` values; "kl", "mse", "low_var_kl" are the YAML aliases of k1, k2, k3."""


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    Direction (one convention everywhere): the first argument is the policy
    being trained (or the policy that sampled), the second the reference. With
    ``d = ref_logprobs - logprobs``:

    * ``k1`` ("kl"): ``-d`` (unbiased, high variance, can be negative);
    * ``k2`` ("mse"): ``0.5 * d**2``;
    * ``k3`` ("low_var_kl"): ``exp(d) - d - 1`` with ``d`` clamped to [-20, 20]
      and the result clamped to [-10, 10] (unbiased before clamping, >= 0, low
      variance);
    * ``abs``: ``|d|``.

    Args:
        logprobs: Log-probs of the sampled tokens under the policy, any shape.
        ref_logprobs: The same tokens under the reference, same shape.
        kind: One of :data:`KL_KINDS`.

    Returns:
        Per-token estimates, same shape as ``logprobs``.

    Raises:
        ValueError: For an unknown kind or mismatched shapes.
    """
    check_choice("kind", kind, KL_KINDS)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    kind = _ALIASES.get(kind, kind)
    diff = ref_logprobs - logprobs
    if kind == "k1":
        return -diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    d = diff.clamp(min=-20.0, max=20.0)
    return (torch.exp(d) - d - 1.0).clamp(min=-10.0, max=10.0)
