"""Online scaling (``runner.online_scaling``) against the same disaggregated run without it.

Issue 20's acceptance: the reasoning toy task in disaggregated mode with
online scaling reaches its accuracy target in less wall-clock time than
without. Once generation ends, the scaled actor grows from its one base rank
(CPU slot 0) onto the rollout's slot for training and shrinks back before the
next generation; the static actor trains on slot 0 alone while slot 1 idles.

One run, one cluster, one task. Both modes use the same disaggregated
placement (actor on CPU slot 0; rollout and reward on slot 1) and the same
recipe: the shipped ``toy_grpo_cpu.yaml`` (64 prompts x 16 samples, shuffled
minibatches, recomputed logprobs, one torch thread per worker: its own best
setting on this box), the task of ``benchmarks/test_async_grpo.py``, the same
seeds; only ``runner.online_scaling`` differs. The groups of each mode are
launched once, side by side, while the task is generated (the scaled actor
builds its grown model then, once).

The initial accuracy is the warm start's greedy held-out accuracy that
:func:`make_toy_task` reports. Each mode trains from the same warm start,
evaluates (greedy, all held-out prompts) every ``EVAL_EVERY`` steps and stops
at the first eval at or above ``initial + GAIN``, or after ``MAX_STEPS`` (the
test then fails: the row has no time). Its time is the wall clock from the
start of its first step to the end of that eval, evals included.

Rows:

* **time to +GAIN held-out accuracy**, ``static seconds / scaled seconds``;
  target > 1.0, floor 0.25;
* **step time**, from the same runs: ``static median time/step / scaled
  median time/step`` (steps after ``WARMUP``); target > 1.0, floor 0.25;
* **scale-up + scale-down seconds** per step (target < 2 s, the floor allows
  4x that), the median of ``time/scale_up + time/scale_down`` over the scaled
  run's steps.

The two modes train the same algorithm on the same data; the scaled run
splits each minibatch over two ranks (bit-identical to a static two-rank
actor, ``test_online_scaling.py``), so its numbers differ from the one-rank
run's by float rounding and the eval that first reaches the goal may come a
few steps apart: read the step-time row beside the time-to-accuracy row.

Measured on the shared 2-core box (other jobs running), two runs of the file
(124 s and 100 s); initial accuracy 0.167, goal 0.217:

* run 1: static reached it at step 20 in 20.3 s (median step 0.934 s), scaled
  at step 45 in 51.2 s (median step 1.127 s): 0.40x, step time 0.83x;
* run 2: both at step 20, static 22.5 s (median step 0.979 s), scaled 23.9 s
  (1.133 s): 0.94x, step time 0.86x; median stages static / scaled: training
  0.539 / 0.595 s, logprob recomputation 0.214 / 0.191 s.

The target (> 1.0) is NOT met. Scale-up + scale-down: 0.030-0.032 s median per
step (0.40-0.45 s before the grown model was built once): the 2 s target is met
by far (with the re-shard shared with the embodied stack in
``rlinf.core.fsdp_scaling``: 0.041 s and 0.035 s median in two more runs, whose
static steps were also slower, 1.16 s). What is left is the training itself:
two gloo ranks train the step's batch ~1.4-1.5x faster than one outside Ray,
but inside these Ray runs no faster than one rank (not explained yet), and
which eval first reaches a +0.05 goal varies between runs (run 1). See
``docs/online_scaling.md``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from rlinf.core.config import load_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import ToyTaskConfig, make_toy_task
from rlinf.sched import Cluster, WorkerGroup

pytestmark = pytest.mark.timeout(900)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "config"
GAIN = 0.05
EVAL_EVERY = 5
MAX_STEPS = 60
WARMUP = 2
STAGES = ("time/rollout", "time/reward", "time/actor/inference", "time/actor/training")
# The task of the docs' quickstart, the slow learning test and the async benchmark.
TASK = ToyTaskConfig(num_train=1500, num_test=300, max_operand=29, sft_steps=300, batch_size=64)


def _cfg(toy: Path, logs: Path, scaling: bool) -> ReasoningConfig:
    return load_config(
        "toy_grpo_cpu",
        CONFIG_DIR,
        [
            f"data.train_files=[{toy}/train.jsonl]",
            f"data.val_files=[{toy}/test.jsonl]",
            f"actor.model_path={toy}/warmstart",
            f"runner.max_steps={MAX_STEPS}",
            "runner.save_interval=-1",
            f"runner.val_check_interval={EVAL_EVERY}",  # builds the held-out set
            "runner.val_before_train=false",
            f"runner.logger.log_path={logs}",
            "runner.logger.logger_backends=[]",
            f"+runner.online_scaling={str(scaling).lower()}",
        ],
        ReasoningConfig,
    )


def _time_to_gain(
    cfg: ReasoningConfig, groups: tuple[WorkerGroup, ...], goal: float
) -> dict[str, Any]:
    """Trains until an eval reaches ``goal`` (or ``MAX_STEPS``); returns times and curve."""
    runner = ReasoningRunner(cfg, *groups)
    evals: list[tuple[int, float, float]] = []  # (step, accuracy, seconds since start)
    steps: list[dict[str, float]] = []  # what each train_step returned
    reached: float | None = None
    mode = "scaled" if cfg.runner.online_scaling else "static"
    try:
        runner.init_workers()
        start = time.perf_counter()
        while runner.global_step < runner.total_steps:
            steps.append(runner.train_step())
            step = runner.global_step
            if step % EVAL_EVERY == 0:
                acc = runner.evaluate()["eval/accuracy"]
                evals.append((step, acc, time.perf_counter() - start))
                print(f"  {mode} step {step}: {acc:.3f} at {evals[-1][2]:.1f} s", flush=True)
                if acc >= goal:
                    reached = evals[-1][2]
                    break
    finally:
        runner.close()
    return {
        "seconds": reached,
        "evals": evals,
        "step_time": statistics.median(m["time/step"] for m in steps[WARMUP:]),
        "train_seconds": sum(m["time/step"] for m in steps),
        "scale_s": [m.get("time/scale_up", 0.0) + m.get("time/scale_down", 0.0) for m in steps],
        "stages": {
            key: statistics.median(m[key] for m in steps[WARMUP:])
            for key in STAGES
            if all(key in m for m in steps[WARMUP:])
        },
        "steps": len(steps),
    }


def test_online_scaling_vs_static_time_to_accuracy(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    assert not ray.is_initialized()
    toy = tmp_path / "toy"
    modes = {"static": False, "scaled": True}
    cfgs = {mode: _cfg(toy, tmp_path / mode, on) for mode, on in modes.items()}
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        with ThreadPoolExecutor(max_workers=2) as pool:
            launches = {
                mode: pool.submit(launch_reasoning_groups, cfg, cluster, f"bench-{mode}-")
                for mode, cfg in cfgs.items()
            }
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            task = make_toy_task(toy, TASK)  # while the workers start
            torch.set_num_threads(before)
            launched: dict[str, Any] = {m: f.result(timeout=600) for m, f in launches.items()}
        groups = {m: (g[1], g[2], g[3]) for m, g in launched.items()}
        goal = task.accuracy + GAIN
        results: dict[str, dict[str, Any]] = {}
        try:
            for mode in modes:
                results[mode] = _time_to_gain(cfgs[mode], groups[mode], goal)
        finally:
            for group_set in groups.values():
                for group in group_set:
                    group.shutdown()
    print(f"\ninitial held-out accuracy {task.accuracy:.3f}, goal {goal:.3f}")
    for mode, r in results.items():
        print(
            f"{mode}: reached in {r['seconds']} s after {r['steps']} steps "
            f"(training {r['train_seconds']:.1f} s, median step {r['step_time']:.3f} s, "
            f"median stages { ({k: round(v, 3) for k, v in r['stages'].items()}) }); "
            f"evals (step, acc, s): {[(s, round(a, 3), round(t, 1)) for s, a, t in r['evals']]}"
        )
    scale_s = results["scaled"]["scale_s"]
    print(f"scale up+down seconds per step: {[round(s, 3) for s in scale_s]}")
    missed = [m for m, r in results.items() if r["seconds"] is None]
    assert not missed, (
        f"{missed} did not reach {goal:.3f} (+{GAIN:.2f}) within {MAX_STEPS} steps; "
        "raise MAX_STEPS or lower GAIN"
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
        f"online scaling vs static disaggregated GRPO, toy task time to +{GAIN:.2f} held-out",
        results["scaled"]["seconds"],
        results["static"]["seconds"],
        unit="s",
        baseline_name="static actor (1 rank)",
        target=1.0,
        floor=0.25,
        higher_is_better=False,
    )
    record_ratio(
        "online scaling vs static disaggregated GRPO, toy task step time (64x16 responses)",
        1.0 / results["scaled"]["step_time"],
        1.0 / results["static"]["step_time"],
        unit="steps/s",
        baseline_name="static actor (1 rank)",
        target=1.0,
        floor=0.25,
    )
