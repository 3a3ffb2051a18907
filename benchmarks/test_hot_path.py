"""The embodied hot path: one ManiSkill PickCube env and the MLP policy vs the bare simulator.

Issue 15 asks the rollout to run at the simulator's speed when envs are few
and cheap. This module measures how far it is, and where the time goes, in
one run (~1.5 min; skipped without ManiSkill or a Vulkan driver):

- ``rollout time beyond the env's chunk_step`` (info): per env step, the
  rollout's wall time minus the env rank's time inside ``chunk_step`` (the
  hand-offs and the policy's critical part), next to the bare simulator step.
- ``rollout vs bare simulator`` (target 0.8x, floor 0.2x): env steps/s of
  ``generate_rollouts`` (one ``PickCube-v1`` state env on the CPU sim, the
  MLP policy of ``maniskill_pickcube_ppo_mlp``, C = 1, env on CPU slot 0 and
  rollout on slot 1, 50 env steps per rollout) against the bare ManiSkill
  env stepped with random actions in this process (50 steps per round). The
  two alternate block by block (``interleave``).
- ``bare simulator in a worker process vs in the driver`` (info): the same
  bare loop in a plain Ray worker process (``BareSimulatorProcess``), in
  the same interleaving: how much of the gap above is only the simulator
  running in a Ray worker process rather than in this one.
- ``rollout ... vs bare simulator in a Ray worker process`` (info): the
  rollout against that worker-process loop, so our own per-step cost alone,
  without what a worker process costs the simulator on the machine (on the
  2-core VM the row above swings between 0.72x and 1.07x from run to run,
  and the target row with it).
- ``bare simulator in a plain subprocess vs in the driver`` (info): the same
  in a plain spawned process (``BareSimulatorSubprocess``, no Ray), to tell
  a Ray worker's own cost from that of any second process.
- ``rollout ... vs bare simulator in the env rank's own process`` and ``bare
  simulator in the env rank's process vs in the driver`` (info): the same loop
  run by the env rank itself (``EnvWorkerWithBareLoop.bare_steps``), between
  its rollouts. A process's speed can differ by several percent for its whole
  lifetime, with or without Ray (``benchmarks/notes/embodied_hot_path.md``); on the same
  process the rollout's ratio is our own per-step cost alone.
- ``bare simulator under torch.inference_mode vs plain`` (info): the same
  loop in the driver on a second env stepped under ``torch.inference_mode()``,
  as our ManiSkill backend steps its envs: what that alone buys (ManiSkill's
  step is mostly small torch ops).
- ``rollout in the env process vs bare simulator`` (target 0.8x, floor 0.2x):
  the same with ``rollout.in_env_process`` (the env rank runs the policy
  itself: no hand-offs, but the policy's work is on the env's thread), and its
  time beyond ``chunk_step`` (info). The ManiSkill MLP configs run the row
  above (``in_env_process: false``, their GPU layout); this one is their CPU
  option (``in_env_process: true``).
- the profile (info rows, no targets), the parts of one chunk step measured
  in this process on one thread under ``torch.inference_mode()`` (as the
  worker loops run them), each against the bare simulator step (median
  microseconds): our env wrapper's ``chunk_step`` (simulator
  included); the policy's ``predict_action_batch`` (actions, logprobs and
  values), and the same right after a chunk step (as in a rollout: the
  simulator step leaves the caches cold); pickling and unpickling each
  message of a hop
  (the observation message, the action chunk, the full ``PolicyOutput``:
  what a channel hop does besides waking the other side); and the trajectory
  builder. What a rollout step costs beyond the sum of the critical parts is
  the channel hops' wake-ups and the worker loops.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bare_simulator
import numpy as np
import pytest
import ray
import torch
from bare_simulator import (
    CONTROL,
    STEPS,
    BareSimulatorProcess,
    BareSimulatorSubprocess,
    EnvWorkerWithBareLoop,
    bare_env,
    bare_steps,
)

from rlinf.core.channel.serialization import dumps, loads
from rlinf.core.config import compose_config, validate_config
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.envs import EnvConfig, make_env
from rlinf.embodied.models import build_policy
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, MultiStepRolloutWorker
from rlinf.embodied.workers.common import merge_observations, obs_message
from rlinf.embodied.workers.trajectory import TrajectoryBuilder
from rlinf.sched import Cluster, HybridComponentPlacement, WorkerGroup, launch_groups, wait_all

if importlib.util.find_spec("mani_skill") is None:
    pytest.skip("ManiSkill is not installed: no hot-path rows", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "examples" / "embodiment" / "config"
PLACEMENT = {"actor": 0, "env": 0, "rollout": 1}


def rollout_config(log_path: Path, in_env_process: bool = False) -> EmbodiedConfig:
    data = compose_config(
        "maniskill_pickcube_ppo_mlp",
        CONFIG_DIR,
        [
            "env.train.num_envs=1",
            "env.train.sim_backend=cpu",
            f"env.train.max_steps_per_rollout_epoch={STEPS}",
            f"actor.global_batch_size={STEPS}",
            f"actor.micro_batch_size={STEPS}",
            "runner.val_check_interval=-1",
            "runner.save_interval=-1",
        ],
    )
    # The policy in the env process places no rollout group.
    placement = {"actor": 0, "env": 0} if in_env_process else PLACEMENT
    data["cluster"]["component_placement"] = placement
    data["runner"]["logger"]["log_path"] = str(log_path)
    data["env"]["eval"] = None
    data["rollout"]["in_env_process"] = in_env_process
    return validate_config(data, EmbodiedConfig)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread in this process, as in a worker on one CPU slot (then restored)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[WorkerGroup], Path]]:
    assert not ray.is_initialized()
    log_path = tmp_path_factory.mktemp("hot_path")
    cfg = rollout_config(log_path)
    # bare_simulator is not importable in the Ray workers: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(bare_simulator)
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        placement = HybridComponentPlacement(PLACEMENT, cluster.info)
        unlaunched = {
            name: (cls.create_group(cfg), placement.get_strategy(name))
            for cls, name in (
                (EmbodiedFSDPActor, "actor"),
                (MultiStepRolloutWorker, "rollout"),
                (EnvWorkerWithBareLoop, "env"),
            )
        }
        launched = launch_groups(cluster, unlaunched, timeout=300)
        try:
            yield list(launched.values()), log_path
        finally:
            for group in launched.values():
                group.close()
    if ray.is_initialized():
        ray.shutdown()


def _rollout_vs_bare(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    in_env_process: bool,
) -> tuple[dict[str, float], list[float]]:
    """Env steps/s per candidate (interleaved): the rollout, and the bare simulator here,
    here under ``inference_mode``, in a Ray worker process, in a plain subprocess and in
    the env rank's own process; and the rollout's time beyond the env's chunk_step per
    env step (us)."""
    (actor, rollout, env), log_path = groups
    sim = bare_env()
    sim_inference = bare_env()  # only ever stepped under inference_mode (see below)
    sim_process = ray.remote(num_cpus=0)(BareSimulatorProcess).remote()
    ray.get(sim_process.steps.remote())  # warm-up

    def in_env_rank() -> None:
        wait_all([env.bare_steps()], timeout=120)

    in_env_rank()  # warm-up: builds the env rank's bare env
    sim_subprocess = BareSimulatorSubprocess()
    steps: list[int] = []
    beyond_env_us: list[float] = []  # rollout wall time minus the env's chunk_step time
    cfg = rollout_config(log_path, in_env_process)
    with EmbodiedRunner(cfg, actor, None if in_env_process else rollout, env) as runner:
        runner.init_workers()
        runner.update_rollout_weights()
        runner.generate_rollouts()  # warm-up: first reset and inference

        def one_rollout() -> None:
            metrics = runner.generate_rollouts()
            steps.append(int(metrics["rollout/env_steps"]))
            beyond = metrics["time/generate_rollouts"] - metrics["time/env_chunk_steps"]
            beyond_env_us.append(beyond / STEPS * 1e6)

        stats = interleave(
            {
                "rollout": one_rollout,
                "bare simulator": bare_steps(sim, STEPS, np.random.default_rng(0)),
                "bare simulator under inference_mode": inference_mode(
                    bare_steps(sim_inference, STEPS, np.random.default_rng(0))
                ),
                "bare simulator in a worker process": lambda: ray.get(sim_process.steps.remote()),
                "bare simulator in a plain subprocess": sim_subprocess.steps,
                "bare simulator in the env rank's process": in_env_rank,
            },
            blocks=3,
            rounds=6,
            warmup_rounds=2,
        )
    sim.close()
    sim_inference.close()
    sim_subprocess.close()
    ray.get(sim_process.close.remote())
    ray.kill(sim_process)
    done = np.diff(steps)  # rollout/env_steps counts the run's env steps so far
    assert done.size and bool((done == STEPS).all()), steps  # 1 env, auto-reset: all steps live
    return {name: STEPS / stat.median for name, stat in stats.items()}, beyond_env_us


def inference_mode(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` under ``torch.inference_mode()``, as the ManiSkill backend steps its envs."""

    def wrapped() -> None:
        with torch.inference_mode():
            run()

    return wrapped


ROWS = {
    False: (
        "hot path: rollout vs bare simulator, 1 ManiSkill PickCube-v1 state env + MLP",
        "hot path: rollout vs bare simulator in a Ray worker process",
        "hot path: rollout vs bare simulator in the env rank's own process",
        "hot path: rollout time beyond the env's chunk_step, per env step",
    ),
    True: (
        "hot path: rollout in the env process vs bare simulator, 1 PickCube-v1 state env + MLP",
        "hot path: rollout in the env process vs bare simulator in a Ray worker process",
        "hot path: rollout in the env process vs bare simulator in the env rank's own process",
        "hot path: in the env process, rollout time beyond chunk_step, per env step",
    ),
}
"""Row names with a rollout group and with ``rollout.in_env_process``."""


@pytest.mark.parametrize("in_env_process", [False, True], ids=["rollout_group", "in_env_process"])
def test_rollout_vs_bare_simulator(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
    in_env_process: bool,
) -> None:
    """With a rollout group, and with the env rank running the policy itself."""
    rates, beyond_env_us = _rollout_vs_bare(groups, interleave, in_env_process)
    sim_rate = rates["bare simulator"]
    rate_row, in_worker_row, own_process_row, beyond_row = ROWS[in_env_process]
    record_ratio(
        rate_row,
        rates["rollout"],
        sim_rate,
        unit="env steps/s",
        baseline_name="bare sim",
        target=0.8,
        floor=0.2,
    )
    # The same rollout against the same bare loop run in a Ray worker process (the
    # kind of process the env rank is), and in the env rank's own process (the same
    # process draw: a process's speed can differ by several percent for its
    # lifetime): our own per-step cost, without what the process costs the simulator.
    for row, baseline, baseline_name in (
        (in_worker_row, "bare simulator in a worker process", "bare sim in worker"),
        (own_process_row, "bare simulator in the env rank's process", "bare sim in env rank"),
    ):
        record_ratio(
            row,
            rates["rollout"],
            rates[baseline],
            unit="env steps/s",
            baseline_name=baseline_name,
            target=None,
            floor=None,
        )
    run = "in-env-process run" if in_env_process else "rollout-group run"
    for where in ("a worker process", "a plain subprocess", "the env rank's process"):
        record_ratio(
            f"hot path: bare simulator in {where} vs in the driver, during the {run}",
            rates[f"bare simulator in {where}"],
            sim_rate,
            unit="env steps/s",
            baseline_name="bare sim",
            target=None,
            floor=None,
        )
    record_ratio(
        f"hot path: bare simulator under torch.inference_mode vs plain, during the {run}",
        rates["bare simulator under inference_mode"],
        sim_rate,
        unit="env steps/s",
        baseline_name="bare sim",
        target=None,
        floor=None,
    )
    record_ratio(
        beyond_row,
        statistics.median(beyond_env_us),
        1e6 / sim_rate,
        unit="us",
        baseline_name="sim step",
        target=None,
        floor=None,
        higher_is_better=False,
    )


def _median_us(fn: Callable[[], object], rounds: int = 300, warmup: int = 30) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def test_profile_of_one_chunk_step(record_ratio: Callable[..., object], tmp_path: Path) -> None:
    """Where a chunk step's microseconds go, part by part, against the simulator step.

    The parts run under ``torch.inference_mode()``, as the env and rollout
    workers' loops run them; the bare simulator step (the baseline) does not.
    """
    sim = bare_env()
    sim_us = _median_us(bare_steps(sim, 1, np.random.default_rng(0)), rounds=400)
    sim.close()
    with torch.inference_mode():
        parts = _profile_parts(tmp_path)
    for name, micros in parts.items():
        record_ratio(
            f"hot path profile: {name}",
            micros,
            sim_us,
            unit="us",
            baseline_name="sim step",
            target=None,
            floor=None,
            higher_is_better=False,
        )


def _profile_parts(tmp_path: Path) -> dict[str, float]:
    """Median microseconds of each part of a chunk step (see the module docstring)."""
    cfg = EnvConfig(
        env_type="maniskill",
        env_id="PickCube-v1",
        obs_mode="state",
        num_envs=1,
        sim_backend="cpu",
        auto_reset=True,
        max_episode_steps=STEPS,
        env_kwargs=CONTROL,
    )
    env = make_env(cfg)
    state: dict[str, Any] = {"out": env.reset()}
    actions = torch.rand(1, 1, env.spec.action_dim) * 2 - 1

    def env_step() -> None:
        state["out"], _ = env.chunk_step(actions)

    parts: dict[str, float] = {"env wrapper chunk_step (sim included)": _median_us(env_step, 400)}
    model = rollout_config(tmp_path).actor.model
    policy = build_policy(model, env.spec)
    generator = torch.Generator().manual_seed(0)
    out = state["out"]

    message = obs_message(out)

    def predict() -> Any:
        return policy.predict_action_batch(
            merge_observations([message])[0], mode="train", generator=generator
        )

    policy_out = predict()
    builder = TrajectoryBuilder(1, 1, 0.8, "always")
    alive = env.last_alive_mask

    def build() -> None:
        builder.add_policy_output(policy_out)
        builder.add_chunk(out, alive)

    parts["policy predict_action_batch"] = _median_us(predict)

    def predict_after_chunk_step() -> float:
        env.chunk_step(actions)  # as in a rollout: the simulator step runs in between
        started = time.perf_counter()
        predict()
        return time.perf_counter() - started

    after_step = [predict_after_chunk_step() for _ in range(300)]
    parts["policy predict_action_batch right after a chunk step (in situ)"] = (
        statistics.median(after_step[30:]) * 1e6
    )
    parts["obs message pickle + unpickle"] = _median_us(lambda: loads(*dumps(obs_message(out))))
    parts["action chunk pickle + unpickle"] = _median_us(lambda: loads(*dumps(policy_out.actions)))
    parts["PolicyOutput pickle + unpickle (overlaps the env)"] = _median_us(
        lambda: loads(*dumps(policy_out))
    )
    parts["trajectory builder, one step (overlaps the policy)"] = _median_us(
        build, rounds=STEPS, warmup=0
    )
    env.close()
    return parts
