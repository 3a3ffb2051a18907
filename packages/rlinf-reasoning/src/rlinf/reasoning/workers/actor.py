"""``FSDPActor``: trains a Hugging Face causal LM with GRPO under FSDP2.

One rank per device (GPU with NCCL, unchecked; or CPU slot with gloo, tested).
Each decoder layer and the root module are ``fully_shard``-ed over all actor
ranks; the optimizer is AdamW over the sharded parameters.

A training step (:meth:`FSDPActor.run_training`) consumes this rank's share of
the step's prompt groups from a channel, *as they arrive*, through a
:class:`~rlinf.reasoning.workers.step_feed.StepFeed` (arrival, old and
proximal logprobs):

* on arrival a group gets its advantages (group-relative, so no barrier is
  needed);
* the step's responses are split into ``n_minibatches`` minibatches of whole
  groups, each into micro-batches; as soon as a micro-batch's groups are in,
  its old logprobs are recomputed with the step's starting weights (with
  ``actor.recompute_logprobs``; plus reference logprobs for KL terms) and its
  forward/backward runs (gradient accumulation), so training overlaps
  generation in disaggregated mode; one optimizer step per minibatch;
* old logprobs must come from the starting weights, so with recomputation
  every group is pulled (and recomputed) before the step's first optimizer
  update; global advantage whitening and REINFORCE++ also wait for the batch;
* the first minibatch of the first epoch trains with the starting weights, so
  its training forward *is* the recomputation: its old logprobs are taken from
  that forward (detached) instead of a separate no-grad pass, which saves a
  quarter of the recomputation with 4 minibatches (only when nothing makes the
  two forwards differ: no dropout, no reference model, streamed advantages;
  :meth:`FSDPActor._fuses_first_minibatch`);
* forward passes run in fixed chunks at fixed points of the loop, so every
  actor rank issues the same FSDP collectives in the same order.

Weights reach the rollout in buckets (:meth:`sync_model_to_rollout`): the full
tensors are gathered over the actor ranks and rank 0 broadcasts one
:class:`~rlinf.core.weight_sync.WeightBucket` of at most
``actor.sync_bucket_mb`` to every rollout rank per call.

Online scaling (``runner.online_scaling``, built with ``base_world_size`` < the
group's world size): ranks ``0..base_world_size-1`` (the *base* ranks) hold the
model, optimizer and schedule; the others (the *extra* ranks, launched on the
rollout's devices) take no part outside training phases. :meth:`scale_up` grows
the actor onto every rank for a training phase, :meth:`scale_down` shrinks it
back:

* process groups: the default group spans every rank and a subgroup the base
  ranks; both are created once at start (all ranks must join each creation);
* the grown model (``fully_shard`` over every rank), its AdamW and LR schedule
  are built once, at start, on every rank and kept; a phase only copies state
  into and out of them (no disk load, no re-wrapping, no new optimizer);
* re-sharding is :mod:`rlinf.core.fsdp_scaling`'s (shared with the embodied
  actor): rank 0 gathers the parameters and AdamW moments in flat buffers, one
  per dtype, broadcasts the small rest (schedule, param-group
  hyper-parameters, AdamW step counts, counters; pickled) and scatters each
  rank its rows, copied into its FSDP2 shards. Rank 0 briefly holds one full
  copy of the parameters and moments; every other rank only its shard;
* the extra ranks keep their shard of the grown model and optimizer between
  phases (1/world of the training state; on a GPU it waits in host memory,
  unchecked), and the base ranks keep their model during the training phase;
* the data of the step re-splits by itself: each rank takes
  ``rollout_batch_size / ranks`` groups from the channel.

An optimizer that has not stepped yet sends no state (creating it, as
``get_optimizer_state_dict`` would, bumps AdamW's step counts and changes the
first update).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf.core.algorithms import (
    MetricMeans,
    ReasoningAdvantageInputs,
    agg_loss,
    early_stop_ratio_exceeded,
    get_advantage,
    get_policy_loss,
    kl_penalty,
    masked_mean,
    truncated_is_weights,
)
from rlinf.core.channel import Channel
from rlinf.core.dist import (
    clip_and_step,
    full_tensor,
    init_process_group,
    reshard_fsdp,
    select_device,
)
from rlinf.core.fsdp_scaling import (
    ScalingMeshes,
    TrainParts,
    check_phase,
    grow,
    park,
    require_state,
    setup_scaling,
    shrink,
)
from rlinf.core.optim import lr_lambda, move_optimizer_state
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult
from rlinf.core.seeding import derive_seed
from rlinf.core.train_state import load_train_state, save_train_state
from rlinf.core.weight_sync import WeightBucket, send_weights
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.models import (
    compute_token_logprobs,
    compute_token_logprobs_and_entropy,
    load_causal_lm,
    resolve_dtype,
)
from rlinf.reasoning.workers.batch import PackedBatch, Sample, pack_samples, pad_rows
from rlinf.reasoning.workers.common import setup_torch_threads
from rlinf.reasoning.workers.step_feed import StepFeed
from rlinf.sched import Worker

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["FSDPActor"]

_MIB = 1 << 20


class FSDPActor(Worker):
    """The GRPO actor: FSDP2 training, logprob recomputation, bucketed weight sync.

    Args:
        cfg: The validated run config.
        collocated: Whether the actor shares its devices with the rollout
            (then it takes the device lock around its phases and, on GPUs,
            offloads between them).
        base_world_size: Online scaling: the ranks that hold the model between
            training phases (the others join for training only, see
            :meth:`scale_up`); ``None``: every rank, always.
    """

    def __init__(
        self, cfg: ReasoningConfig, collocated: bool = False, base_world_size: int | None = None
    ) -> None:
        super().__init__()
        setup_torch_threads(cfg.cluster.torch_threads)
        self.cfg = cfg
        self.collocated = collocated
        self._base_world_arg = base_world_size
        self._grown = False
        self._base_parts: TrainParts | None = None  # online scaling: kept while grown
        self.version = 0
        self.num_syncs = 0
        self._offloaded = False
        self._optim_steps = 0
        self._stage_times: deque[dict[str, float]] = deque(maxlen=1024)

    # ------------------------------------------------------------------ setup
    def init_worker(self, total_steps: int) -> dict[str, Any]:
        """Starts torch.distributed, loads and shards the model, builds the optimizer.

        Args:
            total_steps: Training steps of the run (for the LR schedule).

        Returns:
            ``{"num_params", "device", "backend"}``.

        Raises:
            FileNotFoundError: If ``actor.model_path`` is not a model directory.
            ValueError: If prompt + response do not fit the model's positions.
        """
        cfg = self.cfg
        self.device = select_device()
        backend = init_process_group(cfg.actor.dist_backend, self.device, cfg.runner.step_timeout_s)
        torch.manual_seed(derive_seed(cfg.runner.seed, "actor", self.rank) % 2**31)
        self.dtype = resolve_dtype(cfg.actor.dtype)
        self.temperature = cfg.algorithm.sampling_params.temperature
        self.ref_model: nn.Module | None = None
        alg = cfg.algorithm
        self.total_optim_steps = max(1, total_steps * alg.n_minibatches * alg.update_epoch)
        self.loss_fn = get_policy_loss(alg.loss_type)
        self.adv_fn = get_advantage(alg.adv_type)
        self._setup_scaling()
        info: dict[str, Any] = {"device": str(self.device), "backend": backend}
        info["base_world_size"] = self.base_world_size
        info["checkpoint_world_size"] = self.checkpoint_world_size
        num_params = 0
        if self.holds_state:  # the extra ranks hold nothing outside training phases
            self._build_models()
            self.model.train()
            self.optimizer = self._build_optimizer()
            self.scheduler = self._build_scheduler()
            num_params = sum(p.numel() for p in self.model.parameters())
        if self.scaling:
            self._build_grown()
        if self._offload_enabled:
            self.offload()
        return {"num_params": num_params, **info}

    def _build_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        return self._lambda_lr(self.optimizer)

    def _lambda_lr(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """The run's LR schedule over ``optimizer``'s param groups."""
        opt = self.cfg.actor.optim
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lr_lambda(opt.lr_scheduler, opt.warmup_steps, self.total_optim_steps, opt.min_lr_ratio),
        )

    def _build_models(self) -> None:
        """Sets ``model``, ``ref_model`` (when KL terms need it) and ``pad_token_id``.

        The backend hook of :meth:`init_worker`: here HF models sharded with FSDP2.
        """
        cfg = self.cfg
        if self.scaling:
            assert self._meshes.base_mesh is not None  # only base ranks build at start
            self.mesh = self._meshes.base_mesh
        else:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        self.model = self._shard(self._load_model())
        if cfg.needs_ref_model:
            ref = load_causal_lm(cfg.actor.model_path, dtype=self.dtype, device=self.device)
            ref.requires_grad_(False)
            self.ref_model = self._shard(ref)
            self.ref_model.eval()

    def _load_model(self) -> nn.Module:
        """The HF model of ``actor.model_path``; checks positions, sets ``pad_token_id``."""
        model = load_causal_lm(self.cfg.actor.model_path, dtype=self.dtype, device=self.device)
        self._check_positions(getattr(model.config, "max_position_embeddings", None))
        self.pad_token_id = int(getattr(model.config, "pad_token_id", None) or 0)
        if self.cfg.actor.gradient_checkpointing:
            enable: Any = model.gradient_checkpointing_enable
            enable()
        return model

    def _build_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the model's parameters; the LR schedule drives its param groups."""
        return self._adamw(self.model)

    def _adamw(self, model: nn.Module) -> torch.optim.AdamW:
        """AdamW over ``model``'s parameters with the configured hyper-parameters."""
        opt = self.cfg.actor.optim
        return torch.optim.AdamW(
            model.parameters(),
            lr=opt.lr,
            betas=opt.adam_betas,
            eps=opt.adam_eps,
            weight_decay=opt.weight_decay,
            fused=True,  # one kernel per param group (CPU default: a Python loop over tensors)
        )

    def _check_positions(self, limit: object) -> None:
        """Raises if prompt + response do not fit ``limit`` positions (``None``: unknown)."""
        cfg = self.cfg
        needed = cfg.data.max_prompt_length + cfg.algorithm.sampling_params.max_new_tokens
        if isinstance(limit, int) and needed > limit:
            raise ValueError(
                f"data.max_prompt_length ({cfg.data.max_prompt_length}) + "
                f"algorithm.sampling_params.max_new_tokens "
                f"({cfg.algorithm.sampling_params.max_new_tokens}) = {needed} exceeds the "
                f"model's max_position_embeddings={limit} ({cfg.actor.model_path}); lower them"
            )

    # ------------------------------------------------------------ online scaling
    def _setup_scaling(self) -> None:
        """Online scaling: the base ranks' subgroup and both device meshes (all ranks join)."""
        self._meshes: ScalingMeshes = setup_scaling(self._base_world_arg, self.device)
        self.base_world_size = self._meshes.base_world_size
        self.scaling = self._meshes.scaling
        self._grown = not self.scaling
        self._base_pg = self._meshes.base_group  # None on the extra ranks

    @property
    def holds_state(self) -> bool:
        """Whether this rank holds the model now (a base rank, or any rank while grown)."""
        return self._grown or self.rank < self.base_world_size

    @property
    def checkpoint_world_size(self) -> int:
        """The ranks ``0..n-1`` that save and load checkpoints: the base ranks."""
        return self.base_world_size

    def _build_grown(self) -> None:
        """Online scaling: the model, AdamW and LR schedule over every rank, built once.

        Every rank builds them at start (``fully_shard`` over the world mesh) and
        keeps them; :meth:`scale_up` only copies the base ranks' state into them
        and :meth:`scale_down` copies it back. On a GPU they wait in host memory
        between training phases (unchecked).
        """
        grown = self._shard(self._load_model(), self._meshes.world_mesh)
        grown.train()
        optimizer = self._adamw(grown)
        self._grown_parts = TrainParts(grown, optimizer, self._lambda_lr(optimizer))
        if self.device.type != "cpu":
            park(self._grown_parts, torch.device("cpu"))

    def _require_state(self, method: str) -> None:
        active = self._grown or self.rank < self.base_world_size
        require_state(method, self.rank, self.base_world_size, active, "model")

    def _counters(self) -> dict[str, int]:
        """The small counters that travel with the state (rank 0's win)."""
        return {
            "optim_steps": self._optim_steps,
            "version": self.version,
            "num_syncs": self.num_syncs,
        }

    def _set_counters(self, counters: dict[str, int]) -> None:
        """Takes the counters :meth:`_counters` gave (rank 0's, after a scale-up)."""
        self._optim_steps = int(counters["optim_steps"])
        self.version = int(counters["version"])
        self.num_syncs = int(counters["num_syncs"])

    def scale_up(self) -> dict[str, Any]:
        """Grows the actor from its base ranks onto every rank (every rank calls it).

        Moves the base ranks' parameters, AdamW state, schedule and counters
        onto every rank (:meth:`_grow`). Afterwards :meth:`run_training`
        splits the step's groups over all ranks.

        Returns:
            ``{"seconds", "world_size"}``.

        Raises:
            RuntimeError: Without online scaling, or when already grown.
        """
        check_phase("scale_up", self.rank, self.scaling, self._grown)
        start = time.perf_counter()
        self._grow()
        self._grown = True
        return {"seconds": time.perf_counter() - start, "world_size": self.world_size}

    def _grow(self) -> None:
        """Copies the base ranks' state into the grown model and optimizer (built at start).

        With :func:`rlinf.core.fsdp_scaling.grow`.
        """
        base = self.rank < self.base_world_size
        if base:  # kept for scale_down
            self._base_parts = TrainParts(self.model, self.optimizer, self.scheduler)
        parts = self._grown_parts
        out = grow(
            self._meshes, self._base_parts if base else None, parts, self.device, self._counters()
        )
        self._set_counters(out["extra"])
        self.model, self.optimizer, self.scheduler = parts.model, parts.optimizer, parts.scheduler
        assert self._meshes.world_mesh is not None
        self.mesh = self._meshes.world_mesh

    def scale_down(self) -> dict[str, Any]:
        """Shrinks the actor back to its base ranks (every rank calls it; :meth:`_shrink`).

        Returns:
            ``{"seconds", "world_size"}`` (the base world size).

        Raises:
            RuntimeError: Without online scaling, or when not grown.
        """
        check_phase("scale_down", self.rank, self.scaling, self._grown)
        start = time.perf_counter()
        self._shrink()
        self._grown = False
        return {"seconds": time.perf_counter() - start, "world_size": self.base_world_size}

    def _shrink(self) -> None:
        """Copies the trained state back into the base ranks' model and optimizer.

        With :func:`rlinf.core.fsdp_scaling.shrink`. The extra ranks keep only
        their idle shard of the grown model (in host memory on a GPU) for the
        next :meth:`scale_up`.
        """
        base = self._base_parts if self.rank < self.base_world_size else None
        shrink(self._meshes, self._grown_parts, base, self.device)
        del self.model, self.optimizer, self.scheduler
        if base is not None:
            self.model, self.optimizer, self.scheduler = base.model, base.optimizer, base.scheduler
            assert self._meshes.base_mesh is not None
            self.mesh = self._meshes.base_mesh
        self._base_parts = None

    # ------------------------------------------------------------ data parallel
    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel replicas (FSDP: its rank)."""
        return self.rank

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas: each takes an equal share of the step's groups.

        With online scaling: every rank while grown, else the base ranks.
        """
        return self.world_size if self._grown else self.base_world_size

    @property
    def _dp_group(self) -> dist.ProcessGroup | None:
        """The group that all-reduces data-parallel statistics (``None``: the default one)."""
        return None if self._grown else self._base_pg

    @property
    def _reports_data(self) -> bool:
        """Whether this rank reports its groups (once per data-parallel replica)."""
        return True

    def _receive_group(self, channel: Channel, timeout: float) -> RolloutResult:
        """The next prompt group of this rank's share (the hook for model-parallel peers)."""
        item: RolloutResult = channel.get(timeout=timeout)
        return item

    @property
    def _offload_enabled(self) -> bool:
        flag = self.cfg.actor.enable_offload
        if flag is None:
            return self.collocated and self.device.type != "cpu"
        return flag

    def _shard(self, model: nn.Module, mesh: DeviceMesh | None = None) -> nn.Module:
        """FSDP2 over ``mesh`` (default: ``self.mesh``): each decoder layer and the root.

        With ``actor.fsdp_units: model`` the root alone (one all-gather per forward).
        """
        from torch.distributed.fsdp import fully_shard

        mesh = self.mesh if mesh is None else mesh
        names: set[str] = set()
        if self.cfg.actor.fsdp_units == "layers":
            names = set(getattr(model, "_no_split_modules", None) or [])
        reshard = self.cfg.actor.reshard_after_forward
        for module in list(model.modules()):
            if type(module).__name__ in names:
                fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model

    # ------------------------------------------------------------ offload/onload
    def offload(self) -> None:
        """Moves parameters, gradients and optimizer state to the CPU (no-op on CPU)."""
        if self._offloaded or self.device.type == "cpu":
            self._offloaded = True
            return
        self._move(torch.device("cpu"))
        torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        """Moves what :meth:`offload` moved back to the device."""
        if not self._offloaded:
            return
        if self.device.type != "cpu":
            self._move(self.device)
        self._offloaded = False

    def _move(self, device: torch.device) -> None:
        self.model.to(device)
        if self.ref_model is not None:
            self.ref_model.to(device)
        move_optimizer_state(self.optimizer, device)

    # -------------------------------------------------------------- weight sync
    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Hugging Face names of every parameter (tied ones once) and persistent buffer."""
        named: list[tuple[str, torch.Tensor]] = list(self.model.named_parameters())
        keys = set(self.model.state_dict().keys())
        named += [(n, b) for n, b in self.model.named_buffers() if n in keys]
        return named

    def sync_model_to_rollout(
        self, rollout_group: str, rollout_world_size: int, version: int
    ) -> dict[str, Any]:
        """Sends the full weights to every rollout rank, one broadcast per bucket.

        Every actor rank gathers the full tensors (a collective); rank 0 sends.

        Args:
            rollout_group: The rollout group's name.
            rollout_world_size: Its ranks (all receive every bucket).
            version: The weight version (the global step they start).

        Returns:
            ``{"version", "num_buckets", "num_tensors", "bytes", "seconds"}``.
        """
        self._require_state("sync_model_to_rollout")
        start = time.perf_counter()
        phase = self.device_phase(
            lock=self.collocated,
            offload=self._offload_enabled,
            timeout=self.cfg.runner.step_timeout_s,
        )
        with phase:
            timeout = self.cfg.runner.channel_timeout_s
            send = self.broadcast_sender(rollout_group, rollout_world_size, timeout)
            cap = int(self.cfg.actor.sync_bucket_mb * _MIB)
            buckets, total, num_tensors = self._send_weights(
                version, cap, send if self.rank == 0 else None
            )
            self.version = version
            self.num_syncs += 1
        return {
            "version": version,
            "num_buckets": buckets,
            "num_tensors": num_tensors,
            "bytes": total,
            "seconds": time.perf_counter() - start,
        }

    def _send_weights(
        self, version: int, cap_bytes: int, send: Callable[[WeightBucket], None] | None
    ) -> tuple[int, int, int]:
        """Walks the bucket plan; ``send`` (rank 0's) sends each bucket.

        Every rank joins the all-gathers; only rank 0 copies and sends.

        Returns:
            ``(buckets, bytes, tensors)`` of the sync.
        """
        named = self._named_weights()
        buckets, total = send_weights(named, version, cap_bytes, send, gather=full_tensor)
        return buckets, total, len(named)

    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full (gathered) weights as CPU tensors; every rank must call it (tests/tools)."""
        self._require_state("full_weights")
        with self.device_phase(lock=False, offload=self._offloaded), torch.no_grad():
            return [(n, full_tensor(t).detach().cpu().clone()) for n, t in self._named_weights()]

    # ------------------------------------------------------------------ forward
    def _forward_logprobs(
        self, model: nn.Module, samples: list[Sample], *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        packed = self._pack(samples)
        inputs = (model, packed.input_ids, packed.attention_mask)
        options: dict[str, Any] = {
            "response_start": packed.response_start,
            "temperature": self.temperature,
            "response_mask": packed.response_mask,
        }
        if with_entropy:
            lp, ent = compute_token_logprobs_and_entropy(*inputs, **options)
            return lp, ent, packed.response_mask
        return compute_token_logprobs(*inputs, **options), None, packed.response_mask

    def _pack(self, samples: list[Sample]) -> PackedBatch:
        """The samples' prompts and responses packed into one batch on the device."""
        pairs = [(s.prompt_ids, s.response_ids) for s in samples]
        masks = [s.generated_mask for s in samples]
        return pack_samples(pairs, self.pad_token_id, masks).to(self.device)

    def _no_grad_logprobs(self, model: nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
        size = self.cfg.actor.logprob_micro_batch_size or self.cfg.actor.micro_batch_size
        out: list[torch.Tensor] = []
        was_training = model.training
        model.eval()  # no dropout: these are the reference numbers for the ratio and KL
        try:
            with torch.no_grad():
                for i in range(0, len(samples), size):
                    out += self._chunk_logprobs(model, samples[i : i + size])
        finally:
            model.train(was_training)
        return out

    def _chunk_logprobs(self, model: nn.Module, chunk: list[Sample]) -> list[torch.Tensor]:
        """One chunk of :meth:`_no_grad_logprobs`: each response's logprobs on the CPU."""
        lp, _, _ = self._forward_logprobs(model, chunk)
        return [lp[k, : s.response_length].float().cpu() for k, s in enumerate(chunk)]

    def _fuses_first_minibatch(self) -> bool:
        """Whether the first minibatch's training forward supplies its old logprobs.

        True when old logprobs are recomputed, no reference model needs the same
        samples, advantages stream (REINFORCE++ and whitening read the old
        logprobs before training) and the model has no active dropout (a
        training-mode forward then equals the no-grad one, up to float rounding).
        """
        cfg, alg = self.cfg, self.cfg.algorithm
        if not cfg.actor.recompute_logprobs or self.ref_model is not None:
            return False
        if alg.normalize_advantages or alg.is_reinpp:
            return False
        return not _has_dropout(self.model)

    def recompute_logprobs(self, results: list[RolloutResult]) -> list[list[float]]:
        """Logprobs of the results' responses under the current weights (every rank calls it).

        Args:
            results: Prompt groups (this rank's; ranks may pass different ones).

        Returns:
            One list of float32 logprobs per response, in order.
        """
        self._require_state("recompute_logprobs")
        samples = [s for r in results for s in self._samples(r)]
        return [lp.tolist() for lp in self._no_grad_logprobs(self.model, samples)]

    # ------------------------------------------------------------------ training
    def _samples(self, result: RolloutResult) -> list[Sample]:
        rewards = result.rewards if result.rewards is not None else [0.0] * result.group_size
        masks: list[list[bool] | None] = (
            list(result.generated_masks) if result.generated_masks else [None] * result.group_size
        )
        out = []
        for ids, lps, end, reward, generated in zip(
            result.response_ids, result.rollout_logprobs, result.is_end, rewards, masks, strict=True
        ):
            lp = torch.tensor(lps, dtype=torch.float32)
            out.append(
                Sample(
                    prompt_ids=list(result.prompt_ids),
                    response_ids=list(ids),
                    rollout_logprobs=lp,
                    old_logprobs=lp,
                    advantages=torch.zeros(len(ids)),
                    reward=float(reward),
                    is_end=bool(end),
                    generated_mask=None if generated is None else list(generated),
                )
            )
        return out

    def _all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of ``tensor`` over the data-parallel replicas (itself when there is one)."""
        if self.dp_size == 1:
            return tensor
        out = tensor.to(self.device).clone()
        dist.all_reduce(out, group=self._dp_group)
        return out / self.dp_size

    def _advantages(self, samples: list[Sample], group_size: int) -> None:
        """Fills ``advantages`` of whole groups (``len(samples)`` a multiple of G)."""
        alg = self.cfg.algorithm
        width = max(1, max(s.response_length for s in samples))
        mask = torch.zeros((len(samples), width), dtype=torch.bool)
        for i, s in enumerate(samples):
            if s.generated_mask is None:
                mask[i, : s.response_length] = True
            else:  # token-level terms (REINFORCE++ KL) skip observation tokens
                mask[i, : s.response_length] = torch.as_tensor(s.generated_mask, dtype=torch.bool)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        all_reduce = None
        if self.dp_size > 1:

            def all_reduce(t: torch.Tensor) -> torch.Tensor:
                t = t.clone()
                dist.all_reduce(t, group=self._dp_group)
                return t

        ref = None
        if alg.is_reinpp and alg.reinpp_kl_beta > 0:
            ref = pad_rows([s.ref_logprobs for s in samples], width)  # type: ignore[misc]
        inputs = ReasoningAdvantageInputs(
            rewards=rewards,
            response_mask=mask,
            group_size=group_size,
            norm_by_std=alg.norm_by_std,
            normalize_advantages=alg.normalize_advantages,
            logprobs=pad_rows([s.old_logprobs for s in samples], width),
            ref_logprobs=ref,
            kl_beta=alg.reinpp_kl_beta,
            kl_kind=alg.kl_penalty,
            use_baseline=alg.use_reinpp_baseline,
            all_reduce=all_reduce,
        )
        adv, _ = self.adv_fn(inputs)
        for i, s in enumerate(samples):
            s.advantages = adv[i, : s.response_length].float()

    def run_training(
        self,
        channel: Channel,
        step: int,
        requeue: Channel | None = None,
        proximal: Channel | None = None,
    ) -> dict[str, Any]:
        """Trains on this rank's share of step ``step``'s prompt groups from ``channel``.

        In asynchronous GRPO (``algorithm.max_staleness`` = k > 0) the actor's
        weights are version ``step``; a group generated with a version older than
        ``step - k`` is dropped (never trained on), counted, and its prompt is put
        back on ``requeue`` (when given) so the rollout generates it again.

        Args:
            channel: Where the rewarded :class:`RolloutResult` groups arrive.
            step: The global step (0-based) being trained (= the weight version).
            requeue: Async mode: the request channel that takes dropped prompts back.
            proximal: Async mode: where the rollout puts the proximal logprobs of the
                previous version's groups under this step's weights (it scores them
                right after loading them); those groups take their old logprobs from
                there instead of a no-grad forward here.

        Returns:
            ``{"train": minibatch-averaged actor metrics, "rollout": rollout
            statistics of this rank's groups, "time": busy seconds, "versions"
            and "indices" of the trained groups, "staleness": ``step - version``
            of each trained group, "dropped": groups dropped as too stale}``.

        Raises:
            RuntimeError: A group without rewards, or generated with weights newer
                than the actor's.
        """
        self._require_state("run_training")
        alg = self.cfg.algorithm
        feed = StepFeed(self, channel, step, requeue, proximal)
        tally = _TrainTally()
        phase = contextlib.ExitStack()
        try:
            # --- arrival: the groups (and old logprobs) needed before the first micro-batch
            if self.collocated:  # the rollout holds the devices until it has generated all
                feed.pull(feed.share)
            # Lock and onload; the weights stay on the device for the next weight sync.
            timeout = self.cfg.runner.step_timeout_s
            phase.enter_context(
                self.device_phase(lock=self.collocated, offload=False, timeout=timeout)
            )
            feed.pull_what_cannot_stream()
            self.model.train()
            for epoch in range(alg.update_epoch):
                order = feed.epoch_order(epoch)
                for mb in range(alg.n_minibatches):
                    # --- gradient accumulation over the minibatch's micro-batches
                    self._train_minibatch(feed, order, epoch, mb, tally)
                    # --- old logprobs of every remaining group, before the first update
                    if epoch == mb == 0:
                        feed.before_first_update()
                    # --- optimizer step
                    t0 = time.perf_counter()
                    step_metrics, stepped = self._optimizer_step()
                    tally.means.add(step_metrics)
                    tally.skipped += not stepped
                    feed.busy["train"] += time.perf_counter() - t0
        finally:
            phase.close()
        return self._step_report(feed, tally)

    def _train_minibatch(
        self, feed: StepFeed, order: list[Sample], epoch: int, mb: int, tally: _TrainTally
    ) -> None:
        """Forward and backward of minibatch ``mb`` of ``order`` (``feed.minibatch`` samples).

        The gradients accumulate over its micro-batches and are reduced once,
        after the last one; each micro-batch waits only for its own groups.
        """
        micro = self.cfg.actor.micro_batch_size
        first, n_micro = mb * feed.minibatch, feed.minibatch // micro
        minibatch_tokens = self._minibatch_tokens(feed, order, first)
        set_old = feed.sets_old(epoch, mb)
        for k in range(n_micro):
            lo, hi = first + k * micro, first + (k + 1) * micro
            feed.before_micro_batch(hi)
            if math.isnan(tally.train_start):
                tally.train_start = time.time()
            t0 = time.perf_counter()
            scale = 1.0
            if minibatch_tokens > 0:
                # token-mean over the micro-batch -> over the whole minibatch
                # (all ranks): * tokens here * micro-batches * ranks / total
                tokens = sum(s.response_length for s in order[lo:hi])
                scale = tokens * n_micro * self.dp_size / minibatch_tokens
            # reduce the gradients once per minibatch, after its last micro-batch
            self._set_gradient_sync(k == n_micro - 1)
            m = self._micro_step(order[lo:hi], n_micro, scale, set_old=set_old)
            feed.busy["train"] += time.perf_counter() - t0
            # weight 1/n_micro: each minibatch counts once, like its optimizer step
            tally.means.add(m, weight=1.0 / n_micro)

    def _minibatch_tokens(self, feed: StepFeed, order: list[Sample], first: int) -> float:
        """Response tokens of the minibatch at ``first`` over all ranks (0: no token scale).

        With ``algorithm.use_valid_token_scale`` it waits for the minibatch's groups.
        """
        if not self.cfg.algorithm.use_valid_token_scale:
            return 0.0
        last = first + feed.minibatch
        feed.pull(-(-last // feed.group_size))
        local = sum(s.response_length for s in order[first:last])
        return float(self._all_reduce_mean(torch.tensor([float(local)])).item()) * self.dp_size

    def _step_report(self, feed: StepFeed, tally: _TrainTally) -> dict[str, Any]:
        """What :meth:`run_training` returns; records the step's training times."""
        step = feed.step
        feed.busy["total"] = time.perf_counter() - feed.started
        self._stage_times.append(
            {"step": float(step), "train_start": tally.train_start, "train_end": time.time()}
        )
        samples, results, dropped = feed.samples, feed.results, feed.dropped
        if not self._reports_data:  # a model-parallel peer: its replica's first rank reports
            samples, results, dropped = [], [], []
        return {
            # skipped_steps: a count (every rank saw the same global norm), not a mean
            "train": {
                **tally.means.means(),
                "actor/skipped_steps": float(tally.skipped),
                "actor/proximal_from_rollout": feed.from_rollout / max(1, len(samples)),
            },
            "rollout": self._rollout_stats(samples, results),
            "time": feed.busy,
            "versions": sorted({r.version for r in results}),
            "indices": [r.index for r in results],
            "staleness": [step - r.version for r in results],
            "dropped": len(dropped),
        }

    def _proximal_scores(
        self, channel: Channel, step: int, timeout: float
    ) -> dict[tuple[int, int], list[torch.Tensor]]:
        """The rollout's proximal logprobs for weights ``step`` (older messages are skipped).

        Waits for the first message of version ``step``, then merges those of the
        other rollout ranks that are already there (each rank sends its own
        groups' scores). A rank's message that comes later is skipped at the next
        step: its groups get the actor's own recomputation.
        """
        key = str(self.rank)

        def version_of(message: dict[str, Any]) -> int:
            version = int(message["version"])
            if version > step:
                raise RuntimeError(
                    f"proximal logprobs of version {version} reached the actor at step "
                    f"{step}; the rollout loads weights only after their step"
                )
            return version

        message: dict[str, Any] = channel.get(key=key, timeout=timeout)
        while version_of(message) < step:
            message = channel.get(key=key, timeout=timeout)
        groups: dict[tuple[int, int], list[torch.Tensor]] = dict(message["groups"])
        while True:
            try:
                message = channel.get_nowait(key=key)
            except asyncio.QueueEmpty:
                return groups
            if version_of(message) == step:
                groups.update(message["groups"])

    def _too_stale(
        self, item: RolloutResult, version: int, requeue: Channel | None, timeout: float
    ) -> bool:
        """Whether ``item`` is older than ``algorithm.max_staleness`` versions (async mode).

        A dropped group's prompt goes back on ``requeue`` (once per data-parallel
        replica) to be generated again with newer weights.

        Raises:
            RuntimeError: If ``item`` comes from weights newer than ``version``.
        """
        alg = self.cfg.algorithm
        if item.version > version:
            raise RuntimeError(
                f"the group of prompt {item.index} was generated with weight version "
                f"{item.version}, newer than the actor's {version}"
            )
        if not alg.is_async or version - item.version <= alg.max_staleness:
            return False
        if requeue is not None and self._reports_data:
            request = RolloutRequest(
                prompt_ids=list(item.prompt_ids),
                answers=list(item.answers),
                group_size=item.group_size,
                index=item.index,
                step=version,
            )
            requeue.put(request, timeout=timeout)
        return True

    def _epoch_perm(self, step: int, epoch: int, n: int) -> list[int]:
        """The seeded minibatch order of ``n`` samples in ``epoch`` of ``step`` (shuffle)."""
        gen = torch.Generator().manual_seed(
            derive_seed(self.cfg.runner.seed, "shuffle", step, self.dp_rank, epoch)
        )
        return torch.randperm(n, generator=gen).tolist()

    def _set_gradient_sync(self, enabled: bool) -> None:
        """FSDP2: whether the next backward reduce-scatters the gradients.

        Off for all but a minibatch's last micro-batch: the gradients accumulate
        unsharded on each rank and are reduced once (fewer, larger collectives).
        A no-op for a model that is not ``fully_shard``-ed.
        """
        toggle = getattr(self.model, "set_requires_gradient_sync", None)
        if toggle is not None:
            toggle(enabled)

    def _micro_step(
        self, batch: list[Sample], n_micro: int, loss_scale: float = 1.0, set_old: bool = False
    ) -> dict[str, Any]:
        """Forward, loss and backward of one micro-batch; metrics as 0-d tensors (no sync).

        Args:
            batch: The micro-batch's samples.
            n_micro: Micro-batches in the minibatch (the loss is divided by it).
            loss_scale: Extra loss factor (token-mean over the whole minibatch).
            set_old: The forward runs with the step's starting weights: store its
                detached logprobs as the samples' old logprobs first (instead of
                a separate no-grad recomputation).
        """
        want_entropy = self.cfg.algorithm.entropy_bonus > 0
        lp, ent, mask = self._forward_logprobs(self.model, batch, with_entropy=want_entropy)
        if set_old:
            with torch.no_grad():
                for k, s in enumerate(batch):
                    s.old_logprobs = lp[k, : s.response_length].detach().float().cpu()
        loss, out = self._micro_loss(batch, lp, ent, mask)
        (loss * loss_scale / n_micro).backward()  # type: ignore[no-untyped-call]
        return out

    def _micro_loss(
        self,
        batch: list[Sample],
        lp: torch.Tensor,
        ent: torch.Tensor | None,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The micro-batch's loss (before scaling) and metrics from its logprobs and entropy."""
        alg = self.cfg.algorithm
        width = mask.shape[1]
        old = pad_rows([s.old_logprobs for s in batch], width).to(self.device)
        adv = pad_rows([s.advantages for s in batch], width).to(self.device)
        rollout_lp = pad_rows([s.rollout_logprobs for s in batch], width).to(self.device)
        extra: dict[str, Any] = {}
        if alg.use_importance_sampling_fix:  # old = the actor's recomputation (config check)
            weights = truncated_is_weights(old, rollout_lp, alg.importance_sampling_clip, mask)
            adv = adv * weights
            extra["actor/is_weight_mean"] = masked_mean(weights, mask)
        loss, metrics = self.loss_fn(
            logprobs=lp,
            old_logprobs=old,
            advantages=adv,
            loss_mask=mask,
            clip_ratio_low=alg.clip_ratio_low,
            clip_ratio_high=alg.clip_ratio_high,
            dual_clip_c=alg.clip_ratio_c,
            loss_agg_mode=alg.loss_agg_mode,
        )
        out = dict(metrics)
        if alg.kl_beta > 0:
            ref = pad_rows([s.ref_logprobs for s in batch], width).to(self.device)  # type: ignore[misc]
            kl = agg_loss(kl_penalty(lp, ref, alg.kl_penalty), mask, alg.loss_agg_mode)
            loss = loss + alg.kl_beta * kl
            out["actor/kl_loss"] = kl.detach()
        if ent is not None:
            ent_loss = agg_loss(ent, mask, alg.loss_agg_mode)
            loss = loss - alg.entropy_bonus * ent_loss
            out["actor/entropy_loss"] = ent_loss.detach()
        out.update(extra)
        if alg.early_stop_imp_ratio is not None:
            stop, _ = early_stop_ratio_exceeded(
                lp, old, mask, alg.early_stop_imp_ratio, self._all_reduce_mean
            )
            out["actor/early_stopped"] = float(stop)
            if stop:  # still backward (zero gradient): every rank runs the same collectives
                loss = loss * 0.0
        out["actor/final_loss"] = loss.detach()
        with torch.no_grad():
            diff = (old - rollout_lp).abs()
            out["actor/rollout_train_kl"] = masked_mean(diff, mask)
            # diff >= 0, so a masked max with 0 fill is also right for an empty mask
            out["actor/logprob_diff_max"] = torch.where(mask.bool(), diff, 0.0).max()
        return loss, out

    def _optimizer_step(self) -> tuple[dict[str, float], bool]:
        lr = float(self.optimizer.param_groups[0]["lr"])
        reshard_fsdp(self.model)  # no gathered copy from a no-grad forward outlives the step
        # One fused norm (one collective under FSDP2); a non-finite one skips the step.
        norms, stepped = clip_and_step(self.optimizer, self.cfg.actor.optim.clip_grad)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()  # the schedule counts planned steps, skipped ones too
        self._optim_steps += 1
        return {**norms, "actor/lr": lr}, stepped

    @staticmethod
    def _rollout_stats(samples: list[Sample], results: list[RolloutResult]) -> dict[str, float]:
        n = len(samples)
        if n == 0:
            return {}
        lengths = [s.response_length for s in samples]
        prompt = [len(s.prompt_ids) for s in samples]
        valid = [a for s in samples for a in s.advantages.tolist()]
        trajectory: dict[str, float] = {}  # multi-turn: per-trajectory counts, summed
        for result in results:
            for stats in result.trajectory_stats or ():
                for key, value in stats.items():
                    trajectory[f"traj/{key}"] = trajectory.get(f"traj/{key}", 0.0) + value
        return {
            **trajectory,
            "count": float(n),
            "reward_sum": float(sum(s.reward for s in samples)),
            "response_length_sum": float(sum(lengths)),
            "response_length_max": float(max(lengths)),
            "response_length_min": float(min(lengths)),
            "prompt_length_sum": float(sum(prompt)),
            "ended_sum": float(sum(s.is_end for s in samples)),
            "adv_sum": float(sum(valid)),
            "adv_count": float(len(valid)),
            "adv_max": float(max(valid)) if valid else 0.0,
            "adv_min": float(min(valid)) if valid else 0.0,
            "groups": float(len(results)),
        }

    # --------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str, step: int) -> None:
        """Writes this rank's model/optimizer shards, scheduler and RNG under ``path/actor``.

        Also writes ``path/actor/huggingface`` (rank 0): the full weights and the
        model config, loadable as a ``model_path``.

        Args:
            path: The ``global_step_N`` directory.
            step: The global step the state belongs to.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        self._require_state("save_checkpoint")
        root = Path(path) / "actor"
        with self.device_phase(lock=False, offload=self._offload_enabled):
            extra = {
                "step": step,
                "version": self.version,
                "optim_steps": self._optim_steps,
                "scheduler": self.scheduler.state_dict(),
            }
            save_train_state(root, self.model, self.optimizer, extra, process_group=self._dp_group)
            full = get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            if self.rank == 0:
                from safetensors.torch import save_file

                hf = root / "huggingface"
                hf.mkdir(exist_ok=True)
                config: Any = getattr(self.model, "config", None)
                if config is not None:
                    config.save_pretrained(hf)
                gen: Any = getattr(self.model, "generation_config", None)
                if gen is not None:
                    gen.save_pretrained(hf)
                tensors = {k: v.contiguous().clone() for k, v in _tensors(full).items()}
                save_file(tensors, hf / "model.safetensors")
            dist.barrier(group=self._dp_group)

    def load_checkpoint(self, path: str) -> int:
        """Restores model, optimizer, scheduler and RNG from ``path/actor``.

        Args:
            path: A ``global_step_N`` directory written by :meth:`save_checkpoint`.

        Returns:
            The global step of the checkpoint.

        Raises:
            FileNotFoundError: If the actor state is missing.
        """
        self._require_state("load_checkpoint")
        with self.device_phase(lock=False, offload=self._offload_enabled):
            extra = load_train_state(
                Path(path) / "actor", self.model, self.optimizer, process_group=self._dp_group
            )
        self.scheduler.load_state_dict(extra["scheduler"])
        self.version = int(extra["version"])
        self._optim_steps = int(extra["optim_steps"])
        return int(extra["step"])

    def stage_times(self) -> list[dict[str, float]]:
        """When each recent :meth:`run_training` call trained (tests and debugging).

        Returns:
            One ``{"step", "train_start", "train_end"}`` per call, oldest first
            (the last 1024): when its first micro-batch started and when the
            call ended, in ``time.time()`` seconds (comparable across the
            processes of one node).
        """
        return list(self._stage_times)

    def state_summary(self) -> dict[str, Any]:
        """Version, optimizer steps, lr and fingerprints of the state (tests and debugging).

        Every rank must call it (the weights are gathered).

        Returns:
            ``{"version", "optim_steps", "lr", "checksum"}`` (sum of the full
            weights) and SHA-256 digests of the full weights (``weights_sha256``),
            this rank's optimizer state (``optim_sha256``) and this process's
            Python, numpy and torch RNG states (``rng_sha256``): equal digests,
            equal state.
        """
        weights = self.full_weights()
        return {
            "version": self.version,
            "optim_steps": self._optim_steps,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "checksum": sum(float(t.double().sum()) for _, t in weights),
            "weights_sha256": _digest(t for _, t in weights),
            "optim_sha256": _digest(_optimizer_tensors(self.optimizer)),
            "rng_sha256": _rng_digest(),
        }

    def teardown(self) -> None:
        """Destroys the process group, then releases channels and locks."""
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        super().teardown()


@dataclass
class _TrainTally:
    """The training side of one :meth:`FSDPActor.run_training` call."""

    means: MetricMeans = field(default_factory=MetricMeans)  # over minibatches
    skipped: int = 0  # optimizer steps skipped for a non-finite gradient norm
    train_start: float = math.nan  # time.time() when the first micro-batch started


def _has_dropout(model: nn.Module) -> bool:
    """Whether a training-mode forward of ``model`` may differ from an eval-mode one.

    Looks for dropout modules with ``p > 0`` and for positive ``*dropout`` /
    ``*pdrop`` entries of a Hugging Face config (functional dropout, e.g. in
    attention); anything unknown counts as dropout.
    """
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    if config is None:
        return False
    for key, value in vars(config).items():
        if key.endswith(("dropout", "pdrop")) and isinstance(value, int | float) and value > 0:
            return True
    return False


def _digest(tensors: Iterable[torch.Tensor]) -> str:
    """SHA-256 of the tensors' shapes, dtypes and bytes, in order (local shards of DTensors)."""
    h = hashlib.sha256()
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        data = local.detach().cpu().contiguous()
        h.update(f"{tuple(data.shape)}{data.dtype}".encode())
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """The optimizer's state tensors, parameter by parameter in param-group order."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for _, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    yield value


def _rng_digest() -> str:
    """SHA-256 of this process's Python, numpy and torch (CPU) RNG states."""
    import random

    import numpy as np

    h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    state: Any = np.random.get_state()  # ("MT19937", keys, pos, has_gauss, cached)
    h.update(state[1].tobytes())
    h.update(repr(state[2:]).encode())
    return h.hexdigest()


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
