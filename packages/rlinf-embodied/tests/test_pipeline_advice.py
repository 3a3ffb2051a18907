"""The runner's choice and advice on ``pipeline_stage_num`` (pure functions of measured rates)."""

from __future__ import annotations

from rlinf.embodied.pipelining import (
    HANDOFF_SHARE,
    PIPELINE_MARGIN,
    StageChooser,
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
    limit = 1.0 - 2 * PIPELINE_MARGIN  # the e at which the estimate is the margin below 1 s
    inside, outside = limit + 0.01, limit - 0.01
    assert pipeline_advice(2, env_seconds=inside, policy_seconds=0.0, rollout_seconds=1.0) is None
    assert pipeline_advice(2, env_seconds=outside, policy_seconds=0.0, rollout_seconds=1.0)


# ----------------------------------------------------------------------------- in_env_process


def test_one_stage_mostly_hand_offs_suggests_the_policy_in_the_env_process() -> None:
    # The README's CartPole job with a rollout group: 0.09 s of env and 0.06 s of policy
    # in a 0.34 s rollout, so 0.19 s of hand-offs.
    message = in_env_process_advice(env_seconds=0.09, policy_seconds=0.06, rollout_seconds=0.34)
    assert message is not None
    assert "rollout.in_env_process: auto" in message
    assert "0.190 s of this 0.340 s rollout" in message


def test_hand_offs_below_the_share_get_no_in_env_process_advice() -> None:
    costs = {"env_seconds": 0.5, "policy_seconds": 0.5 - HANDOFF_SHARE + 0.01}
    assert in_env_process_advice(**costs, rollout_seconds=1.0) is None  # just under
    costs["policy_seconds"] -= 0.02
    assert in_env_process_advice(**costs, rollout_seconds=1.0)  # just over
    assert in_env_process_advice(**costs, rollout_seconds=0.0) is None


# ----------------------------------------------------------------------------- StageChooser


def test_one_stage_or_disabled_never_merges() -> None:
    for chooser in (StageChooser(1, True), StageChooser(2, False)):
        assert not chooser.active
        for _ in range(5):
            assert not chooser.next_merged()
            assert chooser.record(100.0) is None


def test_the_third_rollout_is_the_merged_trial_and_the_faster_mode_stays() -> None:
    chooser = StageChooser(2, True)
    modes, said = [], []
    for rate in (50.0, 100.0, 150.0, 10.0, 10.0):  # warm-up, pipelined, merged, then slow
        modes.append(chooser.next_merged())
        said.append(chooser.record(rate))
    assert modes == [False, False, True, True, True]
    assert said[:2] == [None, None] and said[3:] == [None, None]
    message = said[2]
    assert message is not None
    assert "pipeline_stage_num=2" in message and "100" in message and "150" in message
    assert "merged from now on" in message and "rollout.adaptive_stages" in message


def test_a_slower_merged_trial_keeps_the_stages_pipelined() -> None:
    chooser = StageChooser(2, True)
    for rate in (50.0, 100.0, 90.0):
        chooser.record(rate)
    assert chooser.merged is False and not chooser.next_merged()


def test_the_state_round_trips_so_a_resumed_run_repeats_the_trials() -> None:
    straight = StageChooser(2, True)
    straight.record(50.0)
    straight.record(100.0)  # saved here, before the merged trial
    resumed = StageChooser(2, True)
    resumed.load_state(straight.state())
    assert resumed.next_merged() is straight.next_merged() is True
    assert resumed.record(120.0) == straight.record(120.0)
    assert resumed.merged is straight.merged is True
