"""``EmbodiedSACActor``: off-policy SAC training from a replay buffer (one actor rank).

Why: SAC reuses every env step many times, so the actor keeps a
:class:`~rlinf.embodied.replay.ReplayBuffer` and trains while env and rollout
keep running (the :class:`~rlinf.embodied.async_runner.AsyncEmbodiedRunner`).

Per :meth:`EmbodiedSACActor.train_step`:

1. :meth:`~EmbodiedSACActor.ingest`: every trajectory piece waiting in the
   actor channel becomes transitions ``(s, a, r, s', terminated, truncated)``
   (the env workers record ``s'`` when ``loss_type`` is ``sac``; only alive
   sub-steps count) and goes into the buffer.
2. Wait (blocking on the channel) until the buffer has seen
   ``warmup_steps + (updates + updates_per_step) / replay_ratio`` env steps, so
   the run keeps ``replay_ratio`` updates per env step after warm-up.
3. ``updates_per_step`` SAC updates on uniform minibatches of
   ``actor.global_batch_size``: twin critics (lr ``value_lr``), actor (lr ``lr``),
   temperature (lr ``value_lr``, when ``auto_alpha``), Polyak target critics.

Weights go to the rollout group by broadcast (:meth:`sync_model_to_rollout`),
with the train-step count as version. Checkpoints hold the policy, the target
critics, the three optimizers, ``log_alpha``, the replay buffer (its valid
rows), the counters and the RNG states: a resumed run continues exactly.

Cost: per update, three forward/backward passes of small MLPs on one batch;
checkpoints grow with the buffer (``replay_capacity`` rows at most).
"""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlinf.core.algorithms import (
    default_target_entropy,
    polyak_update,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_loss,
    sac_q_target,
)
from rlinf.core.channel import Channel
from rlinf.core.checkpoint import rng_state, set_rng_state
from rlinf.core.dist import select_device
from rlinf.core.protocols.embodied import EnvSpec, Trajectory
from rlinf.core.seeding import derive_seed
from rlinf.core.weight_sync import DEFAULT_BUCKET_BYTES, send_weights
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.models import SACPolicy, build_policy
from rlinf.embodied.replay import ReplayBuffer, Transitions
from rlinf.embodied.workers.common import setup_process
from rlinf.sched import Worker

__all__ = ["EmbodiedSACActor", "trajectory_transitions"]


def trajectory_transitions(traj: Trajectory) -> Transitions:
    """The alive sub-steps of a trajectory as transitions (one action per chunk).

    Args:
        traj: A trajectory whose ``forward_inputs`` carry ``next_<key>`` entries.

    Returns:
        The transitions, in (time, env) order.

    Raises:
        ValueError: No ``next_<key>`` entries (the env workers did not run SAC).
    """
    inputs = traj.forward_inputs
    keys = [k for k in inputs if not k.startswith("next_") and f"next_{k}" in inputs]
    if not keys:
        raise ValueError(
            f"trajectory forward_inputs {sorted(inputs)} carry no next observations; the env "
            "workers record them only with algorithm.loss_type: sac"
        )
    alive = (
        traj.alive[..., 0]
        if traj.alive is not None
        else torch.ones(traj.rewards.shape[:2], dtype=torch.bool)
    )
    return Transitions(
        obs={k: inputs[k][alive] for k in keys},
        actions=traj.actions[alive].float(),
        rewards=traj.rewards[..., 0][alive].float(),
        next_obs={k: inputs[f"next_{k}"][alive] for k in keys},
        terminations=traj.terminations[1:, :, 0][alive],
        truncations=traj.truncations[1:, :, 0][alive],
    )


class EmbodiedSACActor(Worker):
    """Actor rank of SAC: policy, target critics, optimizers and the replay buffer.

    Args:
        cfg: The run config.
    """

    def __init__(self, cfg: EmbodiedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        setup_process(cfg)
        self.device = select_device()
        self.model: SACPolicy | None = None
        self.target: nn.ModuleDict | None = None
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.log_alpha = torch.zeros(())
        self.target_entropy = 0.0
        self.replay = ReplayBuffer(1)
        self.generator = torch.Generator()
        self.global_step = 0
        self.updates = 0
        self._rollout_group = ""
        self._rollout_world_size = 1

    # ------------------------------------------------------------------ setup

    def init_worker(
        self,
        cfg: EmbodiedConfig,
        spec: EnvSpec,
        rollout_group: str,
        rollout_world_size: int,
        env_world_size: int,
        offload: bool = False,
    ) -> None:
        """(Re)builds the policy, target critics, optimizers and an empty replay buffer.

        ``env_world_size`` and ``offload`` are unused: one actor rank takes every
        piece, and SAC keeps its small models on the device.

        Raises:
            RuntimeError: More than one actor rank.
        """
        del env_world_size, offload
        if self.world_size != 1:
            raise RuntimeError(
                f"EmbodiedSACActor runs on one rank, the group has {self.world_size}; place "
                "the actor on one resource rank"
            )
        self.cfg = cfg
        setup_process(cfg)
        self._rollout_group = rollout_group
        self._rollout_world_size = rollout_world_size
        alg, optim = cfg.algorithm, cfg.actor.optim
        torch.manual_seed(cfg.actor.seed)
        policy = build_policy(cfg.actor.model, spec).to(self.device)
        if not isinstance(policy, SACPolicy):
            raise TypeError(
                f"actor.model.model_type={cfg.actor.model.model_type!r} built "
                f"{type(policy).__name__}; SAC needs model_type: sac_mlp"
            )
        self.model = policy
        self.target = nn.ModuleDict(
            {"q1": copy.deepcopy(policy.q1), "q2": copy.deepcopy(policy.q2)}
        ).requires_grad_(False)
        critic_lr = optim.value_lr if optim.value_lr is not None else optim.lr

        def adamw(params: list[Any], lr: float) -> torch.optim.Optimizer:
            return torch.optim.AdamW(
                params,
                lr=lr,
                betas=optim.adam_betas,
                eps=optim.adam_eps,
                weight_decay=optim.weight_decay,
            )

        self.log_alpha = torch.tensor(
            math.log(alg.init_alpha), device=self.device, requires_grad=alg.auto_alpha
        )
        self.optimizers = {
            "actor": adamw(policy.actor_parameters(), optim.lr),
            "critic": adamw(policy.critic_parameters(), critic_lr),
        }
        if alg.auto_alpha:
            self.optimizers["alpha"] = torch.optim.Adam(
                [self.log_alpha], lr=critic_lr, betas=optim.adam_betas, eps=optim.adam_eps
            )
        self.target_entropy = (
            alg.target_entropy
            if alg.target_entropy is not None
            else default_target_entropy(spec.action_dim)
        )
        self.replay = ReplayBuffer(alg.replay_capacity, self.device)
        self.generator = torch.Generator().manual_seed(derive_seed(cfg.actor.seed, "replay"))
        self.global_step = 0
        self.updates = 0

    def _parts(self) -> tuple[SACPolicy, nn.ModuleDict]:
        if self.model is None or self.target is None:
            raise RuntimeError("init_worker() must run before this call")
        return self.model, self.target

    def get_global_step(self) -> int:
        """Train steps done (the weight version of the next sync)."""
        return self.global_step

    # ------------------------------------------------------------------ weights

    def sync_model_to_rollout(self) -> int:
        """Broadcasts the policy's weights to every rollout rank; returns the train steps done."""
        model, _ = self._parts()
        timeout = self.cfg.runner.channel_timeout_s
        send = self.broadcast_sender(self._rollout_group, self._rollout_world_size, timeout)
        with self.worker_timer("sync_weights"):
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            send_weights(list(state.items()), self.global_step, DEFAULT_BUCKET_BYTES, send)
        return self.global_step

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's state dict as CPU tensors (for checks and tests)."""
        model, _ = self._parts()
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    # ------------------------------------------------------------------ data

    def _add(self, items: list[tuple[int, Trajectory]]) -> int:
        items.sort(key=lambda item: int(item[0]))
        added = 0
        for _, traj in items:
            batch = trajectory_transitions(traj)
            self.replay.add(batch)
            added += len(batch)
        return added

    def ingest(self, actor_channel: Channel) -> int:
        """Moves the pieces waiting in the channel into the buffer (no wait); returns rows added."""
        items: list[tuple[int, Trajectory]] = []
        with self.worker_timer("ingest"):
            while True:
                try:
                    items.append(actor_channel.get_nowait(key=str(self.rank)))
                except asyncio.QueueEmpty:
                    break
            return self._add(items)

    def _wait_for_env_steps(self, actor_channel: Channel) -> None:
        """Blocks on the channel until the buffer allows ``updates_per_step`` more updates."""
        alg = self.cfg.algorithm
        batch = self.cfg.actor.global_batch_size
        target = self.updates + alg.updates_per_step
        need = alg.warmup_steps + math.ceil(target / alg.replay_ratio - 1e-9)
        timeout = self.cfg.runner.channel_timeout_s
        with self.worker_timer("wait_env_steps"):
            while self.replay.total_added < need or self.replay.size < batch:
                item = actor_channel.get(key=str(self.rank), timeout=timeout)
                self._add([item])

    # ------------------------------------------------------------------ training

    def train_step(self, actor_channel: Channel) -> dict[str, float]:
        """Ingests, waits for enough env steps, then runs ``updates_per_step`` updates.

        Returns:
            ``train/*`` means over the step's updates (``q_loss``, ``actor_loss``,
            ``alpha``, ``entropy``, ``q1_mean``, ``target_mean``, ``alpha_loss``),
            ``train/updates`` and ``replay/size``, ``replay/env_steps``,
            ``replay/updates_per_env_step``.
        """
        self.ingest(actor_channel)
        self._wait_for_env_steps(actor_channel)
        sums: dict[str, float] = {}
        k = self.cfg.algorithm.updates_per_step
        with self.worker_timer("train"):
            for _ in range(k):
                for key, value in self._update().items():
                    sums[key] = sums.get(key, 0.0) + value
        self.global_step += 1
        env_steps = self.replay.total_added
        return {
            **{f"train/{key}": value / k for key, value in sums.items()},
            "train/updates": float(self.updates),
            "replay/size": float(self.replay.size),
            "replay/env_steps": float(env_steps),
            "replay/updates_per_env_step": self.updates / env_steps if env_steps else 0.0,
        }

    def _step(self, name: str, loss: torch.Tensor, params: list[nn.Parameter]) -> None:
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        clip = self.cfg.actor.optim.clip_grad
        if clip is not None and name != "alpha":
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()

    def _update(self) -> dict[str, float]:
        """One SAC update on a fresh minibatch; returns its scalar metrics."""
        model, target = self._parts()
        alg = self.cfg.algorithm
        batch = self.replay.sample(self.cfg.actor.global_batch_size, self.generator)
        states = batch.obs["states"].float()
        next_states = batch.next_obs["states"].float()
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = model.sample(next_states)
            x = torch.cat([next_states, next_actions], dim=-1)
            y = sac_q_target(
                batch.rewards,
                target["q1"](x).squeeze(-1),
                target["q2"](x).squeeze(-1),
                next_logp,
                batch.terminations,
                alg.gamma,
                alpha,
            )
        q1, q2 = model.q_values(states, batch.actions)
        q_loss, q_metrics = sac_critic_loss(q1, q2, y)
        self._step("critic", q_loss, model.critic_parameters())
        actions, logp = model.sample(states)
        q1_pi, q2_pi = model.q_values(states, actions)
        actor_loss, actor_metrics = sac_actor_loss(logprobs=logp, q1=q1_pi, q2=q2_pi, alpha=alpha)
        self._step("actor", actor_loss, model.actor_parameters())
        metrics = {**q_metrics, **actor_metrics}
        if alg.auto_alpha:
            alpha_loss = sac_alpha_loss(self.log_alpha, logp, self.target_entropy)
            self._step("alpha", alpha_loss, [])
            metrics["alpha_loss"] = alpha_loss.detach()
        sources = [*model.q1.parameters(), *model.q2.parameters()]
        polyak_update([*target["q1"].parameters(), *target["q2"].parameters()], sources, alg.tau)
        self.updates += 1
        out = {key: float(value) for key, value in metrics.items()}
        out["alpha"] = float(self.log_alpha.detach().exp())
        return out

    # ------------------------------------------------------------------ checkpoints

    def _state(self) -> dict[str, Any]:
        model, target = self._parts()
        return {
            "model": model.state_dict(),
            "target": target.state_dict(),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "log_alpha": self.log_alpha.detach().cpu().clone(),
            "replay": self.replay.state_dict(),
            "generator": self.generator.get_state(),
            "updates": self.updates,
        }

    def save_checkpoint(self, path: str, step: int) -> None:
        """Writes the whole SAC state (replay buffer included) to ``path/actor/sac.pt``."""
        folder = Path(path) / "actor"
        folder.mkdir(parents=True, exist_ok=True)
        with self.worker_timer("save_checkpoint"):
            state = {**self._state(), "step": step, "rng": rng_state()}
            with open(folder / "sac.pt", "wb") as f:
                torch.save(state, f)

    def load_checkpoint(self, path: str) -> int:
        """Restores what :meth:`save_checkpoint` wrote; returns the global step saved."""
        model, target = self._parts()
        state = torch.load(Path(path) / "actor" / "sac.pt", weights_only=False)
        model.load_state_dict(state["model"])
        target.load_state_dict(state["target"])
        for key, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][key])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"].to(self.device))
        self.replay.load_state_dict(state["replay"])
        self.generator.set_state(state["generator"])
        self.updates = int(state["updates"])
        self.global_step = int(state["step"])
        set_rng_state(state["rng"])
        return self.global_step

    def state_fingerprint(self) -> dict[str, Any]:
        """Everything a resume must restore, as CPU tensors and numbers (for tests)."""
        state = self._state()
        return {
            "model": {k: v.detach().cpu().clone() for k, v in state["model"].items()},
            "target": {k: v.detach().cpu().clone() for k, v in state["target"].items()},
            "optimizers": {
                name: {
                    "steps": sorted(float(s["step"]) for s in opt["state"].values() if "step" in s),
                    "exp_avg": [s["exp_avg"].detach().cpu().clone() for s in opt["state"].values()],
                }
                for name, opt in state["optimizers"].items()
            },
            "log_alpha": state["log_alpha"],
            "replay": state["replay"],
            "updates": self.updates,
            "global_step": self.global_step,
        }
