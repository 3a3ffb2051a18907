"""The runner's advice on ``pipeline_stage_num`` and ``in_env_process`` (pure functions of
measured times)."""

from __future__ import annotations

from rlinf.embodied.pipelining import (
    _HANDOFF_SHARE,
    _PIPELINE_MARGIN,
    in_env_process_advice,
    pipeline_advice,
)


def test_one_stage_gets_no_advice() -> None:
    assert pipeline_advice(1, env_seconds=0.0, policy_seconds=0.0, rollout_seconds=1.0) is None


def test_balanced_env_and_policy_keep_their_stages() -> None:
    # Two stages overlapped 0.4 s of env and 0.4 s of policy into 0.5 s: one stage
    # would take about 0.4 + 0.4 + 0.1 / 2 = 0.85 s.
    assert pipeline_advice(2, env_seconds=0.4, policy_seconds=0.4, rollout_seconds=0.5) is None


def test_cheap_env_and_policy_make_stages_lose_and_the_message_says_so() -> None:
    # CartPole-like: 0.08 s of env, 0.06 s of policy, the rest of 0.29 s is hand-offs;
    # one stage: 0.14 + 0.21 / 2 = 0.245 s.
    message = pipeline_advice(2, env_seconds=0.08, policy_seconds=0.06, rollout_seconds=0.29)
    assert message is not None
    assert "rollout.pipeline_stage_num=2" in message and "pipeline_stage_num: 1" in message
    assert "0.245 s" in message and "0.290 s" in message


def test_the_margin_keeps_near_ties_quiet() -> None:
    # env e, no policy, a 1 s rollout, 2 stages: one stage estimated at (1 + e) / 2.
    limit = 1.0 - 2 * _PIPELINE_MARGIN  # the e at which the estimate is the margin below 1 s
    inside, outside = limit + 0.01, limit - 0.01
    assert pipeline_advice(2, env_seconds=inside, policy_seconds=0.0, rollout_seconds=1.0) is None
    assert pipeline_advice(2, env_seconds=outside, policy_seconds=0.0, rollout_seconds=1.0)


# ----------------------------------------------------------------------------- in_env_process


def test_one_stage_mostly_hand_offs_suggests_the_policy_in_the_env_process() -> None:
    # The README's CartPole job with a rollout group: 0.09 s of env and 0.06 s of policy
    # in a 0.34 s rollout, so 0.19 s of hand-offs.
    message = in_env_process_advice(env_seconds=0.09, policy_seconds=0.06, rollout_seconds=0.34)
    assert message is not None
    assert "rollout.in_env_process: true runs the policy in the env workers" in message
    assert "0.190 s of this 0.340 s rollout" in message


def test_hand_offs_below_the_share_get_no_in_env_process_advice() -> None:
    costs = {"env_seconds": 0.5, "policy_seconds": 0.5 - _HANDOFF_SHARE + 0.01}
    assert in_env_process_advice(**costs, rollout_seconds=1.0) is None  # just under
    costs["policy_seconds"] -= 0.02
    assert in_env_process_advice(**costs, rollout_seconds=1.0)  # just over
    assert in_env_process_advice(**costs, rollout_seconds=0.0) is None
