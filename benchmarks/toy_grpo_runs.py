"""Toy-task GRPO runs shared by the reasoning benchmarks (async GRPO, online scaling).

Both compare two modes of the shipped ``toy_grpo_cpu.yaml`` recipe from the
same warm start: :func:`toy_config` builds a mode's config,
:func:`launch_modes` starts each mode's groups once (side by side, while the
toy task is generated) and :func:`time_to_gain` trains until a held-out eval
reaches a goal.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlinf.core.config import load_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups
from rlinf.reasoning.toy_task import ToyTaskConfig, ToyTaskResult, make_toy_task
from rlinf.sched import Cluster, WorkerGroup

CONFIG_DIR = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "config"
# The task of the docs' quickstart, the slow learning test and these benchmarks.
TASK = ToyTaskConfig(num_train=1500, num_test=300, max_operand=29, sft_steps=300, batch_size=64)
WARMUP = 2
"""Steps left out of the median step time."""
STAGES = ("time/rollout", "time/reward", "time/actor/inference", "time/actor/training")

Groups = tuple[WorkerGroup, ...]


def toy_config(
    toy: Path, logs: Path, max_steps: int, eval_every: int, *overrides: str
) -> ReasoningConfig:
    """The recipe on the task in ``toy``, logging under ``logs``, plus ``overrides``."""
    return load_config(
        "toy_grpo_cpu",
        CONFIG_DIR,
        [
            f"data.train_files=[{toy}/train.jsonl]",
            f"data.val_files=[{toy}/test.jsonl]",
            f"actor.model_path={toy}/warmstart",
            f"runner.max_steps={max_steps}",
            "runner.save_interval=-1",
            f"runner.val_check_interval={eval_every}",  # builds the held-out set
            "runner.val_before_train=false",
            f"runner.logger.log_path={logs}",
            "runner.logger.logger_backends=[]",
            *overrides,
        ],
        ReasoningConfig,
    )


def launch_modes(
    cluster: Cluster, cfgs: dict[str, ReasoningConfig], toy: Path
) -> tuple[dict[str, Groups], ToyTaskResult]:
    """Each mode's rollout, reward and actor groups, launched while ``TASK`` is made in ``toy``."""
    with ThreadPoolExecutor(max_workers=len(cfgs)) as pool:
        launches = {
            mode: pool.submit(launch_reasoning_groups, cfg, cluster, f"bench-{mode}-")
            for mode, cfg in cfgs.items()
        }
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        task = make_toy_task(toy, TASK)
        torch.set_num_threads(before)
        launched = {mode: f.result(timeout=600) for mode, f in launches.items()}
    return {mode: (g[1], g[2], g[3]) for mode, g in launched.items()}, task


def shutdown(groups: dict[str, Groups]) -> None:
    """Shuts every mode's groups down."""
    for group_set in groups.values():
        for group in group_set:
            group.close()


def time_to_gain(
    cfg: ReasoningConfig, groups: Groups, goal: float, eval_every: int, label: str
) -> dict[str, Any]:
    """Trains until an eval reaches ``goal`` (or ``runner.max_steps``); times and curve.

    A run's time is the wall clock from the start of its first step to the end
    of the eval that reaches the goal (evals included); ``None`` if none does.
    """
    runner = ReasoningRunner(cfg, *groups)
    evals: list[tuple[int, float, float]] = []  # (step, accuracy, seconds since start)
    steps: list[dict[str, float]] = []  # what each train_step returned
    reached: float | None = None
    try:
        runner.init_workers()
        start = time.perf_counter()
        while runner.global_step < runner.total_steps:
            steps.append(runner.train_step())
            step = runner.global_step
            if step % eval_every == 0:
                acc = runner.evaluate()["eval/accuracy"]
                evals.append((step, acc, time.perf_counter() - start))
                print(f"  {label} step {step}: {acc:.3f} at {evals[-1][2]:.1f} s", flush=True)
                if acc >= goal:
                    reached = evals[-1][2]
                    break
        runner.stop_streams()
    finally:
        runner.close()
    late = steps[WARMUP:]
    return {
        "seconds": reached,
        "evals": evals,
        "step_time": statistics.median(m["time/step"] for m in late),
        "train_seconds": sum(m["time/step"] for m in steps),
        "scale_s": [m.get("time/scale_up", 0.0) + m.get("time/scale_down", 0.0) for m in steps],
        "stages": {
            key: statistics.median(m[key] for m in late)
            for key in STAGES
            if all(key in m for m in late)
        },
        "staleness_max": max((m.get("rollout/staleness_max", 0.0) for m in steps), default=0.0),
        "dropped": sum(m.get("rollout/dropped_stale_groups", 0.0) for m in steps),
        "steps": len(steps),
    }


def describe(label: str, result: dict[str, Any], extra: str) -> str:
    """One printed line of a :func:`time_to_gain` run: when it reached the goal, its
    training and median step time, ``extra``, and its evals (step, accuracy, seconds)."""
    evals = [(s, round(a, 3), round(t, 1)) for s, a, t in result["evals"]]
    return (
        f"{label}: reached in {result['seconds']} s after {result['steps']} steps "
        f"(training {result['train_seconds']:.1f} s, median step "
        f"{result['step_time']:.3f} s, {extra}); evals (step, acc, s): {evals}"
    )
