"""AsyncEmbodiedRunner + SAC end to end: real Ray groups on CPU slots, real gymnasium envs.

* SAC learns Pendulum-v1 (the example config, smaller nets and batch);
* resume from ``auto`` restores the model, the target critics, the optimizers,
  alpha, the replay buffer and the step / env-step counters, and the run goes on;
* a discrete env is refused by name before any policy is built.

``test_async_example.py`` runs the example main (HalfCheetah-v5) and checks shutdown.

The three groups are launched once and reused (``init_workers`` rebuilds every
worker's state from the runner's config).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config import ConfigError, compose_config, validate_config
from rlinf.embodied.async_runner import AsyncEmbodiedRunner
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.workers import EmbodiedSACActor
from rlinf.sched import WorkerGroup

ROOT = Path(__file__).resolve().parents[3]
CONFIG_DIR = ROOT / "examples" / "embodiment" / "config"
SHM = Path("/dev/shm")

SMALL_NETS = [
    "actor.model.hidden_dims=[64,64]",
    "actor.global_batch_size=128",
    "actor.micro_batch_size=128",
]


def make_config(tmp_path: Path, name: str, overrides: Sequence[str] = ()) -> EmbodiedConfig:
    data = compose_config(
        "pendulum_sac_mlp",
        CONFIG_DIR,
        [f"runner.logger.log_path={tmp_path}", f"runner.logger.experiment_name={name}", *overrides],
    )
    return validate_config(data, EmbodiedConfig)


@pytest.fixture(scope="module")
def groups(
    tmp_path_factory: pytest.TempPathFactory, embodied_groups: Callable[..., Any]
) -> Iterator[list[WorkerGroup]]:
    cfg = make_config(tmp_path_factory.mktemp("launch"), "launch")
    with embodied_groups(cfg, "sac", EmbodiedSACActor) as launched:
        yield launched


HELD_EVALS = 3  # the last evals of the learning test that must all pass -200


def test_sac_learns_pendulum(groups: list[WorkerGroup], tmp_path: Path) -> None:
    """SAC on Pendulum-v1 reaches a mean eval return > -200 (8 episodes) within 20k env steps.

    Budget: 200 steps of 50 updates (10,000 updates at replay_ratio 1 after 1,000
    warm-up env steps: ~11,100 env steps), eval every 20 steps; 64x64 nets, batch
    128, seeds of the example config (runner.seed 1, actor.seed 3, env seeds 0 /
    1000). Env and actor run concurrently, so on a loaded machine the
    interleaving (which transitions each update sees) and the curve vary; the
    test asks that the first eval (step 20, still near the random policy) is
    below -500, that an eval passes -200 within 20k env steps, and that the last
    ``HELD_EVALS`` evals all stay above -200 (learned, not one lucky eval).
    """
    actor, rollout, env = groups
    steps = 200
    cfg = make_config(
        tmp_path,
        "learn",
        [*SMALL_NETS, f"runner.max_epochs={steps}", "runner.val_check_interval=20"],
    )
    with AsyncEmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        metrics = runner.run()
        assert runner.global_step == steps
        env_steps = runner.total_env_steps
        tb_dir = runner.tensorboard_dir
    returns = scalars(tb_dir, "eval/return")
    env_steps_at = scalars(tb_dir, "rollout/env_steps")
    assert sorted(returns) == list(range(20, steps + 1, 20))
    assert returns[20] < -500, returns
    passed = [s for s, r in returns.items() if r > -200]
    assert passed, returns
    assert env_steps_at[min(passed)] < 20_000
    last = [returns[s] for s in sorted(returns)[-HELD_EVALS:]]
    assert all(r > -200 for r in last), f"the last {HELD_EVALS} evals must hold -200: {returns}"
    assert env_steps < 20_000
    assert metrics["train/updates"] == steps * 50
    assert metrics["replay/size"] == metrics["replay/env_steps"]
    # The buffer has every env step but those of the rollout epoch that ended last
    # (4 envs * 25 steps), which arrived after the actor's last step.
    assert 0 <= env_steps - metrics["replay/env_steps"] <= 100
    assert 0.8 < metrics["replay/updates_per_env_step"] <= 1.0
    assert metrics["train/alpha"] < 1.0  # the temperature was tuned down from init_alpha
    assert metrics["rollout/env_steps_per_s"] >= 0


def scalars(tb_dir: Path, key: str) -> dict[int, float]:
    events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(key)}


def _same(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two nested fingerprints differ."""
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [p for k in a for p in _same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return [f"{path}: len {len(a)} != {len(b)}"]
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _same(x, y, f"{path}[{i}]")
        ]
    if isinstance(a, torch.Tensor):
        return [] if torch.equal(a, b) else [path]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_resume_restores_models_optimizers_alpha_targets_replay_and_counters(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    common = [*SMALL_NETS, "algorithm.warmup_steps=200", "runner.val_check_interval=-1"]
    first = make_config(tmp_path, "run", [*common, "runner.max_epochs=4", "runner.save_interval=2"])
    with AsyncEmbodiedRunner(first, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        saved = actor.state_fingerprint().wait()[0]  # == the step-4 checkpoint's state
        env_steps = runner.total_env_steps
        ckpt_root = runner.checkpoint_root
    assert sorted(p.name for p in ckpt_root.iterdir()) == ["global_step_2", "global_step_4"]
    assert saved["updates"] == 200 and saved["replay"]["size"] == env_steps > 0
    assert float(saved["log_alpha"]) != 0.0  # alpha moved away from init_alpha = 1

    second = make_config(
        tmp_path, "run", [*common, "runner.max_epochs=6", "runner.resume_dir=auto"]
    )
    with AsyncEmbodiedRunner(second, actor, rollout, env) as runner:
        runner.init_workers()
        assert runner.global_step == 4 and runner.total_env_steps == env_steps
        restored = actor.state_fingerprint().wait()[0]
        assert not _same(saved, restored)
        metrics = runner.run()
        assert runner.global_step == 6
    assert metrics["train/updates"] == 300  # counted on from the restored 200
    assert metrics["rollout/env_steps"] > env_steps  # the env went on from the restored count


def test_discrete_env_is_refused_naming_loss_type(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    cfg = make_config(
        tmp_path,
        "cartpole",
        ["env.train.env_id=CartPole-v1", "env.train.max_episode_steps=500", "env.eval=null"],
    )
    with (
        AsyncEmbodiedRunner(cfg, actor, rollout, env) as runner,
        pytest.raises(ConfigError, match=r"algorithm\.loss_type.*discrete"),
    ):
        runner.init_workers()
