"""The runner's one-time advice on ``pipeline_stage_num`` (a pure function of measured times)."""

from __future__ import annotations

import pytest

from rlinf.embodied.runner import PIPELINE_MIN_GAIN, pipeline_advice


def test_one_stage_gets_no_advice() -> None:
    assert pipeline_advice(1, env_seconds=0.0, policy_seconds=0.0, rollout_seconds=1.0) is None


def test_balanced_env_and_policy_keep_their_stages() -> None:
    # Env and policy each take 40% of the rollout: overlapping can save up to 40%.
    assert pipeline_advice(2, env_seconds=0.4, policy_seconds=0.4, rollout_seconds=1.0) is None


@pytest.mark.parametrize(("env_s", "policy_s"), [(0.05, 0.8), (0.8, 0.05), (0.02, 0.03)])
def test_a_cheap_side_makes_stages_useless_and_the_message_says_why(
    env_s: float, policy_s: float
) -> None:
    message = pipeline_advice(2, env_seconds=env_s, policy_seconds=policy_s, rollout_seconds=1.0)
    assert message is not None
    assert "rollout.pipeline_stage_num=2" in message and "pipeline_stage_num: 1" in message
    assert f"at most {min(env_s, policy_s):.0%}" in message


def test_the_threshold_is_the_documented_bound() -> None:
    at = PIPELINE_MIN_GAIN
    assert pipeline_advice(2, env_seconds=at, policy_seconds=1.0, rollout_seconds=1.0) is None
    below = at * 0.99
    assert pipeline_advice(2, env_seconds=below, policy_seconds=1.0, rollout_seconds=1.0)
