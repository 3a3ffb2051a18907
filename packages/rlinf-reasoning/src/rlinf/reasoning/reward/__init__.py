r"""Math rewards: answer extraction and equivalence, and a process-pool scorer.

* :func:`verify` / :func:`is_equiv` / :func:`extract_boxed_answer` /
  :func:`normalize_answer`: the pure checks (see :mod:`.math_verifier` for the rules);
* :class:`MathRewardScorer`: batch scoring with a hard per-sample timeout;
* :class:`RewardConfig`: the ``reward`` config section.

Example::

    with MathRewardScorer.from_config(RewardConfig(reward_scale=5.0)) as scorer:
        rewards = scorer.score([r"... \boxed{42}"], [["42"]])  # [5.0]
"""

from rlinf.reasoning.reward.config import RewardConfig
from rlinf.reasoning.reward.math_verifier import (
    extract_boxed_answer,
    is_equiv,
    normalize_answer,
    reference_answer,
    verify,
)
from rlinf.reasoning.reward.scorer import MathRewardScorer, VerifyFn, default_num_workers

__all__ = [
    "MathRewardScorer",
    "RewardConfig",
    "VerifyFn",
    "default_num_workers",
    "extract_boxed_answer",
    "is_equiv",
    "normalize_answer",
    "reference_answer",
    "verify",
]
