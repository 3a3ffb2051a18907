"""Online scaling end to end: CartPole PPO on Ray with the actor growing each step.

Two CPU slots: actor 0, env and rollout 1. The actor group is launched with an
extra rank on slot 1 (beside env and rollout); each step it grows onto it for
the training phase and shrinks back. Checked: the run trains, logs
``time/scale_up``, ``time/scale_down`` and the actor world size per phase,
writes checkpoints from the base rank and resumes from them
(``runner.resume_dir: auto``); a rank killed while the state is re-sharded
surfaces as :class:`rlinf.sched.ScalingError` naming the phase and the rank, and
the relaunched groups resume from the last checkpoint (also by themselves with
``runner.max_restarts``).

Both tests are in the slow tier (Ray start-up and relaunches: ~1 min each).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.autoplace_profile import embodied_actor_strategy
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker, MultiStepRolloutWorker
from rlinf.sched import Cluster, HybridComponentPlacement, ScalingError, WorkerGroup, launch_groups

pytestmark = pytest.mark.slow

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
PLACEMENT = {"actor": 0, "env": 1, "rollout": 1}
KILL_ON_CALL = 3  # the third scale_up: after the step-2 checkpoint


class MortalActor(EmbodiedFSDPActor):
    """The actor; in an experiment named ``kill-*`` extra rank 1 dies in its third scale_up."""

    def init_worker(self, cfg: EmbodiedConfig, *args: Any) -> Any:
        self._experiment_dir = cfg.runner.logger.experiment_dir
        self._kill = cfg.runner.logger.experiment_name.startswith("kill-")
        self._calls = 0
        return super().init_worker(cfg, *args)

    def scale_up(self) -> dict[str, float]:
        self._calls += 1
        if self._kill and self.rank == 1 and self._calls == KILL_ON_CALL:
            marker = self._experiment_dir / "killed"
            if not marker.exists():  # once per run: the relaunched rank lives
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        return super().scale_up()


def make_config(tmp_path: Path, name: str, overrides: Sequence[str] = ()) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            "+runner.online_scaling=true",
            f"runner.logger.log_path={tmp_path}",
            f"runner.logger.experiment_name={name}",
            "env.train.num_envs=8",
            "env.train.max_steps_per_rollout_epoch=32",
            "env.eval.num_envs=4",
            "env.eval.max_episode_steps=40",
            "actor.global_batch_size=128",
            "actor.micro_batch_size=32",
            "runner.max_epochs=4",
            "runner.save_interval=2",
            "runner.val_check_interval=-1",
            *overrides,
        ],
    )
    data["cluster"]["component_placement"] = PLACEMENT
    data["rollout"]["in_env_process"] = False  # online scaling grows onto the rollout's slot
    return validate_config(data, EmbodiedConfig)


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerGroup]]:
    assert not ray.is_initialized()
    cfg = make_config(tmp_path_factory.mktemp("launch"), "launch")
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
        strategy, args = embodied_actor_strategy(cfg, placement)
        launched = launch_groups(
            cluster,
            {
                "scale-actor": (MortalActor.create_group(cfg, **args), strategy),
                "scale-rollout": (
                    MultiStepRolloutWorker.create_group(cfg),
                    placement.get_strategy("rollout"),
                ),
                "scale-env": (EnvWorker.create_group(cfg), placement.get_strategy("env")),
            },
            timeout=300,
        )
        groups = list(launched.values())
        try:
            yield groups
        finally:
            for group in groups:
                group.close()


def scalars(tb_dir: Path, key: str) -> dict[int, float]:
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(key)} if key in acc.Tags()["scalars"] else {}


def test_scaled_cartpole_run_logs_scaling_and_resumes(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    assert actor.world_size == 2
    cfg = make_config(tmp_path, "scaled", ["runner.max_epochs=3"])
    with EmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        assert runner.base_actor_ranks == [0]
        assert not runner.collocated  # env and rollout share slot 1 (hybrid), the actor not
        metrics = runner.run()
        assert runner.global_step == 3
        tb_dir, ckpt_root = runner.tensorboard_dir, runner.checkpoint_root
    assert math.isfinite(metrics["train/actor/policy_loss"])
    assert metrics["actor/world_size_generate"] == 1.0
    assert metrics["actor/world_size_train"] == 2.0
    for key in ("time/scale_up", "time/scale_down"):
        assert sorted(scalars(tb_dir, key)) == [1, 2, 3]
        assert all(v >= 0 for v in scalars(tb_dir, key).values())
    assert scalars(tb_dir, "actor/world_size_train") == {1: 2.0, 2: 2.0, 3: 2.0}
    assert sorted(p.name for p in ckpt_root.iterdir()) == ["global_step_2", "global_step_3"]
    # Resume: one more step from the newest checkpoint.
    more = make_config(tmp_path, "scaled", ["runner.resume_dir=auto"])
    with EmbodiedRunner(more, actor, rollout, env) as runner:
        runner.init_workers()
        assert runner.global_step == 3
        runner.run()
        assert runner.global_step == 4
    env_steps = scalars(tb_dir, "rollout/env_steps")
    assert env_steps[4] == 4 * env_steps[1]  # the env-step count went on from the checkpoint


def test_a_rank_killed_mid_scale_up_is_a_scaling_error_and_the_run_resumes(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    cfg = make_config(tmp_path, "kill-up")
    with EmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        with pytest.raises(ScalingError, match=r"scale_up: scale-actor\[rank 1\]") as info:
            runner.run()
        assert (info.value.phase, info.value.rank) == ("scale_up", 1)
        assert runner.global_step == KILL_ON_CALL - 1
    assert (cfg.runner.logger.experiment_dir / "killed").exists()
    for group in groups:
        group.relaunch()
    again = make_config(tmp_path, "kill-up", ["runner.resume_dir=auto"])
    with EmbodiedRunner(again, actor, rollout, env) as runner:
        runner.init_workers()
        assert runner.global_step == 2  # from the step-2 checkpoint
        runner.run()
        assert runner.global_step == 4
    # With runner.max_restarts the runner relaunches and resumes by itself.
    auto = make_config(tmp_path, "kill-auto", ["runner.max_restarts=1"])
    with EmbodiedRunner(auto, actor, rollout, env) as runner:
        runner.init_workers()
        metrics = runner.run()
        assert runner.global_step == 4 and runner.restarts == 1
    assert metrics["train/restarts"] == 1.0
    assert (auto.runner.logger.experiment_dir / "killed").exists()
