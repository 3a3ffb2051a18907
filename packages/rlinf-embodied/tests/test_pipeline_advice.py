"""The runner's choice and advice on ``pipeline_stage_num`` (pure functions of measured rates)."""

from __future__ import annotations

from rlinf.embodied.pipelining import (
    HANDOFF_SHARE,
    PIPELINE_MARGIN,
    PIPELINED_MARGIN,
    TRIAL_ROLLOUTS,
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
    assert "rollout.in_env_process: true (auto, where the env ranks hold no GPU)" in message
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


def test_two_trials_per_mode_and_the_faster_best_trial_stays() -> None:
    assert TRIAL_ROLLOUTS == 2  # the rates below spell out two trials per mode
    chooser = StageChooser(2, True)
    modes, said = [], []
    # warm-up, pipelined 100 and (slowed) 60, merged (first resets) 90 and 150, then slow
    for rate in (50.0, 100.0, 60.0, 90.0, 150.0, 10.0, 10.0):
        modes.append(chooser.next_merged())
        said.append(chooser.record(rate))
    assert modes == [False, False, False, True, True, True, True]
    assert said[:4] == [None] * 4 and said[5:] == [None, None]
    message = said[4]
    assert message is not None
    assert "pipeline_stage_num=2" in message and "100" in message and "150" in message
    assert "best of 2" in message
    assert "merged from now on" in message and "rollout.adaptive_stages" in message


def test_one_slow_pipelined_trial_does_not_flip_the_choice() -> None:
    """Each mode counts with its best trial: a slowed pipelined rollout (a load burst)
    does not make a slower merged mode win."""
    chooser = StageChooser(2, True)
    for rate in (50.0, 40.0, 120.0, 100.0, 90.0):  # pipelined 40 (slowed), 120; merged 100, 90
        chooser.record(rate)
    assert chooser.merged is False and not chooser.next_merged()


def test_pipelined_stages_stay_only_when_clearly_faster() -> None:
    assert PIPELINED_MARGIN == 0.1  # the rates below sit on either side of it
    for merged_best, merged in ((100.0, True), (91.0, True), (90.0, True), (89.0, False)):
        chooser = StageChooser(2, True)
        for rate in (50.0, 99.0, 99.0, merged_best - 5.0, merged_best):
            chooser.record(rate)
        assert chooser.merged is merged, (merged_best, chooser.merged)
        assert chooser.next_merged() is merged


def test_the_state_round_trips_so_a_resumed_run_repeats_the_trials() -> None:
    straight = StageChooser(2, True)
    for rate in (50.0, 100.0, 80.0, 110.0):  # saved here, between the two merged trials
        straight.record(rate)
    resumed = StageChooser(2, True)
    resumed.load_state(straight.state())
    assert resumed.next_merged() is straight.next_merged() is True
    assert resumed.record(90.0) == straight.record(90.0)  # best merged 110 > 100
    assert resumed.merged is straight.merged is True


def test_a_state_saved_before_the_merged_rate_was_kept_loads() -> None:
    """Checkpoints from before several trials per mode have no ``merged_rate``."""
    chooser = StageChooser(2, True)
    chooser.load_state({"rollouts": 2, "merged": None, "pipelined_rate": 100.0})
    assert not chooser.next_merged()  # rollout 3: the second pipelined trial
    chooser.record(90.0)
    assert chooser.next_merged()
    chooser.record(120.0)
    assert chooser.record(80.0) is not None and chooser.merged is True
