"""Token sampling from raw logits: temperature, then top-k, then top-p.

The filtering here only decides *which* token is drawn. The logprob reported
for that token is computed separately, from the unfiltered temperature-scaled
distribution (:func:`rlinf.reasoning.models.logprobs.token_logprobs_from_logits`).
"""

from __future__ import annotations

import torch

from rlinf.reasoning.engines.base import SamplingParams

__all__ = ["filter_logits", "make_generator", "sample_tokens"]


def filter_logits(scaled_logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Masks the tokens outside the top-k set and the top-p nucleus with ``-inf``.

    Top-k is applied first, then top-p on the renormalised remainder (the
    order vLLM, SGLang and transformers use). Ties at the k-th value are kept.
    The most likely token always survives.

    Args:
        scaled_logits: ``[B, V]`` float logits already divided by the temperature.
        top_k: Number of tokens to keep; ``<= 0`` disables it.
        top_p: Nucleus mass in ``(0, 1]``; 1 disables it.

    Returns:
        ``[B, V]`` logits with filtered entries set to ``-inf`` (a new tensor
        when anything is filtered, otherwise ``scaled_logits`` itself).
    """
    logits = scaled_logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        # Keep a token while the mass strictly before it is below top_p.
        remove_sorted = mass_before >= top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A seeded generator on ``device``, or ``None`` (global RNG) when ``seed`` is None.

    Args:
        seed: The seed, or ``None``.
        device: Device the sampling tensors live on.

    Returns:
        The generator or ``None``.
    """
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample_tokens(
    raw_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """Draws one token per row of ``raw_logits``.

    Args:
        raw_logits: ``[B, V]`` logits straight from the model.
        params: Sampling parameters.
        generator: RNG (see :func:`make_generator`).

    Returns:
        ``[B]`` int64 token ids.
    """
    scaled = raw_logits.float() / params.temperature
    if params.is_greedy:
        return scaled.argmax(dim=-1)
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
