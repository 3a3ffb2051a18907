"""``EmbodiedFSDPActor``: trains the policy with PPO or GRPO under FSDP2.

Each actor rank holds the policy wrapped by ``fully_shard`` (FSDP2) over a 1-D
device mesh of all actor ranks: NCCL on GPUs (unchecked), gloo on CPUs (tested).
Per training step:

1. :meth:`recv_rollout_batch`: the rank's trajectory pieces from the actor
   channel, ordered by piece index and concatenated along the env dim.
2. :meth:`compute_advantages_and_returns`: the registered estimator
   (``algorithm.adv_type``) on the T+1 data; GAE whitening uses statistics
   summed over all actor ranks.
3. :meth:`run_training`: ``update_epoch`` passes; each pass shuffles the rank's
   ``T * B`` samples (seeded by seed, step, epoch and rank), cuts them into
   ``global_batch_size / Wa`` minibatches and each minibatch into micro batches
   (gradient accumulation, gradient sync on the last micro batch), clips the
   gradient norm and steps AdamW (value-head parameters at ``value_lr``). The
   LR schedule steps once per training step.

Weights go to the rollout group by broadcast from rank 0, stamped with the
global step as version (:meth:`sync_model_to_rollout`).

Online scaling (``runner.online_scaling``, the group launched with
``base_world_size`` < its world size by
:func:`~rlinf.embodied.autoplace_profile.launch_embodied_groups`): the env ships
each rollout to *every* actor rank (the extra ranks, on the rollout's devices,
just buffer their share); :meth:`EmbodiedFSDPActor.scale_up` then copies the
base ranks' policy, AdamW and schedule into grown parts sharded over every rank
(built once, kept), advantages and training run on all ranks, and
:meth:`EmbodiedFSDPActor.scale_down` copies the result back. Weight sync,
checkpoints and eval use the base ranks. The groups, meshes and re-sharding are
:mod:`rlinf.core.fsdp_scaling`'s (shared with the reasoning actor).

Async PPO/GRPO (``runner.mode: async`` with an on-policy loss, driven by
:class:`~rlinf.embodied.async_ppo_runner.AsyncPPORunner`): :meth:`train_next_batch`
takes the oldest batch waiting in the actor channel (the env keeps shipping the
next one while the actor trains), drops it if its oldest weight version is more
than ``algorithm.max_staleness`` behind the actor's step (counted in
``rollout/dropped_batches``), else computes advantages and trains with the
decoupled loss: at the start of training the actor recomputes the *proximal*
logprobs of the batch with its current weights (no gradient); the PPO ratio and
clip are taken against them, and each sample's advantage is multiplied by
``truncated_is_weights(proximal, behaviour, algorithm.importance_sampling_clip)``
where *behaviour* are the logprobs the rollout recorded when sampling. GAE and
the value clip use the values the rollout recorded (the behaviour policy's
critic), as in sync PPO. With behaviour == proximal (a batch of the current
version) the weights are 1 and the update equals sync PPO's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlinf.core.algorithms import (
    EmbodiedAdvantageInputs,
    MetricMeans,
    compute_loss_mask,
    explained_variance,
    get_advantage,
    get_policy_loss,
    masked_mean,
    truncated_is_weights,
    value_loss,
)
from rlinf.core.channel import Channel
from rlinf.core.dist import clip_and_step, init_process_group, reshard_fsdp, select_device
from rlinf.core.fsdp_scaling import (
    ScalingMeshes,
    TrainParts,
    check_phase,
    grow,
    require_state,
    setup_scaling,
    shrink,
)
from rlinf.core.optim import lr_lambda, move_optimizer_state
from rlinf.core.protocols.embodied import EnvSpec, RolloutBatch, Trajectory
from rlinf.core.seeding import derive_seed
from rlinf.core.train_state import load_train_state, save_train_state
from rlinf.core.weight_sync import DEFAULT_BUCKET_BYTES, send_weights
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.models import BasePolicy, build_policy
from rlinf.embodied.workers.common import (
    actor_pieces,
    concat_trajectories,
    setup_process,
)
from rlinf.sched import Worker

__all__ = ["EmbodiedFSDPActor", "batch_staleness", "proximal_logprobs"]

# The step's largest |logprobs - old_logprobs| over valid entries (a max over micro-batches
# and ranks, not a mean): 0 up to float noise when the actor re-scores exactly what the
# rollout sampled.
_LOGPROB_GAP = "actor/logprob_diff_max"


@dataclasses.dataclass
class _TrainData:
    """One rank's rollout batch flattened to ``[n = T * B, ...]`` on the actor's device."""

    n: int
    chunks: int
    chunk_level: bool
    logprob_level: str
    inputs: dict[str, torch.Tensor]
    old_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor | None
    mask: torch.Tensor
    mask_sum: torch.Tensor | None
    is_weights: torch.Tensor | None = None
    """Async PPO: ``[n, width]`` truncated IS weights (proximal vs behaviour); None: sync."""


def batch_staleness(versions: torch.Tensor, step: int) -> tuple[int, float]:
    """How many weight versions a batch lags behind the actor's step.

    Args:
        versions: The weight version of each chunk step of the batch (``[T]``).
        step: The actor's global step (its weight version).

    Returns:
        ``(step - oldest version, mean of step - version)``.

    Raises:
        RuntimeError: A version is newer than ``step`` (the rollout cannot be ahead).
    """
    if versions.numel() == 0:
        raise RuntimeError("the rollout batch has no chunk steps, so no weight version")
    newest = int(versions.max())
    if newest > step:
        raise RuntimeError(
            f"the rollout batch was generated with weight version {newest}, newer than the "
            f"actor's step {step}"
        )
    lag = step - versions.to(torch.float64)
    return int(lag.max()), float(lag.mean())


def proximal_logprobs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    chunks: int,
    level: str,
    micro_batch_size: int,
) -> torch.Tensor:
    """The current policy's logprobs of the batch's actions, at ``level``, without gradient.

    The decoupled PPO loss takes its ratio and clip against these (the *proximal*
    policy: the weights at the start of the update).

    Args:
        model: The policy (FSDP-wrapped or not); every rank runs the same passes.
        inputs: ``[n, ...]`` forward inputs (they include the sampled actions).
        chunks: Action chunks per sample (``C``).
        level: ``token_level``, ``action_level`` or ``chunk_level``.
        micro_batch_size: Samples per forward pass.

    Returns:
        ``[n, width]`` logprobs (the width of :func:`_at_level`).
    """
    n = next(iter(inputs.values())).shape[0]
    parts = []
    with torch.no_grad():
        for start in range(0, n, micro_batch_size):
            part = {k: v[start : start + micro_batch_size] for k, v in inputs.items()}
            out = model(part, compute_logprobs=True, compute_entropy=False, compute_values=False)
            parts.append(_at_level(out["logprobs"], chunks, level).detach())
    return torch.cat(parts, dim=0)


class EmbodiedFSDPActor(Worker):
    """Actor rank: FSDP2 policy, optimizer, scheduler and the rank's rollout batch.

    Args:
        cfg: The run config.
        base_world_size: Online scaling (``runner.online_scaling``): the ranks that
            hold the policy between training phases; the others (launched on the
            rollout's devices by :func:`rlinf.sched.grown_actor_strategy`) join
            for training only (:meth:`scale_up`). ``None``: every rank, always.
    """

    def __init__(self, cfg: EmbodiedConfig, base_world_size: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        setup_process(cfg)
        # The policy returns a dict of tensors some of which are views; nothing here
        # modifies them in place, so FSDP2's warning about that does not apply.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* view tensor")
        self.device = select_device()
        self.model: BasePolicy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.batch: RolloutBatch | None = None
        self.global_step = 0
        self._rollout_group = ""
        self._rollout_world_size = 1
        self._env_world_size = 1
        self._offload = False
        self._offloaded = False
        self._max_episode_steps = 1
        self.dropped_batches = 0
        self._base_world_arg = base_world_size
        self.base_world_size = self.world_size if base_world_size is None else base_world_size
        """Online scaling: ranks ``0..base_world_size-1`` hold the policy between steps."""
        self.scaling = self.base_world_size < self.world_size
        self._grown = False
        self._meshes: ScalingMeshes | None = None
        self._base_parts: TrainParts | None = None
        self._grown_parts: TrainParts | None = None

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
        """(Re)builds the process group, the FSDP2 policy, the optimizer and the schedule.

        With online scaling (``base_world_size`` < the group's world size) only the
        base ranks build them now; the extra ranks start empty and build the grown
        parts at the first :meth:`scale_up`. ``offload``: offload the optimizer state
        between phases (collocated mode).

        Raises:
            ValueError: Online scaling with ``offload`` (the runner refuses it first).
        """
        self.cfg = cfg
        self._rollout_group = rollout_group
        setup_process(cfg)  # plugin modules of this config
        self._rollout_world_size = rollout_world_size
        self._env_world_size = env_world_size
        self._offload = offload
        self._offloaded = False
        self._max_episode_steps = spec.max_episode_steps
        self._spec = spec
        init_process_group(cfg.actor.dist_backend, self.device, cfg.runner.step_timeout_s)
        # FSDP pulls in DTensor (and sympy): ~3 s of imports that only actor processes pay.
        from torch.distributed.device_mesh import init_device_mesh

        self._setup_scaling()
        if self.scaling and offload:
            raise ValueError(
                "runner.online_scaling=true with an offloading actor (actor.enable_offload, or "
                "the actor sharing devices with env/rollout) is not supported; set "
                "actor.enable_offload: false and place the actor on its own resources"
            )
        self.global_step = 0
        self.dropped_batches = 0
        self.batch = None
        self._use_parts(None)
        if not self.holds_state:  # an extra rank: idle until scale_up()
            return
        if self.scaling:
            assert self._meshes is not None
            mesh = self._meshes.base_mesh
        else:
            mesh = init_device_mesh(self.device.type, (self.world_size,))
        parts = self._build_parts(mesh)
        self._use_parts(parts)
        if self.scaling:
            self._base_parts = parts
        if self._offload:
            self.offload()

    def _use_parts(self, parts: TrainParts | None) -> None:
        """Trains ``parts``' model, optimizer and schedule from now on (None: holds none)."""
        if parts is None:
            self.model, self.optimizer, self.scheduler = None, None, None
        else:
            self.model = parts.model  # type: ignore[assignment]
            self.optimizer, self.scheduler = parts.optimizer, parts.scheduler

    def _build_parts(self, mesh: Any) -> TrainParts:
        """The FSDP2 policy over ``mesh``, its AdamW (value head at ``value_lr``) and schedule."""
        from torch.distributed.fsdp import fully_shard

        cfg = self.cfg
        torch.manual_seed(cfg.actor.seed)
        policy = build_policy(cfg.actor.model, self._spec).to(self.device)
        fully_shard(policy, mesh=mesh, reshard_after_forward=cfg.actor.reshard_after_forward)
        optim = cfg.actor.optim
        value_params = [p for n, p in policy.named_parameters() if "value_head" in n]
        other_params = [p for n, p in policy.named_parameters() if "value_head" not in n]
        groups: list[dict[str, Any]] = [{"params": other_params, "lr": optim.lr, "name": "actor"}]
        if value_params:
            groups.append(
                {"params": value_params, "lr": optim.value_lr or optim.lr, "name": "critic"}
            )
        optimizer = torch.optim.AdamW(
            groups,
            lr=optim.lr,
            betas=optim.adam_betas,
            eps=optim.adam_eps,
            weight_decay=optim.weight_decay,
            fused=True,  # one kernel per param group (CPU default: a Python loop over tensors)
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lr_lambda(
                optim.lr_scheduler, optim.warmup_steps, cfg.runner.total_steps, optim.min_lr_ratio
            ),
        )
        return TrainParts(policy, optimizer, scheduler)

    # ------------------------------------------------------------ online scaling

    def _setup_scaling(self) -> None:
        """Online scaling: the base ranks' subgroup and both device meshes (all ranks join)."""
        self._meshes = setup_scaling(self._base_world_arg, self.device)
        self.base_world_size = self._meshes.base_world_size
        self.scaling = self._meshes.scaling
        self._grown = False
        self._base_parts = self._grown_parts = None

    @property
    def holds_state(self) -> bool:
        """Whether this rank holds the model now (a base rank, or any rank while grown)."""
        return not self.scaling or self._grown or self.rank < self.base_world_size

    @property
    def grown(self) -> bool:
        """Whether the actor is grown onto every rank now (always, without online scaling)."""
        return not self.scaling or self._grown

    @property
    def _model_group(self) -> dist.ProcessGroup | None:
        """The ranks holding the model now (``None``: the default group, every rank)."""
        return None if self.grown or self._meshes is None else self._meshes.base_group

    @property
    def _model_world_size(self) -> int:
        return self.world_size if self.grown else self.base_world_size

    def scaling_info(self) -> dict[str, int]:
        """``{"world_size", "base_world_size"}``: the runner's view of online scaling."""
        return {"world_size": self.world_size, "base_world_size": self.base_world_size}

    def _require_state(self, method: str) -> None:
        require_state(method, self.rank, self.base_world_size, self.holds_state, "policy")

    def _require_grown(self, method: str) -> None:
        if not self.grown:
            raise RuntimeError(
                f"{method}() on actor rank {self.rank}: with runner.online_scaling the step's "
                f"data is split over all {self.world_size} actor ranks; call scale_up() on every "
                "rank first"
            )

    def scale_up(self) -> dict[str, float]:
        """Grows the actor from its base ranks onto every rank (every rank calls it).

        The grown parts (policy sharded over all ranks, AdamW, LR schedule) are
        built at the first call and kept; each call copies the base ranks' state
        into them (:func:`rlinf.core.fsdp_scaling.grow`), with the global step.

        Returns:
            ``{"seconds", "world_size", "bytes"}``.

        Raises:
            RuntimeError: Without online scaling, or when already grown.
        """
        check_phase("scale_up", self.rank, self.scaling, self._grown)
        start = time.perf_counter()
        assert self._meshes is not None
        if self._grown_parts is None:
            self._grown_parts = self._build_parts(self._meshes.world_mesh)
        extra = {"global_step": self.global_step, "dropped_batches": self.dropped_batches}
        out = grow(self._meshes, self._base_parts, self._grown_parts, self.device, extra)
        self.global_step = int(out["extra"]["global_step"])
        self.dropped_batches = int(out["extra"]["dropped_batches"])
        return self._switch_parts(grown=True, start=start, moved=out)

    def scale_down(self) -> dict[str, float]:
        """Shrinks the actor back to its base ranks (every rank calls it).

        The trained state goes from the grown parts into the base ranks' parts;
        the extra ranks keep their (now stale) grown parts for the next
        :meth:`scale_up` (in host memory on a GPU) and hold no usable policy in
        between (:func:`rlinf.core.fsdp_scaling.shrink`).

        Returns:
            ``{"seconds", "world_size", "bytes"}`` (world size: the base one).

        Raises:
            RuntimeError: Without online scaling, or when not grown.
        """
        check_phase("scale_down", self.rank, self.scaling, self._grown)
        start = time.perf_counter()
        assert self._meshes is not None and self._grown_parts is not None
        out = shrink(self._meshes, self._grown_parts, self._base_parts, self.device)
        return self._switch_parts(grown=False, start=start, moved=out)

    def _switch_parts(self, grown: bool, start: float, moved: dict[str, Any]) -> dict[str, float]:
        """Trains the grown (or base) parts from now on; returns what scale_up/_down report."""
        self._use_parts(self._grown_parts if grown else self._base_parts)
        self._grown = grown
        return {
            "seconds": time.perf_counter() - start,
            "world_size": float(self.world_size if grown else self.base_world_size),
            "bytes": float(moved["bytes"]),
        }

    def _parts(
        self,
    ) -> tuple[BasePolicy, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        if self.scaling and not self.holds_state:
            self._require_state("this call")
        if self.model is None or self.optimizer is None or self.scheduler is None:
            raise RuntimeError("init_worker() must run before this call")
        return self.model, self.optimizer, self.scheduler

    def set_global_step(self, step: int) -> None:
        """Sets the step (the weight version the next sync carries)."""
        self.global_step = int(step)

    def get_global_step(self) -> int:
        """The current global step."""
        return self.global_step

    # ------------------------------------------------------------------ offload

    def offload(self) -> None:
        """Moves the optimizer state to the CPU and drops gradients (GPU only).

        FSDP2 parameters stay sharded on the device; on a CPU machine this only
        drops gradients.
        """
        if self.optimizer is None:
            return
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            move_optimizer_state(self.optimizer, torch.device("cpu"))
            torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        """Moves the optimizer state back to the device."""
        if self.optimizer is not None and self._offloaded and self.device.type == "cuda":
            move_optimizer_state(self.optimizer, self.device)
        self._offloaded = False

    # ------------------------------------------------------------------ weights

    def get_full_state_dict(self, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        """The full (unsharded) policy state dict on the CPU; collective over actor ranks.

        Args:
            trainable_only: Leave out the frozen parameters (they are not gathered).

        Returns:
            The state dict on rank 0, an empty dict on other ranks.
        """
        model, _, _ = self._parts()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
        )
        state = get_model_state_dict(model, options=options)
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}

    def sync_model_to_rollout(self) -> int:
        """Broadcasts the full weights from rank 0 to every rollout rank.

        Every actor rank takes part in gathering the shards; rank 0 sends. A policy
        whose frozen parameters come from ``model_path`` (LoRA) sends only its
        trainable tensors and buffers. Returns the version sent (the global step).
        """
        # Collocated (offloading), the gather uses the shared devices: hold their lock
        # (the parameters stay on the device, so there is nothing to onload).
        lock = (
            self.device_lock.hold(self.cfg.runner.step_timeout_s, f"{self.group_name}[{self.rank}]")
            if self._offload
            else contextlib.nullcontext()
        )
        timeout = self.cfg.runner.channel_timeout_s
        send = self.broadcast_sender(self._rollout_group, self._rollout_world_size, timeout)
        with self.worker_timer("sync_weights"):
            with lock:
                state = self.get_full_state_dict(self._parts()[0].frozen_from_disk)
            if self.rank == 0:
                send_weights(list(state.items()), self.global_step, DEFAULT_BUCKET_BYTES, send)
        return self.global_step

    # ------------------------------------------------------------------ data

    def recv_rollout_batch(self, actor_channel: Channel) -> dict[str, int]:
        """Receives this rank's trajectory pieces; returns ``{"num_envs": B, "chunk_steps": T}``."""
        _, per_actor = actor_pieces(
            self.world_size, self._env_world_size, self.cfg.rollout.pipeline_stage_num
        )
        timeout = self.cfg.runner.channel_timeout_s
        self.batch = None
        with self.worker_timer("recv_rollout_batch"):
            items = [
                actor_channel.get(key=str(self.rank), timeout=timeout) for _ in range(per_actor)
            ]
            items.sort(key=lambda item: int(item[0]))
            traj = concat_trajectories([piece for _, piece in items])
            del items
        self.batch = RolloutBatch(trajectory=traj)
        return {"num_envs": traj.num_envs, "chunk_steps": int(traj.rewards.shape[0])}

    def batch_versions(self) -> list[int]:
        """The distinct weight versions stamped on the received batch, sorted."""
        batch = self._require_batch()
        return sorted({int(v) for v in batch.trajectory.versions.tolist()})

    def train_next_batch(self, actor_channel: Channel) -> dict[str, float]:
        """Async PPO/GRPO step: the oldest queued batch, dropped if too stale, else trained.

        Receives the rank's pieces of the oldest batch in ``actor_channel`` (the
        next one may already be arriving behind it). Its staleness is the actor's
        step minus the oldest weight version stamped on it, the maximum over actor
        ranks; above ``algorithm.max_staleness`` the batch is dropped on every rank
        (no update, the step does not advance). Otherwise
        :meth:`compute_advantages_and_returns` and :meth:`run_training` (with the
        decoupled loss, see the module docstring) run on it.

        Args:
            actor_channel: Env -> actor channel (key: this rank).

        Returns:
            ``dropped`` (1.0 or 0.0), ``rollout/dropped_batches`` (cumulative over the
            run, checkpointed), ``rollout/trained_version`` (oldest version of the
            batch); when trained also ``rollout/staleness_mean``,
            ``rollout/staleness_max`` and the ``rollout/*`` and ``train/*`` metrics.
        """
        k = self.cfg.algorithm.staleness_bound(self.cfg.runner.mode)
        self.recv_rollout_batch(actor_channel)
        versions = self._require_batch().trajectory.versions
        worst, mean = batch_staleness(versions, self.global_step)
        stats = torch.tensor([float(worst), mean], dtype=torch.float64)
        worst = int(self._all_reduce(stats[:1], dist.ReduceOp.MAX)[0])
        mean = float(self._all_reduce(stats[1:])[0]) / self.world_size
        metrics: dict[str, float] = {"rollout/trained_version": float(self.global_step - worst)}
        dropped = worst > k
        if dropped:
            self.batch = None
            self.dropped_batches += 1
        else:
            metrics.update(self.compute_advantages_and_returns())
            metrics.update(self.run_training())
        metrics.update(
            {"dropped": float(dropped), "rollout/dropped_batches": float(self.dropped_batches)}
        )
        if not dropped:
            metrics.update({"rollout/staleness_mean": mean, "rollout/staleness_max": float(worst)})
        return metrics

    def _all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        out = tensor.detach().to(self.device, copy=True)
        if self._model_world_size > 1:
            dist.all_reduce(out, op=op, group=self._model_group)
        return out.cpu()

    def _require_batch(self) -> RolloutBatch:
        if self.batch is None:
            raise RuntimeError("no rollout batch: call recv_rollout_batch() first")
        return self.batch

    def _substep_mask(self, traj: Trajectory) -> torch.Tensor:
        """[T, B, C] bool: sub-steps that enter the loss."""
        mask = (
            traj.alive.clone()
            if traj.alive is not None
            else torch.ones_like(traj.rewards, dtype=torch.bool)
        )
        if not self.cfg.env.train.auto_reset:
            mask &= compute_loss_mask(traj.dones).mask
        return mask

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Advantages (and value targets for GAE) of the received batch.

        Returns ``rollout/*`` metrics (reduced over actor ranks): mean valid reward,
        advantage and return mean/max/min.
        """
        self._require_grown("compute_advantages_and_returns")
        batch = self._require_batch()
        traj = batch.trajectory
        alg = self.cfg.algorithm
        with self.worker_timer("compute_advantages"):
            substep = self._substep_mask(traj)
            mask = (
                substep.any(dim=-1, keepdim=True) if alg.reward_type == "chunk_level" else substep
            )
            inputs = EmbodiedAdvantageInputs(
                rewards=traj.rewards,
                dones=traj.dones,
                values=traj.prev_values if alg.adv_type == "gae" else None,
                loss_mask=mask,
                gamma=alg.gamma,
                gae_lambda=alg.gae_lambda,
                reward_type=alg.reward_type,
                group_size=alg.group_size,
                normalize_advantages=alg.normalize_advantages,
                eps=1e-8,
                all_reduce=self._all_reduce,
            )
            advantages, returns = get_advantage(alg.adv_type)(inputs)
        batch.advantages = advantages
        batch.returns = returns
        batch.loss_mask = mask
        named = [("rewards", traj.rewards, substep), ("advantages", advantages, mask)]
        if returns is not None:
            named.append(("returns", returns, mask))
        stats = self._masked_stats([(value, m) for _, value, m in named])
        metrics = {"rollout/rewards": stats[0]["mean"]}
        for (name, _, _), stat in zip(named[1:], stats[1:], strict=True):
            for key, number in stat.items():
                metrics[f"rollout/{name}_{key}"] = number
        return metrics

    def _masked_stats(
        self, pairs: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[dict[str, float]]:
        """Global masked mean/max/min of each ``(value, mask)``: two all-reduces in all."""
        sums, extremes = [], []
        inf = torch.tensor(float("inf"), dtype=torch.float64)
        for value, mask in pairs:
            m = mask.expand_as(value)
            v = value.to(torch.float64)
            sums += [torch.where(m, v, torch.zeros_like(v)).sum(), m.sum().to(torch.float64)]
            extremes += [torch.where(m, v, -inf).max(), -torch.where(m, v, inf).min()]
        total = self._all_reduce(torch.stack(sums)).tolist()
        peak = self._all_reduce(torch.stack(extremes), dist.ReduceOp.MAX).tolist()
        out = []
        for i in range(len(pairs)):
            s, n = total[2 * i], total[2 * i + 1]
            if n == 0:
                out.append({"mean": 0.0, "max": 0.0, "min": 0.0})
            else:
                out.append({"mean": s / n, "max": peak[2 * i], "min": -peak[2 * i + 1]})
        return out

    # ------------------------------------------------------------------ training

    def run_training(self) -> dict[str, float]:
        """PPO/GRPO update epochs on the received batch (see the module docstring).

        Returns ``train/*`` metrics averaged over micro batches, then over actor ranks.
        """
        self._require_grown("run_training")
        model, optimizer, scheduler = self._parts()
        batch = self._require_batch()
        if batch.advantages is None or batch.loss_mask is None:
            raise RuntimeError("call compute_advantages_and_returns() before run_training()")
        phase = self.device_phase(
            lock=self._offload, offload=self._offload, timeout=self.cfg.runner.step_timeout_s
        )
        with phase, self.worker_timer("run_training"):
            metrics = self._train(model, optimizer, batch)
            scheduler.step()
        self.global_step += 1
        self.batch = None
        return metrics

    def _train(
        self, model: BasePolicy, optimizer: torch.optim.Optimizer, batch: RolloutBatch
    ) -> dict[str, float]:
        """Update epochs: shuffled minibatches, each micro-steps then one optimizer step."""
        cfg, alg = self.cfg, self.cfg.algorithm
        data = self._flatten(batch)
        per_rank = cfg.actor.global_batch_size // self.world_size
        if data.n % per_rank != 0:
            raise ValueError(
                f"actor.global_batch_size={cfg.actor.global_batch_size}: this rank holds "
                f"{data.n} samples but its share of a global batch is {per_rank}; make "
                f"{per_rank} divide {data.n}"
            )
        micro = cfg.actor.micro_batch_size
        accum = per_rank // micro
        means = MetricMeans()  # stays on the device until the step ends
        gap = torch.zeros((), device=self.device)  # the largest |logprobs - old_logprobs|
        gradient_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDPModule's
        skipped = 0
        for epoch in range(alg.update_epoch):
            # A fresh permutation per epoch, seeded by (step, epoch, rank): resumable.
            generator = torch.Generator().manual_seed(
                derive_seed(cfg.actor.seed, self.global_step, epoch, self.rank)
            )
            perm = torch.randperm(data.n, generator=generator)
            for start in range(0, data.n, per_rank):
                minibatch = perm[start : start + per_rank]
                # Gradient accumulation: FSDP syncs gradients on the last micro-step only.
                optimizer.zero_grad(set_to_none=True)
                for k in range(accum):
                    if gradient_sync is not None:
                        gradient_sync(k == accum - 1)
                    idx = minibatch[k * micro : (k + 1) * micro]
                    step_metrics = self._micro_step(model, data, idx, accum)
                    gap = torch.maximum(gap, step_metrics.pop(_LOGPROB_GAP))
                    means.add(step_metrics)
                # One optimizer step; a non-finite global norm skips it (counted).
                reshard_fsdp(model)  # no gathered copy outlives the step
                norms, stepped = clip_and_step(optimizer, cfg.actor.optim.clip_grad)
                means.add(norms)
                skipped += not stepped
        optimizer.zero_grad(set_to_none=True)
        metrics = self._train_metrics(optimizer, means, skipped, data)
        gap = self._all_reduce(gap.to(torch.float64).reshape(1), op=dist.ReduceOp.MAX)
        metrics[f"train/{_LOGPROB_GAP}"] = float(gap)
        return metrics

    def _flatten(self, batch: RolloutBatch) -> _TrainData:
        """The batch as ``[T * B, ...]`` tensors on the device, gathered from every micro-step."""
        alg = self.cfg.algorithm
        traj = batch.trajectory
        assert batch.advantages is not None and batch.loss_mask is not None
        t, b, chunks = traj.rewards.shape
        n, dev = t * b, self.device
        chunk_level = alg.reward_type == "chunk_level"
        level = alg.logprob_type or alg.reward_type
        old_logprobs = _at_level(traj.prev_logprobs.reshape(n, -1), chunks, level)
        old_values = traj.prev_values[:-1].reshape(n, -1)
        if chunk_level:
            old_values = old_values[:, :1]
        mask = batch.loss_mask.reshape(n, -1).to(dev)
        inputs = {k: v.reshape(n, *v.shape[2:]).to(dev) for k, v in traj.forward_inputs.items()}
        old_logprobs = old_logprobs.to(dev)
        is_weights = None
        if self.cfg.runner.mode == "async":  # decoupled PPO: ratio vs proximal, IS vs behaviour
            assert self.model is not None
            proximal = proximal_logprobs(
                self.model, inputs, chunks, level, self.cfg.actor.micro_batch_size
            )
            is_weights = truncated_is_weights(
                proximal,
                old_logprobs,
                alg.importance_sampling_clip,
                _widen(mask, proximal.shape[1]),
            )
            old_logprobs = proximal
        mask_sum = None
        if alg.loss_agg_mode == "episode-length-norm":
            per_env = batch.loss_mask.reshape(t, b, -1).sum(dim=(0, 2))
            mask_sum = per_env.view(1, b, 1).expand(t, b, mask.shape[-1]).reshape(n, -1).to(dev)
        return _TrainData(
            n=n,
            chunks=chunks,
            chunk_level=chunk_level,
            logprob_level=level,
            inputs=inputs,
            old_logprobs=old_logprobs,
            old_values=old_values.to(dev),
            advantages=batch.advantages.reshape(n, -1).to(dev),
            returns=None if batch.returns is None else batch.returns.reshape(n, -1).to(dev),
            mask=mask,
            mask_sum=mask_sum,
            is_weights=is_weights,
        )

    def _micro_step(
        self, model: BasePolicy, data: _TrainData, idx: torch.Tensor, accum: int
    ) -> dict[str, Any]:
        """Forward, loss and backward (scaled by 1/accum) of one micro-batch; its metrics."""
        alg = self.cfg.algorithm
        critic = alg.loss_type == "actor_critic"
        out = model(
            {key: v[idx] for key, v in data.inputs.items()},
            compute_logprobs=True,
            compute_entropy=True,
            compute_values=critic,
        )
        mask = data.mask[idx]
        mask_sum = data.mask_sum[idx] if data.mask_sum is not None else None
        # Clipped surrogate on the log-probabilities at logprob_level (per token, sub-step
        # or chunk); advantages and masks are repeated to that width.
        logprobs = _at_level(out["logprobs"], data.chunks, data.logprob_level)
        width = logprobs.shape[1]
        advantages = _widen(data.advantages[idx], width)
        if data.is_weights is not None:  # async: truncated IS (proximal vs behaviour)
            advantages = advantages * data.is_weights[idx]
        loss, metrics = get_policy_loss(alg.loss_type)(
            logprobs=logprobs,
            old_logprobs=data.old_logprobs[idx],
            advantages=advantages,
            loss_mask=_widen(mask, width),
            clip_ratio_low=alg.clip_ratio_low,
            clip_ratio_high=alg.clip_ratio_high,
            loss_agg_mode=alg.loss_agg_mode,
            loss_mask_sum=None if mask_sum is None else _widen(mask_sum, width, scale=True),
            max_episode_steps=self._max_episode_steps,
        )
        if critic:
            # Clipped value loss against the GAE returns.
            assert data.returns is not None
            values = out["values"][:, :1] if data.chunk_level else out["values"]
            vloss, value_metrics = value_loss(
                values,
                data.old_values[idx],
                data.returns[idx],
                mask,
                alg.value_clip,
                alg.loss_agg_mode,
                huber_delta=alg.huber_delta,
                mask_sum=mask_sum,
                max_episode_steps=self._max_episode_steps,
            )
            loss = loss + vloss
            metrics.update(value_metrics)
        with torch.no_grad():  # |gap| >= 0: a 0 fill is a right masked max, also when empty
            gap = (logprobs.detach().float() - data.old_logprobs[idx].float()).abs()
            metrics[_LOGPROB_GAP] = torch.where(_widen(mask, width).bool(), gap, 0.0).max()
        if data.is_weights is not None:
            metrics["actor/is_weight_mean"] = masked_mean(
                data.is_weights[idx], _widen(mask, width)
            ).detach()
        # Entropy bonus (logged either way).
        entropy_at_level = _at_level(out["entropy"], data.chunks, data.logprob_level)
        entropy = masked_mean(entropy_at_level, _widen(mask, entropy_at_level.shape[1]))
        if alg.entropy_bonus > 0:
            loss = loss - alg.entropy_bonus * entropy
        torch.autograd.backward(loss / accum)
        return {
            **metrics,
            "actor/entropy_loss": entropy.detach(),
            "actor/total_loss": loss.detach(),
        }

    def _train_metrics(
        self, optimizer: torch.optim.Optimizer, means: MetricMeans, skipped: int, data: _TrainData
    ) -> dict[str, float]:
        """``train/*`` metrics: micro-batch means averaged over ranks, skips, LRs, EV."""
        metrics = {f"train/{k}": v for k, v in means.means().items()}
        keys = sorted(metrics)
        reduced = self._all_reduce(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        metrics = {k: float(v) / self.world_size for k, v in zip(keys, reduced, strict=True)}
        # Every rank saw the same (global) norms, so its count is the run's.
        metrics["train/actor/skipped_steps"] = float(skipped)
        for group in optimizer.param_groups:
            metrics[f"train/{group.get('name', 'actor')}/lr"] = float(group["lr"])
        if self.cfg.algorithm.loss_type == "actor_critic" and data.returns is not None:
            metrics["train/critic/explained_variance"] = explained_variance(
                data.old_values, data.returns, data.mask, all_reduce=self._all_reduce
            )
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: str, step: int) -> None:
        """Writes model and optimizer shards, scheduler, step and RNG under ``path/actor``.

        Collective over actor ranks; the layout is :mod:`rlinf.core.train_state`'s.
        """
        model, optimizer, scheduler = self._parts()
        extra = {
            "step": step,
            "scheduler": scheduler.state_dict(),
            "dropped_batches": self.dropped_batches,
        }
        phase = self.device_phase(lock=False, offload=self._offload)
        with self.worker_timer("save_checkpoint"), phase:
            save_train_state(
                Path(path) / "actor",
                model,
                optimizer,
                extra,
                frozen_from_disk=model.frozen_from_disk,
                process_group=self._model_group,
            )

    def load_checkpoint(self, path: str) -> int:
        """Restores what :meth:`save_checkpoint` wrote; returns the global step saved."""
        model, optimizer, scheduler = self._parts()
        with self.device_phase(lock=False, offload=self._offload):
            extra = load_train_state(
                Path(path) / "actor",
                model,
                optimizer,
                frozen_from_disk=model.frozen_from_disk,
                process_group=self._model_group,
            )
        scheduler.load_state_dict(extra["scheduler"])
        self.global_step = int(extra["step"])
        self.dropped_batches = int(extra.get("dropped_batches", 0))
        return self.global_step


def _at_level(values: torch.Tensor, chunks: int, level: str) -> torch.Tensor:
    """[n, C * A] per-dimension values as [n, C * A] (token_level), [n, C] or [n, 1] sums."""
    n = values.shape[0]
    if level == "token_level":
        return values.reshape(n, -1)
    per_step = values.reshape(n, chunks, -1).sum(dim=-1)
    return per_step.sum(dim=-1, keepdim=True) if level == "chunk_level" else per_step


def _widen(values: torch.Tensor, width: int, *, scale: bool = False) -> torch.Tensor:
    """[n, k] repeated along dim 1 to [n, width] (each column ``width / k`` times).

    With ``scale`` the repeated values are multiplied by ``width / k`` (mask sums: a
    sub-step counts as ``A`` token entries).
    """
    repeats = width // values.shape[1]
    if repeats == 1:
        return values
    widened = values.repeat_interleave(repeats, dim=1)
    return widened * repeats if scale else widened
