"""Reading a pi0 checkpoint directory: its config (transformers or lerobot) and its weights.

pi0 checkpoints come in three layouts, all loaded into the stock
``transformers.PI0ForConditionalGeneration``:

* ``transformers``: ``config.json`` with ``model_type: pi0`` and keys such as
  ``model.vlm.language_model.layers.0.self_attn.q_proj.weight``;
* ``lerobot`` (``lerobot/pi0_base`` and its fine-tunes): ``config.json`` with
  ``type: pi0`` (lerobot's own fields) and keys such as
  ``model.paligemma_with_expert.paligemma.model.language_model.layers.0...``;
* ``openpi`` (openpi's PyTorch port): the same keys without the leading ``model.``.

The weight renaming is transformers' own conversion map for ``pi0`` (applied by
``from_pretrained``); this module translates lerobot's config into a
``PI0Config`` and, for writing test checkpoints, maps transformers keys back
onto the other two layouts (:func:`to_layout`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from torch import Tensor
from transformers import PI0Config

__all__ = [
    "GEMMA_VARIANTS",
    "LAYOUTS",
    "Layout",
    "lerobot_to_pi0_config",
    "read_pi0_config",
    "to_layout",
]

Layout = Literal["transformers", "lerobot", "openpi"]
LAYOUTS: tuple[Layout, ...] = ("transformers", "lerobot", "openpi")

GEMMA_VARIANTS: dict[str, dict[str, int]] = {
    "gemma_2b": {
        "hidden_size": 2048,
        "num_hidden_layers": 18,
        "intermediate_size": 16384,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
    },
    "gemma_300m": {
        "hidden_size": 1024,
        "num_hidden_layers": 18,
        "intermediate_size": 4096,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
    },
}
"""openpi's Gemma sizes by lerobot's ``paligemma_variant`` / ``action_expert_variant`` name."""

_PALIGEMMA_VOCAB = 257152
_SIGLIP_SO400M = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
}

_LEROBOT_SIZE_KEYS = ("rlinf_vlm_config", "rlinf_dit_config")
"""Optional lerobot-config extensions that give explicit sizes (tiny test models)."""


def _variant(name: str, key: str, path: Path) -> dict[str, int]:
    if name not in GEMMA_VARIANTS:
        raise ValueError(
            f"{path}: {key}={name!r} is not a known Gemma variant; use one of "
            f"{sorted(GEMMA_VARIANTS)} or give explicit sizes under "
            f"{_LEROBOT_SIZE_KEYS[0] if key == 'paligemma_variant' else _LEROBOT_SIZE_KEYS[1]}"
        )
    return dict(GEMMA_VARIANTS[name])


def lerobot_to_pi0_config(data: dict[str, Any], path: Path) -> PI0Config:
    """Translates a lerobot ``config.json`` (``type: pi0``) into a ``PI0Config``.

    Read fields: ``chunk_size``, ``max_state_dim``, ``max_action_dim``,
    ``num_inference_steps``, ``paligemma_variant``, ``action_expert_variant``,
    ``image_resolution``, the ``time_sampling_*`` and ``min_period``/``max_period``
    fields; the rest (features, normalisation mapping, optimiser settings) does not
    shape the network. ``rlinf_vlm_config``/``rlinf_dit_config`` (PaliGemma and
    Gemma config dicts) override the variant sizes; tiny test checkpoints use them.

    Args:
        data: The parsed ``config.json``.
        path: Its path (for messages).

    Returns:
        The equivalent transformers config.

    Raises:
        ValueError: An unknown variant, or a non-square image resolution.
    """
    resolution = data.get("image_resolution", [224, 224])
    if len(resolution) != 2 or resolution[0] != resolution[1]:
        raise ValueError(
            f"{path}: image_resolution={resolution} must be square [S, S]; pi0's SigLIP tower "
            "takes square images"
        )
    vlm = data.get("rlinf_vlm_config")
    if vlm is None:
        text = _variant(data.get("paligemma_variant", "gemma_2b"), "paligemma_variant", path)
        vlm = {
            "text_config": {"model_type": "gemma", **text, "vocab_size": _PALIGEMMA_VOCAB},
            "vision_config": {
                "model_type": "siglip_vision_model",
                **_SIGLIP_SO400M,
                "image_size": int(resolution[0]),
                "vision_use_head": False,
            },
            "projection_dim": text["hidden_size"],
            "image_token_id": _PALIGEMMA_VOCAB,
        }
    dit = data.get("rlinf_dit_config")
    if dit is None:
        dit = _variant(
            data.get("action_expert_variant", "gemma_300m"), "action_expert_variant", path
        )
    kwargs = {
        key: data[key]
        for key in (
            "chunk_size",
            "max_state_dim",
            "max_action_dim",
            "num_inference_steps",
            "time_sampling_beta_alpha",
            "time_sampling_beta_beta",
            "time_sampling_scale",
            "time_sampling_offset",
            "min_period",
            "max_period",
        )
        if key in data
    }
    return PI0Config(vlm_config=vlm, dit_config=dit, **kwargs)


def read_pi0_config(directory: str | Path) -> tuple[PI0Config, Layout | None]:
    """The ``PI0Config`` of a checkpoint directory and, when the config tells, its layout.

    Args:
        directory: A directory with ``config.json``.

    Returns:
        ``(config, "lerobot")`` for a lerobot config, ``(config, None)`` for a transformers
        one (whose weights may be in any layout; ``from_pretrained`` renames them).

    Raises:
        FileNotFoundError: No ``config.json``.
        ValueError: A config that is neither pi0 format (names the keys it found).
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; a pi0 checkpoint directory needs config.json (transformers "
            "model_type: pi0, or lerobot type: pi0)"
        )
    data = json.loads(path.read_text())
    if data.get("model_type") == "pi0":
        return PI0Config.from_pretrained(str(directory), local_files_only=True), None
    if data.get("type") == "pi0":
        return lerobot_to_pi0_config(data, path), "lerobot"
    found = {k: data[k] for k in ("model_type", "type") if k in data}
    raise ValueError(
        f"{path} is not a pi0 config (found {found or 'neither model_type nor type'}); "
        "model_type pi0 loads transformers configs (model_type: pi0) and lerobot ones "
        "(type: pi0). Point actor.model.model_path at a pi0 checkpoint"
    )


_TO_OPENPI: tuple[tuple[str, str], ...] = (
    (r"^model\.vlm\.language_model\.embed_tokens\.", "paligemma_with_expert.paligemma.lm_head."),
    (r"^model\.dit\.embed_tokens\.", "paligemma_with_expert.gemma_expert.lm_head."),
    (
        r"^model\.vlm\.vision_tower\.",
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.",
    ),
    (r"^model\.vlm\.", "paligemma_with_expert.paligemma.model."),
    (r"^model\.dit\.", "paligemma_with_expert.gemma_expert.model."),
    (r"^embed_action_time\.", ""),
)
"""transformers key -> openpi key: the inverse of transformers' ``pi0`` conversion map."""


def to_layout(state_dict: dict[str, Tensor], layout: Layout) -> dict[str, Tensor]:
    """Renames a ``PI0ForConditionalGeneration`` state dict into another checkpoint layout.

    The input embedding matrices move to the ``lm_head`` names the hub checkpoints
    store them under (their embeddings are tied to the LM heads there).

    Args:
        state_dict: transformers-layout tensors.
        layout: ``transformers`` (unchanged), ``openpi`` or ``lerobot``.

    Returns:
        The same tensors under the layout's names.
    """
    if layout == "transformers":
        return dict(state_dict)
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        name = key
        for pattern, replacement in _TO_OPENPI:
            renamed = re.sub(pattern, replacement, name)
            if renamed != name:
                name = renamed
                break
        out[("model." if layout == "lerobot" else "") + name] = value
    return out
