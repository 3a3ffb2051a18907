"""Pipelined rollout: env steps/s with ``pipeline_stage_num: 2`` versus 1, in one run.

A synthetic env and a synthetic policy (both registered here and imported by the
workers through ``runner.plugin_modules``) cost the same sleep per env, on
different CPU slots (env on slot 0, rollout on slot 1). With one stage the env
and the policy take turns; with two stages the env simulates one half of its
envs while the policy acts on the other half, so the rollout time approaches
half. Ratio row: target 1.85x (issue 15; ideal 2x), floor 1.3x.

The VLA row does the same with real compute on the rollout side: a tiny pi0
(``make_tiny_pi0``: transformers' stock ``PI0ForConditionalGeneration``, run
with ``lang_reach_ppo_pi0``, value head on) acts on ``lang_reach`` images,
states and instructions, and the env (``lang_reach`` plus a sleep,
``calibrated_lang_reach``) is calibrated in this process to cost what one pi0
call costs per env, so the env and the policy weigh the same. Target 1.5x,
floor 1.1x.

The A/A control row compares one CartPole stage (32 envs, MLP) with itself in
the same interleaved blocks: its spread is this comparison's noise, the bar a
default-on speed change must clear. An informational row (``-m slow``) compares
two stages with one on ManiSkill PickCube (state, CPU sim, 8 envs).

Both settings use the same launched worker groups (``init_workers`` rebuilds
the envs for each stage count). pytest-benchmark times ``generate_rollouts``
over several rollouts per block after a warm-up rollout, the two settings in
interleaved blocks (``interleave`` in ``conftest.py``) so load bursts hit both
alike.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from numpy.typing import NDArray
from torch import Tensor, nn

from rlinf.core.config import compose_config, validate_config
from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.envs import (
    EnvConfig,
    StepResult,
    VectorEnv,
    available_envs,
    make_env,
    register_env,
)
from rlinf.embodied.envs.lang_reach import LangReachEnv
from rlinf.embodied.models import (
    BasePolicy,
    PolicyConfig,
    available_policies,
    build_policy,
    register_policy,
)
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker, MultiStepRolloutWorker
from rlinf.sched import Cluster, HybridComponentPlacement, WorkerGroup

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "examples" / "embodiment" / "config"
COST_PER_ENV_S = 2e-3
"""Sleep per env and call, for the synthetic env step and the synthetic policy alike."""
STATE_DIM = 4


class SleepyEnv(VectorEnv):
    """Does nothing for ``COST_PER_ENV_S`` per stepped env and sub-step; episodes never end."""

    def _setup(self) -> EnvSpec:
        return EnvSpec(
            state_dim=STATE_DIM,
            image_shape=None,
            action_dim=1,
            action_low=(-1.0,),
            action_high=(1.0,),
            max_episode_steps=1_000_000,
        )

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> dict[str, Tensor]:
        return {"states": torch.zeros(len(env_ids), STATE_DIM)}

    def _step_envs(self, actions: Tensor, active: NDArray[Any]) -> StepResult:
        time.sleep(COST_PER_ENV_S * int(active.sum()))
        n = self.num_envs
        return StepResult(
            obs={"states": torch.zeros(n, STATE_DIM)},
            rewards=np.zeros(n),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
        )

    def _close(self) -> None:
        pass


class SleepyPolicy(BasePolicy):
    """Sleeps ``COST_PER_ENV_S`` per env when acting; one linear layer makes it trainable."""

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        self.linear = nn.Linear(STATE_DIM, 1)

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
    ) -> PolicyOutput:
        states = obs["states"]
        n, c = states.shape[0], self.num_action_chunks
        time.sleep(COST_PER_ENV_S * n)
        actions = torch.zeros(n, c, 1)
        return PolicyOutput(
            actions=actions,
            prev_logprobs=torch.zeros(n, c),
            prev_values=torch.zeros(n, self.value_dim),
            forward_inputs={"states": states, "action": actions},
        )

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        out = self.linear(forward_inputs["states"]) * 0.0
        c = self.num_action_chunks
        return {
            "logprobs": out.expand(-1, c),
            "entropy": out.expand(-1, c),
            "values": out.expand(-1, self.value_dim),
        }

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        return torch.zeros(obs["states"].shape[0], self.value_dim)


class CalibratedLangReachEnv(LangReachEnv):
    """``lang_reach`` plus a sleep of ``env_kwargs.cost_per_env_s`` per stepped env and sub-step."""

    def _setup(self) -> EnvSpec:
        kwargs = dict(self.cfg.env_kwargs)
        self._cost_per_env_s = float(kwargs.pop("cost_per_env_s", 0.0))
        self.cfg = self.cfg.model_copy(update={"env_kwargs": kwargs})
        return super()._setup()

    def _step_envs(self, actions: Tensor, active: NDArray[Any]) -> StepResult:
        time.sleep(self._cost_per_env_s * int(active.sum()))
        return super()._step_envs(actions, active)


# The workers import this file again (runner.plugin_modules) under another module name.
if "sleepy" not in available_envs():
    register_env("sleepy")(SleepyEnv)
    register_env("calibrated_lang_reach")(CalibratedLangReachEnv)
if "sleepy" not in available_policies():
    register_policy("sleepy")(SleepyPolicy)

PLACEMENT = {"actor": 0, "env": 0, "rollout": 1}
STAGES = {"1 stage": 1, "2 stages": 2}
"""The two settings, by their names in pytest-benchmark's table."""
A_A_CONTROL = "1 stage, again"
"""A third candidate, one stage again: its ratio to "1 stage" is this comparison's noise."""


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[WorkerGroup], Path]]:
    assert not ray.is_initialized()
    log_path = tmp_path_factory.mktemp("pipeline")
    cfg = synthetic_config(log_path, 1)
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        placement = HybridComponentPlacement(PLACEMENT, cluster.info)
        roles = (
            (EmbodiedFSDPActor, "actor"),
            (MultiStepRolloutWorker, "rollout"),
            (EnvWorker, "env"),
        )
        unlaunched = [cls.create_group(cfg) for cls, _ in roles]
        try:
            with ThreadPoolExecutor(len(roles)) as pool:  # start the three groups together
                futures = [
                    pool.submit(
                        group.launch,
                        cluster,
                        placement_strategy=placement.get_strategy(name),
                        name=f"pipe-{name}",
                        timeout=300,  # slow starts on a busy 2-core machine
                    )
                    for group, (_, name) in zip(unlaunched, roles, strict=True)
                ]
                for future in futures:
                    future.result()
            yield unlaunched, log_path
        finally:
            for group in unlaunched:
                group.close()
    if ray.is_initialized():  # the Cluster attached to a Ray already running here: disconnect
        ray.shutdown()


def _with(data: dict[str, Any], log_path: Path, stages: int) -> EmbodiedConfig:
    data["cluster"]["component_placement"] = PLACEMENT
    data["cluster"]["cpu_slots_per_node"] = 2
    data["rollout"]["pipeline_stage_num"] = stages
    data["rollout"]["in_env_process"] = False  # a rollout group on slot 1
    data["runner"]["logger"]["log_path"] = str(log_path)
    data["runner"]["plugin_modules"] = [str(Path(__file__).resolve())]
    data["env"]["eval"] = None
    return validate_config(data, EmbodiedConfig)


def synthetic_config(log_path: Path, stages: int) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            "env.train.env_type=sleepy",
            "env.train.env_id=sleepy",
            "env.train.num_envs=16",
            "env.train.max_steps_per_rollout_epoch=16",
            "actor.model.model_type=sleepy",
            "actor.global_batch_size=16",
            "actor.micro_batch_size=16",
        ],
    )
    return _with(data, log_path, stages)


def cartpole_config(log_path: Path, stages: int) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp", CONFIG_DIR, ["env.train.num_envs=32", "actor.global_batch_size=512"]
    )
    return _with(data, log_path, stages)


def maniskill_config(log_path: Path, stages: int) -> EmbodiedConfig:
    data = compose_config(
        "maniskill_pickcube_ppo_mlp",
        CONFIG_DIR,
        [
            "env.train.num_envs=8",
            "env.train.sim_backend=cpu",
            "env.train.max_steps_per_rollout_epoch=20",
            "env.train.max_episode_steps=20",
            "actor.global_batch_size=160",
            "actor.micro_batch_size=160",
            "runner.val_check_interval=-1",
            "runner.save_interval=-1",
        ],
    )
    return _with(data, log_path, stages)


VLA_ENVS = 64
"""lang_reach envs of the VLA row (32 per stage with two stages)."""


def pi0_cost_per_env_s(model_path: Path, envs: int, chunks: int) -> float:
    """Seconds one train-mode pi0 call costs per env, on one thread, at ``envs`` envs.

    The policy is built as ``lang_reach_ppo_pi0`` builds it (sde sampler from the
    noise mean, one value per chunk), so the call costs what a rollout rank's does.
    """
    env = make_env(EnvConfig(env_type="lang_reach", env_id="fixed", obs_mode="rgb", num_envs=envs))
    cfg = PolicyConfig(
        model_type="pi0",
        model_path=model_path,
        num_action_chunks=chunks,
        flow_sampler="sde",
        flow_start="zero",
        noise_level=0.5,
        add_value_head=True,  # PPO: the rollout computes values too
        value_type="chunk_level",
    )
    policy = build_policy(cfg, env.spec)
    obs = env.reset(seed=0).obs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a rollout worker on one CPU slot
    try:
        times = []
        for _ in range(25):
            start = time.perf_counter()
            policy.predict_action_batch(obs, "train")
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
        env.close()
    return float(np.median(times[5:])) / envs


def vla_config(
    log_path: Path, model_path: Path, sub_step_cost_s: float, stages: int
) -> EmbodiedConfig:
    """``lang_reach_ppo_pi0`` on ``calibrated_lang_reach`` (``sub_step_cost_s`` per env step)."""
    data = compose_config(
        "lang_reach_ppo_pi0",
        CONFIG_DIR,
        [
            "env.train.env_type=calibrated_lang_reach",
            f"env.train.num_envs={VLA_ENVS}",
            "env.train.max_steps_per_rollout_epoch=64",  # 16 chunk steps per rollout
            "env.train.max_episode_steps=64",
            "env.train.auto_reset=true",
            f"++env.train.env_kwargs={{cost_per_env_s: {sub_step_cost_s}}}",
            f"actor.model.model_path={model_path}",
            "actor.global_batch_size=512",
            "actor.micro_batch_size=512",
            "runner.val_check_interval=-1",
        ],
    )
    return _with(data, log_path, stages)


def steps_per_second(
    groups: list[WorkerGroup],
    make: Callable[[int], EmbodiedConfig],
    interleave: Callable[..., dict[str, Any]],
    rounds: int,
    blocks: int,
    label: str = "",
    candidates: Mapping[str, int] = STAGES,
) -> dict[str, float]:
    """Env steps/s of ``generate_rollouts`` per candidate (median rollout time, interleaved).

    ``candidates`` maps each candidate's name to its stage count.
    """
    actor, rollout, env = groups
    current: dict[str, EmbodiedRunner] = {}
    steps: dict[str, int] = {}

    @contextlib.contextmanager
    def block(name: str) -> Iterator[None]:
        with EmbodiedRunner(make(candidates[name]), actor, rollout, env) as runner:
            runner.init_workers()
            runner.update_rollout_weights()
            metrics = runner.generate_rollouts()  # warm-up: first reset, first inference
            steps[name] = int(metrics["rollout/env_steps"])  # env steps of one rollout
            current[name] = runner
            yield
            del current[name]

    def one_rollout(name: str) -> Callable[[], object]:
        return lambda: current[name].generate_rollouts()

    stats = interleave(
        {name: one_rollout(name) for name in candidates},
        blocks=blocks,
        rounds=rounds,
        block_context=block,
        label=label,
    )
    return {name: steps[name] / s.median for name, s in stats.items()}


def record_stage_ratio(
    record_ratio: Callable[..., object],
    name: str,
    rates: dict[str, float],
    target: float | None = None,
    floor: float | None = None,
) -> None:
    record_ratio(
        name,
        rates["2 stages"],
        rates["1 stage"],
        unit="env steps/s",
        baseline_name="1 stage",
        target=target,
        floor=floor,
    )


def test_two_stages_overlap_env_and_policy(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
) -> None:
    launched, log_path = groups
    rates = steps_per_second(
        launched, lambda s: synthetic_config(log_path, s), interleave, rounds=3, blocks=2
    )
    record_stage_ratio(
        record_ratio,
        f"pipeline 2 stages vs 1, synthetic env = policy cost ({COST_PER_ENV_S * 1e3:g} ms/env)",
        rates,
        target=1.85,  # issue 15 (ideal 2x)
        floor=1.3,  # well under the target
    )


def test_pipeline_a_a_control_on_cartpole(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
) -> None:
    """One CartPole stage against itself, in the same blocks: the comparison's noise."""
    launched, log_path = groups
    rates = steps_per_second(
        launched,
        lambda s: cartpole_config(log_path, s),
        interleave,
        rounds=2,  # short blocks: a slow spell of a second or so hits both candidates
        blocks=6,
        candidates={"1 stage": 1, A_A_CONTROL: 1},
    )
    record_ratio(
        "pipeline A/A control, CartPole: 1 stage vs 1 stage, same blocks (this comparison's noise)",
        rates[A_A_CONTROL],
        rates["1 stage"],
        unit="env steps/s",
        baseline_name="1 stage",
        target=None,
        floor=None,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_maniskill_ratio(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
) -> None:
    launched, log_path = groups
    if importlib.util.find_spec("mani_skill") is None:
        pytest.skip("ManiSkill is not installed: no PickCube row")
    rates = steps_per_second(
        launched,
        lambda s: maniskill_config(log_path, s),
        interleave,
        rounds=2,
        blocks=1,
        label="#maniskill",
    )
    record_stage_ratio(
        record_ratio,
        "pipeline 2 stages vs 1, ManiSkill PickCube-v1 state + MLP (8 CPU envs)",
        rates,
    )


def test_two_stages_overlap_env_and_vla_rollout(
    groups: tuple[list[WorkerGroup], Path],
    interleave: Callable[..., dict[str, Any]],
    record_ratio: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seeds' pipelined hybrid mode with a pi0 rollout, env cost = policy cost."""
    pytest.importorskip("transformers", reason="VLAs need rlinf-embodied[vla]")
    from rlinf.embodied.envs.lang_reach import INSTRUCTIONS
    from rlinf.embodied.models.vla.pi0.tiny import make_tiny_pi0

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    launched, log_path = groups
    chunks = 4  # lang_reach_ppo_pi0's num_action_chunks, pi0's chunk_size
    model = make_tiny_pi0(
        log_path / "pi0", instructions=INSTRUCTIONS, action_dim=2, chunk_size=chunks, state_dim=2
    )
    per_env = pi0_cost_per_env_s(model, VLA_ENVS // 2, chunks)
    sub_step = per_env / chunks  # the env steps each env C times per policy call
    rates = steps_per_second(
        launched,
        lambda s: vla_config(log_path, model, sub_step, s),
        interleave,
        rounds=3,
        blocks=2,
        label="#vla",
    )
    record_stage_ratio(
        record_ratio,
        f"pipeline 2 stages vs 1, tiny pi0 + lang_reach, env = policy cost "
        f"({per_env * 1e3:.2f} ms/env per call)",
        rates,
        target=1.5,
        floor=1.1,  # readings of 1.2-1.4x on a busy 2-core VM leave 1.2 no margin
    )
