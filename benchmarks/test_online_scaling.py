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
:func:`make_toy_task` reports. Each mode trains from the same warm start once
per data order in ``DATA_SEEDS`` (``data.seed``: which prompts make each
step's batch; the modes alternate, static then scaled, per order), evaluates
(greedy, all held-out prompts) every ``EVAL_EVERY`` steps and stops at the
first eval at or above ``initial + GAIN``, or after ``MAX_STEPS`` (the test
then fails: the row has no time). A run's time is the wall clock from the
start of its first step to the end of that eval, evals included.

Rows:

* **time to +GAIN held-out accuracy**, the sum over the data orders of the
  static runs' seconds / the sum of the scaled runs'; target > 1.0, floor 0.25;
* **step time**, from the same runs: ``static / scaled`` of the median over
  the runs of each run's median ``time/step`` (steps after ``WARMUP``);
  target > 1.0, floor 0.25;
* **scale-up + scale-down seconds** per step (target < 2 s, the floor allows
  4x that), the median of ``time/scale_up + time/scale_down`` over the scaled
  runs' steps.

The two modes train the same algorithm on the same data; the scaled run
splits each minibatch over two ranks (bit-identical to a static two-rank
actor, ``test_online_scaling.py``), so its numbers differ from the one-rank
run's by float rounding, and the eval that first reaches a +0.05 goal moves by
tens of steps between such runs (measured: 15 to 60). One data order decides
nothing (one run measured 0.40x, another 1.74x); the sum over three orders
is the row.

Measured on a quiet 2-core box (2026-11-27; 3.5 min for the file), with the
recipe's one FSDP2 unit for the tiny model kept gathered from forward to
backward (``actor.fsdp_units: model``, ``reshard_after_forward: false``), one
gradient reduction per minibatch, a fused AdamW and the local-shard clip:

* run 1: time to goal 91.9 s static (25, 50, 60 steps) vs 81.9 s scaled (55,
  45, 55 steps): **1.12x**; median step 0.648 vs 0.490 s: **1.32x**;
* run 2: 92.8 s (25, 50, 60) vs 73.9 s (40, 40, 60): **1.25x**; step 0.654 vs
  0.501 s: **1.31x**;
* run 3 (later, after the Megatron row was added): 83.2 s (25, 50, 60) vs 72.1 s
  (45, 60, 40): **1.15x**; step 0.590 vs 0.468 s: **1.26x**; the Megatron row
  0.700 vs 0.500 s: **1.40x**;
* scale-up + scale-down ~0.02 s median per step, ~97x under the 2 s budget;
  training 0.24-0.26 s on two ranks vs 0.35-0.36 s on one, the logprob
  recomputation 0.06-0.07 vs 0.10-0.11 s.

Before (one data order, per-layer FSDP2 units resharded after forward, a
gradient reduce-scatter per micro-batch): step time 0.83-1.07x and time to
goal 0.40-1.74x, training on two ranks no faster than on one (0.36-0.44 vs
0.38-0.41 s: gloo collectives cost ~0.8 ms each here, and each micro-batch
waited on several). See ``docs/online_scaling.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from toy_grpo_runs import (
    TASK,
    WARMUP,
    describe,
    launch_modes,
    shutdown,
    time_to_gain,
    toy_config,
)

from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import make_toy_task
from rlinf.sched import Cluster

pytestmark = pytest.mark.timeout(900)

GAIN = 0.05
EVAL_EVERY = 5
# The slowest runs that reached the goal needed 60 steps; one scaled run (data.seed 42,
# 2026-11-30, full tier) missed it in 80, its evals 0.18-0.21 against a 0.217 goal: the
# held-out accuracy moves by ~0.02 from eval to eval. The LR is constant after warm-up,
# so more steps change no run that reaches the goal sooner.
MAX_STEPS = 120
# Each mode trains once per data order (``data.seed``: which prompts make each
# step's batch); the time-to-accuracy row compares the sums over these runs.
DATA_SEEDS = (42, 7, 2024)


def _cfg(toy: Path, logs: Path, scaling: bool, data_seed: int, *extra: str) -> ReasoningConfig:
    flag = f"+runner.online_scaling={str(scaling).lower()}"
    return toy_config(toy, logs, MAX_STEPS, EVAL_EVERY, flag, f"data.seed={data_seed}", *extra)


def test_online_scaling_vs_static_time_to_accuracy(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    assert not ray.is_initialized()
    toy = tmp_path / "toy"
    modes = {"static": False, "scaled": True}
    cfgs = {mode: _cfg(toy, tmp_path / mode, on, DATA_SEEDS[0]) for mode, on in modes.items()}
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        groups, task = launch_modes(cluster, cfgs, toy)
        goal = task.accuracy + GAIN
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        try:
            for seed in DATA_SEEDS:  # the modes alternate, so load changes hit both
                for mode, on in modes.items():
                    cfg = _cfg(toy, tmp_path / f"{mode}-{seed}", on, seed)
                    runs[mode].append(time_to_gain(cfg, groups[mode], goal, EVAL_EVERY, mode))
        finally:
            shutdown(groups)
    print(f"\ninitial held-out accuracy {task.accuracy:.3f}, goal {goal:.3f}")
    for mode, mode_runs in runs.items():
        for seed, r in zip(DATA_SEEDS, mode_runs, strict=True):
            stages = {k: round(v, 3) for k, v in r["stages"].items()}
            print(describe(f"{mode} (data.seed {seed})", r, f"median stages {stages}"))
    scale_s = [s for r in runs["scaled"] for s in r["scale_s"]]
    print(f"scale up+down seconds per step: {[round(s, 3) for s in scale_s]}")
    missed = [
        (mode, seed)
        for mode, mode_runs in runs.items()
        for seed, r in zip(DATA_SEEDS, mode_runs, strict=True)
        if r["seconds"] is None
    ]
    assert not missed, (
        f"{missed} did not reach {goal:.3f} (+{GAIN:.2f}) within {MAX_STEPS} steps; "
        "raise MAX_STEPS or lower GAIN"
    )
    results = {
        mode: {
            "seconds": sum(r["seconds"] for r in mode_runs),
            "step_time": statistics.median(r["step_time"] for r in mode_runs),
        }
        for mode, mode_runs in runs.items()
    }
    print({mode: {k: round(v, 3) for k, v in r.items()} for mode, r in results.items()})
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
        f"online scaling vs static disaggregated GRPO, toy task time to +{GAIN:.2f} held-out "
        f"(sum over {len(DATA_SEEDS)} data orders)",
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


MEGATRON_STEPS = 12


def test_online_scaling_megatron_step_time(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    """The Megatron actor (TP = 1): step time with online scaling (1 -> 2 replicas) vs static.

    The same recipe, ``actor.training_backend=megatron``; ``MEGATRON_STEPS``
    steps per mode from the warm start, no evals (step time only; the
    time-to-accuracy row above is the FSDP actor's).
    """
    pytest.importorskip("megatron.core")
    assert not ray.is_initialized()
    toy = tmp_path / "toy"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    make_toy_task(toy, TASK)
    torch.set_num_threads(before)
    extra = ("+actor.training_backend=megatron",)
    medians: dict[str, float] = {}
    scale_s: list[float] = []
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        for mode, on in {"static": False, "scaled": True}.items():
            cfg = _cfg(toy, tmp_path / mode, on, DATA_SEEDS[0], *extra)
            groups = launch_reasoning_groups(cfg, cluster, f"meg-{mode}-")[1:]
            runner = ReasoningRunner(cfg, *groups)
            try:
                runner.init_workers()
                steps = [runner.train_step() for _ in range(MEGATRON_STEPS)]
            finally:
                runner.close()
                for group in groups:
                    group.close()
            medians[mode] = statistics.median(m["time/step"] for m in steps[WARMUP:])
            scale_s += [m.get("time/scale_up", 0.0) + m.get("time/scale_down", 0.0) for m in steps]
            print(
                f"megatron {mode}: median step {medians[mode]:.3f} s, training "
                f"{statistics.median(m['time/actor/training'] for m in steps[WARMUP:]):.3f} s"
            )
    print(f"megatron scale up+down seconds per step: {[round(s, 4) for s in scale_s if s]}")
    record_ratio(
        "online scaling vs static, Megatron actor (TP 1, 1 -> 2 replicas), toy task step time",
        1.0 / medians["scaled"],
        1.0 / medians["static"],
        unit="steps/s",
        baseline_name="static Megatron actor (1 rank)",
        target=1.0,
        floor=0.25,
    )
