"""Reasoning (LLM) advantage estimators: one scalar reward per response."""

from __future__ import annotations

import torch

from rlinf.core.algorithms._checks import as_float, check_in_unit_interval, check_same_shape, fail
from rlinf.core.algorithms.inputs import AllReduce
from rlinf.core.algorithms.kl import kl_penalty
from rlinf.core.algorithms.utils import group_normalize, masked_whiten

__all__ = ["compute_grpo_advantages", "compute_reinforce_plus_plus"]


def _check_rewards_mask(rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if rewards.dim() != 1:
        fail("rewards.shape", tuple(rewards.shape), "must be [N]", "pass one reward per response")
    if response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        fail(
            "response_mask.shape",
            tuple(response_mask.shape),
            f"must be [N, L] with N = len(rewards) = {rewards.shape[0]}",
            "pass the [N, L] mask of response tokens",
        )


def compute_grpo_advantages(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    group_size: int,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO: group-relative reward broadcast to every response token.

    Responses ``[k*G, (k+1)*G)`` answer prompt k. Each gets
    ``A = (r - group mean) / (group std + eps)`` (unbiased std; without the
    division when ``norm_by_std`` is False), on all of its response tokens. A
    group whose rewards are all equal gets 0.

    Args:
        rewards: [N] float, N a multiple of G.
        response_mask: [N, L] bool.
        group_size: G >= 2.
        norm_by_std: Divide by the group std.
        eps: Added to the group std.

    Returns:
        [N, L] advantages, zero outside ``response_mask``.

    Raises:
        ValueError: For malformed shapes, G < 2 or N not a multiple of G.
    """
    _check_rewards_mask(rewards, response_mask)
    r = as_float(rewards)
    adv = group_normalize(r, group_size, norm_by_std=norm_by_std, eps=eps)
    return adv[:, None] * response_mask.to(r.dtype)


def _discounted_reverse_cumsum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """``out[:, t] = sum_{k >= t} gamma**(k - t) * x[:, k]`` along dim 1."""
    if gamma == 1.0:
        return x.flip(1).cumsum(1).flip(1)
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        running = x[:, t] + gamma * running
        out[:, t] = running
    return out


def compute_reinforce_plus_plus(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    kl_kind: str = "k2",
    group_size: int = 1,
    use_baseline: bool = False,
    eps: float = 1e-6,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: token-level returns with a KL penalty, whitened over the batch.

    1. Optionally subtract the group mean reward (``use_baseline``).
    2. Put each response's reward on its last valid token.
    3. Subtract ``kl_beta * kl_penalty(logprobs, ref_logprobs, kl_kind)`` on
       every valid token.
    4. Returns = discounted reverse cumulative sum of those token rewards
       (invalid tokens contribute 0 and do not cut the sum).
    5. Advantages = returns whitened over all valid tokens
       (``(x - mean) / (std + eps)``, biased std; global with ``all_reduce``).

    Args:
        rewards: [N] float.
        response_mask: [N, L] bool.
        gamma: Per-token discount in [0, 1].
        logprobs: [N, L] log-probs of the sampling policy (needed if kl_beta > 0).
        ref_logprobs: [N, L] reference log-probs (needed if kl_beta > 0).
        kl_beta: KL coefficient; 0 disables the penalty.
        kl_kind: See :func:`kl_penalty`.
        group_size: G for the baseline.
        use_baseline: Subtract the group mean reward (needs G >= 2).
        eps: Added to the std in the whitening.
        all_reduce: Sums the whitening statistics over ranks.

    Returns:
        ``(advantages, returns)``, both [N, L], zero outside ``response_mask``.

    Raises:
        ValueError: For malformed shapes, a negative kl_beta, or kl_beta > 0
            without log-probs.
    """
    _check_rewards_mask(rewards, response_mask)
    check_in_unit_interval("gamma", gamma)
    if kl_beta < 0:
        fail("kl_beta", kl_beta, "must be >= 0", "set algorithm.reinpp_kl_beta to 0 or more")
    r = as_float(rewards)
    mask = response_mask.bool()
    fmask = mask.to(r.dtype)
    if use_baseline:
        r = group_normalize(r, group_size, norm_by_std=False)

    n, length = mask.shape
    has_tokens = mask.any(dim=1)
    last = length - 1 - mask.flip(1).to(torch.int64).argmax(dim=1)
    token_rewards = torch.zeros(n, length, dtype=r.dtype, device=r.device)
    token_rewards[torch.arange(n, device=r.device), last] = torch.where(
        has_tokens, r, torch.zeros_like(r)
    )
    if kl_beta > 0:
        if logprobs is None or ref_logprobs is None:
            fail(
                "kl_beta",
                kl_beta,
                "needs logprobs and ref_logprobs",
                "pass both log-prob tensors, or set kl_beta=0",
            )
        check_same_shape("logprobs", logprobs, "response_mask", response_mask)
        kl = kl_penalty(as_float(logprobs), as_float(ref_logprobs), kl_kind).to(r.dtype)
        token_rewards = token_rewards - kl_beta * torch.where(mask, kl, torch.zeros_like(kl))

    returns = _discounted_reverse_cumsum(token_rewards, gamma) * fmask
    advantages = masked_whiten(returns, mask, eps=eps, all_reduce=all_reduce) * fmask
    return advantages, returns
