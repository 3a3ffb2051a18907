"""``MegatronActor``: the GRPO actor on a Megatron-core GPT model (tensor/pipeline parallel).

What: the same training step as :class:`~rlinf.reasoning.workers.actor.FSDPActor`
(its ``run_training`` and loss code are reused as they are) on this rank's
tensor-parallel shard of the model, built straight from the Hugging Face
checkpoint (:mod:`rlinf.reasoning.megatron`). The actor ranks split into
``tp * pp`` model-parallel ranks per replica (``actor.model``) and
``world / (tp * pp)`` data-parallel replicas (Megatron's rank order: TP ranks
are consecutive).

* Data: each replica takes ``1 / dp`` of the step's prompt groups. Only the
  first rank of a model-parallel group reads the channel; it broadcasts each
  group to its peers (``broadcast_object_list`` over Megatron's model-parallel
  group), so all ranks of a replica run the same micro-batches.
* Forward: :func:`~rlinf.reasoning.megatron.forward.gpt_logits` and the
  vocab-parallel token logprobs and entropy (the full vocabulary is never
  gathered). With ``pp > 1`` each micro-batch runs alone through Megatron's
  pipeline schedule (no overlap between stages); the last stage computes the
  loss and broadcasts its metrics (and recomputed logprobs) to the others.
* Optimizer step, on GPUs (``actor.model.use_distributed_optimizer``, on by
  default with CUDA unless the actor offloads): Megatron's DDP wrapper and
  distributed optimizer (:mod:`rlinf.reasoning.megatron.dist_optimizer`:
  fp32 master weights and AdamW moments sharded over the replicas, Megatron's
  gradient reduction and norm). On CPU (Megatron's classes need CUDA), and on
  GPUs when offloading: gradients are averaged over the data-parallel group
  (one coalesced all-reduce); the norm sums squares of TP-sharded parameters
  over the model-parallel group and counts replicated ones (norms) and a tied
  embedding's two pipeline copies once (their gradients are summed); torch
  AdamW on each rank's shard. Both clip like ``torch.nn.utils.clip_grad_norm_``
  and skip the step on a non-finite norm, as ``rlinf.core.dist.clip_and_step``.
* Weight sync: the ranks of replica 0 gather each bucket over TP
  (:func:`~rlinf.reasoning.megatron.hf_export.iter_hf_buckets`, HF names);
  actor rank 0 sends it as a :class:`~rlinf.core.weight_sync.WeightBucket`
  to every rollout rank (the rollout's receive path and first-sync check are
  the FSDP path's); later pipeline stages pass their buckets to the first
  stage (one object broadcast per bucket). Other replicas send nothing.
* Checkpoints: ``megatron.core.dist_checkpointing`` of the model and of
  AdamW's moments (sharded like their parameters, written once by replica
  0; the distributed optimizer's own ``fully_reshardable`` layout on GPUs),
  plus each rank's torch RNG, the step, version, scheduler and AdamW's
  step count, and a Hugging Face export. It reshards on load: another
  data-parallel or tensor-parallel size resumes (checked: TP 2 -> 1 and
  DP 2 -> 1; another PP size is unchecked).

* Online scaling (``runner.online_scaling``, PP = 1, without the distributed
  optimizer): every rank builds and keeps a whole replica of its TP shard
  (the ranks beyond ``base_world_size`` add data-parallel replicas; TP and PP
  stay as they are). Between training phases the base replicas form the
  data-parallel group; :meth:`scale_up` broadcasts replica 0's parameters,
  AdamW state, schedule and counters to every replica
  (:func:`rlinf.core.fsdp_scaling.replicate`) and trains over all of them;
  :meth:`scale_down` only switches back to the base replicas' group (every
  replica took the same, all-reduced steps). Checkpoints are saved and loaded
  by every rank (``dist_checkpointing`` coordinates over the whole group; replica
  0 writes). On GPUs the extra replicas wait in host memory between training
  phases (unchecked).

Cost: per micro-batch the forward/backward of the shard plus three
``[B, T]`` all-reduces over TP for the logprobs (two more for the entropy);
per optimizer step one all-reduce of the gradients over DP and one scalar
over TP; per weight sync one all-gather per bucket over TP.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf.core.channel import Channel
from rlinf.core.fsdp_scaling import TrainParts, base_ranks, replicate
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.core.weight_sync import WeightBucket
from rlinf.reasoning.megatron.dist_optimizer import GpuTraining
from rlinf.reasoning.workers.actor import FSDPActor
from rlinf.reasoning.workers.batch import Sample

__all__ = ["MegatronActor"]

_CKPT_FORMAT = "rlinf-megatron-v1"


class MegatronActor(FSDPActor):
    """The GRPO actor on Megatron-core TP/PP shards (``actor.training_backend: megatron``).

    Args:
        cfg: The validated run config.
        collocated: Whether the actor shares its devices with the rollout.
    """

    # ------------------------------------------------------------------ setup
    def _build_models(self) -> None:
        from megatron.core import parallel_state as ps

        from rlinf.reasoning.megatron.model import build_gpt_model, init_model_parallel

        cfg = self.cfg
        self._use_dist_opt = self._uses_distributed_optimizer()  # fails before any set-up
        parallel = cfg.actor.model
        tp, pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
        if self.world_size % (tp * pp):
            raise ValueError(
                f"actor.model.tensor_model_parallel_size={tp} * pipeline_model_parallel_size="
                f"{pp} does not divide the {self.world_size} actor ranks; place a multiple of "
                f"{tp * pp} actor ranks (cluster.component_placement.actor)"
            )
        init_model_parallel(tp, pp, seed=cfg.runner.seed)
        self.tp_size = tp
        self.tp_group = ps.get_tensor_model_parallel_group()
        self._mp_group = ps.get_model_parallel_group()
        self._mp_rank = dist.get_rank(self._mp_group)
        self._mp_src = dist.get_global_rank(self._mp_group, 0)
        self._dp = self._dp_all = ps.get_data_parallel_group()
        self.pp_size = pp
        self._pp_group = ps.get_pipeline_model_parallel_group()
        self._pp_rank = ps.get_pipeline_model_parallel_rank()
        self._last_stage = ps.is_pipeline_last_stage()
        self._last_src = dist.get_global_rank(self._pp_group, pp - 1)
        built = build_gpt_model(cfg.actor.model_path, params_dtype=self.dtype)
        self._check_positions(built.arch.max_position_embeddings)
        self.built = built
        self.model = built.model  # wrapped in Megatron's DDP by _build_optimizer on GPUs
        self._gpu: GpuTraining | None = None
        if cfg.needs_ref_model:
            ref = build_gpt_model(cfg.actor.model_path, params_dtype=self.dtype).model
            ref.requires_grad_(False)
            ref.eval()
            self.ref_model = ref
        config = json.loads((Path(cfg.actor.model_path) / "config.json").read_text())
        self.pad_token_id = int(config.get("pad_token_id") or 0)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        """Megatron's DDP and distributed optimizer on GPUs, else torch AdamW per rank.

        Returns the torch optimizer the LR schedule drives (on GPUs, the one
        inside Megatron's distributed optimizer).
        """
        from rlinf.reasoning.megatron.dist_optimizer import wrap_for_gpu_training

        if not self._use_dist_opt:
            return super()._build_optimizer()
        opt = self.cfg.actor.optim
        self._gpu = wrap_for_gpu_training(
            self.built.model,
            lr=opt.lr,
            betas=opt.adam_betas,
            eps=opt.adam_eps,
            weight_decay=opt.weight_decay,
            clip_grad=opt.clip_grad or 0.0,
        )
        self.model = self._gpu.model
        return self._gpu.torch_optimizer

    def _uses_distributed_optimizer(self) -> bool:
        """``actor.model.use_distributed_optimizer`` resolved (null: CUDA, no offload/scaling)."""
        flag = self.cfg.actor.model.use_distributed_optimizer
        cuda = self.device.type == "cuda"
        if flag is None:
            return cuda and not self._offload_enabled and not self.scaling
        if flag and self.scaling:
            raise ValueError(
                "actor.model.use_distributed_optimizer=true cannot grow online (runner."
                "online_scaling: true replicates per-rank AdamW state); set it to null or false"
            )
        if flag and not cuda:
            raise ValueError(
                f"actor.model.use_distributed_optimizer=true needs CUDA, but the actor runs on "
                f"{self.device}; set it to null (auto) or false"
            )
        if flag and self._offload_enabled:
            raise ValueError(
                "actor.model.use_distributed_optimizer=true cannot offload the actor between "
                "phases (collocated placement or actor.enable_offload: true); set "
                "actor.enable_offload: false, or use_distributed_optimizer: null/false"
            )
        return flag

    # ------------------------------------------------------------ online scaling
    def _setup_scaling(self) -> None:
        """Online scaling: how many ranks are base ranks (the groups come with the model)."""
        base = base_ranks(self._base_world_arg, self.world_size)
        self.base_world_size = base
        self.scaling = base < self.world_size
        self._grown = not self.scaling

    @property
    def holds_state(self) -> bool:
        """Always: every rank builds and keeps a replica (extra ranks train only when grown)."""
        return True

    @property
    def checkpoint_world_size(self) -> int:
        """Every rank: ``dist_checkpointing`` coordinates over the whole group."""
        return self.world_size

    def _build_grown(self) -> None:
        """Online scaling: the base replicas' data-parallel groups (every rank joins)."""
        replica = self.tp_size * self.pp_size
        if self.pp_size != 1 or self.base_world_size % replica:
            raise ValueError(
                f"runner.online_scaling with the Megatron actor adds whole data-parallel "
                f"replicas: the {self.base_world_size} base ranks must be a multiple of "
                f"actor.model.tensor_model_parallel_size={self.tp_size}, with "
                f"pipeline_model_parallel_size=1 (got {self.pp_size}); change "
                "cluster.component_placement.actor or the parallel sizes"
            )
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, sorted(dist.get_process_group_ranks(self._dp_all)))
        self._dp_base: dist.ProcessGroup | None = None
        for ranks in sorted({tuple(r) for r in every}):  # the same order on every rank
            base = [r for r in ranks if r < self.base_world_size]
            group = dist.new_group(base)
            if self.rank in base:
                assert isinstance(group, dist.ProcessGroup)
                self._dp_base = group
        self._dp = self._dp_base
        if self.rank >= self.base_world_size:
            self.offload()  # host memory until the first scale_up (a no-op on CPU)

    def _grow(self) -> None:
        """Trains over every replica from now on; replica 0's state reaches the others.

        Broadcasts parameters, AdamW state, schedule and counters from replica 0
        over the data-parallel group (:func:`rlinf.core.fsdp_scaling.replicate`).
        """
        self.onload()
        parts = TrainParts(self.model, self.optimizer, self.scheduler)
        src = dist.get_global_rank(self._dp_all, 0)
        self._set_counters(replicate(parts, self._dp_all, src, self._counters())["extra"])
        self._dp = self._dp_all

    def _shrink(self) -> None:
        """Trains over the base replicas again (nothing moves).

        Every replica took the same all-reduced steps, so the base ones hold the
        trained state already; the extra ones wait (in host memory on GPUs).
        """
        self._dp = self._dp_base
        if self.rank >= self.base_world_size:
            self.offload()

    # ------------------------------------------------------------ data parallel
    @property
    def dp_rank(self) -> int:
        """This rank's replica (Megatron's data-parallel rank)."""
        return int(dist.get_rank(self._dp))

    @property
    def dp_size(self) -> int:
        """Replicas: actor ranks / (TP * PP)."""
        return int(dist.get_world_size(self._dp))

    @property
    def _dp_group(self) -> dist.ProcessGroup | None:
        group: dist.ProcessGroup = self._dp
        return group

    @property
    def _reports_data(self) -> bool:
        return self._mp_rank == 0

    def _receive_group(self, channel: Channel, timeout: float) -> RolloutResult:
        if dist.get_world_size(self._mp_group) == 1:
            return super()._receive_group(channel, timeout)
        box: list[Any] = [None]
        if self._mp_rank == 0:
            box[0] = channel.get(timeout=timeout)
        dist.broadcast_object_list(box, src=self._mp_src, group=self._mp_group)
        item: RolloutResult = box[0]
        return item

    # ------------------------------------------------------------------ forward
    def _forward_logprobs(
        self, model: nn.Module, samples: list[Sample], *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        from rlinf.reasoning.megatron.forward import gpt_logits

        if self.pp_size > 1:
            raise RuntimeError("with pipeline parallelism forward passes go through _pipeline")
        packed = self._pack(samples)
        start = packed.response_start
        logits = gpt_logits(model, packed.input_ids, packed.attention_mask)
        scoring = logits[:, start - 1 : -1]  # positions [P - 1, T - 1) score tokens [P, T)
        mask = packed.response_mask
        lp, ent = self._token_stats(scoring, packed.input_ids[:, start:], mask, with_entropy)
        return lp, ent, mask

    # ------------------------------------------------------------ pipeline (PP > 1)
    def _pipeline(
        self,
        model: nn.Module,
        samples: list[Sample],
        compute: Callable[
            [torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]
        ],
        *,
        forward_only: bool,
    ) -> dict[str, Any]:
        """One micro-batch through Megatron's pipeline schedule; ``compute``'s results.

        ``compute(scoring_logits, response_ids, response_mask)`` runs on the last
        stage and returns the loss to backpropagate and a dict, which is
        broadcast to every stage of the pipeline group.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from rlinf.reasoning.megatron.forward import pack_left, unpack_left

        packed = self._pack(samples)
        ids, mask, start = packed.input_ids, packed.attention_mask, packed.response_start
        result: dict[str, Any] = {}

        def forward_step(_: Any, stage: nn.Module) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            output = stage(pack_left(ids, mask), positions, attention_mask=None)

            def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                scoring = unpack_left(logits, mask)[:, start - 1 : -1]
                loss, extra = compute(scoring, ids[:, start:], packed.response_mask)
                result.update(extra)
                return loss, {}

            return output, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=model,
            num_microbatches=1,
            seq_length=ids.shape[1],
            micro_batch_size=ids.shape[0],
            forward_only=forward_only,
        )
        box: list[Any] = [result if self._last_stage else None]
        dist.broadcast_object_list(box, src=self._last_src, group=self._pp_group)
        out: dict[str, Any] = box[0]
        return out

    def _token_stats(
        self, scoring: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from rlinf.reasoning.megatron.forward import (
            vocab_parallel_entropy,
            vocab_parallel_token_logprobs,
        )

        vocab = self.built.arch.vocab_size
        m = mask.to(torch.float32)
        lp = vocab_parallel_token_logprobs(scoring, tokens, vocab, self.temperature) * m
        ent = vocab_parallel_entropy(scoring, vocab, self.temperature) * m if entropy else None
        return lp, ent

    def _chunk_logprobs(self, model: nn.Module, chunk: list[Sample]) -> list[torch.Tensor]:
        if self.pp_size == 1:
            return super()._chunk_logprobs(model, chunk)

        def compute(
            scoring: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            lp, _ = self._token_stats(scoring, tokens, mask, entropy=False)
            rows = [lp[k, : s.response_length].cpu() for k, s in enumerate(chunk)]
            return lp.sum() * 0.0, {"rows": rows}

        rows: list[torch.Tensor] = self._pipeline(model, chunk, compute, forward_only=True)["rows"]
        return rows

    def _fuses_first_minibatch(self) -> bool:
        """Never: old logprobs always come from a separate no-grad pass here."""
        return False

    def _micro_step(
        self, batch: list[Sample], n_micro: int, loss_scale: float = 1.0, set_old: bool = False
    ) -> dict[str, Any]:
        if self.pp_size == 1:
            return super()._micro_step(batch, n_micro, loss_scale, set_old)
        want_entropy = self.cfg.algorithm.entropy_bonus > 0

        def compute(
            scoring: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            lp, ent = self._token_stats(scoring, tokens, mask, entropy=want_entropy)
            loss, metrics = self._micro_loss(batch, lp, ent, mask)
            return loss * loss_scale / n_micro, {"metrics": metrics}

        out: dict[str, Any] = self._pipeline(self.model, batch, compute, forward_only=False)
        return dict(out["metrics"])

    # ------------------------------------------------------------------ optimizer
    def _optimizer_step(self) -> tuple[dict[str, float], bool]:
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        from rlinf.reasoning.megatron.dist_optimizer import clip_and_step

        lr = float(self.optimizer.param_groups[0]["lr"])
        if self._gpu is not None:  # Megatron's DDP buffers and distributed optimizer
            gpu_norm, updated = clip_and_step(self._gpu, self.cfg.actor.optim.clip_grad or 0.0)
            self.scheduler.step()  # the schedule counts planned steps, skipped ones too
            self._optim_steps += 1
            return {"actor/grad_norm": gpu_norm, "actor/lr": lr}, updated
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # every rank all-reduces the same buffers
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.pp_size > 1 and self.built.arch.tie_word_embeddings:
            # The first stage's embedding and the last stage's output layer are one
            # weight: sum their gradients (Megatron's finalize_model_grads does this).
            from megatron.core import parallel_state as ps

            group = ps.get_embedding_group()
            if self.rank in dist.get_process_group_ranks(group):
                gpt: Any = self.model
                weight = gpt.shared_embedding_or_output_weight()
                if weight.grad is not None:
                    dist.all_reduce(weight.grad, group=group)
        grads = [p.grad for p in params if p.grad is not None]
        if self.dp_size > 1:  # one coalesced all-reduce: the mean over the replicas
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self._dp)
            flat /= self.dp_size
            start = 0
            for g in grads:
                g.copy_(flat[start : start + g.numel()].view_as(g))
                start += g.numel()
        # Squares of TP-sharded grads from every TP rank; replicated ones (norms) once;
        # the last stage's copy of a tied embedding not at all (the first stage counts it).
        square = torch.zeros((), dtype=torch.float32, device=self.device)
        for p in params:
            shared = getattr(p, "shared", False)
            if p.grad is not None and not shared and param_is_not_tensor_parallel_duplicate(p):
                square += p.grad.detach().float().pow(2).sum()
        if dist.get_world_size(self._mp_group) > 1:
            dist.all_reduce(square, group=self._mp_group)
        norm = float(square.sqrt())
        clip = self.cfg.actor.optim.clip_grad
        stepped = torch.isfinite(torch.tensor(norm)).item()
        if stepped:
            if clip:  # as torch.nn.utils.clip_grad_norm_: always scale by min(1, coef)
                coef = min(1.0, clip / (norm + 1e-6))
                for g in grads:
                    g.mul_(coef)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()  # the schedule counts planned steps, skipped ones too
        self._optim_steps += 1
        return {"actor/grad_norm": norm, "actor/lr": lr}, bool(stepped)

    # -------------------------------------------------------------- weight sync
    def _hf_buckets(self, bucket_bytes: int) -> Any:
        from rlinf.reasoning.megatron.hf_export import iter_hf_buckets

        return iter_hf_buckets(
            self.built.model,
            self.built.arch,
            bucket_bytes=bucket_bytes,
            tp_size=self.tp_size,
            tp_group=self.tp_group,
        )

    def _send_weights(
        self, version: int, cap_bytes: int, send: Callable[[WeightBucket], None] | None
    ) -> tuple[int, int, int]:
        """Replica 0 gathers each bucket over TP; rank 0 (its first rank) sends it.

        Returns:
            ``(buckets, bytes, tensors)``; zeros on the other replicas.
        """
        from rlinf.reasoning.megatron.hf_export import count_hf_buckets

        if self.dp_rank != 0:
            return 0, 0, 0
        local = count_hf_buckets(
            self.built.model, self.built.arch, bucket_bytes=cap_bytes, tp_size=self.tp_size
        )
        counts = [local]
        if self.pp_size > 1:  # every stage's bucket count, in stage order
            every: list[Any] = [None] * self.pp_size
            dist.all_gather_object(every, local, group=self._pp_group)
            counts = [int(c) for c in every]
        count = sum(counts)
        total = tensors = index = 0
        with torch.no_grad():
            for stage, stage_count in enumerate(counts):
                mine = self._hf_buckets(cap_bytes) if stage == self._pp_rank else None
                src = dist.get_global_rank(self._pp_group, stage) if self.pp_size > 1 else 0
                for _ in range(stage_count):
                    bucket = [] if mine is None else next(mine)
                    cpu = [(n, t.to("cpu", copy=True)) for n, t in bucket]
                    if self.pp_size > 1:  # stage -> first stage (its rank 0 sends)
                        box: list[Any] = [cpu]
                        dist.broadcast_object_list(box, src=src, group=self._pp_group)
                        cpu = box[0]
                    total += sum(t.numel() * t.element_size() for _, t in cpu)
                    tensors += len(cpu)
                    if send is not None:
                        send(WeightBucket(version, index, count, cpu))
                    index += 1
        return count, total, tensors

    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full HF-named weights as CPU tensors; every rank must call it (tests/tools)."""
        with self.device_phase(lock=False, offload=self._offloaded), torch.no_grad():
            out = [
                (n, t.detach().cpu().clone())
                for bucket in self._hf_buckets(256 << 20)
                for n, t in bucket
            ]
            if self.pp_size > 1:  # every stage's layers, in stage order
                every: list[Any] = [None] * self.pp_size
                dist.all_gather_object(every, out, group=self._pp_group)
                out = [item for stage in every for item in stage]
        return out

    # --------------------------------------------------------------- checkpoints
    def _sharded_state(self, *, is_loading: bool = False) -> dict[str, Any]:
        """Model and optimizer as Megatron sharded state (``dist_checkpointing``).

        The optimizer's per-parameter tensors (AdamW's moments) get the sharding
        of their parameter, so they reshard with it; the per-parameter step
        count is saved apart (the meta file). Megatron's distributed optimizer
        writes its own layout (``fully_reshardable``, which reshards too).
        """
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )

        from rlinf.reasoning.megatron.dist_optimizer import sharded_optimizer_state

        gpt: Any = self.built.model
        model = gpt.sharded_state_dict()
        if self._gpu is not None:
            opt_state = sharded_optimizer_state(
                self._gpu, gpt.sharded_state_dict(), is_loading=is_loading
            )
            return {"model": model, "optimizer": opt_state}
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        optim = self.optimizer.state_dict()
        ids = get_param_id_to_sharded_param_map(model, params)
        optim_state_to_sharding_state(optim, ids, exclude_keys=("step",))
        return {"model": model, "optimizer": optim}

    def _adam_step(self) -> float:
        """AdamW's per-parameter step count (the updates taken; 0 before the first)."""
        for state in self.optimizer.state.values():
            return float(state["step"])
        return 0.0

    def _init_optimizer_state(self, step: float) -> None:
        """Creates AdamW's state (zero moments, ``step``) so a checkpoint can be loaded into it."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                self.optimizer.state[p] = {
                    "step": torch.tensor(step, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }

    def save_checkpoint(self, path: str, step: int) -> None:
        """See :meth:`FSDPActor.save_checkpoint`; here with ``dist_checkpointing``.

        Under ``path/actor``: ``dist/`` (Megatron's sharded checkpoint of the
        model and the AdamW moments: each shard written once, by replica 0),
        ``rng_rankNNNN.pt`` (each rank's torch RNG), ``megatron_meta.pt`` (step,
        version, scheduler, AdamW's step count, parallel sizes) and
        ``huggingface/`` (full weights and the model config, rank 0).
        """
        from megatron.core import dist_checkpointing
        from safetensors.torch import save_file

        root = Path(path) / "actor"
        if self.rank == 0:
            # dist_checkpointing refuses a non-empty folder: a step saved again (after
            # a restart that resumed from an earlier checkpoint) replaces the old save.
            shutil.rmtree(root / "dist", ignore_errors=True)
            (root / "dist").mkdir(parents=True)
        with self.device_phase(lock=False, offload=self._offload_enabled):
            dist.barrier()  # the empty folder exists before any rank writes
            dist_checkpointing.save(self._sharded_state(), str(root / "dist"))
            if dist.get_rank(self._dp_all) == 0:  # replica 0 (also between scaled phases)
                hf = {n: t.detach().cpu().contiguous().clone() for n, t in self.full_weights()}
                if self.rank == 0:
                    out = root / "huggingface"
                    out.mkdir(exist_ok=True)
                    save_file(hf, out / "model.safetensors")
                    for name in ("config.json", "generation_config.json"):
                        src = Path(self.cfg.actor.model_path) / name
                        if src.is_file():
                            shutil.copy(src, out / name)
            torch.save({"torch": torch.get_rng_state()}, root / f"rng_rank{self.rank:04d}.pt")
            if self.rank == 0:
                torch.save(
                    {
                        "format": _CKPT_FORMAT,
                        "step": step,
                        "version": self.version,
                        "optim_steps": self._optim_steps,
                        "adam_step": self._adam_step(),
                        "scheduler": self.scheduler.state_dict(),
                        "tensor_model_parallel_size": self.tp_size,
                        "pipeline_model_parallel_size": self.pp_size,
                        "distributed_optimizer": self._gpu is not None,
                    },
                    root / "megatron_meta.pt",
                )
            dist.barrier()

    def load_checkpoint(self, path: str) -> int:
        """See :meth:`FSDPActor.load_checkpoint`; the RNG only where this rank's is saved.

        ``dist_checkpointing`` reshards: any data-parallel and tensor-parallel
        size resumes (checked: TP 2 -> 1, DP 2 -> 1). Raises ``ValueError`` if
        the checkpoint was written in another format or optimizer layout.
        """
        from megatron.core import dist_checkpointing

        root = Path(path) / "actor"
        meta_file = root / "megatron_meta.pt"
        if not meta_file.is_file():
            raise FileNotFoundError(
                f"{meta_file} is missing: {path} holds no Megatron actor checkpoint "
                "(written with actor.training_backend: fsdp?); check runner.resume_dir"
            )
        meta = torch.load(meta_file, weights_only=False)
        if meta.get("format") != _CKPT_FORMAT:
            raise ValueError(
                f"{meta_file} has format {meta.get('format')!r}, this release reads "
                f"{_CKPT_FORMAT!r}; resume from a checkpoint this release wrote, or start from "
                "its actor/huggingface export as actor.model_path"
            )
        from rlinf.reasoning.megatron.dist_optimizer import load_optimizer_state

        saved_dist_opt = bool(meta.get("distributed_optimizer", False))
        if saved_dist_opt != (self._gpu is not None):
            raise ValueError(
                f"{meta_file} was written with actor.model.use_distributed_optimizer="
                f"{str(saved_dist_opt).lower()} and this run has "
                f"{str(self._gpu is not None).lower()}; their optimizer layouts differ: resume "
                f"with use_distributed_optimizer: {str(saved_dist_opt).lower()}, or start from "
                "its actor/huggingface export as actor.model_path"
            )
        with self.device_phase(lock=False, offload=self._offload_enabled):
            if self._gpu is not None:
                loaded = dist_checkpointing.load(
                    self._sharded_state(is_loading=True), str(root / "dist")
                )
                self.built.model.load_state_dict(loaded["model"])
                load_optimizer_state(self._gpu, loaded["optimizer"])
            else:
                self._load_torch_optimizer(root, meta)
        rng = root / f"rng_rank{self.rank:04d}.pt"
        if rng.is_file():
            torch.set_rng_state(torch.load(rng, weights_only=False)["torch"])
        self.scheduler.load_state_dict(meta["scheduler"])
        self.version = int(meta["version"])
        self._optim_steps = int(meta["optim_steps"])
        return int(meta["step"])

    def _load_torch_optimizer(self, root: Path, meta: dict[str, Any]) -> None:
        """Loads the model and the per-rank AdamW (the CPU path's layout) from ``root/dist``."""
        from megatron.core import dist_checkpointing

        self._init_optimizer_state(meta["adam_step"])
        template = self._sharded_state()
        loaded = dist_checkpointing.load(template, str(root / "dist"))
        self.built.model.load_state_dict(loaded["model"])
        optim = loaded["optimizer"]
        for group, saved in zip(
            self.optimizer.state_dict()["param_groups"], optim["param_groups"], strict=True
        ):
            saved["params"] = group["params"]
        for state in optim["state"].values():
            state["step"] = torch.tensor(float(meta["adam_step"]), dtype=torch.float32)
        if meta["adam_step"] == 0:  # no update was taken: AdamW starts without state
            optim["state"] = {}
        self.optimizer.load_state_dict(optim)

    def teardown(self) -> None:
        """Destroys Megatron's groups and the process group, then releases channels."""
        from megatron.core import parallel_state as ps

        with contextlib.suppress(Exception):
            ps.destroy_model_parallel()
        super().teardown()
