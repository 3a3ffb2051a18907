"""``runner.max_restarts``: a SIGKILLed env or actor rank does not end the run.

Real Ray groups on CPU slots. The worker classes below are the real ones with
one addition: in the run whose experiment name asks for it, one rank SIGKILLs
its own process as its fourth rollout (env) or update (actor rank 1, while
rank 0 waits in a collective) begins, once per run (a marker file in the
experiment folder keeps the relaunched process alive). The kill is synchronous,
so the step it ends is known whatever the machine's load. The runner must
relaunch every group on the same placement, resume from the newest complete
checkpoint (step 2) and finish the run with the right step and env-step counts.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker
from rlinf.sched import WorkerDiedError, WorkerGroup

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
HYBRID = {"actor": "0-1", "env": 0, "rollout": 1}
KILL_ON_CALL = 4  # the fourth rollout/update: after the step-2 checkpoint, before step 4's


def _die_once(experiment_dir: Path, role: str) -> None:
    """SIGKILLs this process now (inside a remote call), unless it already did so in this run."""
    marker = experiment_dir / f"killed-{role}"
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


class MortalEnvWorker(EnvWorker):
    """The env worker; in an experiment named ``kill-env*`` it dies mid-rollout once."""

    def init_worker(self, cfg: EmbodiedConfig, actor_world_size: int) -> Any:
        self._experiment_dir = cfg.runner.logger.experiment_dir
        self._kill = cfg.runner.logger.experiment_name.startswith("kill-env")
        self._calls = 0
        return super().init_worker(cfg, actor_world_size)

    def interact(self, *args: Any) -> dict[str, Any]:
        self._calls += 1
        if self._kill and self._calls == KILL_ON_CALL:
            _die_once(self._experiment_dir, "env")
        return super().interact(*args)


class MortalActor(EmbodiedFSDPActor):
    """The actor; in an experiment named ``kill-actor*`` rank 1 dies mid-update once."""

    def init_worker(self, cfg: EmbodiedConfig, *args: Any) -> Any:
        self._experiment_dir = cfg.runner.logger.experiment_dir
        self._kill = cfg.runner.logger.experiment_name.startswith("kill-actor")
        self._calls = 0
        return super().init_worker(cfg, *args)

    def run_training(self) -> dict[str, float]:
        self._calls += 1
        if self._kill and self.rank == 1 and self._calls == KILL_ON_CALL:
            _die_once(self._experiment_dir, "actor")
        return super().run_training()


def make_config(
    tmp_path: Path, name: str, max_restarts: int, overrides: Sequence[str] = ()
) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            f"runner.logger.log_path={tmp_path}",
            f"runner.logger.experiment_name={name}",
            "env.train.num_envs=8",
            "env.train.max_steps_per_rollout_epoch=32",
            "env.eval.num_envs=4",
            "env.eval.max_episode_steps=40",
            "actor.global_batch_size=128",
            "actor.micro_batch_size=32",
            "runner.max_epochs=6",
            "runner.save_interval=2",
            "runner.val_check_interval=-1",
            "runner.val_before_train=false",
            f"runner.max_restarts={max_restarts}",
            *overrides,
        ],
    )
    data["cluster"]["component_placement"] = HYBRID
    data["rollout"]["in_env_process"] = False  # the launched groups include a rollout group
    return validate_config(data, EmbodiedConfig)


@pytest.fixture(scope="module")
def groups(
    tmp_path_factory: pytest.TempPathFactory, embodied_groups: Callable[..., Any]
) -> Iterator[list[WorkerGroup]]:
    cfg = make_config(tmp_path_factory.mktemp("launch"), "launch", 0)
    with embodied_groups(cfg, "restart", MortalActor, MortalEnvWorker, slots=3) as launched:
        yield launched


def scalars(tb_dir: Path, key: str) -> dict[int, float]:
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(key)} if key in acc.Tags()["scalars"] else {}


def run_and_check_recovery(groups: list[WorkerGroup], cfg: EmbodiedConfig, role: str) -> None:
    actor, rollout, env = groups
    old_pids = {g.name: g.pid().wait() for g in groups}
    with EmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        metrics = runner.run()
        assert runner.global_step == 6 == cfg.runner.total_steps
        assert runner.restarts == 1
        tb_dir, ckpt_root = runner.tensorboard_dir, runner.checkpoint_root
    marker = cfg.runner.logger.experiment_dir / f"killed-{role}"
    assert marker.exists(), "the rank did not die: the test exercised nothing"
    # Every group was relaunched: new processes, same placement.
    new_pids = {g.name: g.pid().wait() for g in groups}
    for name, pids in old_pids.items():
        assert not set(pids) & set(new_pids[name]), f"{name} was not relaunched"
    assert int(marker.read_text()) in old_pids[f"restart-{role}"]
    assert metrics["train/restarts"] == 1.0
    restarts = scalars(tb_dir, "train/restarts")
    assert restarts[1] == 0.0 and restarts[6] == 1.0
    assert sorted(p.name for p in ckpt_root.iterdir()) == [
        "global_step_2",
        "global_step_4",
        "global_step_6",
    ]
    # Resumed from step 2: the env-step count goes on from the checkpoint, nothing
    # counted twice or lost (each step runs the same number of env steps).
    env_steps = scalars(tb_dir, "rollout/env_steps")
    assert sorted(env_steps) == [1, 2, 3, 4, 5, 6]
    assert env_steps[6] == 6 * env_steps[1]


def test_a_killed_env_worker_is_relaunched_and_the_run_finishes(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    run_and_check_recovery(groups, make_config(tmp_path, "kill-env", 2), "env")


def test_a_killed_actor_rank_is_relaunched_and_the_run_finishes(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    run_and_check_recovery(groups, make_config(tmp_path, "kill-actor", 2), "actor")


def test_without_restarts_a_killed_worker_ends_the_run(
    groups: list[WorkerGroup], tmp_path: Path
) -> None:
    actor, rollout, env = groups
    cfg = make_config(tmp_path, "kill-env-no-restart", 0)
    with EmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        with pytest.raises(WorkerDiedError, match=r"restart-env\[rank 0\] died"):
            runner.run()
        assert runner.global_step == KILL_ON_CALL - 1
        assert runner.restarts == 0
    # The groups can be relaunched by hand, and train again.
    for group in groups:
        group.relaunch()
    ok = make_config(tmp_path, "after", 0, ["runner.max_epochs=1"])
    with EmbodiedRunner(ok, actor, rollout, env) as runner:
        runner.init_workers()
        assert math.isfinite(runner.run()["train/actor/policy_loss"])
        assert runner.global_step == 1
