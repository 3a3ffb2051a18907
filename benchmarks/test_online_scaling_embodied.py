"""Embodied online scaling (``runner.online_scaling``) against the same run without it.

Issue 20 item 2, embodied stack: after each rollout the actor grows onto the
rollout's slot for the PPO update and shrinks back. CartPole PPO with the
README config (``cartpole_ppo_mlp``: 16 envs x 128 chunk steps, 4 update
epochs, minibatches of 512), shortened to ``STEPS`` steps per run and with the
two pipeline stages and a rollout group; disaggregated actor: actor on
CPU slot 0, env and rollout on slot 1; one torch thread per worker (the
embodied workers' setting). Two rows:

* **scale-up + scale-down seconds** per step (target < 2 s; the row is the 2 s
  budget over the median ``time/scale_up + time/scale_down``, floor 0.25);
* **step time, static vs scaled**: the runs alternate (static, scaled, static,
  scaled) on groups launched once; each reports its median ``time/step``
  after ``WARMUP`` steps; the ratio is static / scaled step time (target 1.0,
  floor 0.25). Both modes run the same algorithm on the same data split (the
  scaled actor splits each rollout over 2 ranks, the static one over 1), so
  per step they do the same work.

Measured on the shared 2-core box (66 s for the file, while other helpers' jobs
waited on the Ray lock): scale-up + scale-down 0.16 s median per step
(0.13-0.19 s; 2.5 s on the first step, which builds the grown parts) with the
first, per-tensor re-shard (``full_tensor`` + broadcast + local slice). Since
both stacks share ``rlinf.core.fsdp_scaling``'s flat gather/scatter per dtype
(about 55 s for the file, two runs): 0.029 s and 0.022 s median (0.015-0.066 s;
2.0 s on the first step), 68-92x under the 2 s target. Step time: static
0.82/0.71 and 0.77/0.70 s, scaled 0.97/0.93 and 1.12/0.86 s per step, so 0.80x
and 0.74x (before: static 1.06/0.85 s, scaled 1.29/0.91 s, 0.87x; all on the
shared box): the target (1.0) is NOT met at this size. The PPO update of the
64-wide MLP on 2048 samples takes a few hundred ms on one rank; two gloo ranks
on two shared cores do not train it faster.

On a quiet box (2026-11-27, 33 s for the file), after the config kept the MLP
gathered from forward to backward (``actor.reshard_after_forward: false``):
step time static 0.38/0.33 s, scaled 0.50/0.52 s, 0.69x (training 0.29 s on two
ranks against 0.15-0.19 s on one: 16 optimizer steps of ~10 ms each, and each
costs two ranks several ~1 ms gloo collectives and DTensor's per-op overhead).
After ``clip_and_step`` clipped the local shards with one all-reduce for both
param groups and AdamW went fused: 0.85x (static 0.38/0.32 s, scaled 0.42/0.41
s) and 0.88x (0.32/0.29 s vs 0.34/0.35 s), still NOT met; scale-up + scale-down
0.011-0.015 s per step (1.3 s on the first). The last ``env/return`` differs a
little between the modes (42.0 vs 44.3 after 5 steps): the minibatch shuffles
are seeded per rank, so 1 and 2 ranks draw different minibatches (the exactness
test compares a grown actor with a static one of the same size).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.autoplace_profile import launch_embodied_groups
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.sched import Cluster, WorkerGroup

pytestmark = pytest.mark.timeout(600)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "examples" / "embodiment" / "config"
STEPS = 5
WARMUP = 1
ROUNDS = 2


def _cfg(logs: Path, scaling: bool, name: str) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            f"+runner.online_scaling={str(scaling).lower()}",
            f"runner.logger.log_path={logs}",
            f"runner.logger.experiment_name={name}",
            f"runner.max_epochs={STEPS}",
            "runner.val_check_interval=-1",
            "runner.save_interval=-1",
            "rollout.pipeline_stage_num=2",
            "rollout.in_env_process=false",
        ],
    )
    data["cluster"]["component_placement"] = {"actor": 0, "env": 1, "rollout": 1}
    return validate_config(data, EmbodiedConfig)


def _scalars(tb_dir: Path, key: str) -> list[float]:
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in sorted(acc.Scalars(key), key=lambda e: e.step)]


def _run(cfg: EmbodiedConfig, groups: list[WorkerGroup]) -> Path:
    actor, rollout, env = groups
    with EmbodiedRunner(cfg, actor, rollout, env) as runner:
        runner.init_workers()
        runner.run()
        return runner.tensorboard_dir


def test_embodied_online_scaling_vs_static(
    tmp_path: Path, record_ratio: Callable[..., object]
) -> None:
    assert not ray.is_initialized()
    modes = {"static": False, "scaled": True}
    step_times: dict[str, list[float]] = {mode: [] for mode in modes}
    returns: dict[str, list[float]] = {mode: [] for mode in modes}
    scale_s: list[float] = []
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                mode: pool.submit(
                    launch_embodied_groups, cluster, _cfg(tmp_path, on, "launch"), f"es-{mode}"
                )
                for mode, on in modes.items()
            }
            groups = {mode: f.result(timeout=300) for mode, f in futures.items()}
        try:
            for r in range(ROUNDS):
                for mode, on in modes.items():
                    tb = _run(_cfg(tmp_path, on, f"{mode}{r}"), groups[mode])
                    step_times[mode].append(statistics.median(_scalars(tb, "time/step")[WARMUP:]))
                    returns[mode].append(_scalars(tb, "env/return")[-1])
                    if on:
                        ups, downs = (
                            _scalars(tb, "time/scale_up"),
                            _scalars(tb, "time/scale_down"),
                        )
                        scale_s += [u + d for u, d in zip(ups, downs, strict=True)]
        finally:
            for group_set in groups.values():
                for group in group_set:
                    group.close()
    static = statistics.median(step_times["static"])
    scaled = statistics.median(step_times["scaled"])
    print(
        f"\nmedian step seconds: static {step_times['static']}, scaled {step_times['scaled']}; "
        f"last env/return: static {returns['static']}, scaled {returns['scaled']}; "
        f"scale up+down seconds per step {[round(s, 3) for s in scale_s]}"
    )
    record_ratio(
        "embodied online scaling: scale-up + scale-down per step, CartPole MLP (1 -> 2 ranks)",
        statistics.median(scale_s),
        2.0,
        unit="s",
        baseline_name="2 s budget",
        target=1.0,
        floor=0.25,
        higher_is_better=False,
    )
    record_ratio(
        "embodied online scaling vs static disaggregated PPO, CartPole step time",
        1.0 / scaled,
        1.0 / static,
        unit="steps/s",
        baseline_name="static actor (1 rank)",
        target=1.0,
        floor=0.25,
    )
