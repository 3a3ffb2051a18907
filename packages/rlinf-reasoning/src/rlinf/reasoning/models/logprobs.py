"""Token log-probabilities: one definition for the rollout engine and the actor.

The GRPO/PPO importance ratio compares the log-probability the rollout engine
assigned to each sampled token ("old" logprob) with the one the actor
recomputes. Both sides must therefore compute the *same quantity*:

    logprob(token) = log_softmax(logits.float() / temperature)[token]

* **float32**: the logits are cast to float32 before scaling, whatever the
  model's dtype, so bf16/fp16 models do not lose precision in the softmax.
* **divided by the sampling temperature**: the distribution the tokens were
  drawn from (before truncation) is ``softmax(logits / T)``.
* **before top-k / top-p filtering**: truncation is a property of the sampler,
  not of the policy. The actor only sees full-vocabulary logits and cannot
  reproduce a truncated distribution (it does not know which tokens were
  kept), so the engine reports the untruncated value too. The two numbers then
  agree to float rounding, and the ratio is exactly 1 on the first minibatch
  when no update has happened yet.

Alignment: the logits at position ``t`` score the token at ``t + 1``. In the
actor batch layout (prompt left-padded to ``P`` columns, response right-padded
to ``R = T - P`` columns) the response logprobs come from logits at positions
``[P - 1, T - 1)`` and are aligned with ``input_ids[:, P:]``.

Entropy: :func:`compute_token_logprobs_and_entropy` uses the one entropy of the
code base, :func:`rlinf.core.algorithms.entropy_from_logits`, on the same
temperature-scaled float32 logits (``-inf`` logits of a masked vocabulary add 0,
and its gradients are finite).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlinf.core.algorithms import entropy_from_logits

__all__ = [
    "compute_token_logprobs",
    "compute_token_logprobs_and_entropy",
    "position_ids_from_attention_mask",
    "token_logprobs_from_logits",
]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` in float32 divided by ``temperature`` (no copy of float32 logits at T = 1)."""
    _check_temperature(temperature)
    x = logits.float()
    return x if temperature == 1.0 else x / temperature


def token_logprobs_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of ``tokens`` under ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V]`` raw (unprocessed) logits, any floating dtype.
        tokens: ``[...]`` integer token ids, same leading shape as ``logits``.
        temperature: Sampling temperature (> 0) the tokens were drawn with.

    Returns:
        ``[...]`` float32 log-probabilities.
    """
    scaled = _scaled(logits, temperature)
    chosen = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token of each row.

    Positions before the first real token (left padding) are 0; padding after
    the last real token keeps counting from the last real position, which is
    harmless because those positions are masked out.

    Args:
        attention_mask: ``[B, T]`` bool or 0/1 mask.

    Returns:
        ``[B, T]`` int64 position ids.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: int,
    position_ids: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """Runs ``model``; returns the logits that score ``input_ids[:, response_start:]``, scaled."""
    _check_temperature(temperature)  # before the forward pass
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            "input_ids and attention_mask must both be [B, T]; got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    seq_len = input_ids.shape[1]
    if not 1 <= response_start < seq_len:
        raise ValueError(f"response_start must be in [1, {seq_len}), got {response_start}")
    if position_ids is None:
        position_ids = position_ids_from_attention_mask(attention_mask)
    resp_len = seq_len - response_start
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask.long(),
        "position_ids": position_ids,
        "use_cache": False,
        # Only the last R + 1 positions are needed; skips the LM head elsewhere.
        "logits_to_keep": resp_len + 1,
    }
    logits: torch.Tensor = model(**kwargs).logits
    # Positions [P - 1, T - 1) score tokens [P, T).
    return _scaled(logits[:, -(resp_len + 1) : -1, :], temperature)


def _apply_response_mask(
    values: torch.Tensor, response_mask: torch.Tensor | None, response_start: int
) -> torch.Tensor:
    if response_mask is None:
        return values
    if response_mask.shape[-1] != values.shape[-1]:
        # A full-width [B, T] mask, as in the actor batch layout.
        response_mask = response_mask[:, response_start:]
    if response_mask.shape != values.shape:
        raise ValueError(
            f"response_mask must be [B, R] or [B, T]; got {tuple(response_mask.shape)} "
            f"for logprobs of shape {tuple(values.shape)}"
        )
    return values * response_mask.to(values.dtype)


def compute_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    response_start: int,
    temperature: float = 1.0,
    response_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The actor's recomputation of response-token logprobs.

    Runs one forward pass over the full ``[B, T]`` batch (prompt left-padded to
    ``response_start`` columns, response right-padded after it) and returns
    ``log_softmax(logits / temperature)`` of each response token, in float32.
    Gradients flow through unless the caller wraps it in ``torch.no_grad()``.

    Args:
        model: A Hugging Face causal LM (accepts ``logits_to_keep``).
        input_ids: ``[B, T]`` token ids.
        attention_mask: ``[B, T]`` mask, 1 on real prompt and response tokens.
        response_start: ``P``, the column where responses begin.
        temperature: The sampling temperature used at generation time.
        response_mask: Optional ``[B, T - P]`` (or ``[B, T]``) mask; positions
            where it is false are set to 0.
        position_ids: Optional ``[B, T]``; by default 0 at the first real token
            of each row (:func:`position_ids_from_attention_mask`).

    Returns:
        ``[B, T - P]`` float32 logprobs aligned with ``input_ids[:, P:]``.
    """
    scaled = _forward(model, input_ids, attention_mask, response_start, position_ids, temperature)
    logprobs = token_logprobs_from_logits(scaled, input_ids[:, response_start:])
    return _apply_response_mask(logprobs, response_mask, response_start)


def compute_token_logprobs_and_entropy(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    response_start: int,
    temperature: float = 1.0,
    response_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`compute_token_logprobs`, plus the per-token entropy from the same forward.

    Takes the arguments of :func:`compute_token_logprobs`; ``response_mask`` applies to both
    outputs.

    Returns:
        ``(logprobs, entropy)``, both ``[B, T - P]`` float32; the entropy is
        :func:`rlinf.core.algorithms.entropy_from_logits` of ``logits / temperature``.
    """
    scaled = _forward(model, input_ids, attention_mask, response_start, position_ids, temperature)
    logprobs = token_logprobs_from_logits(scaled, input_ids[:, response_start:])
    entropy = entropy_from_logits(scaled)
    return (
        _apply_response_mask(logprobs, response_mask, response_start),
        _apply_response_mask(entropy, response_mask, response_start),
    )
