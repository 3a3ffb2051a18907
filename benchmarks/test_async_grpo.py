"""Asynchronous GRPO (``algorithm.max_staleness: 1``) against synchronous GRPO: time to accuracy.

Issue 18's acceptance metric: async GRPO reaches the same +15-point gain in
held-out accuracy on the toy task as sync GRPO in less wall-clock time (target
1.3x), and never trains on groups older than ``max_staleness`` versions.

One run, one cluster, one task. Both modes use the same disaggregated
placement (actor on CPU slot 0; rollout and reward on slot 1) and the same
recipe, the shipped ``toy_grpo_cpu.yaml`` (64 prompts x 16 samples, shuffled
minibatches, recomputed logprobs, ``actor.optim.lr`` ``LR``) that the slow
learning test (``test_e2e_learning.py``) runs for 300 steps; truncated IS is
at its default, on in async mode and off in sync mode (where the recomputed
and the rollout logprobs agree, so the weights would be 1). The groups of
each mode are launched once (a worker's mode is fixed at launch), side by
side, while the task is generated.

The initial accuracy is the warm start's greedy held-out accuracy that
:func:`make_toy_task` reports (the runner's eval at step 0 agrees within 0.02;
``test_e2e_learning.py`` checks that). Each mode trains from the same warm
start once per data order in ``DATA_SEEDS`` (``data.seed``: which prompts
make each step's batch; the modes alternate, sync then async, per order),
evaluates (greedy, all held-out prompts) every ``EVAL_EVERY`` steps and stops
at the first eval at or above ``initial + 0.15``, or after ``MAX_STEPS`` (the
test then fails: the row has no time). A run's time is the wall clock from the
start of its first step to the end of that eval, evals included (both modes
evaluate at the same steps; in the async run the rollout keeps generating the
next batch during an eval, which is part of what async buys).

Rows (higher is better):

* time to +15 points: the sum over the data orders of the sync runs' seconds /
  the sum of the async runs'; target 1.3x, floor 0.6x. The tier runs one
  order (``DATA_SEEDS``) to keep CI under its hour: the step at which an eval
  first reaches the goal moves by tens of steps with the data order, in both
  modes, so a single order's ratio is noisy (the floor allows for it); add
  orders to ``DATA_SEEDS`` for a steadier figure. Quiet box, 2026-11-27: this file,
  sync 480 s (200, 300 and 270 steps for orders 42, 7 and 2024) vs async 405 s
  (260, 270, 260): **1.19x**; the same runs done separately before (one order
  per cluster): sync 200, 300, 270 steps vs async 250, 270, 220, per order
  0.92x, 1.34x and 1.56x, summed 1.26x. The file used one order (42) before,
  which measured 0.81x-1.36x over eight runs; 15 minutes now (5 before).
  With the proximal logprobs scored by the rollout (``algorithm.proximal_on_rollout``,
  on by default in async mode), same box and day: sync 482 s (200, 300, 270
  steps) vs async 332 s (200, 210, 270): **1.45x**, step 0.61 vs 0.45 s
  (1.36x);
* step time: ``sync / async`` of the median over the runs of each run's median
  ``time/step`` (steps after the first ``WARMUP``); informational (quiet box:
  1.15-1.23x). Its ceiling is ``1 + G / A``: the async step is at best the
  actor's own work A (~0.48 s: recompute 0.11, training 0.34, preparing
  samples 0.02), the sync one adds the generation and scoring G that does not
  overlap it (~0.11 s); ``docs/sync_vs_async.md`` has the breakdown.

Every async step's ``rollout/staleness_max`` is checked to be at most
``max_staleness`` (the runner also raises if the actor trained on an older
weight version).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from toy_grpo_runs import describe, launch_modes, shutdown, time_to_gain, toy_config

from rlinf.sched import Cluster

pytestmark = pytest.mark.timeout(3000)

GAIN = 0.15
LR = 2e-4
EVAL_EVERY = 10
MAX_STEPS = 350
K = 1
# One data order in the tier (15 minutes with three); every run must reach the goal,
# so this file also checks that sync and async toy GRPO learn (the slow tier's HF
# learning tests, which CI deselects, run the same recipe).
DATA_SEEDS = (42,)


def _orders() -> str:
    """How the row names the data orders it covers."""
    if len(DATA_SEEDS) == 1:
        return f"data order {DATA_SEEDS[0]}"
    return f"sum over {len(DATA_SEEDS)} data orders"


def test_async_vs_sync_grpo_time_to_accuracy(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    assert not ray.is_initialized()
    toy = tmp_path / "toy"
    modes = {"sync": 0, "async": K}

    def cfg(mode: str, seed: int, logs: Path) -> Any:
        lr, staleness = f"actor.optim.lr={LR}", f"algorithm.max_staleness={modes[mode]}"
        return toy_config(toy, logs, MAX_STEPS, EVAL_EVERY, lr, staleness, f"data.seed={seed}")

    cfgs = {mode: cfg(mode, DATA_SEEDS[0], tmp_path / mode) for mode in modes}
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        groups, task = launch_modes(cluster, cfgs, toy)
        goal = task.accuracy + GAIN
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        try:
            for seed in DATA_SEEDS:  # the modes alternate, so load changes hit both
                for mode in modes:
                    run_cfg = cfg(mode, seed, tmp_path / f"{mode}-{seed}")
                    label = f"{mode} (data.seed {seed})"
                    runs[mode].append(time_to_gain(run_cfg, groups[mode], goal, EVAL_EVERY, label))
        finally:
            shutdown(groups)
    print(f"\ninitial held-out accuracy {task.accuracy:.3f}, goal {goal:.3f}")
    for mode, mode_runs in runs.items():
        for seed, r in zip(DATA_SEEDS, mode_runs, strict=True):
            extra = f"staleness max {r['staleness_max']:.0f}, dropped groups {r['dropped']:.0f}"
            print(describe(f"{mode} (data.seed {seed})", r, extra))
    assert all(r["staleness_max"] <= K for r in runs["async"])
    missed = [
        (mode, seed)
        for mode, mode_runs in runs.items()
        for seed, r in zip(DATA_SEEDS, mode_runs, strict=True)
        if r["seconds"] is None
    ]
    assert not missed, (
        f"{missed} did not reach {goal:.3f} (+{GAIN:.2f}) within {MAX_STEPS} steps; "
        "raise MAX_STEPS or LR"
    )
    seconds = {mode: sum(r["seconds"] for r in mode_runs) for mode, mode_runs in runs.items()}
    step = {
        m: statistics.median(r["step_time"] for r in mode_runs) for m, mode_runs in runs.items()
    }
    record_ratio(
        f"async GRPO (max_staleness {K}) vs sync GRPO, toy task time to +15 points held-out "
        f"({_orders()})",
        seconds["async"],
        seconds["sync"],
        unit="s",
        baseline_name="sync GRPO",
        target=1.3,
        floor=0.6,
        higher_is_better=False,
    )
    record_ratio(
        f"async GRPO (max_staleness {K}) vs sync GRPO, toy task step time (64x16 responses)",
        1.0 / step["async"],
        1.0 / step["sync"],
        unit="steps/s",
        baseline_name="sync GRPO",
        target=None,
        floor=None,
    )
