"""Megatron's own training path on GPUs: its DDP wrapper and distributed optimizer.

What: the GPU counterpart of the Megatron actor's CPU optimizer step. The
GPT model is wrapped in Megatron's ``DistributedDataParallel`` (gradients
accumulate into contiguous fp32 buffers) and trained by Megatron's
``DistributedOptimizer`` (the fp32 master weights and AdamW's moments are
sharded over the data-parallel replicas, ZeRO-1 style). These functions cover
what the actor needs:

* :func:`wrap_for_gpu_training`: the DDP wrapper, the optimizer (one
  parameter group, AdamW with decoupled weight decay on every parameter, like
  the FSDP actor's ``torch.optim.AdamW``) and the torch optimizer inside it,
  which the actor's LR schedule drives.
* :func:`clip_and_step`: finalises the gradients (the data-parallel
  reduce-scatter, the tied-embedding all-reduce between pipeline stages), takes
  the global norm with Megatron's TP/PP-aware code, clips like
  ``torch.nn.utils.clip_grad_norm_`` and skips the update on a non-finite norm
  (the same rule as :func:`rlinf.core.dist.clip_and_step`; Megatron's own
  ``step`` would apply a NaN update without a loss scaler), then zeroes the
  buffers.
* :func:`sharded_optimizer_state` and :func:`load_optimizer_state`: the
  optimizer as ``dist_checkpointing`` state in the ``fully_reshardable``
  layout (shaped like the parameters), which reshards to another data- or
  tensor-parallel size on load; with two work-arounds for megatron-core
  0.16.1 with torch's AdamW (no transformer-engine), see their docstrings.

Why Megatron's and not ours: on GPUs its buffers and sharded optimizer are
what make large models fit and its kernels are the tuned ones; the CPU path
(torch AdamW per rank, an explicit all-reduce) exists because these classes
need CUDA. Cost: the optimizer state per rank falls from ``12 * P`` bytes
(fp32 master + two moments) to ``12 * P / dp``; per step one reduce-scatter
of the gradient buffer and one all-gather of the updated parameters over DP.

Checked on one H200 (a world of one rank: the sharding is over one replica);
multi-GPU data parallelism through this path is unchecked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "GpuTraining",
    "clip_and_step",
    "load_optimizer_state",
    "sharded_optimizer_state",
    "wrap_for_gpu_training",
]

#: ``dist_checkpointing`` layout of the distributed optimizer: the DP shards are
#: gathered into tensors shaped like their parameters (a plain optimizer's
#: state), so another DP or TP size can load it. (0.16's other model-space
#: layout, ``fully_sharded_model_space``, is refused by its own checkpointing.)
OPTIMIZER_SHARDING = "fully_reshardable"


@dataclass
class GpuTraining:
    """The wrapped model and the optimizers of Megatron's GPU training path.

    Attributes:
        model: ``megatron.core.distributed.DistributedDataParallel`` around the GPT model.
        optimizer: Megatron's optimizer (a ``DistributedOptimizer``, possibly in a
            ``ChainedOptimizer``).
        torch_optimizer: The torch AdamW inside it (its ``param_groups`` carry the lr).
    """

    model: nn.Module
    optimizer: Any
    torch_optimizer: torch.optim.Optimizer


def wrap_for_gpu_training(
    gpt: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    clip_grad: float,
) -> GpuTraining:
    """Wraps ``gpt`` in Megatron's DDP and builds its distributed optimizer.

    Args:
        gpt: The GPT model on a CUDA device (model parallel state initialised).
        lr: Initial learning rate (the actor's scheduler changes it).
        betas: AdamW's ``(beta1, beta2)``.
        eps: AdamW's epsilon.
        weight_decay: Decoupled weight decay, applied to every parameter.
        clip_grad: Max global grad norm (0 disables), used by :func:`clip_and_step`.

    Returns:
        The wrapped model and optimizers.

    Raises:
        RuntimeError: If ``gpt`` is not on a CUDA device.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    device = next(gpt.parameters()).device
    if device.type != "cuda":
        raise RuntimeError(
            f"Megatron's distributed optimizer needs CUDA; the model is on {device} "
            "(set actor.model.use_distributed_optimizer: false to train with torch AdamW)"
        )
    config: Any = getattr(gpt, "config")  # noqa: B009 - TransformerConfig of the GPT model
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True
    )
    model = DistributedDataParallel(config, ddp_config, gpt)
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_eps=eps,
        clip_grad=clip_grad,
        use_distributed_optimizer=True,
        bf16=config.params_dtype == torch.bfloat16,  # fp32 master weights for bf16 params
        fp16=False,
        params_dtype=config.params_dtype,
    )
    # config_overrides={}: one group, weight decay on every parameter (Megatron's
    # default skips biases and norms; the FSDP actor's AdamW does not).
    optimizer = get_megatron_optimizer(opt_config, [model], config_overrides={})
    inner = [getattr(o, "optimizer", None) for o in _leaves(optimizer)]
    if len(inner) != 1 or not isinstance(inner[0], torch.optim.Optimizer):
        raise RuntimeError(
            f"expected one torch optimizer inside Megatron's, found {inner!r}; "
            "this megatron-core release builds its optimizer differently than 0.16"
        )
    model.zero_grad_buffer()
    optimizer.zero_grad()
    return GpuTraining(model=model, optimizer=optimizer, torch_optimizer=inner[0])


def _leaves(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def clip_and_step(training: GpuTraining, clip_grad: float) -> tuple[float, bool]:
    """Reduces the gradients, clips, steps unless the norm is non-finite, zeroes.

    Call once per optimizer step, after the micro-batches' backward passes (the
    pipeline schedule must not finalise gradients itself: the model config's
    ``finalize_model_grads_func`` stays ``None``).

    Args:
        training: What :func:`wrap_for_gpu_training` built.
        clip_grad: Max global grad norm (0 disables clipping; the norm is still taken).

    Returns:
        ``(grad_norm, stepped)``: the norm before clipping, and whether the
        parameters were updated.
    """
    from megatron.core.distributed import finalize_model_grads

    model, optimizer = training.model, training.optimizer
    finalize_model_grads([model])
    found_inf = optimizer.prepare_grads()  # copies the reduced grads to the fp32 shards
    norm = float(optimizer.get_grad_norm())
    stepped = not found_inf and math.isfinite(norm)
    if stepped:
        if clip_grad > 0:
            _clip(optimizer, clip_grad, norm)
        stepped = bool(optimizer.step_with_ready_grads())
    model.zero_grad_buffer()  # type: ignore[operator]
    optimizer.zero_grad()
    return norm, stepped


def _clip(optimizer: Any, max_norm: float, norm: float) -> None:
    """Scales the fp32 shard gradients by ``min(1, max_norm / (norm + 1e-6))``."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    for leaf in _leaves(optimizer):
        clip_grad_by_total_norm_fp32(leaf.get_parameters(), max_norm, norm)


def sharded_optimizer_state(
    training: GpuTraining, model_state: dict[str, Any], *, is_loading: bool
) -> dict[str, Any]:
    """The optimizer's ``dist_checkpointing`` state, sharded like ``model_state``.

    Args:
        training: What :func:`wrap_for_gpu_training` built.
        model_state: The GPT model's ``sharded_state_dict()``.
        is_loading: Whether the state is a template to load into (creates AdamW's
            state when no step has been taken).

    Returns:
        The sharded state to pass to ``dist_checkpointing.save``/``load``; give
        what a load returns to :func:`load_optimizer_state`.
    """
    _ensure_torch_adam_state(training)
    state: dict[str, Any] = training.optimizer.sharded_state_dict(
        model_state,
        is_loading=is_loading,
        metadata={"distrib_optim_sharding_type": OPTIMIZER_SHARDING},
    )
    return state


def load_optimizer_state(training: GpuTraining, loaded: dict[str, Any]) -> None:
    """Loads what ``dist_checkpointing.load`` returned for :func:`sharded_optimizer_state`.

    With torch's AdamW inside (no transformer-engine or apex), megatron-core
    0.16.1 adds AdamW's per-parameter ``step`` to the state it copies the
    checkpoint's tensors into, and then finds no ``step`` tensor to copy (a
    ``KeyError``); and it gives every parameter the *same* ``step`` tensor,
    which torch's AdamW increments in place once per parameter (a wrong bias
    correction after resuming: measured 3.9e-4 = 0.39 lr off on the toy
    model). The step itself is restored from the param groups; this sets it
    aside while the tensors are copied and gives each parameter its own copy.

    Args:
        training: What :func:`wrap_for_gpu_training` built.
        loaded: The optimizer part of the loaded sharded state.
    """
    leaves = _leaves(training.optimizer)
    if len(leaves) != 1:
        raise RuntimeError(f"expected one optimizer inside Megatron's, found {len(leaves)}")
    leaf = leaves[0]
    state = dict(loaded)
    param_state = state.pop("param_state")
    kind = state.pop("param_state_sharding_type")
    if kind != OPTIMIZER_SHARDING:
        raise ValueError(
            f"the checkpoint's optimizer layout is {kind!r}, this release reads "
            f"{OPTIMIZER_SHARDING!r}; resume from a checkpoint this release wrote"
        )
    leaf.load_state_dict(state)  # param groups, the step, the (allocated) moments
    inner: Any = leaf.optimizer
    steps = {}
    if _is_torch_adam(inner):
        steps = {p: st.pop("step") for p, st in inner.state.items() if "step" in st}
    try:
        leaf.load_parameter_state_from_fully_reshardable(param_state)
    finally:
        for p, step in steps.items():  # one tensor per parameter: AdamW adds 1 in place
            inner.state[p]["step"] = step.detach().clone()


def _is_torch_adam(optimizer: Any) -> bool:
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))


def _ensure_torch_adam_state(training: GpuTraining) -> None:
    """Gives torch AdamW's untouched parameters zero moments and ``step`` 0.

    megatron-core 0.16.1 reads a ``step`` from every parameter's state when it
    builds a checkpoint (and when it prepares one to load into), which torch's
    AdamW creates only at its first update. Zero moments at step 0 are what
    that first update starts from, so training is unchanged.
    """
    inner = training.torch_optimizer
    if not _is_torch_adam(inner):
        return
    for group in inner.param_groups:
        for p in group["params"]:
            if not inner.state[p]:
                inner.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
