"""``runner.max_restarts`` in the ReasoningRunner: a SIGKILLed worker does not end the run.

Real Ray groups (collocated: actor, rollout and reward on two CPU slots) and a
tiny untrained Qwen2 built from a config. The test SIGKILLs one process from
outside as soon as the step-2 checkpoint is complete (a reward worker, then,
in a second run, actor rank 1). The runner must relaunch the three groups on
their placement, resume from that checkpoint and finish all six steps. After
the resume, every actor rank's weights, optimizer state and RNG, the driver's
RNG and the sampler cursor are those the run had, uninterrupted, when it saved
that checkpoint (bit for bit, by SHA-256 digests).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from rlinf.core.config import validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.data.sampler import ResumableSampler
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import make_smoke_task
from rlinf.reasoning.workers.actor import _rng_digest
from rlinf.sched import Cluster, WorkerDiedError, WorkerGroup

STEPS = 6
BATCH = 4
PLACEMENT = {"actor": "0-1", "rollout": "0-1", "reward": "0-1"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_smoke_task(tmp_path_factory.mktemp("toy"), num_prompts=40)


def make_config(toy: Path, logs: Path, name: str, max_restarts: int) -> ReasoningConfig:
    return validate_config(
        {
            "cluster": {"cpu_slots_per_node": 2, "component_placement": PLACEMENT},
            "runner": {
                "max_steps": STEPS,
                "max_epochs": 100,
                "val_check_interval": -1,
                "val_before_train": False,
                "save_interval": 2,
                "max_restarts": max_restarts,
                "step_timeout_s": 300,
                "channel_timeout_s": 120,
                "logger": {
                    "log_path": str(logs),
                    "experiment_name": name,
                    "logger_backends": ["tensorboard"],
                },
            },
            "data": {
                "train_files": [str(toy / "train.jsonl")],
                "prompt_key": "problem",
                "answer_key": "answer",
                "max_prompt_length": 16,
                "seed": 3,
            },
            "algorithm": {
                "group_size": 4,
                "rollout_batch_size": BATCH,
                "n_minibatches": 1,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": 4},
            },
            "actor": {"model_path": str(toy / "model"), "micro_batch_size": 8},
            "reward": {"num_workers": 1},
        },
        ReasoningConfig,
    )


@pytest.fixture(scope="module")
def groups(toy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerGroup]]:
    assert not ray.is_initialized()
    cfg = make_config(toy, tmp_path_factory.mktemp("launch"), "launch", 0)
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        _, actor, rollout, reward = launch_reasoning_groups(cfg, cluster, "restart-", timeout=300)
        try:
            yield [actor, rollout, reward]
        finally:
            for group in (actor, rollout, reward):
                group.close()


class RecordingRunner(ReasoningRunner):
    """Records the training state when it saves a checkpoint and after it loads one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved: dict[int, dict[str, Any]] = {}
        self.restored: dict[int, dict[str, Any]] = {}

    def _state(self) -> dict[str, Any]:
        """Every actor rank's state digests, the driver's RNG digest and sampler cursor."""
        actor = self.actor.execute_on(*self.checkpoint_actor_ranks)
        return {
            "actor": actor.state_summary().wait(self.cfg.runner.step_timeout_s),
            "driver_rng": _rng_digest(),
            "sampler": self.sampler.state_dict(),
        }

    def save_checkpoint(self) -> Path:
        # Recorded first: the victim dies as soon as the checkpoint is complete.
        self.saved[self.global_step] = self._state()
        return super().save_checkpoint()

    def load_checkpoint(self, path: str | Path) -> int:
        step = super().load_checkpoint(path)
        self.restored[step] = self._state()
        return step


def kill_after_checkpoint(marker: Path, group: WorkerGroup, rank: int) -> threading.Thread:
    """SIGKILLs ``group``'s ``rank`` as soon as ``marker`` exists (from a watcher thread)."""
    pid = group.pid().wait()[rank]

    def watch() -> None:
        deadline = time.monotonic() + 600
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def expected_order(cfg: ReasoningConfig, steps: int) -> list[list[int]]:
    """The prompts of each step of an uninterrupted run (the sampler is seeded)."""
    sampler = iter(ResumableSampler(40, shuffle=cfg.data.shuffle, seed=cfg.data.seed))
    return [[next(sampler) for _ in range(BATCH)] for _ in range(steps)]


@pytest.mark.parametrize(
    ("victim", "rank"),
    # The reward case (~70 s with its relaunch) runs in the slow tier: the default
    # run keeps the actor case, the same relaunch-and-resume path.
    [pytest.param("reward", 0, marks=pytest.mark.slow), ("actor", 1)],
)
def test_a_killed_worker_is_relaunched_and_the_run_finishes(
    groups: list[WorkerGroup], toy: Path, tmp_path: Path, victim: str, rank: int
) -> None:
    actor, rollout, reward = groups
    cfg = make_config(toy, tmp_path, f"kill-{victim}", max_restarts=1)
    before = {g.name: g.pid().wait() for g in groups}
    runner = RecordingRunner(cfg, actor, rollout, reward)
    try:
        runner.init_workers()
        marker = runner.checkpoint_root / "global_step_2" / "COMPLETE"
        watcher = kill_after_checkpoint(marker, {"actor": actor, "reward": reward}[victim], rank)
        last = runner.run()
        watcher.join(timeout=5)
        assert not watcher.is_alive()
        assert runner.global_step == STEPS and runner.restarts == 1
        assert last["train/restarts"] == 1.0
        after = {g.name: g.pid().wait() for g in groups}
        for name, pids in before.items():
            assert not set(pids) & set(after[name]), f"{name} was not relaunched"
        ckpts = sorted(p.name for p in runner.checkpoint_root.iterdir())
        assert ckpts == ["global_step_2", "global_step_4", "global_step_6"]
        # Steps 3-6 ran after the resume from step 2, on the prompts an
        # uninterrupted run would have used (the sampler cursor was restored).
        assert runner.data_history[-4:] == expected_order(cfg, STEPS)[2:]
        assert runner.data_history[:2] == expected_order(cfg, STEPS)[:2]
        # The resume restored the state of the uninterrupted run at step 2: weights,
        # optimizer state and RNG of every actor rank, the driver's RNG, the cursor.
        assert list(runner.restored) == [2]
        assert runner.restored[2] == runner.saved[2]
        assert all(s["optim_steps"] == 2 for s in runner.saved[2]["actor"])
        restarts = [m["train/restarts"] for m in runner.metrics_history]
        assert restarts[0] == 0.0 and restarts[-1] == 1.0
    finally:
        runner.close()


def test_without_restarts_a_killed_worker_ends_the_run(
    groups: list[WorkerGroup], toy: Path, tmp_path: Path
) -> None:
    actor, rollout, reward = groups
    cfg = make_config(toy, tmp_path, "kill-no-restart", max_restarts=0)
    runner = ReasoningRunner(cfg, actor, rollout, reward)
    try:
        runner.init_workers()
        marker = runner.checkpoint_root / "global_step_2" / "COMPLETE"
        kill_after_checkpoint(marker, reward, 0)
        with pytest.raises(WorkerDiedError, match=r"restart-RewardGroup\[rank 0\] died"):
            runner.run()
        assert 2 <= runner.global_step < STEPS and runner.restarts == 0
    finally:
        runner.close()
    for group in groups:  # leave live groups for whoever runs next
        group.relaunch()
