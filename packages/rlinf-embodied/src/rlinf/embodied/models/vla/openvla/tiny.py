"""``make_tiny_openvla``: a random, tiny model directory in the openvla-7b layout (no network).

Written files, as on the hub: ``config.json`` (openvla field names, ``model_type:
openvla``, ``norm_stats``), ``model.safetensors`` (the real key names), the Llama 2
format tokenizer (``tokenizer.json`` + config; :func:`build_llama_tokenizer`, with
``<PAD>`` after the base vocabulary), ``preprocessor_config.json`` (the prismatic
processor's fields) and ``dataset_statistics.json``.

Sizes: both towers see ``image_size`` pixels in ``patch_size`` patches; widths
are 32 (DINOv2, 4 registers) and 48 (SigLIP), 2 blocks each; the Llama is 2
layers of width 64. The text vocabulary is ``tokenizer.vocab_size +
pad_to_multiple_of``, so OpenVLA's ``text_config.vocab_size - pad_to_multiple_of``
is the tokenizer's base vocabulary exactly as for openvla-7b (32064 - 64 = 32000),
and the 256 action ids count down from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlinf.embodied.models.vla.openvla.configuration import (
    DINOV2_REG4_ID,
    SIGLIP_SO400M_ID,
    OpenVLAConfig,
)
from rlinf.embodied.models.vla.openvla.modeling import OpenVLAModel
from rlinf.embodied.models.vla.openvla.policy import prompt_text
from rlinf.embodied.models.vla.openvla.vision import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    LayerScale,
    OpenVLAImageProcessor,
)
from rlinf.embodied.models.vla.statistics import write_dataset_statistics
from rlinf.embodied.models.vla.tiny import DEFAULT_INSTRUCTIONS
from rlinf.embodied.models.vla.tiny_tokenizers import build_llama_tokenizer

__all__ = ["make_tiny_openvla", "tiny_openvla_config"]


def tiny_openvla_config(
    *,
    text_vocab_size: int,
    pad_token_id: int,
    decode_mode: str = "autoregressive",
    action_dim: int = 7,
    num_action_chunks: int = 1,
    image_size: int = 32,
    patch_size: int = 8,
    use_fused: bool = True,
    state_dim: int = 0,
    pad_to_multiple_of: int = 64,
    n_action_bins: int = 256,
    add_value_head: bool = True,
    value_type: str = "action_level",
    norm_stats: dict[str, Any] | None = None,
) -> OpenVLAConfig:
    """The config of a tiny OpenVLA (see the module docstring for the sizes)."""
    dino = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_hidden": 64}
    siglip = {"hidden_size": 48, "depth": 2, "num_heads": 2, "mlp_hidden": 96}
    towers = [dino, siglip] if use_fused else [dino]
    ids = [DINOV2_REG4_ID, SIGLIP_SO400M_ID] if use_fused else [DINOV2_REG4_ID]
    return OpenVLAConfig(
        vision_backbone_id="dinosiglip-vit-so-224px" if use_fused else "dinov2-vit-l",
        use_fused_vision_backbone=use_fused,
        arch_specifier="no-align+fused-gelu-mlp" if use_fused else "no-align+gelu-mlp",
        timm_model_ids=ids,
        timm_override_act_layers=[None] * len(ids),
        image_sizes=[image_size] * len(ids),
        vision_configs=[{**t, "patch_size": patch_size} for t in towers],
        text_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": text_vocab_size,
            "max_position_embeddings": 256,
            "pad_token_id": pad_token_id,
        },
        llm_max_length=256,
        pad_token_id=pad_token_id,
        pad_to_multiple_of=pad_to_multiple_of,
        n_action_bins=n_action_bins,
        norm_stats=norm_stats,
        decode_mode=decode_mode,
        action_dim=action_dim,
        num_action_chunks=num_action_chunks,
        proprio_dim=state_dim,
        add_value_head=add_value_head,
        value_type=value_type,
        value_hidden_dims=[32],
    )


def make_tiny_openvla(
    out_dir: str | Path,
    *,
    decode_mode: str = "autoregressive",
    action_dim: int = 7,
    num_action_chunks: int = 1,
    instructions: Sequence[str] = DEFAULT_INSTRUCTIONS,
    image_size: int = 32,
    patch_size: int = 8,
    use_fused: bool = True,
    state_dim: int = 0,
    seed: int = 0,
    unnorm_key: str = "tiny",
    add_value_head: bool = True,
    value_type: str = "action_level",
    pad_to_multiple_of: int = 64,
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
) -> Path:
    """Builds a random tiny OpenVLA(-OFT) and writes it as an openvla-format directory.

    Args:
        out_dir: Directory to write (created).
        decode_mode: ``autoregressive`` (OpenVLA) or ``parallel`` (OpenVLA-OFT).
        action_dim: ``A``.
        num_action_chunks: ``C``.
        instructions: Instructions the tokenizer is trained on (others still encode).
        image_size: Image side of both towers (a multiple of ``patch_size``).
        patch_size: Patch side (8 or 16 for 32-pixel images).
        use_fused: DINOv2 + SigLIP (True) or DINOv2 alone.
        state_dim: Proprio length (0: no proprio projector).
        seed: Seed of the random weights.
        unnorm_key: The single statistics entry.
        add_value_head: Give the model a value head.
        value_type: ``action_level`` or ``chunk_level``.
        pad_to_multiple_of: OpenVLA's vocabulary padding (see the module docstring).
        action_low: ``q01`` per dimension (default -1).
        action_high: ``q99`` per dimension (default 1).

    Returns:
        The directory.

    Raises:
        ValueError: Inconsistent sizes (the message names the argument).
    """
    if not instructions:
        raise ValueError("instructions is empty; give the instructions the model must read")
    block, stats = _statistics(action_dim, action_low, action_high, state_dim)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_llama_tokenizer([prompt_text(text) for text in instructions])
    config = tiny_openvla_config(
        text_vocab_size=int(tokenizer.vocab_size) + pad_to_multiple_of,
        pad_token_id=int(tokenizer.pad_token_id),
        decode_mode=decode_mode,
        action_dim=action_dim,
        num_action_chunks=num_action_chunks,
        image_size=image_size,
        patch_size=patch_size,
        use_fused=use_fused,
        state_dim=state_dim,
        pad_to_multiple_of=pad_to_multiple_of,
        add_value_head=add_value_head,
        value_type=value_type,
        norm_stats={unnorm_key: stats},
    )
    _random_model(config, seed).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    _processor(image_size, use_fused).save(out)
    write_dataset_statistics(out, {unnorm_key: block})
    return out


def _random_model(config: OpenVLAConfig, seed: int) -> OpenVLAModel:
    """The model with seeded random weights; LayerScale raised from 1e-5 so the towers matter."""
    torch.manual_seed(seed)
    model = OpenVLAModel(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LayerScale):
                module.scale_factor.uniform_(0.5, 1.0)
    return model


def _statistics(
    action_dim: int,
    action_low: Sequence[float] | None,
    action_high: Sequence[float] | None,
    state_dim: int,
) -> tuple[dict[str, Sequence[float | bool]], dict[str, Any]]:
    """The ``dataset_statistics.json`` block and the ``norm_stats`` entry of a tiny model.

    Raises:
        ValueError: ``action_low``/``action_high`` do not have ``action_dim`` entries.
    """
    low = list(action_low) if action_low is not None else [-1.0] * action_dim
    high = list(action_high) if action_high is not None else [1.0] * action_dim
    if not len(low) == len(high) == action_dim:
        raise ValueError(
            f"action_low/action_high need action_dim={action_dim} entries, got "
            f"{len(low)}/{len(high)}"
        )
    mask: list[float | bool] = [True] * action_dim
    block: dict[str, Sequence[float | bool]] = {
        "q01": low,
        "q99": high,
        "min": low,
        "max": high,
        "mask": mask,
    }
    stats: dict[str, Any] = {"action": {**block, "mean": [0.0] * action_dim}}
    stats["action"]["std"] = [1.0] * action_dim
    if state_dim:
        ones = [1.0] * state_dim
        stats["proprio"] = {"q01": [-x for x in ones], "q99": ones, "mask": [True] * state_dim}
    return block, stats


def _processor(image_size: int, use_fused: bool) -> OpenVLAImageProcessor:
    """The prismatic processor of the tiny towers (ImageNet stats for DINOv2, 0.5 for SigLIP)."""
    towers = 2 if use_fused else 1
    return OpenVLAImageProcessor(
        input_sizes=[[3, image_size, image_size]] * towers,
        means=[list(IMAGENET_MEAN), [0.5, 0.5, 0.5]][:towers],
        stds=[list(IMAGENET_STD), [0.5, 0.5, 0.5]][:towers],
        interpolations=["bicubic"] * towers,
        use_fused_vision_backbone=use_fused,
    )
