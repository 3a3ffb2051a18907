"""One rank of the embodied online-scaling exactness check (test_online_scaling.py, no Ray).

Usage: ``python online_scaling_ranks.py RANK PORT OUT_DIR``.

Both processes build two :class:`EmbodiedFSDPActor` s over the same two ranks
(gloo): a static two-rank actor and an online-scaling one with one base rank.
Each step, rank ``r`` gives both the same CartPole-shaped trajectory piece (its
half of the envs, actions sampled by the initial policy); the scaling actor
grows to two ranks first (``scale_up``) and shrinks back after
(``scale_down``). Before every ``scale_up`` both ranks scramble the grown copy
(its parameters and AdamW state: moments and step), which the scale-up must
overwrite with the base rank's state. Rank 0 writes the full weights and AdamW
state of both (grown and after shrinking) to ``OUT_DIR/step{k}.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
T, ENVS = 16, 8


def _config() -> Any:
    from rlinf.core.config import compose_config, validate_config
    from rlinf.embodied.config import EmbodiedConfig

    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            f"env.train.num_envs={ENVS}",
            f"env.train.max_steps_per_rollout_epoch={T}",
            "actor.global_batch_size=64",
            "actor.micro_batch_size=16",
            "+runner.online_scaling=true",
            "runner.logger.logger_backends=[]",
            "+runner.step_timeout_s=120",
        ],
    )
    data["cluster"]["component_placement"] = {"actor": 0, "env": 1, "rollout": 1}
    data["rollout"]["in_env_process"] = False  # online scaling grows onto the rollout's slot
    return validate_config(data, EmbodiedConfig)


def _spec() -> Any:
    from rlinf.core.protocols.embodied import EnvSpec

    return EnvSpec(
        state_dim=4, image_shape=None, action_dim=1, num_actions=2, max_episode_steps=500
    )


def _trajectory(cfg: Any, spec: Any, step: int) -> Any:
    """A CartPole-shaped trajectory of ``ENVS`` envs, sampled by a fresh policy."""
    from rlinf.core.protocols.embodied import Trajectory
    from rlinf.embodied.models import build_policy

    torch.manual_seed(1234)
    policy = build_policy(cfg.actor.model, spec)
    gen = torch.Generator().manual_seed(100 + step)
    rows: dict[str, list[torch.Tensor]] = {"actions": [], "logprobs": [], "values": []}
    inputs: dict[str, list[torch.Tensor]] = {}
    for _ in range(T + 1):
        obs = {"states": torch.randn(ENVS, 4, generator=gen)}
        out = policy.predict_action_batch(obs, generator=gen)
        rows["values"].append(out.prev_values)
        if len(rows["actions"]) < T:
            rows["actions"].append(out.actions.reshape(ENVS, -1).float())
            rows["logprobs"].append(out.prev_logprobs)
            for k, v in out.forward_inputs.items():
                inputs.setdefault(k, []).append(v)
    chunks = cfg.actor.model.num_action_chunks
    dones = torch.rand(T + 1, ENVS, chunks, generator=gen) < 0.05
    dones[0] = False
    return Trajectory(
        actions=torch.stack(rows["actions"]),
        prev_logprobs=torch.stack(rows["logprobs"]),
        prev_values=torch.stack(rows["values"]),
        rewards=torch.rand(T, ENVS, chunks, generator=gen),
        dones=dones,
        terminations=dones.clone(),
        truncations=torch.zeros_like(dones),
        forward_inputs={k: torch.stack(v) for k, v in inputs.items()},
        versions=torch.zeros(T, dtype=torch.int64),
        group_ids=torch.arange(ENVS),
    )


def _piece(traj: Any, rank: int) -> Any:
    from rlinf.embodied.workers.common import split_trajectory

    return split_trajectory(traj, 2)[rank]


def _full_state(actor: Any) -> dict[str, torch.Tensor]:
    """Full parameters and AdamW state of the actor's policy (collective over its mesh)."""
    model, optimizer = actor.model, actor.optimizer
    out: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for name, p in model.named_parameters():
        out[name] = p.full_tensor().detach().clone()
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                full = value.full_tensor() if hasattr(value, "full_tensor") else value
                out[f"{names[id(p)]}.{key}"] = full.detach().clone()
    return out


def _scramble(parts: Any, seed: int) -> None:
    """Overwrites ``parts``' parameter shards and AdamW state on this rank with noise."""
    gen = torch.Generator().manual_seed(seed)

    def noise_like(tensor: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(tensor)
        local = out.to_local() if hasattr(out, "to_local") else out
        local.copy_(torch.randn(local.shape, generator=gen, dtype=local.dtype))
        return out

    with torch.no_grad():
        for p in parts.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.copy_(torch.randn(local.shape, generator=gen, dtype=local.dtype))
            parts.optimizer.state[p] = {
                "step": torch.tensor(7.0),
                "exp_avg": noise_like(p),
                "exp_avg_sq": noise_like(p).abs(),
            }


def _scramble_grown_copies(actor: Any, rank: int) -> None:
    """Scrambles the grown copy now and right after it is built at the first scale_up."""
    if actor._grown_parts is not None:
        _scramble(actor._grown_parts, seed=1000 + rank)
        return
    build, base_mesh = actor._build_parts, actor._meshes.base_mesh

    def build_scrambled(mesh: Any) -> Any:
        parts = build(mesh)
        if mesh is not base_mesh:
            _scramble(parts, seed=1000 + rank)
        return parts

    actor._build_parts = build_scrambled


def main() -> None:
    rank, port, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    os.environ.update(
        GROUP_NAME="EmbodiedScalingCheck",
        RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
    )
    import rlinf.sched.worker.worker as worker_module

    worker_module.install_resolver = lambda *a, **k: None  # type: ignore[assignment]  # no Ray
    from rlinf.core.protocols.embodied import RolloutBatch
    from rlinf.embodied.workers import EmbodiedFSDPActor

    cfg, spec = _config(), _spec()
    static = EmbodiedFSDPActor(cfg)
    static.init_worker(cfg, spec, "Rollout", 1, 1)
    scaled = EmbodiedFSDPActor(cfg, base_world_size=1)
    scaled.init_worker(cfg, spec, "Rollout", 1, 1)
    assert scaled.holds_state == (rank == 0) and scaled.scaling
    initial = _full_state(static)
    for step in range(3):
        piece = _piece(_trajectory(cfg, spec, step), rank)
        static.batch = RolloutBatch(trajectory=piece)
        static.compute_advantages_and_returns()
        static_metrics = static.run_training()
        scaled.batch = RolloutBatch(trajectory=piece)  # as recv_rollout_batch, before growing
        _scramble_grown_copies(scaled, rank)
        up = scaled.scale_up()
        scaled.compute_advantages_and_returns()
        scaled_metrics = scaled.run_training()
        grown = _full_state(scaled)  # collective over both ranks
        down = scaled.scale_down()
        ref = _full_state(static)
        if rank == 0:
            torch.save(
                {
                    "initial": initial,
                    "static": ref,
                    "grown": grown,
                    "scaled": _full_state(scaled),  # base rank only: its mesh is rank 0
                    "lrs": (
                        [g["lr"] for g in static.optimizer.param_groups],
                        [g["lr"] for g in scaled.optimizer.param_groups],
                    ),
                    "sched": (static.scheduler.state_dict(), scaled.scheduler.state_dict()),
                    "steps": (static.global_step, scaled.global_step),
                    "loss": (
                        static_metrics["train/actor/policy_loss"],
                        scaled_metrics["train/actor/policy_loss"],
                    ),
                    "seconds": (up["seconds"], down["seconds"]),
                },
                out / f"step{step}.pt",
            )
        else:
            assert not scaled.holds_state and scaled.model is None
    static.teardown()


if __name__ == "__main__":
    main()
