"""Building this rank's Megatron ``GPTModel`` from a local Hugging Face checkpoint.

What: :func:`init_model_parallel` sets up Megatron's process groups and RNG
(applying the CPU shims where there is no CUDA); :func:`build_gpt_model` reads
``config.json``, builds this rank's tensor/pipeline-parallel shard of the model
with the local layer spec and loads the safetensors weights into it.

Why: the actor's one entry point to a model; the rollout engine's checkpoint
directory is all it needs.

Cost: the model's allocation (its share of parameters, uninitialised) and the
reading of its share of the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig
from torch import nn

from rlinf.reasoning.megatron.cpu_shims import apply_cpu_shims
from rlinf.reasoning.megatron.hf_config import (
    HFArchitecture,
    gpt_layer_spec,
    read_hf_architecture,
    transformer_config,
    transformer_engine_usable,
)
from rlinf.reasoning.megatron.hf_layout import rule_for
from rlinf.reasoning.megatron.hf_load import layer_offset, load_hf_weights

__all__ = ["HFGPTModel", "build_gpt_model", "init_model_parallel", "mark_tensor_parallel_params"]


def init_model_parallel(tp_size: int, pp_size: int, seed: int = 0) -> None:
    """Megatron's TP/PP/DP groups over the default process group, and its seeded RNG states.

    The default process group must exist (``torch.distributed``). On a machine
    without CUDA the CPU shims are applied first.

    Args:
        tp_size: Tensor-parallel size.
        pp_size: Pipeline-parallel size (the rest of the world is data parallel).
        seed: Seed of Megatron's RNG tracker.
    """
    apply_cpu_shims()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size
    )
    model_parallel_cuda_manual_seed(seed)


@dataclass(frozen=True)
class HFGPTModel:
    """This rank's model and what the bridge needs to map it back to HF.

    Attributes:
        model: This rank's ``GPTModel`` (its TP shard of its PP stage).
        arch: The checkpoint's architecture.
        config: The Megatron config it was built with.
        padded_vocab: Vocabulary rows of its embedding / output layer (all ranks).
        transformer_engine: Whether it uses transformer-engine's layer spec (CUDA
            and TE installed; unchecked) rather than Megatron's local one.
    """

    model: GPTModel
    arch: HFArchitecture
    config: TransformerConfig
    padded_vocab: int
    transformer_engine: bool = False


def mark_tensor_parallel_params(model: nn.Module, arch: HFArchitecture) -> int:
    """Sets Megatron's ``tensor_model_parallel`` attributes on the TP-sharded parameters.

    Megatron's layers set them in their weight initialisers, which the bridge
    skips (``perform_initialization=False``: the checkpoint is loaded instead),
    so only the biases carry them. Gradient-norm code (Megatron's
    ``clip_grad_norm_fp32`` and the actor's) counts a parameter without them as
    replicated, once per TP group: sharded weights would be undercounted.

    Args:
        model: This rank's ``GPTModel``.
        arch: Its architecture.

    Returns:
        The number of parameters marked.
    """
    offset = layer_offset(model)
    marked = 0
    for name, param in model.named_parameters():
        layout = rule_for(name, offset, arch.tie_word_embeddings).layout
        if layout == "full" or getattr(param, "tensor_model_parallel", False):
            continue
        # As megatron.core.tensor_parallel.set_tensor_model_parallel_attributes (which
        # asserts the attributes are unset; some layers set the defaults).
        param.tensor_model_parallel = True  # type: ignore[attr-defined]
        param.partition_dim = 1 if layout == "row" else 0  # type: ignore[attr-defined]
        param.partition_stride = 1  # type: ignore[attr-defined]
        marked += 1
    return marked


def build_gpt_model(
    model_dir: str | Path,
    *,
    params_dtype: torch.dtype = torch.float32,
    vocab_multiple: int = 1,
    load_weights: bool = True,
    **config_overrides: Any,
) -> HFGPTModel:
    """This rank's shard of the checkpoint in ``model_dir``, on the current device.

    Call :func:`init_model_parallel` first. Parameters are allocated on
    ``torch.cuda.current_device()`` (the CPU under the CPU shims).

    Args:
        model_dir: A ``save_pretrained`` directory (``config.json`` and safetensors).
        params_dtype: Parameter dtype.
        vocab_multiple: Pad the vocabulary to a multiple of this times the TP size.
        load_weights: Load the checkpoint (else parameters stay uninitialised).
        **config_overrides: Further ``TransformerConfig`` fields.

    Returns:
        The model (train mode) and its mapping data.

    Raises:
        RuntimeError: If Megatron's model parallel groups are not initialised.
    """
    if not ps.model_parallel_is_initialized():
        raise RuntimeError("call init_model_parallel (Megatron's process groups) first")
    tp_size = ps.get_tensor_model_parallel_world_size()
    arch = read_hf_architecture(model_dir)
    config = transformer_config(
        arch,
        tp_size=tp_size,
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        params_dtype=params_dtype,
        **config_overrides,
    )
    padded_vocab = arch.padded_vocab_size(tp_size, vocab_multiple)
    use_te = transformer_engine_usable()
    model = GPTModel(
        config,
        gpt_layer_spec(transformer_engine=use_te),
        vocab_size=padded_vocab,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,
    )
    if torch.cuda.is_available():
        # Megatron creates some modules (the local spec's torch norms) on the CPU;
        # its training loop moves the model to the GPU after building it, as here.
        model.cuda(torch.cuda.current_device())
    mark_tensor_parallel_params(model, arch)
    if load_weights:
        load_hf_weights(
            model,
            model_dir,
            arch,
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=tp_size,
            padded_vocab=padded_vocab,
        )
    return HFGPTModel(model, arch, config, padded_vocab, transformer_engine=use_te)
