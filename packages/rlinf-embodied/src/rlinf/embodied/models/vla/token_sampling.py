"""OpenVLA's action-token distribution: warp, sample, score.

One function warps logits and every consumer goes through it, so rollout sampling
and actor re-scoring cannot drift apart (the rollout-vs-actor mismatch that gives
PPO ratios != 1 at lr = 0). Steps, all in float32 over the full vocabulary:
ids outside the action bins -> -inf; divide by the temperature; keep the ``top_k``
largest (ties at the k-th value are kept); the rest -> -inf. Training samples the
softmax of the result; eval takes its argmax; logprobs and entropy are those of
the same warped distribution.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlinf.embodied.models.vla.action_bins import ActionBins

__all__ = ["sample_action_ids", "token_entropy", "token_log_probs", "warp_action_logits"]


def warp_action_logits(logits: Tensor, bins: ActionBins, temperature: float, top_k: int) -> Tensor:
    """Restricts logits to the bin ids, applies the temperature, then top-k.

    Args:
        logits: ``[..., vocab_size]`` raw LM-head logits.
        bins: The model's bin layout.
        temperature: > 0.
        top_k: Keep this many bins (0 or >= n_bins: all).

    Returns:
        float32 logits of the same shape; -inf outside the kept bins.

    Raises:
        ValueError: Bad temperature or a vocabulary size that does not match ``bins``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (eval mode uses argmax)")
    if logits.shape[-1] != bins.vocab_size:
        raise ValueError(
            f"logits have {logits.shape[-1]} columns but the vocabulary has {bins.vocab_size}"
        )
    warped = logits.float() / temperature
    warped = warped.masked_fill(~bins.bin_id_mask(warped.device), float("-inf"))
    if 0 < top_k < bins.n_bins:
        kth = torch.topk(warped, top_k, dim=-1).values[..., -1:]
        warped = warped.masked_fill(warped < kth, float("-inf"))
    return warped


def sample_action_ids(
    warped: Tensor, *, greedy: bool, generator: torch.Generator | None = None
) -> Tensor:
    """Draws one id per position from warped logits (argmax when ``greedy``).

    Args:
        warped: ``[..., vocab_size]`` from :func:`warp_action_logits`.
        greedy: Take the most likely id.
        generator: Random generator for the categorical draw.

    Returns:
        int64 ids ``[...]``.
    """
    if greedy:
        return warped.argmax(dim=-1)
    probs = torch.softmax(warped, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator)
    return ids.reshape(probs.shape[:-1])


def token_log_probs(warped: Tensor, ids: Tensor) -> Tensor:
    """Log-probabilities ``[...]`` (float32) of ``ids`` under the warped distribution."""
    log_probs = torch.log_softmax(warped, dim=-1)
    return log_probs.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)


def token_entropy(warped: Tensor) -> Tensor:
    """Entropy ``[...]`` (float32, nats) of the warped distribution (-inf ids contribute 0)."""
    log_probs = torch.log_softmax(warped, dim=-1)
    terms = torch.where(torch.isfinite(log_probs), log_probs.exp() * log_probs, 0.0)
    return -terms.sum(dim=-1)
