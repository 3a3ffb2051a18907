"""Shared RL math for the embodied and reasoning stacks (needs torch: ``rlinf-core[rl]``).

Registries resolve ``algorithm.adv_type`` and ``algorithm.loss_type``::

    from rlinf.core.algorithms import EmbodiedAdvantageInputs, get_advantage, get_policy_loss

    adv, ret = get_advantage("gae")(EmbodiedAdvantageInputs(rewards, dones, values, gamma=0.99))
    loss, metrics = get_policy_loss("ppo")(logprobs=lp, old_logprobs=old, advantages=a,
                                           loss_mask=m, clip_ratio_low=0.2, clip_ratio_high=0.28)

Modules: ``registry`` (name tables), ``inputs`` (estimator inputs/outputs),
``embodied_advantages`` / ``reasoning_advantages`` (the math),
``advantages`` (the registered estimators), ``loss_mask``, ``losses``, ``kl``,
``entropy``, ``off_policy`` (truncated IS, ratio early stop), ``sac`` (soft
actor-critic losses, Polyak update), ``utils`` (masked
reductions, whitening, loss aggregation), ``step_metrics`` (metric means read
once per step).
See ``docs/algorithms.md``.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rlinf.core.algorithms needs torch, an optional dependency of rlinf-core. "
        "Fix: pip install 'rlinf-core[rl]' (or install torch)"
    ) from exc

from rlinf.core.algorithms.advantages import (
    gae_advantage,
    grpo_advantage,
    reinforce_plus_plus_advantage,
)
from rlinf.core.algorithms.embodied_advantages import (
    compute_embodied_gae,
    compute_embodied_grpo,
    resize_loss_mask,
)
from rlinf.core.algorithms.entropy import entropy_from_logits
from rlinf.core.algorithms.inputs import (
    AdvantageInputs,
    AdvantageResult,
    AllReduce,
    EmbodiedAdvantageInputs,
    ReasoningAdvantageInputs,
    RewardType,
)
from rlinf.core.algorithms.kl import KL_KINDS, kl_penalty
from rlinf.core.algorithms.loss_mask import LossMask, compute_loss_mask
from rlinf.core.algorithms.losses import explained_variance, ppo_policy_loss, value_loss
from rlinf.core.algorithms.off_policy import early_stop_ratio_exceeded, truncated_is_weights
from rlinf.core.algorithms.reasoning_advantages import (
    compute_grpo_advantages,
    compute_reinforce_plus_plus,
)
from rlinf.core.algorithms.registry import (
    AdvantageFn,
    PolicyLossFn,
    available_advantages,
    available_policy_losses,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)
from rlinf.core.algorithms.sac import (
    default_target_entropy,
    polyak_update,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_loss,
    sac_q_target,
)
from rlinf.core.algorithms.step_metrics import MetricMeans, to_floats
from rlinf.core.algorithms.utils import (
    LOSS_AGG_MODES,
    LossAggMode,
    agg_loss,
    group_normalize,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageResult",
    "AllReduce",
    "EmbodiedAdvantageInputs",
    "LossAggMode",
    "LossMask",
    "MetricMeans",
    "PolicyLossFn",
    "ReasoningAdvantageInputs",
    "RewardType",
    "agg_loss",
    "available_advantages",
    "available_policy_losses",
    "compute_embodied_gae",
    "compute_embodied_grpo",
    "compute_grpo_advantages",
    "compute_loss_mask",
    "compute_reinforce_plus_plus",
    "default_target_entropy",
    "early_stop_ratio_exceeded",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantage",
    "get_advantage",
    "get_policy_loss",
    "group_normalize",
    "grpo_advantage",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "polyak_update",
    "ppo_policy_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_plus_plus_advantage",
    "resize_loss_mask",
    "sac_actor_loss",
    "sac_alpha_loss",
    "sac_critic_loss",
    "sac_q_target",
    "to_floats",
    "truncated_is_weights",
    "value_loss",
]
