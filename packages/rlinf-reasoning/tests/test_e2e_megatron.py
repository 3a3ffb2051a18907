"""End to end GRPO with the Megatron actor (TP = 2) through the runner and real Ray workers.

Both CPU slots hold everything (collocated): the two actor ranks form one
tensor-parallel group (one data-parallel replica), the rollout and reward
have a rank on each slot. A short run trains, the first weight sync is
verified exact by the rollout (and a last one by the test), a checkpoint is
written, and a fresh runner resumes from it with exactly its weights and the
same data order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from safetensors.torch import load_file

from rlinf.core.config import validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import ToyTaskConfig, make_toy_task
from rlinf.sched import Cluster

pytest.importorskip("megatron.core")
# ~80 s (Megatron TP2 through Ray): slow tier, to keep the default run in its
# budget; the Megatron actor's own tests (test_actor_megatron.py: TP2 step equals
# FSDP, checkpoints, weight export) run by default.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

STEPS = 4
PLACEMENT = {"actor": "0-1", "rollout": "0-1", "reward": "0-1"}


def _cfg(toy: Path, logs: Path, name: str, **runner: Any) -> ReasoningConfig:
    return validate_config(
        {
            "cluster": {"cpu_slots_per_node": 2, "component_placement": PLACEMENT},
            "runner": {
                "max_steps": STEPS,
                "max_epochs": 1000,
                "val_before_train": False,
                "val_check_interval": -1,
                "save_interval": 2,
                "step_timeout_s": 300,
                "channel_timeout_s": 120,
                "logger": {"log_path": str(logs), "experiment_name": name},
                **runner,
            },
            "data": {
                "train_files": [str(toy / "train.jsonl")],
                "prompt_key": "problem",
                "answer_key": "answer",
                "max_prompt_length": 16,
                "seed": 7,
            },
            "algorithm": {
                "group_size": 4,
                "rollout_batch_size": 8,
                "n_minibatches": 2,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": 8},
            },
            "actor": {
                "training_backend": "megatron",
                "model": {"tensor_model_parallel_size": 2},
                "model_path": str(toy / "warmstart"),
                "micro_batch_size": 8,
                "sync_bucket_mb": 0.1,
                "optim": {"lr": 3e-4},
            },
            "reward": {"num_workers": 1},
        },
        ReasoningConfig,
    )


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    make_toy_task(out, ToyTaskConfig(num_train=200, num_test=20, max_operand=29, sft_steps=60))
    torch.set_num_threads(before)
    return out


def _run(cfg: ReasoningConfig, cluster: Cluster, name: str, resume: Path | None = None) -> Any:
    placement, actor, rollout, reward = launch_reasoning_groups(cfg, cluster, name)
    assert placement.is_collocated and actor.world_size == 2
    runner = ReasoningRunner(cfg, actor, rollout, reward, collocated=True)
    try:
        runner.init_workers(resume_dir=resume)
        if resume is not None:  # the resumed weights are the checkpoint's, exactly
            saved = load_file(resume / "actor" / "huggingface" / "model.safetensors")
            loaded = dict(actor.full_weights().wait()[0])
            assert loaded.keys() == saved.keys()
            assert all(torch.equal(loaded[n], saved[n]) for n in saved)
        runner.run()
        summary = actor.state_summary().wait()
        # After a sync every rollout engine holds exactly the actor's current weights.
        runner.update_rollout_weights(runner.global_step)
        full = actor.full_weights().wait()[0]
        assert rollout.weights_max_abs_diff(full).wait() == [0.0, 0.0]
        return runner, summary
    finally:
        runner.close(groups=True)


def test_megatron_tp2_trains_syncs_and_resumes(toy: Path, tmp_path: Path) -> None:
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        cfg = _cfg(toy, tmp_path / "logs", "full")
        full, summary = _run(cfg, cluster, "full")
        assert full.global_step == STEPS
        # Both TP ranks hold the same (gathered) weights; 2 optimizer steps per step.
        assert summary[0]["checksum"] == summary[1]["checksum"]
        assert summary[0]["optim_steps"] == STEPS * 2
        first = full.sync_history[0]
        buckets = first["actor"]["num_buckets"]
        assert 2 <= buckets < first["actor"]["num_tensors"]
        for rank in first["rollout"]:  # every rollout rank: all buckets, exact weights
            assert rank["num_buckets"] == buckets and rank["max_abs_diff"] == 0.0
        assert all(m["rollout/num_groups"] == 8 for m in full.metrics_history)
        # A step whose groups all have equal rewards has zero advantages (zero gradient).
        norms = [m["actor/grad_norm"] for m in full.metrics_history]
        print(f"\nMegatron TP=2 e2e: grad norms {norms}")
        assert any(n > 0 for n in norms)
        ckpt = full.checkpoint_root / "global_step_2"
        assert (ckpt / "actor" / "dist" / "metadata.json").is_file()  # dist_checkpointing
        assert (ckpt / "actor" / "megatron_meta.pt").is_file()
        assert (ckpt / "actor" / "huggingface" / "model.safetensors").is_file()

        resumed_cfg = _cfg(toy, tmp_path / "logs", "resumed")
        resumed, again = _run(resumed_cfg, cluster, "resumed", resume=ckpt)
        assert resumed.global_step == STEPS
        assert resumed.data_history == full.data_history[2:]
        assert again[0]["optim_steps"] == summary[0]["optim_steps"]
        # Not the same final weights: with two rollout and reward ranks the groups reach
        # the actor in a racy order (minibatches differ) and each rollout rank seeds its
        # sampling by rank, so two runs differ anyway; test_actor_megatron.py checks that
        # a resumed step equals the uninterrupted one on the same groups.
        rewards = [round(m["rollout/reward_scores"], 3) for m in full.metrics_history]
        print(
            f"Megatron TP=2 e2e: rewards {rewards}, final checksum "
            f"{summary[0]['checksum']:.6f} (resumed {again[0]['checksum']:.6f})"
        )
