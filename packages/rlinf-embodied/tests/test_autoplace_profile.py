"""``rlinf auto-place`` for embodied configs: profile_data, candidate configs, real profiling.

The real-profiling test starts Ray and the three CartPole groups collocated on
two CPU slots, times one step after a warm-up step, and searches placements.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.core.config import ConfigError, compose_config, validate_config
from rlinf.embodied.autoplace_profile import (
    apply_candidate,
    auto_place,
    candidate_config,
    launch_embodied_groups,
    profile_from_steps,
    total_envs,
)
from rlinf.embodied.config import EmbodiedConfig
from rlinf.sched import Cluster
from rlinf.sched.autoplace import EmbodiedLayout

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"


def _cfg(tmp_path: Path, *overrides: str) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [f"runner.logger.log_path={tmp_path}", *overrides],
    )
    return validate_config(data, EmbodiedConfig)


def test_profile_data_ranks_placements_without_ray(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path, "+profile_data={env_cost: 0.2, rollout_cost: 0.8, actor_cost: 0.1, sync_cost: 0}"
    )
    report = auto_place(cfg, max_stages=2)
    assert report.source == "profile_data"
    assert report.num_slots == 2
    times = [c.predicted_step_s for c in report.candidates]
    assert times == sorted(times)
    assert report.candidates[0].mode == "collocated"
    # 16 envs on the one env rank of the config: 8 per rank when collocated on 2 slots.
    assert report.candidates[0].overrides == {
        "rollout.pipeline_stage_num": 1,
        "env.train.num_envs": 8,
        "rollout.in_env_process": False,
    }
    # The config runs the policy in the env process; every suggestion places a
    # rollout group, so pasting one must give a config that validates.
    assert cfg.rollout.in_env_process
    for candidate in report.candidates:
        applied = apply_candidate(cfg, candidate)
        assert not applied.rollout.in_env_process
        assert "rollout" in applied.cluster.component_placement or any(
            "rollout" in key for key in applied.cluster.component_placement
        )


def test_profile_data_keys_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"profile_data\.env_cost"):
        _cfg(tmp_path, "+profile_data={rollout_cost: 1, actor_cost: 1}")
    with pytest.raises(ConfigError, match=r"profile_data\.inference_cost"):
        _cfg(
            tmp_path,
            "+profile_data={env_cost: 1, rollout_cost: 1, actor_cost: 1, inference_cost: 1}",
        )
    with pytest.raises(ConfigError, match=r"profile_data\.env_cost"):
        _cfg(tmp_path, "+profile_data={env_cost: -1, rollout_cost: 1, actor_cost: 1}")


def test_candidate_config_keeps_total_envs_and_applies_rules(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    envs = total_envs(cfg, 2)
    assert envs == 16
    out = candidate_config(cfg, EmbodiedLayout((0, 1), (0, 1), (0, 1), 1), envs)
    assert out.cluster.component_placement == {"actor,env,rollout": "0-1"}
    assert out.env.train.num_envs == 8
    assert out.rollout.pipeline_stage_num == 1
    with pytest.raises(ValueError, match="do not split over 2 env ranks"):
        candidate_config(cfg, EmbodiedLayout((0, 1), (0, 1), (0, 1), 1), 15)
    with pytest.raises(ConfigError, match="rollout ranks"):
        candidate_config(cfg, EmbodiedLayout((0, 0), (1, 2), (0, 2), 1), 48)


def test_async_runner_is_refused(tmp_path: Path) -> None:
    data = compose_config(
        "pendulum_sac_mlp",
        CONFIG_DIR,
        [
            f"runner.logger.log_path={tmp_path}",
            "+profile_data={env_cost: 1, rollout_cost: 1, actor_cost: 1}",
        ],
    )
    cfg = validate_config(data, EmbodiedConfig)
    with pytest.raises(ValueError, match=r"runner\.mode: sync"):
        auto_place(cfg)


def test_profile_from_steps_splits_the_rollout() -> None:
    records = [
        {"step": 1.0, "sync": 0.05, "generate": 0.7, "actor": 0.2, "env": 0.3, "policy": 0.3}
    ] * 3
    prof = profile_from_steps(records, 2)
    assert prof.handoff_s == pytest.approx(0.1)
    assert prof.overhead_s == pytest.approx(0.05)
    with pytest.raises(ValueError, match="give profile_data"):
        profile_from_steps([{**records[0], "env": float("nan")}], 2)


def test_real_profiling_on_cartpole(tmp_path: Path) -> None:
    """Profiles CartPole on the real workers (Ray, 2 CPU slots) and ranks placements."""
    cfg = _cfg(
        tmp_path,
        "env.train.max_steps_per_rollout_epoch=32",
        "actor.global_batch_size=256",
        "actor.micro_batch_size=64",
    )
    # One slot: three worker processes start instead of six (start-up dominates here).
    report = auto_place(cfg, profile_steps=1, force_profile=True, slots=1)
    assert report.source == "profiled"
    prof = report.profile
    assert prof["env_cost"] > 0 and prof["rollout_cost"] > 0 and prof["actor_cost"] > 0
    assert prof["slots"] == 1
    assert [c.placement for c in report.candidates] == [{"actor,env,rollout": "0"}]
    times = [c.predicted_step_s for c in report.candidates]
    assert times == sorted(times) and times[0] > 0


def test_profiling_names_the_rule_the_collocated_run_breaks(tmp_path: Path) -> None:
    """Refused before any cluster starts: 2 actor ranks need global_batch_size % 1024 == 0."""
    cfg = _cfg(tmp_path, "actor.micro_batch_size=512")
    with pytest.raises(ValueError, match="collocated on all 2 slot") as info:
        auto_place(cfg, force_profile=True)
    assert "actor.global_batch_size" in str(info.value)
    assert "profile_data" in str(info.value)


def test_launching_the_three_groups_refuses_the_policy_in_the_env_process(
    tmp_path: Path,
) -> None:
    """Auto-place and online scaling launch a rollout group; in_env_process has none."""
    cfg = _cfg(tmp_path, "rollout.in_env_process=true")
    cluster: Cluster = None  # type: ignore[assignment]  # refused before any launch
    with pytest.raises(ValueError, match=r"rollout\.in_env_process: false"):
        launch_embodied_groups(cluster, cfg)
