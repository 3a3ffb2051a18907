"""Entropy of categorical distributions given as logits."""

from __future__ import annotations

import torch

from rlinf.core.algorithms._checks import as_float, fail

__all__ = ["entropy_from_logits"]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_k p_k log p_k`` of ``softmax(logits)`` over the last dim.

    Computed from ``log_softmax`` (stable for large logits; ``-inf`` logits of
    masked-out classes contribute 0). Half-precision logits are computed in float32.

    Args:
        logits: [..., K] unnormalised log-probabilities (divide by the sampling
            temperature first if the samples were drawn at one).

    Returns:
        [...] entropies in nats.

    Raises:
        ValueError: If ``logits`` is 0-d.
    """
    if logits.dim() == 0:
        fail("logits.shape", (), "has no class dim", "pass [..., K] logits")
    x = as_float(logits)
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)
