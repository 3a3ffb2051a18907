"""``make_tiny_pi0``: a randomly initialised pi0 checkpoint directory, in a real layout.

The network is the stock ``PI0ForConditionalGeneration`` at a tiny size
(PaliGemma with a 2-layer SigLIP and a 2-layer Gemma, a 2-layer Gemma expert
sharing its attention heads' geometry; about 0.2 M parameters), so tests and
tutorials exercise the very code a downloaded pi0 runs through. The directory
holds what a real one holds, in the chosen layout:

* ``transformers``: ``config.json`` (``model_type: pi0``) + ``model.safetensors``;
* ``lerobot``: lerobot's ``config.json`` (``type: pi0``; the tiny sizes under
  ``rlinf_vlm_config``/``rlinf_dit_config``) + weights under lerobot's names;
* ``openpi``: transformers ``config.json`` + weights under openpi's names;

plus a Gemma-format tokenizer (:mod:`..tiny_tokenizers`), a
``preprocessor_config.json`` and action statistics (``dataset_statistics.json``,
or openpi's ``norm_stats.json`` with ``stats_format="openpi"``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from transformers import PI0Config, PI0ForConditionalGeneration

from rlinf.embodied.models.vla.pi0.checkpoint import LAYOUTS, Layout, to_layout
from rlinf.embodied.models.vla.pi0.images import Pi0ImageProcessor
from rlinf.embodied.models.vla.statistics import write_dataset_statistics
from rlinf.embodied.models.vla.tiny_tokenizers import build_gemma_tokenizer

__all__ = ["make_tiny_pi0", "tiny_pi0_config"]

_HEAD_DIM = 16


def tiny_pi0_config(
    *,
    vocab_size: int,
    image_size: int = 32,
    patch_size: int = 8,
    chunk_size: int = 4,
    max_action_dim: int = 8,
    max_state_dim: int = 8,
    num_steps: int = 4,
    width: int = 64,
    expert_width: int = 32,
    layers: int = 2,
) -> PI0Config:
    """A tiny ``PI0Config``: the VLM and the expert share ``head_dim`` and one KV head.

    Args:
        vocab_size: Text vocabulary (the tokenizer's size); the image token id is this.
        image_size: SigLIP input side.
        patch_size: SigLIP patch side (divides ``image_size``).
        chunk_size: Actions per chunk ``H``.
        max_action_dim: Action width the model predicts.
        max_state_dim: State width the model reads.
        num_steps: Denoising steps.
        width: VLM hidden size (a multiple of 16).
        expert_width: Expert hidden size (a multiple of 16).
        layers: Layers of each transformer.
    """
    if image_size % patch_size:
        raise ValueError(f"image_size={image_size} is not a multiple of patch_size={patch_size}")
    vlm = {
        "text_config": {
            "model_type": "gemma",
            "hidden_size": width,
            "num_hidden_layers": layers,
            "intermediate_size": 2 * width,
            "num_attention_heads": width // _HEAD_DIM,
            "num_key_value_heads": 1,
            "head_dim": _HEAD_DIM,
            "vocab_size": vocab_size,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": width // _HEAD_DIM,
            "patch_size": patch_size,
            "image_size": image_size,
            "vision_use_head": False,
        },
        "projection_dim": width,
        "image_token_id": vocab_size,
    }
    dit = {
        "hidden_size": expert_width,
        "num_hidden_layers": layers,
        "intermediate_size": 2 * expert_width,
        "num_attention_heads": expert_width // _HEAD_DIM,
        "num_key_value_heads": 1,
        "head_dim": _HEAD_DIM,
    }
    return PI0Config(
        vlm_config=vlm,
        dit_config=dit,
        chunk_size=chunk_size,
        max_action_dim=max_action_dim,
        max_state_dim=max_state_dim,
        num_inference_steps=num_steps,
    )


def _lerobot_config(config: PI0Config) -> dict[str, Any]:
    """Lerobot's ``config.json`` fields for ``config`` (sizes under the rlinf_* extensions)."""
    vlm_config: Any = config.vlm_config
    dit_config: Any = config.dit_config
    vlm, dit = vlm_config.to_dict(), dit_config.to_dict()
    return {
        "type": "pi0",
        "n_obs_steps": 1,
        "chunk_size": config.chunk_size,
        "n_action_steps": config.chunk_size,
        "max_state_dim": config.max_state_dim,
        "max_action_dim": config.max_action_dim,
        "num_inference_steps": config.num_inference_steps,
        "image_resolution": [vlm_config.vision_config.image_size] * 2,
        "tokenizer_max_length": 48,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "rlinf_vlm_config": {
            "text_config": {k: vlm["text_config"][k] for k in _GEMMA_KEYS}
            | {"model_type": "gemma"},
            "vision_config": {k: vlm["vision_config"][k] for k in _SIGLIP_KEYS}
            | {"model_type": "siglip_vision_model"},
            "projection_dim": int(vlm_config.projection_dim),
            "image_token_id": int(vlm_config.image_token_id),
        },
        "rlinf_dit_config": {k: dit[k] for k in _GEMMA_KEYS if k != "vocab_size"},
    }


_GEMMA_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)
_SIGLIP_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "patch_size",
    "image_size",
    "vision_use_head",
)


def _write_identity_statistics(
    out: Path, stats_format: str, action_dim: int, state_dim: int, unnorm_key: str
) -> None:
    """Statistics that map [-1, 1] onto itself: openpi ``norm_stats.json`` or ours."""
    ones, zeros = [1.0] * action_dim, [0.0] * action_dim
    if stats_format == "openpi":
        stats: dict[str, Any] = {
            "actions": {"mean": zeros, "std": ones, "q01": [-1.0] * action_dim, "q99": ones}
        }
        if state_dim:
            stats["state"] = {"mean": [0.0] * state_dim, "std": [1.0] * state_dim}
        (out / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}, indent=2) + "\n")
        return
    block: dict[str, Sequence[float | bool]] = {
        "q01": [-1.0] * action_dim,
        "q99": ones,
        "min": [-1.0] * action_dim,
        "max": ones,
        "mask": [True] * action_dim,
    }
    write_dataset_statistics(out, {unnorm_key: block})


def make_tiny_pi0(
    out_dir: str | Path,
    *,
    layout: Layout = "transformers",
    instructions: Sequence[str] = (),
    action_dim: int = 2,
    chunk_size: int = 4,
    image_size: int = 32,
    patch_size: int = 8,
    max_action_dim: int = 8,
    max_state_dim: int = 8,
    num_steps: int = 4,
    seed: int = 0,
    unnorm_key: str = "tiny",
    stats_format: Literal["rlinf", "openpi"] = "rlinf",
    state_dim: int = 0,
    prompt_length: int = 16,
    layers: int = 2,
) -> Path:
    """Builds a random tiny pi0 and writes it as a checkpoint directory.

    Args:
        out_dir: Directory to write (created).
        layout: Weight and config layout (``transformers``, ``lerobot``, ``openpi``).
        instructions: Strings the tokenizer's vocabulary should cover well.
        action_dim: The env's action dims (the statistics' length).
        chunk_size: ``H``, actions per chunk.
        image_size: SigLIP input side.
        patch_size: SigLIP patch side.
        max_action_dim: pi0's padded action width (raised to ``action_dim`` if smaller).
        max_state_dim: pi0's padded state width (raised to ``state_dim`` if smaller).
        num_steps: Denoising steps.
        seed: Initialisation seed.
        unnorm_key: The ``dataset_statistics.json`` entry.
        stats_format: ``rlinf`` (``dataset_statistics.json``, quantiles) or ``openpi``
            (``norm_stats.json``, mean/std: identity maps here).
        state_dim: The env's state dims (0: none; else identity state statistics).
        prompt_length: Text tokens per prompt (the tokenizer's ``model_max_length``);
            raised to fit the longest of ``instructions`` with ``<bos>`` and newline.
        layers: Layers of the SigLIP tower, the VLM and the expert. The expert reads the
            VLM's KV cache layer by layer, so its last layer sees VLM features after
            ``layers - 1`` VLM layers: tasks that must bind a word to an image region (the
            ``random`` lang_reach layout) need 4.

    Returns:
        The directory.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {list(LAYOUTS)}")
    if action_dim < 1 or state_dim < 0:
        raise ValueError(f"action_dim={action_dim} must be >= 1 and state_dim={state_dim} >= 0")
    max_action_dim, max_state_dim = max(max_action_dim, action_dim), max(max_state_dim, state_dim)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_gemma_tokenizer(instructions)
    longest = max((len(tokenizer(text).input_ids) + 2 for text in instructions), default=0)
    tokenizer.model_max_length = max(prompt_length, longest)
    config = tiny_pi0_config(
        vocab_size=len(tokenizer),
        image_size=image_size,
        patch_size=patch_size,
        chunk_size=chunk_size,
        max_action_dim=max_action_dim,
        max_state_dim=max_state_dim,
        num_steps=num_steps,
        layers=layers,
    )
    torch.manual_seed(seed)
    model = PI0ForConditionalGeneration(config)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if layout == "lerobot":
        (out / "config.json").write_text(json.dumps(_lerobot_config(config), indent=2) + "\n")
    else:
        config.save_pretrained(str(out))
    save_file(to_layout(state, layout), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(out))
    Pi0ImageProcessor(image_size=image_size).save(out)
    _write_identity_statistics(out, stats_format, action_dim, state_dim, unnorm_key)
    return out
