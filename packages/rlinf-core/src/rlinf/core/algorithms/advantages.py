"""The registered advantage estimators ("gae", "grpo", "reinforce_plus_plus").

Each takes an :class:`EmbodiedAdvantageInputs` or
:class:`ReasoningAdvantageInputs` and returns an :class:`AdvantageResult`:

* ``gae``: embodied only. :func:`compute_embodied_gae`, then (by default)
  whitening of the advantages over the loss mask.
* ``grpo``: both stacks. Embodied: :func:`compute_embodied_grpo`. Reasoning:
  :func:`compute_grpo_advantages`, then optional whitening over valid tokens.
  No returns.
* ``reinforce_plus_plus`` (alias ``reinpp``): reasoning only.
  :func:`compute_reinforce_plus_plus`.
"""

from __future__ import annotations

from typing import TypeVar

from rlinf.core.algorithms.embodied_advantages import (
    compute_embodied_gae,
    compute_embodied_grpo,
    resize_loss_mask,
)
from rlinf.core.algorithms.inputs import (
    AdvantageInputs,
    AdvantageResult,
    EmbodiedAdvantageInputs,
    ReasoningAdvantageInputs,
)
from rlinf.core.algorithms.reasoning_advantages import (
    compute_grpo_advantages,
    compute_reinforce_plus_plus,
)
from rlinf.core.algorithms.registry import register_advantage
from rlinf.core.algorithms.utils import masked_whiten

__all__ = ["gae_advantage", "grpo_advantage", "reinforce_plus_plus_advantage"]

_I = TypeVar("_I", EmbodiedAdvantageInputs, ReasoningAdvantageInputs)


def _require(name: str, inputs: AdvantageInputs, kind: type[_I]) -> _I:
    if not isinstance(inputs, kind):
        stack = "embodied" if kind is EmbodiedAdvantageInputs else "reasoning"
        raise ValueError(
            f"algorithm.adv_type={name!r} supports {stack} inputs only "
            f"(got {type(inputs).__name__}). Fix: pick an estimator for your stack "
            "(embodied: gae, grpo; reasoning: grpo, reinforce_plus_plus)"
        )
    return inputs


@register_advantage("gae")
def gae_advantage(inputs: AdvantageInputs) -> AdvantageResult:
    """Embodied GAE; advantages whitened over the loss mask if ``normalize_advantages``.

    Args:
        inputs: :class:`EmbodiedAdvantageInputs`.

    Returns:
        ``(advantages, returns)`` [T, B, C] or [T, B, 1].

    Raises:
        ValueError: For reasoning inputs or malformed embodied inputs.
    """
    x = _require("gae", inputs, EmbodiedAdvantageInputs)
    adv, ret = compute_embodied_gae(
        x.rewards,
        x.dones,
        x.values,
        gamma=x.gamma,
        gae_lambda=x.gae_lambda,
        reward_type=x.reward_type,
    )
    if x.normalize_advantages:
        t, b, c = x.rewards.shape
        mask = (
            None if x.loss_mask is None else resize_loss_mask(x.loss_mask, (t, b, c), x.reward_type)
        )
        adv = masked_whiten(adv, mask, eps=x.eps, all_reduce=x.all_reduce)
    return AdvantageResult(adv, ret)


@register_advantage("grpo")
def grpo_advantage(inputs: AdvantageInputs) -> AdvantageResult:
    """GRPO for either stack (dispatches on the input type); returns is None.

    Args:
        inputs: Embodied or reasoning inputs.

    Returns:
        ``(advantages, None)``: [T, B, C]/[T, B, 1] embodied, [N, L] reasoning.

    Raises:
        ValueError: For malformed inputs, G < 2 or a batch of partial groups.
    """
    if isinstance(inputs, EmbodiedAdvantageInputs):
        adv = compute_embodied_grpo(
            inputs.rewards,
            inputs.dones,
            group_size=inputs.group_size,
            loss_mask=inputs.loss_mask,
            reward_type=inputs.reward_type,
            eps=inputs.eps,
        )
        return AdvantageResult(adv, None)
    x = _require("grpo", inputs, ReasoningAdvantageInputs)
    adv = compute_grpo_advantages(
        x.rewards, x.response_mask, group_size=x.group_size, norm_by_std=x.norm_by_std, eps=x.eps
    )
    if x.normalize_advantages:
        mask = x.response_mask.bool()
        adv = masked_whiten(adv, mask, eps=x.eps, all_reduce=x.all_reduce) * mask.to(adv.dtype)
    return AdvantageResult(adv, None)


@register_advantage("reinforce_plus_plus", aliases=("reinpp",))
def reinforce_plus_plus_advantage(inputs: AdvantageInputs) -> AdvantageResult:
    """REINFORCE++ for reasoning inputs.

    Args:
        inputs: :class:`ReasoningAdvantageInputs`.

    Returns:
        ``(advantages, returns)``, both [N, L].

    Raises:
        ValueError: For embodied inputs or malformed reasoning inputs.
    """
    x = _require("reinforce_plus_plus", inputs, ReasoningAdvantageInputs)
    adv, ret = compute_reinforce_plus_plus(
        x.rewards,
        x.response_mask,
        gamma=x.gamma,
        logprobs=x.logprobs,
        ref_logprobs=x.ref_logprobs,
        kl_beta=x.kl_beta,
        kl_kind=x.kl_kind,
        group_size=x.group_size,
        use_baseline=x.use_baseline,
        eps=x.eps,
        all_reduce=x.all_reduce,
    )
    return AdvantageResult(adv, ret)
