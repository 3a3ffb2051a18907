"""Async PPO end to end: real Ray groups on two CPU slots (actor: 0, env and rollout: 1).

* a short CartPole run (``runner.mode: async``, ``max_staleness`` 1): the
  one-step-off schedule (step s trains the batch of weight version s - 1), the
  ``rollout/staleness_*`` and ``rollout/dropped_batches`` metrics in TensorBoard,
  and resume from a checkpoint of that run;
* stale batches are dropped: a runner that withholds the weight syncs (the
  rollout keeps generating with version 0) makes the actor drop every batch
  older than ``max_staleness``; the versions it trains on never are; the same
  with GRPO (``loss_type: actor``, no critic) and ``max_staleness`` 2;
* slow: the example config in async mode reaches eval return 475.

The groups are launched once and reused (``init_workers`` rebuilds every worker's
state from the runner's config).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.async_ppo_runner import AsyncPPORunner
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.workers import EmbodiedFSDPActor
from rlinf.sched import WorkerGroup

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
DISAGG = {"actor": 0, "env": 1, "rollout": 1}

SMALL = [
    "runner.mode=async",
    "env.train.num_envs=8",
    "env.train.max_steps_per_rollout_epoch=32",
    "env.eval.num_envs=4",
    "env.eval.max_episode_steps=40",
    "actor.global_batch_size=128",
    "actor.micro_batch_size=64",
    "runner.val_check_interval=-1",
]


def make_config(
    tmp_path: Path, name: str, overrides: Sequence[str] = (), config_name: str = "cartpole_ppo_mlp"
) -> EmbodiedConfig:
    data = compose_config(
        config_name,
        CONFIG_DIR,
        [f"runner.logger.log_path={tmp_path}", f"runner.logger.experiment_name={name}", *overrides],
    )
    data["cluster"]["component_placement"] = DISAGG
    data["rollout"]["in_env_process"] = False  # a rollout group on slot 1
    return validate_config(data, EmbodiedConfig)


def scalars(tb_dir: Path, key: str) -> dict[int, float]:
    events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(key)}


@pytest.fixture(scope="module")
def groups(
    tmp_path_factory: pytest.TempPathFactory, embodied_groups: Callable[..., Any]
) -> Iterator[list[WorkerGroup]]:
    cfg = make_config(tmp_path_factory.mktemp("launch"), "launch", ["runner.mode=async"])
    with embodied_groups(cfg, "appo", EmbodiedFSDPActor) as launched:
        yield launched


def test_async_ppo_runs_one_step_off_logs_staleness_and_resumes(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    cfg = make_config(
        tmp_path, "straight", [*SMALL, "runner.max_epochs=4", "runner.save_interval=2"]
    )
    with AsyncPPORunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        tb_dir, ckpt_root = runner.tensorboard_dir, runner.checkpoint_root
        assert runner.global_step == 4
        # Step 0 trains the batch of the initial weights; then one version behind.
        assert runner.trained_versions == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert scalars(tb_dir, "rollout/staleness_max") == {1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert scalars(tb_dir, "rollout/staleness_mean")[4] == 1.0
    assert scalars(tb_dir, "rollout/dropped_batches") == {s: 0.0 for s in (1, 2, 3, 4)}
    assert set(scalars(tb_dir, "train/actor/policy_loss")) == {1, 2, 3, 4}
    # Four batches of 8 envs x 32 steps, none generated past the last step. A step
    # logs the env steps of the generations that finished since the previous log:
    # step 1's batch always (it trained on it); the others in whichever step saw them
    # finish (generation races the training on a busy machine).
    env_steps = scalars(tb_dir, "rollout/env_steps")
    done = {s: env_steps[s] - env_steps.get(s - 1, 0.0) for s in (1, 2, 3, 4)}
    assert env_steps[4] == 4 * 8 * 32 and done[1] > 0, done
    assert all(d % (8 * 32) == 0 for d in done.values()), done
    per_s = scalars(tb_dir, "rollout/env_steps_per_s")
    assert all((per_s[s] > 0) == (done[s] > 0) for s in done), (per_s, done)
    assert "train/actor/is_weight_mean" in EventAccumulator(str(tb_dir)).Reload().Tags()["scalars"]
    assert sorted(p.name for p in ckpt_root.iterdir()) == ["global_step_2", "global_step_4"]

    # Resume from the step-2 checkpoint: the batches in flight at the save are lost,
    # so the resumed run generates step 2's batch again with the checkpoint's weights.
    resumed_cfg = make_config(
        tmp_path, "resumed", [*SMALL, "runner.max_epochs=4", "runner.resume_dir=auto"]
    )
    target = resumed_cfg.runner.logger.experiment_dir / "checkpoints" / "global_step_2"
    shutil.copytree(ckpt_root / "global_step_2", target)
    with AsyncPPORunner(resumed_cfg, actor, rollout, env) as runner:
        runner.init_workers()
        # The env state was saved after the generation in flight (step 2's batch) ended:
        # its env steps stay counted.
        assert runner.global_step == 2 and runner.total_env_steps == 3 * 8 * 32
        runner.run()
        resumed_dir = runner.tensorboard_dir
        assert runner.global_step == 4
        assert runner.trained_versions == [(2, 2), (3, 2)]
    assert set(scalars(resumed_dir, "train/actor/policy_loss")) == {3, 4}
    assert scalars(resumed_dir, "rollout/staleness_max") == {3: 0.0, 4: 1.0}
    assert scalars(resumed_dir, "rollout/env_steps")[4] == 5 * 8 * 32


class WithheldSyncs(AsyncPPORunner):
    """Pretends to sync weights until the first drop: the rollout keeps version 0.

    After a drop the runner resends the weights; from then on they really go.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.real_version = -1

    def update_rollout_weights(self) -> float:
        if self.global_step > 0 and self.dropped_batches == 0:
            self._synced_version = self.global_step  # a sync that never reached the rollout
            return 0.0
        if self.real_version != self.global_step:
            self._synced_version = -1
            self.real_version = self.global_step
        return super().update_rollout_weights()


def test_batches_older_than_max_staleness_are_dropped(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    cfg = make_config(tmp_path, "stale", [*SMALL, "runner.max_epochs=4", "runner.save_interval=-1"])
    with WithheldSyncs(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        tb_dir = runner.tensorboard_dir
        assert runner.global_step == 4
        trained = runner.trained_versions
        dropped = runner.dropped_batches
    # Steps 0 and 1 train version-0 batches; at step 2 version 0 is 2 behind: dropped.
    assert trained[:2] == [(0, 0), (1, 0)]
    assert [step for step, _ in trained] == [0, 1, 2, 3]
    assert all(step - version <= 1 for step, version in trained), trained
    assert dropped >= 1
    assert scalars(tb_dir, "rollout/dropped_batches")[4] == float(dropped)
    assert max(scalars(tb_dir, "rollout/staleness_max").values()) <= 1.0


def test_async_grpo_with_max_staleness_two_trains_two_behind_then_drops(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    """GRPO (actor loss, no critic) with k = 2: version-0 batches train at steps 0-2, then drop."""
    actor, rollout, env = groups
    # The GRPO example has no runner.mode / max_staleness keys: "+" adds them.
    overrides = [
        *("+runner.mode=async" if o == "runner.mode=async" else o for o in SMALL),
        "env.train.max_episode_steps=32",
        "+algorithm.max_staleness=2",
        "rollout.pipeline_stage_num=1",
        "runner.max_epochs=5",
        "runner.save_interval=-1",
    ]
    cfg = make_config(tmp_path, "grpo-stale", overrides, config_name="cartpole_grpo_mlp")
    assert cfg.algorithm.loss_type == "actor"
    with WithheldSyncs(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        tb_dir = runner.tensorboard_dir
        trained = runner.trained_versions
        dropped = runner.dropped_batches
    # The rollout keeps version 0: 0, 1 and 2 steps behind are within k = 2; 3 is not.
    assert trained[:3] == [(0, 0), (1, 0), (2, 0)], trained
    assert [step for step, _ in trained] == [0, 1, 2, 3, 4]
    assert all(step - version <= 2 for step, version in trained), trained
    assert dropped >= 1
    assert max(scalars(tb_dir, "rollout/staleness_max").values()) == 2.0
    assert set(scalars(tb_dir, "train/actor/policy_loss")) == {1, 2, 3, 4, 5}
    assert "train/actor/value_loss" not in EventAccumulator(str(tb_dir)).Reload().Tags()["scalars"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_async_ppo_cartpole_reaches_475(groups: list[WorkerGroup], tmp_path: Path) -> None:
    """The example config in async mode (max_staleness 1) reaches eval return 475 in 140 steps."""
    actor, rollout, env = groups
    cfg = make_config(tmp_path, "learn", ["runner.mode=async"])
    with AsyncPPORunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        tb_dir = runner.tensorboard_dir
    returns = scalars(tb_dir, "eval/return")
    assert max(returns.values()) >= 475, returns
    assert max(scalars(tb_dir, "rollout/staleness_max").values()) <= 1.0


def test_async_ppo_runs_two_pipelined_stages(groups: list[WorkerGroup], tmp_path: Path) -> None:
    """Two stages in async mode stay two stages: every batch brings every env step, and
    the checkpoint keeps both stages' seed schedules."""
    actor, rollout, env = groups
    overrides = [*SMALL, "rollout.pipeline_stage_num=2", "runner.max_epochs=3"]
    cfg = make_config(tmp_path, "two_stages", [*overrides, "runner.save_interval=3"])
    with AsyncPPORunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        tb_dir, ckpt_root = runner.tensorboard_dir, runner.checkpoint_root
    assert scalars(tb_dir, "rollout/env_steps")[3] == 3 * 8 * 32.0  # three whole batches
    saved = torch.load(ckpt_root / "global_step_3" / "env" / "rank_0.pt", weights_only=False)
    assert len(saved["seed_epochs"]) == 2
