"""The auto-placement cost model and enumeration (pure functions, no Ray)."""

from __future__ import annotations

import math

import pytest

from rlinf.core.autoplace import (
    AutoPlaceReport,
    format_report,
    medians,
    ranked_report,
    report_to_json,
)
from rlinf.sched.autoplace import (
    EmbodiedLayout,
    EmbodiedProfile,
    ReasoningLayout,
    ReasoningProfile,
    component_world_size,
    config_slots,
    enumerate_embodied,
    enumerate_reasoning,
    predict_embodied,
    predict_reasoning,
    search_embodied,
    search_reasoning,
)

COLLOCATED2 = EmbodiedLayout((0, 1), (0, 1), (0, 1), 1)
HYBRID2 = EmbodiedLayout((0, 0), (1, 1), (0, 1), 1)


def test_enumerate_embodied_on_two_slots() -> None:
    layouts = enumerate_embodied(2, max_stages=2)
    assert [(lay.placement(), lay.stages, lay.mode) for lay in layouts] == [
        ({"actor,env,rollout": "0-1"}, 1, "collocated"),
        ({"actor": "0-1", "env": "0", "rollout": "1"}, 1, "hybrid"),
        ({"actor,rollout": "1", "env": "0"}, 1, "hybrid"),
        ({"actor": "0-1", "env": "0", "rollout": "1"}, 2, "hybrid"),
        ({"actor,rollout": "1", "env": "0"}, 2, "hybrid"),
    ]


def test_enumerate_embodied_group_sizes_and_disaggregated() -> None:
    layouts = enumerate_embodied(4, max_stages=4)
    stages = {lay.stages for lay in layouts}
    assert stages == {1, 2, 4}
    splits = {(lay.size("env"), lay.size("rollout")) for lay in layouts if lay.mode != "collocated"}
    assert {(1, 3), (2, 2), (3, 1)} <= splits  # every env/rollout group size
    disagg = [lay for lay in layouts if lay.mode == "disaggregated"]
    assert disagg and all(lay.size("actor") >= 1 for lay in disagg)
    assert EmbodiedLayout((0, 1), (2, 2), (3, 3), 2) in disagg
    assert len(set(layouts)) == len(layouts)  # no duplicates
    assert enumerate_embodied(1) == [EmbodiedLayout((0, 0), (0, 0), (0, 0), 1)]


@pytest.mark.parametrize("bad", [0, -1])
def test_enumerate_refuses_no_slots(bad: int) -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        enumerate_embodied(bad)
    with pytest.raises(ValueError, match="at least one slot"):
        enumerate_reasoning(bad)
    with pytest.raises(ValueError, match="pipeline_stage_num is at least 1"):
        enumerate_embodied(2, max_stages=bad)


def test_collocated_sums_the_phases_and_scales_with_slots() -> None:
    # Measured collocated on 2 slots: 2 slot-seconds of env work, 4 of policy work.
    prof = EmbodiedProfile(env_s=1.0, rollout_s=2.0, actor_s=0.5, slots=2, sync_s=0.1)
    terms = predict_embodied(prof, COLLOCATED2)
    assert terms["rollout"] == pytest.approx(3.0)
    assert terms["actor"] == pytest.approx(0.5)
    assert terms["step"] == pytest.approx(3.0 + 0.5 + 0.1)
    one = EmbodiedLayout((0, 0), (0, 0), (0, 0), 1)
    assert predict_embodied(prof, one)["rollout"] == pytest.approx(6.0)  # half the slots


def test_pipelining_overlaps_env_and_policy_on_separate_slots() -> None:
    prof = EmbodiedProfile(env_s=1.0, rollout_s=1.0, actor_s=0.0, slots=2)
    # env 2 s on one slot, policy 2 s on the other
    for stages, expected in ((1, 4.0), (2, 3.0), (4, 2.5)):
        layout = EmbodiedLayout((0, 0), (1, 1), (0, 1), stages)
        assert predict_embodied(prof, layout)["rollout"] == pytest.approx(expected)
    # policy 4x env: max + min / S
    prof = EmbodiedProfile(env_s=0.25, rollout_s=1.0, actor_s=0.0, slots=2)
    layout = EmbodiedLayout((0, 0), (1, 1), (0, 1), 2)
    assert predict_embodied(prof, layout)["rollout"] == pytest.approx(2.0 + 0.5 / 2)
    # The pipeline fills and drains once per rollout: one stage of one of K chunk steps.
    prof = EmbodiedProfile(env_s=0.25, rollout_s=1.0, actor_s=0.0, slots=2, rounds=8)
    assert predict_embodied(prof, layout)["rollout"] == pytest.approx(2.0 + 0.5 / 16)
    one_stage = EmbodiedLayout((0, 0), (1, 1), (0, 1), 1)
    assert predict_embodied(prof, one_stage)["rollout"] == pytest.approx(2.5)


def test_handoffs_make_more_stages_cost() -> None:
    prof = EmbodiedProfile(env_s=0.1, rollout_s=0.1, actor_s=0.0, slots=2, handoff_s=0.2)
    t = {
        s: predict_embodied(prof, EmbodiedLayout((0, 0), (1, 1), (0, 1), s))["rollout"]
        for s in (1, 2, 4)
    }
    assert t[1] < t[2] < t[4]  # cheap env and policy: one stage wins


def test_actor_group_size_scales_training() -> None:
    prof = EmbodiedProfile(env_s=0.0, rollout_s=0.0, actor_s=1.0, slots=2)
    assert predict_embodied(prof, HYBRID2)["actor"] == pytest.approx(1.0)
    with_rollout = EmbodiedLayout((0, 0), (1, 1), (1, 1), 1)
    assert predict_embodied(prof, with_rollout)["actor"] == pytest.approx(2.0)


def test_search_ranks_fastest_first_and_reports_refusals() -> None:
    env_heavy = EmbodiedProfile(env_s=3.0, rollout_s=0.1, actor_s=0.1, slots=4)
    cands, skipped = search_embodied(
        env_heavy,
        4,
        max_stages=2,
        overrides=lambda lay: {"env.train.num_envs": 12 // lay.size("env")},
        refuse=lambda lay: "three env ranks" if lay.size("env") == 3 else None,
    )
    times = [c.predicted_step_s for c in cands]
    assert times == sorted(times)
    assert skipped and all("three env ranks" in s for s in skipped)
    assert all(c.overrides["rollout.pipeline_stage_num"] in (1, 2) for c in cands)
    assert all("env.train.num_envs" in c.overrides for c in cands)
    # The best spends the most slots on the env (or shares all of them: collocated).
    best = cands[0]
    assert best.mode == "collocated" or best.placement["env"] == "0-1"


def test_pipelining_wins_when_collocation_pays_a_weight_sync() -> None:
    """Equal env and policy on 2 slots: hybrid with 2 stages beats collocated only if the
    collocated phases add up to more than the pipeline's fill and drain."""
    prof = EmbodiedProfile(env_s=1.0, rollout_s=1.0, actor_s=0.1, slots=2)
    col = predict_embodied(prof, COLLOCATED2)["step"]
    hyb = predict_embodied(prof, EmbodiedLayout((0, 0), (1, 1), (0, 1), 4))["step"]
    assert col < hyb  # ideal data parallelism: collocated is never slower here
    assert math.isclose(col, 2.1)


def test_profile_refuses_negative_or_nan_costs() -> None:
    with pytest.raises(ValueError, match=r"env_cost=-1\.0"):
        EmbodiedProfile(env_s=-1.0, rollout_s=0.0, actor_s=0.0, slots=1)
    with pytest.raises(ValueError, match="inference_cost=nan"):
        ReasoningProfile(rollout_s=1, reward_s=0, inference_s=float("nan"), actor_s=1, slots=1)
    with pytest.raises(ValueError, match="slots=0"):
        EmbodiedProfile(env_s=1.0, rollout_s=0.0, actor_s=0.0, slots=0)
    with pytest.raises(ValueError, match="rounds=0"):
        EmbodiedProfile(env_s=1.0, rollout_s=0.0, actor_s=0.0, slots=1, rounds=0)


def test_reasoning_model_and_enumeration() -> None:
    layouts = enumerate_reasoning(3)
    assert [lay.placement() for lay in layouts] == [
        {"actor,rollout,reward": "0-2"},
        {"actor": "0", "rollout": "1-2", "reward": "1-2"},
        {"actor": "0-1", "rollout": "2", "reward": "2"},
    ]
    prof = ReasoningProfile(
        rollout_s=2.0, reward_s=0.0, inference_s=1.0, actor_s=1.0, slots=2, groups=4
    )
    col = predict_reasoning(prof, ReasoningLayout((0, 1), (0, 1)))
    assert col["generate"] == pytest.approx(3.0)
    dis = predict_reasoning(prof, ReasoningLayout((0, 0), (1, 1)))
    # rollout 4 s, inference 2 s on one slot each: overlap but one chunk's fill
    assert dis["generate"] == pytest.approx(4.0 + 2.0 / 4)
    assert dis["actor"] == pytest.approx(2.0)
    cands, _ = search_reasoning(prof, 2)
    assert cands[0].mode == "collocated"
    rollout_bound = ReasoningProfile(
        rollout_s=0.5, reward_s=0.0, inference_s=0.5, actor_s=0.0, slots=2, groups=8, sync_s=0.0
    )
    cands, _ = search_reasoning(
        rollout_bound, 2, refuse=lambda lay: "no" if lay.mode == "collocated" else None
    )
    assert [c.mode for c in cands] == ["disaggregated"]


def test_slots_and_world_sizes_from_a_placement() -> None:
    placement = {"actor": "0-7", "env": "0-3", "rollout": "4-7"}
    assert config_slots(placement, num_nodes=1, cpu_slots_per_node=0) == 8
    assert config_slots(placement, num_nodes=2, cpu_slots_per_node=3) == 6
    assert component_world_size(placement, "env", 8) == 4
    assert component_world_size({"actor,env,rollout": "0-1:0-3"}, "rollout", 2) == 4
    with pytest.raises(ValueError, match="--slots N"):
        config_slots({"actor,env,rollout": "all"}, num_nodes=1, cpu_slots_per_node=0)
    with pytest.raises(ValueError, match="does not place 'critic'"):
        component_world_size(placement, "critic", 8)


def test_report_formats_as_a_table_and_json() -> None:
    prof = EmbodiedProfile(env_s=1.0, rollout_s=1.0, actor_s=0.1, slots=2)
    cands, skipped = search_embodied(prof, 2, max_stages=2)
    report = AutoPlaceReport(cands, {"env_cost": 1.0}, "profile_data", 2, skipped)
    text = format_report(report, top=2)
    assert text.splitlines()[3].lstrip().startswith("1")
    assert '"actor,env,rollout": 0-1' in text
    assert "pipeline_stage_num: 1" in text
    assert "(3 more; --top to show them)" in text
    import json

    data = json.loads(report_to_json(report, top=1))
    assert data["candidates"][0]["rank"] == 1
    assert data["candidates"][0]["placement"] == {"actor,env,rollout": "0-1"}
    assert len(data["candidates"]) == 1


def test_medians_and_ranked_report_refuse_empty_inputs() -> None:
    med = medians([{"a": 3.0}, {"a": 1.0}, {"a": 2.0}])
    assert med("a") == 2.0
    with pytest.raises(ValueError, match="no timed steps"):
        medians([])
    prof = EmbodiedProfile(env_s=1.0, rollout_s=1.0, actor_s=0.1, slots=2)
    cands, skipped = search_embodied(prof, 2, max_stages=2)
    report = ranked_report(cands, skipped, {"env_cost": 1.0}, "profiled", 2)
    assert report == AutoPlaceReport(cands, {"env_cost": 1.0}, "profiled", 2, skipped)
    with pytest.raises(ValueError, match="no placement passes the config's rules:\n  why"):
        ranked_report([], ["why"], {}, "profiled", 2)
