"""The checkpoint layout shared by both stacks: progress record, saved config, actor state."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from rlinf.core.checkpoint import rng_state
from rlinf.core.config.schema import CoreConfig
from rlinf.core.run_state import (
    ConfigChangedError,
    RunProgress,
    config_changes,
    load_run_state,
    save_run_state,
)
from rlinf.core.train_state import load_train_state, save_train_state


def test_config_changes_name_run_defining_keys_only() -> None:
    saved = {
        "runner": {"seed": 1, "max_epochs": 10, "save_interval": 5},
        "actor": {"global_batch_size": 128, "micro_batch_size": 32, "optim": {"lr": 1e-3}},
        "algorithm": {"group_size": 8},
        "cluster": {"component_placement": {"actor": "0-1"}},
    }
    current = {
        "runner": {"seed": 2, "max_epochs": 20, "save_interval": 1},
        "actor": {"global_batch_size": 256, "micro_batch_size": 16, "optim": {"lr": 1e-4}},
        "algorithm": {"group_size": 8, "rollout_batch_size": 4},
        "cluster": {"component_placement": {"actor": "0-3"}},
    }
    assert config_changes(saved, current) == [
        "actor.global_batch_size: 128 -> 256",
        "algorithm.rollout_batch_size: (unset) -> 4",
        "cluster.component_placement.actor: '0-1' -> '0-3'",
        "runner.seed: 1 -> 2",
    ]
    assert config_changes(saved, saved) == []


def _saved(tmp_path: Path, cfg: CoreConfig) -> RunProgress:
    progress = RunProgress(global_step=7, restarts=1, total_env_steps=900, rng=rng_state(False))
    progress.data_cursor = {"epoch": 2, "position": 5}
    save_run_state(tmp_path, progress, cfg)
    return progress


def test_progress_round_trips_with_the_same_config(tmp_path: Path) -> None:
    cfg = CoreConfig()
    saved = _saved(tmp_path, cfg)
    assert (tmp_path / "config.yaml").read_text().startswith("runner:\n")
    cfg.runner.max_epochs = 99  # not run-defining
    loaded = load_run_state(tmp_path, cfg, allow_config_change=False)
    assert loaded.global_step == 7 and loaded.restarts == 1 and loaded.total_env_steps == 900
    assert loaded.data_cursor == {"epoch": 2, "position": 5}
    assert loaded.rng is not None and saved.rng is not None
    assert loaded.rng["python"] == saved.rng["python"]


def test_a_changed_seed_is_refused_by_name_unless_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = CoreConfig()
    _saved(tmp_path, cfg)
    cfg.runner.seed = cfg.runner.seed + 1
    with pytest.raises(ConfigChangedError) as err:
        load_run_state(tmp_path, cfg, allow_config_change=False)
    assert f"runner.seed: 1234 -> {cfg.runner.seed}" in str(err.value)
    assert str(tmp_path) in str(err.value) and "runner.allow_config_change" in str(err.value)
    with caplog.at_level(logging.WARNING, logger="rlinf.checkpoint"):
        loaded = load_run_state(tmp_path, cfg, allow_config_change=True)
    assert loaded.global_step == 7
    assert "runner.seed: 1234 -> 1235" in caplog.text


def test_a_folder_without_progress_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"progress\.pt"):
        load_run_state(tmp_path, CoreConfig(), allow_config_change=False)


def test_train_state_round_trips_model_optimizer_extras_and_rng(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    random.seed(5)
    save_train_state(tmp_path / "actor", model, optimizer, {"step": 3, "version": 2})
    after_save = (random.random(), torch.rand(1).item())

    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh(torch.randn(5, 4)).sum().backward()
    fresh_optimizer.step()
    extra = load_train_state(tmp_path / "actor", fresh, fresh_optimizer)
    assert extra == {"step": 3, "version": 2}
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)
    torch.testing.assert_close(fresh_optimizer.state_dict()["state"][0]["exp_avg"], moments)
    assert (random.random(), torch.rand(1).item()) == after_save  # RNG restored
    with pytest.raises(FileNotFoundError, match="no actor state"):
        load_train_state(tmp_path / "missing", fresh, fresh_optimizer)
