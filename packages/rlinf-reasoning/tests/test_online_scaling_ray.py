"""Online scaling with real Ray groups (slow tier): the runner's loop, a rank killed mid-re-shard.

Disaggregated placement on two CPU slots (actor on slot 0, rollout and reward on
slot 1), ``runner.online_scaling: true``: the actor group has two ranks, rank 1
on the rollout's slot. A tiny untrained Qwen2 (learning does not matter here).
Both actors: FSDP (re-sharded state) and Megatron (TP = 1, replicated state;
its checkpoints are written and read by both ranks).

* every step logs ``time/scale_up``, ``time/scale_down`` and the actor's world
  size per phase (1 generating, 2 training) and trains on the step's prompts;
* the extra rank SIGKILLs itself in the middle of the step-3 scale-up (after
  the small state's broadcast, before it keeps its shard; Megatron: in the
  replica broadcast): the run ends at once with a
  :class:`ScalingError` naming the phase and the rank (no hang), and after a
  relaunch it resumes from its last checkpoint (step 2) and finishes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from rlinf.core.config import validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import make_smoke_task
from rlinf.reasoning.workers import FSDPActor, MegatronActor
from rlinf.sched import Cluster, ScalingError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 6
KILL_AT = 2  # rank 1 dies in scale-up number KILL_AT + 1 (weight version KILL_AT)


def _dies_now(actor: FSDPActor) -> bool:
    """Whether rank 1 should die in this scale-up: number ``KILL_AT + 1``, once per run folder."""
    ups = getattr(actor, "_ups", 0) + 1
    setattr(actor, "_ups", ups)  # noqa: B010
    marker = Path(actor.cfg.runner.logger.experiment_dir) / "killed-mid-reshard"
    if actor.rank != 1 or ups != KILL_AT + 1 or marker.exists():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return True


def _die(*args: Any, **kwargs: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DiesReSharding(FSDPActor):
    """Rank 1 kills its own process mid scale-up of step ``KILL_AT``, once per run folder.

    It dies where it would receive its rows (the scatter of
    :func:`rlinf.core.fsdp_scaling.grow`, after the small state's broadcast),
    while rank 0 is inside the collectives.
    """

    def scale_up(self) -> dict[str, Any]:
        from rlinf.core import fsdp_scaling

        if _dies_now(self):
            fsdp_scaling._scatter_rows = _die  # type: ignore[assignment]  # this process only
        return super().scale_up()


class MegatronDiesReSharding(MegatronActor):
    """The Megatron actor's rank 1 dies in the tensor broadcast of its step-``KILL_AT`` scale-up.

    The small state's broadcast has passed; rank 0 is inside
    :func:`rlinf.core.fsdp_scaling.replicate`'s flat-buffer broadcast.
    """

    def scale_up(self) -> dict[str, Any]:
        import torch.distributed as dist

        if _dies_now(self):
            dist.broadcast = _die  # this process only
        return super().scale_up()


ACTORS: dict[str, type[FSDPActor]] = {"fsdp": DiesReSharding, "megatron": MegatronDiesReSharding}


def make_config(
    toy: Path, logs: Path, name: str, backend: str = "fsdp", **runner: Any
) -> ReasoningConfig:
    return validate_config(
        {
            "cluster": {
                "cpu_slots_per_node": 2,
                "component_placement": {"actor": 0, "rollout": 1, "reward": 1},
            },
            "runner": {
                "max_steps": STEPS,
                "max_epochs": 100,
                "val_check_interval": -1,
                "val_before_train": False,
                "save_interval": 2,
                "online_scaling": True,
                "step_timeout_s": 120,
                "channel_timeout_s": 60,
                "logger": {
                    "log_path": str(logs),
                    "experiment_name": name,
                    "logger_backends": [],
                },
                **runner,
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
                "rollout_batch_size": 4,
                "n_minibatches": 1,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": 4},
            },
            "actor": {
                "training_backend": backend,
                "model_path": str(toy / "model"),
                "micro_batch_size": 8,
            },
            "reward": {"num_workers": 1},
        },
        ReasoningConfig,
    )


@pytest.fixture(scope="module", params=sorted(ACTORS))
def setup(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    backend = request.param
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    assert not ray.is_initialized()
    toy = make_smoke_task(tmp_path_factory.mktemp("toy"), num_prompts=40)
    logs = tmp_path_factory.mktemp("logs")
    cfg = make_config(toy, logs, "launch", backend)
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        _, actor, rollout, reward = launch_reasoning_groups(
            cfg, cluster, "scaling-", timeout=300, actor_cls=ACTORS[backend]
        )
        try:
            yield {"toy": toy, "logs": logs, "backend": backend, "groups": [actor, rollout, reward]}
        finally:
            for group in (actor, rollout, reward):
                group.close()


def test_online_scaling_run_logs_phases_and_survives_a_rank_killed_mid_reshard(
    setup: dict[str, Any],
) -> None:
    actor, rollout, reward = groups = setup["groups"]
    assert actor.world_size == 2
    # rank 0 on the actor's slot, rank 1 on the rollout's
    assert [p.resource_ranks for p in actor.placements] == [(0,), (1,)]
    assert [p.resource_ranks for p in rollout.placements] == [(1,)]
    backend = setup["backend"]
    cfg = make_config(setup["toy"], setup["logs"], "kill", backend)
    runner = ReasoningRunner(cfg, actor, rollout, reward)
    try:
        runner.init_workers()
        with pytest.raises(ScalingError) as info:
            runner.run()
        err = info.value
        assert (err.phase, err.rank) == ("scale_up", 1)
        assert "scale_up" in str(err) and "rank 1" in str(err)
        assert runner.global_step == KILL_AT
        for m in runner.metrics_history:
            assert m["actor/world_size_generate"] == 1.0
            assert m["actor/world_size_train"] == 2.0
            assert m["time/scale_up"] > 0 and m["time/scale_down"] > 0
            print(
                f"step {m['step']:.0f}: scale up {m['time/scale_up']:.2f} s, "
                f"down {m['time/scale_down']:.2f} s, step {m['time/step']:.2f} s"
            )
        trained = runner.data_history[:KILL_AT]
    finally:
        runner.close()
    for group in groups:
        group.relaunch()
    resumed = ReasoningRunner(
        make_config(setup["toy"], setup["logs"], "kill", backend, resume_dir="auto"),
        actor,
        rollout,
        reward,
    )
    try:
        resumed.init_workers()
        assert resumed.global_step == KILL_AT  # from checkpoints/global_step_2
        resumed.run()
        assert resumed.global_step == STEPS
        assert len(resumed.data_history) == STEPS - KILL_AT
        assert all(len(set(d)) == 4 for d in trained + resumed.data_history)
        ckpts = sorted(p.name for p in resumed.checkpoint_root.iterdir())
        assert ckpts == ["global_step_2", "global_step_4", "global_step_6"]
    finally:
        resumed.close()
