"""Inputs and outputs of the registered advantage estimators.

An estimator registered with :func:`~rlinf.core.algorithms.register_advantage`
takes one of the two input records below (one per stack) and returns an
:class:`AdvantageResult`. The record carries every knob an estimator of that
stack may read; an estimator ignores the fields it does not use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

__all__ = [
    "AdvantageInputs",
    "AdvantageResult",
    "AllReduce",
    "EmbodiedAdvantageInputs",
    "ReasoningAdvantageInputs",
    "RewardType",
]

RewardType = Literal["action_level", "chunk_level"]
"""Credit granularity of embodied rewards: per sub-step, or summed per chunk."""

AllReduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over data-parallel ranks and returns the sum (e.g. a wrapper of
``torch.distributed.all_reduce``). Used for global statistics; None means local."""


class AdvantageResult(NamedTuple):
    """What an estimator returns; unpacks as ``advantages, returns``.

    Attributes:
        advantages: Same layout as the estimator's output (embodied [T, B, C] or
            [T, B, 1]; reasoning [N, L]).
        returns: Value targets of the same shape, or None for estimators that
            have none (GRPO).
    """

    advantages: torch.Tensor
    returns: torch.Tensor | None


@dataclass(frozen=True)
class EmbodiedAdvantageInputs:
    """Embodied rollout data in the T+1 convention.

    Attributes:
        rewards: [T, B, C] float, per sub-step rewards.
        dones: [T + 1, B, C] bool. Row 0 is the all-false bootstrap row (it is
            never read); ``dones[t + 1, b, c]`` means sub-step ``c`` of chunk step
            ``t`` ended an episode (termination or truncation).
        values: [T + 1, B, V] with V == C (action-level head) or V == 1
            (chunk-level head); the last row is the value of the final state.
            Needed by "gae"; None there means all-zero values.
        loss_mask: [T, B, C] or [T, B, 1] bool from
            :func:`~rlinf.core.algorithms.compute_loss_mask`, or None when every
            step is valid (auto-reset runs). "grpo" derives it from ``dones``
            when None.
        gamma: Discount per sub-step (action_level) or per chunk (chunk_level).
        gae_lambda: GAE lambda.
        reward_type: "action_level" or "chunk_level".
        group_size: GRPO group size G: envs ``[k*G, (k+1)*G)`` form group k.
        normalize_advantages: "gae" only: whiten the advantages over the valid
            entries (the reference always does; "grpo" is group-normalised already
            and ignores this).
        eps: Added to the standard deviation in every normalisation.
        all_reduce: Makes the "gae" whitening statistics global over ranks.
    """

    rewards: torch.Tensor
    dones: torch.Tensor
    values: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    gamma: float = 1.0
    gae_lambda: float = 1.0
    reward_type: RewardType = "action_level"
    group_size: int = 1
    normalize_advantages: bool = True
    eps: float = 1e-6
    all_reduce: AllReduce | None = None


@dataclass(frozen=True)
class ReasoningAdvantageInputs:
    """Reasoning (LLM) rollout data: one scalar reward per response.

    Attributes:
        rewards: [N] float, one per response; G consecutive responses share a prompt.
        response_mask: [N, L] bool, true on the response tokens.
        group_size: G, the responses per prompt.
        norm_by_std: "grpo": divide by the group std (False: only subtract the mean).
        normalize_advantages: "grpo": afterwards whiten over all valid tokens
            (token-weighted; global when ``all_reduce`` is given).
        logprobs: [N, L] log-probs of the sampling (old) policy; for the
            REINFORCE++ KL penalty.
        ref_logprobs: [N, L] log-probs of the reference model.
        kl_beta: REINFORCE++ per-token KL coefficient (0 disables the penalty).
        kl_kind: KL estimator for the penalty (see :func:`kl_penalty`).
        gamma: REINFORCE++ per-token discount.
        use_baseline: REINFORCE++: subtract the group mean reward first.
        eps: Added to the standard deviation in every normalisation.
        all_reduce: Makes whitening statistics global over ranks.
    """

    rewards: torch.Tensor
    response_mask: torch.Tensor
    group_size: int = 1
    norm_by_std: bool = True
    normalize_advantages: bool = False
    logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    kl_beta: float = 0.0
    kl_kind: str = "k2"
    gamma: float = 1.0
    use_baseline: bool = False
    eps: float = 1e-6
    all_reduce: AllReduce | None = None


AdvantageInputs = EmbodiedAdvantageInputs | ReasoningAdvantageInputs
"""Either input record."""
