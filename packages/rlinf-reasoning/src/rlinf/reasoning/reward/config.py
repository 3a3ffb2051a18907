"""The ``reward`` config section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlinf.core.config import RLinfModel

__all__ = ["RewardConfig"]


class RewardConfig(RLinfModel):
    """Rule-based reward settings (``reward``); unknown keys are errors.

    A correct response scores ``+reward_scale`` times the scorer's ``correct`` value,
    a wrong one ``reward_scale`` times its ``incorrect`` value (see
    :class:`~rlinf.reasoning.reward.MathRewardScorer`).
    """

    reward_type: Literal["math"] = Field(
        "math", description="Which rule-based reward to use; only 'math' exists."
    )
    reward_scale: float = Field(
        1.0, gt=0, description="Multiplies the correct and incorrect scores."
    )
    timeout_s: float = Field(
        5.0, gt=0, description="Hard limit in seconds for scoring one response."
    )
    num_workers: int | None = Field(
        None, ge=1, description="Scoring processes; null means min(CPUs, 8)."
    )
