"""Entropy of categorical distributions given as logits."""

from __future__ import annotations

import torch

from rlinf.core.algorithms._checks import as_float, fail

__all__ = ["entropy_from_logits"]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_k p_k log p_k`` of ``softmax(logits)`` over the last dim.

    With ``z = logits - max(logits)`` per row, computed as
    ``logsumexp(z) - sum_k softmax(z)_k * z_k`` (equal to ``-sum_k p_k log p_k``,
    accurate for large logits). A ``-inf`` logit (a masked-out class, p = 0)
    contributes exactly 0, and so do its first and second derivatives: it enters
    the sums as the most negative finite float, whose probability is 0, so no
    ``0 * inf`` appears forward or backward. Half-precision logits are computed
    in float32 (float32 and float64 are kept).

    Memory: besides the (float32) logits, two tensors of their size are kept
    for backward (the shifted logits and the probabilities); the others of
    that size are temporary.

    Args:
        logits: [..., K] unnormalised log-probabilities (divide by the sampling
            temperature first if the samples were drawn at one). A row needs at
            least one finite logit; a row of only ``-inf`` is not a distribution
            and gives NaN.

    Returns:
        [...] entropies in nats.

    Raises:
        ValueError: If ``logits`` is 0-d.
    """
    if logits.dim() == 0:
        fail("logits.shape", (), "has no class dim", "pass [..., K] logits")
    x = as_float(logits)
    shift = x.detach().amax(dim=-1, keepdim=True)  # the entropy does not depend on it
    # clamp maps -inf to the most negative float and keeps NaN; it saves only x.
    z = x.clamp(min=torch.finfo(x.dtype).min) - shift
    p = torch.softmax(z, dim=-1)  # exactly 0 where a logit is -inf
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)
