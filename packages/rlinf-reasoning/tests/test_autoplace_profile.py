"""``rlinf auto-place`` for reasoning configs: profile_data, rules, and (slow) real profiling."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.core.config import compose_config, validate_config
from rlinf.reasoning.autoplace_profile import (
    auto_place,
    candidate_config,
    profile_from_metrics,
    stream_units,
)
from rlinf.reasoning.config import ReasoningConfig
from rlinf.sched.autoplace import ReasoningLayout

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "reasoning" / "config"


def _cfg(tmp_path: Path, toy: Path | None = None, *overrides: str) -> ReasoningConfig:
    toy = toy or tmp_path
    data = compose_config(
        "toy_grpo_cpu",
        CONFIG_DIR,
        [
            f"data.train_files=[{toy}/train.jsonl]",
            f"data.val_files=[{toy}/test.jsonl]",
            f"actor.model_path={toy}/warmstart",
            f"runner.logger.log_path={tmp_path}",
            *overrides,
        ],
    )
    return validate_config(data, ReasoningConfig)


def test_profile_data_ranks_placements(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path, None, "+profile_data={rollout_cost: 2.0, inference_cost: 0.5, actor_cost: 0.5}"
    )
    report = auto_place(cfg)
    assert report.source == "profile_data"
    assert [c.mode for c in report.candidates] == ["collocated", "disaggregated"]
    n, chunk = cfg.algorithm.rollout_batch_size, cfg.rollout.groups_per_chunk
    assert report.profile["stream_units"] == stream_units(cfg) == -(-n // chunk)


def test_candidate_rules(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, None, "algorithm.max_staleness=1")
    with pytest.raises(ValueError, match="asynchronous GRPO"):
        candidate_config(cfg, ReasoningLayout((0, 1), (0, 1)))
    assert candidate_config(cfg, ReasoningLayout((0, 0), (1, 1))).cluster.component_placement == {
        "actor": "0",
        "rollout": "1",
        "reward": "1",
    }


def test_profile_from_metrics() -> None:
    step = {
        "time/rollout": 1.0,
        "time/reward": 0.1,
        "time/actor/inference": 0.2,
        "time/actor/training": 0.5,
        "time/sync_weights": 0.05,
        "time/step": 2.0,
    }
    prof = profile_from_metrics([step, step], slots=2, groups=4)
    assert prof.rollout_s == 1.0 and prof.groups == 4
    assert prof.overhead_s == pytest.approx(0.15)
    with pytest.raises(ValueError, match="no timed steps"):
        profile_from_metrics([], slots=2, groups=4)


@pytest.mark.slow
def test_real_profiling_on_the_toy_task(tmp_path: Path) -> None:
    """Toy task, actor/rollout/reward collocated on 2 CPU slots (Ray; ~40 s with the toy task)."""
    from rlinf.reasoning.toy_task import ToyTaskConfig, make_toy_task

    toy = tmp_path / "toy"
    make_toy_task(
        toy, ToyTaskConfig(num_train=100, num_test=20, max_operand=29, sft_steps=5, batch_size=32)
    )
    cfg = _cfg(
        tmp_path,
        toy,
        "algorithm.rollout_batch_size=16",
        "algorithm.group_size=4",
        "algorithm.n_minibatches=1",
        "actor.micro_batch_size=32",
    )
    report = auto_place(cfg, profile_steps=1, force_profile=True)
    assert report.source == "profiled"
    assert report.profile["rollout_cost"] > 0 and report.profile["actor_cost"] > 0
    assert {c.mode for c in report.candidates} == {"collocated", "disaggregated"}
