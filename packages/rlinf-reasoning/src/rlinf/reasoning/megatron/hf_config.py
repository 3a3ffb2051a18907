"""A Hugging Face Qwen2 ``config.json`` as a Megatron ``TransformerConfig`` and local layer spec.

What: :func:`read_hf_architecture` reads ``config.json`` (no transformers
import, so both the old ``rope_theta`` and the transformers-5
``rope_parameters`` layouts are read the same) into :class:`HFArchitecture`,
refusing what the Megatron model would compute differently;
:func:`transformer_config` and :func:`gpt_layer_spec` turn it into the config
and the local (non-transformer-engine) layer spec of ``GPTModel``.

Why: the actor builds Megatron straight from the rollout engine's checkpoint,
with no offline conversion, so the mapping must be exact: RMSNorm (eps),
SwiGLU (``gated_linear_unit``), bias on q/k/v only, grouped-query attention
(``num_query_groups``), the rotary base, tied or untied embeddings. The
vocabulary is padded to a multiple of ``vocab_multiple * tp`` so it splits
evenly over tensor-parallel ranks; the padded rows are zero and the logprob
helpers mask their logits out, so the real vocabulary's numbers match HF.

Cost: reading one small JSON file.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.spec_utils import ModuleSpec

__all__ = [
    "HFArchitecture",
    "UnsupportedConfigError",
    "gpt_layer_spec",
    "read_hf_architecture",
    "transformer_config",
    "transformer_engine_usable",
]

SUPPORTED_MODEL_TYPES = ("qwen2",)


class UnsupportedConfigError(ValueError):
    """A ``config.json`` key whose value the Megatron model would not reproduce."""


@dataclass(frozen=True)
class HFArchitecture:
    """The shape of a Qwen2-family model, as read from its ``config.json``.

    Attributes:
        vocab_size: Rows of HF's embedding (the real vocabulary).
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (query groups).
        head_dim: Width of one head.
        ffn_hidden_size: MLP width (``intermediate_size``).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: Rotary base.
        max_position_embeddings: Longest sequence.
        tie_word_embeddings: Whether the LM head is the embedding.
        attention_dropout: Attention-probability dropout.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_dropout: float

    def padded_vocab_size(self, tp_size: int, vocab_multiple: int = 1) -> int:
        """The vocabulary rounded up to a multiple of ``vocab_multiple * tp_size``."""
        step = vocab_multiple * tp_size
        return -(-self.vocab_size // step) * step


def _refuse(key: str, value: Any, why: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"config.json: {key}={value!r} is not supported ({why})")


def _rope_theta(cfg: dict[str, Any]) -> float:
    """The rotary base from ``rope_parameters`` (transformers 5) or ``rope_theta``; default only."""
    scaling = cfg.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "default":
        raise _refuse("rope_scaling", scaling, "only unscaled (default) rotary embeddings")
    params = cfg.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise _refuse("rope_parameters.rope_type", kind, "only 'default' rotary embeddings")
    extra = sorted(set(params) - {"rope_theta", "rope_type", "type"})
    if extra:
        raise _refuse(f"rope_parameters.{extra[0]}", params[extra[0]], "unknown rotary option")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _check_attention_layout(cfg: dict[str, Any]) -> None:
    """Refuses sliding-window attention and any non-full attention layer."""
    if cfg.get("use_sliding_window", False):
        raise _refuse("use_sliding_window", cfg["use_sliding_window"], "full attention only")
    for i, kind in enumerate(cfg.get("layer_types") or []):
        if kind != "full_attention":
            raise _refuse(f"layer_types[{i}]", kind, "full attention only")
    if cfg.get("quantization_config") is not None:
        raise _refuse("quantization_config", cfg["quantization_config"], "float weights only")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse("hidden_act", act, "SwiGLU (silu) only")


def read_hf_architecture(model: str | Path | dict[str, Any]) -> HFArchitecture:
    """Reads a Qwen2 ``config.json`` (a model directory, the file, or its parsed dict).

    Args:
        model: A ``save_pretrained`` directory, its ``config.json``, or the dict.

    Returns:
        The architecture.

    Raises:
        UnsupportedConfigError: Naming the key and value of anything the Megatron
            model would not reproduce (another model type, rope scaling, sliding
            window, an activation other than silu, quantization).
        FileNotFoundError: If there is no ``config.json``.
    """
    if isinstance(model, dict):
        cfg = model
    else:
        path = Path(model)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {str(path)!r}")
        cfg = json.loads(path.read_text(encoding="utf-8"))
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _refuse("model_type", model_type, f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    _check_attention_layout(cfg)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return HFArchitecture(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        ffn_hidden_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        # Qwen2Config's default is untied.
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_dropout=float(cfg.get("attention_dropout", 0.0)),
    )


def _check_divisible(arch: HFArchitecture, tp_size: int, pp_size: int) -> None:
    for what, value, by, name in (
        ("num_attention_heads", arch.num_heads, tp_size, "tensor parallel size"),
        ("num_key_value_heads", arch.num_kv_heads, tp_size, "tensor parallel size"),
        ("intermediate_size", arch.ffn_hidden_size, tp_size, "tensor parallel size"),
        ("num_hidden_layers", arch.num_layers, pp_size, "pipeline parallel size"),
    ):
        if value % by:
            raise ValueError(f"config.json: {what}={value} is not divisible by the {name} {by}")


def transformer_config(
    arch: HFArchitecture,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    params_dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> TransformerConfig:
    """The Megatron config of ``arch`` at the given parallel sizes.

    Fusions that need apex or custom kernels are off, so the same config runs on
    the CPU and on GPUs; weights are not initialised (they are loaded).

    Args:
        arch: From :func:`read_hf_architecture`.
        tp_size: Tensor-parallel size.
        pp_size: Pipeline-parallel size.
        params_dtype: Parameter (and pipeline communication) dtype.
        **overrides: Further ``TransformerConfig`` fields (they win).

    Returns:
        The config.

    Raises:
        ValueError: If heads, key/value heads, MLP width or layers do not split.
    """
    _check_divisible(arch, tp_size, pp_size)
    fields: dict[str, Any] = {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_heads,
        "num_query_groups": arch.num_kv_heads,
        "kv_channels": arch.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": arch.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": True,
        "hidden_dropout": 0.0,
        "attention_dropout": arch.attention_dropout,
        "tensor_model_parallel_size": tp_size,
        "pipeline_model_parallel_size": pp_size,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "perform_initialization": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
    }
    fields.update(overrides)
    return TransformerConfig(**fields)


def transformer_engine_usable() -> bool:
    """Whether the transformer-engine layer spec is used: CUDA present and TE installed."""
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def gpt_layer_spec(transformer_engine: bool = False) -> ModuleSpec:
    """The GPT layer spec: Megatron's local one with RMSNorm, or transformer-engine's.

    Transformer-engine's fuses each norm into the linear layer after it
    (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``);
    :mod:`.hf_layout` maps both namings. The TE spec needs CUDA and the
    ``transformer_engine`` package; it has not been run here (neither this
    machine nor the GPU check machine can install it).

    Args:
        transformer_engine: Use transformer-engine's spec (see
            :func:`transformer_engine_usable`).
    """
    if transformer_engine:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        te_spec: ModuleSpec = get_gpt_layer_with_transformer_engine_spec()
        return te_spec
    spec: ModuleSpec = get_gpt_layer_local_spec(normalization="RMSNorm")
    return spec
