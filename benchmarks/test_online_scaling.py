"""Online scaling (``runner.online_scaling``) against the same disaggregated run without it.

Issue 20 item 2: once generation ends, the actor grows onto the rollout's
devices for training and shrinks back before the next generation. Two rows:

* **scale-up + scale-down seconds** per step on the toy model (target < 2 s,
  the floor allows 4x that), the median of ``time/scale_up + time/scale_down``
  over the scaled run's steps;
* **step time, static vs scaled**: the toy task (short warm start), the same
  disaggregated placement (actor on CPU slot 0; rollout and reward on slot 1)
  and recipe (shuffled minibatches, as in ``toy_grpo_cpu.yaml``, so the actor
  trains after the whole batch is generated in both modes), one torch thread
  per worker. Without scaling slot 1 idles while the single actor rank trains;
  with it, two actor ranks train. The runs alternate (static, scaled, static,
  scaled); each reports its median ``time/step`` after ``WARMUP`` steps, and
  ends with an eval of the held-out prompts (printed for both: the two modes
  run the same number of steps of the same algorithm, so the step-time ratio
  is the time-to-accuracy ratio as long as their accuracies agree; the row
  does not stop at an accuracy target). Target > 1.0.

Measured on the 2-core box with other jobs running (81 s for the file):
scale-up + scale-down 0.40 s median per step (0.26-0.76 s; 0.94 s before
``scale_down`` stopped calling ``gc.collect``): the 2 s target is met.
Step time: static 1.01/0.69 s, scaled 1.52/1.11 s per step, so 0.65x: the
target (> 1.0) is NOT met on this toy size. The single actor rank trains a
step in ~0.4 s here and overlaps part of it with generation; the scaled step
adds ~0.4 s of re-sharding and its two-rank training is no faster on two
shared cores (gloo collectives on a 64-wide model cost as much as they save).
The gain needs training phases long against the re-shard (bigger models, more
update epochs) and devices that are really idle. Eval accuracy after 6 steps
was 0.025/0.025 static and 0.0/0.025 scaled (a 20-step warm start: too short
a run for an accuracy target, so no time-to-accuracy is measured).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from rlinf.core.config import validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import ToyTaskConfig, make_toy_task
from rlinf.sched import Cluster, WorkerGroup

pytestmark = pytest.mark.timeout(900)

STEPS = 6
WARMUP = 1
ROUNDS = 2
TASK = ToyTaskConfig(num_train=400, num_test=40, max_operand=29, sft_steps=20, batch_size=64)


def _cfg(toy: Path, logs: Path, scaling: bool) -> ReasoningConfig:
    return validate_config(
        {
            "cluster": {
                "cpu_slots_per_node": 2,
                "torch_threads": 1,
                "component_placement": {"actor": 0, "rollout": 1, "reward": 1},
            },
            "runner": {
                "max_steps": STEPS,
                "max_epochs": 100,
                "val_check_interval": STEPS,
                "val_before_train": False,
                "save_interval": -1,
                "online_scaling": scaling,
                "step_timeout_s": 600,
                "channel_timeout_s": 300,
                "logger": {"log_path": str(logs), "logger_backends": []},
            },
            "data": {
                "train_files": [str(toy / "train.jsonl")],
                "val_files": [str(toy / "test.jsonl")],
                "prompt_key": "problem",
                "answer_key": "answer",
                "max_prompt_length": 16,
                "seed": 1,
            },
            "algorithm": {
                "group_size": 16,
                "rollout_batch_size": 32,
                "n_minibatches": 4,
                "shuffle_rollout": True,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": 16},
            },
            "rollout": {"groups_per_chunk": 8},
            "actor": {
                "model_path": str(toy / "warmstart"),
                "micro_batch_size": 64,
                "sync_bucket_mb": 0.25,
                "optim": {"lr": 2e-4},
            },
            "reward": {"num_workers": 1},
        },
        ReasoningConfig,
    )


def _run(cfg: ReasoningConfig, groups: tuple[WorkerGroup, ...]) -> list[dict[str, float]]:
    runner = ReasoningRunner(cfg, *groups)
    try:
        runner.init_workers()
        runner.run()
    finally:
        runner.close()
    return runner.metrics_history


def test_online_scaling_vs_static_disaggregated(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    assert not ray.is_initialized()
    toy = tmp_path / "toy"
    modes = {"static": False, "scaled": True}
    cfgs = {mode: _cfg(toy, tmp_path / mode, on) for mode, on in modes.items()}
    step_times: dict[str, list[float]] = {mode: [] for mode in modes}
    accuracy: dict[str, list[float]] = {mode: [] for mode in modes}
    scale_s: list[float] = []
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        with ThreadPoolExecutor(max_workers=2) as pool:
            launches = {
                mode: pool.submit(launch_reasoning_groups, cfg, cluster, f"bench-{mode}-")
                for mode, cfg in cfgs.items()
            }
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            make_toy_task(toy, TASK)  # while the workers start
            torch.set_num_threads(before)
            launched: dict[str, Any] = {m: f.result(timeout=600) for m, f in launches.items()}
        groups = {m: (g[1], g[2], g[3]) for m, g in launched.items()}
        try:
            for _ in range(ROUNDS):
                for mode in modes:
                    history = _run(cfgs[mode], groups[mode])
                    step_times[mode].append(
                        statistics.median(m["time/step"] for m in history[WARMUP:])
                    )
                    accuracy[mode].append(history[-1]["eval/accuracy"])
                    if mode == "scaled":
                        scale_s += [m["time/scale_up"] + m["time/scale_down"] for m in history]
        finally:
            for group_set in groups.values():
                for group in group_set:
                    group.shutdown()
    static, scaled = (
        statistics.median(step_times["static"]),
        statistics.median(step_times["scaled"]),
    )
    print(
        f"\nmedian step seconds: static {step_times['static']}, scaled {step_times['scaled']}; "
        f"eval accuracy after {STEPS} steps: static {accuracy['static']}, "
        f"scaled {accuracy['scaled']}; scale up+down seconds per step {scale_s}"
    )
    record_ratio(
        "online scaling: scale-up + scale-down per step, toy model (1 -> 2 ranks, gloo)",
        statistics.median(scale_s),
        2.0,
        unit="s",
        baseline_name="2 s budget",
        target=1.0,
        floor=0.25,
        higher_is_better=False,
    )
    record_ratio(
        "online scaling vs static disaggregated GRPO, toy task step time (32x16 responses)",
        1.0 / scaled,
        1.0 / static,
        unit="steps/s",
        baseline_name="static actor (1 rank)",
        target=1.0,
        floor=0.25,
    )
