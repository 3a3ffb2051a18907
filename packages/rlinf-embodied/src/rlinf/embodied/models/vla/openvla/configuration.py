"""``OpenVLAConfig``: the ``config.json`` of an OpenVLA-format directory (``model_type: openvla``).

The fields of OpenVLA's ``prismatic`` Hugging Face port are read under their
own names, so ``openvla/openvla-7b``'s ``config.json`` loads unchanged:
``vision_backbone_id``, ``llm_backbone_id``, ``arch_specifier``,
``use_fused_vision_backbone``, ``image_resize_strategy``, ``timm_model_ids``,
``timm_override_act_layers``, ``image_sizes``, ``text_config`` (a ``LlamaConfig``
dict), ``llm_max_length``, ``pad_token_id``, ``pad_to_multiple_of``,
``n_action_bins``, ``norm_stats`` and ``output_projector_states``. The defaults
are openvla-7b's, so ``OpenVLAConfig()`` describes the 7.5 B model.

Fields added by RLinf (all optional; a real checkpoint lacks them and gets the
defaults, i.e. OpenVLA's 7-D single-step autoregressive decoding):

* ``vision_configs``: one dict per vision tower (same order as ``timm_model_ids``)
  overriding the sizes that are otherwise derived from the timm id:
  ``hidden_size``, ``depth``, ``num_heads``, ``mlp_hidden``, ``patch_size``,
  ``num_registers``, ``layer_scale_init``. Tiny test models use it.
* ``decode_mode``: ``autoregressive`` (OpenVLA: one token after the other) or
  ``parallel`` (OpenVLA-OFT: every action token from one forward pass).
* ``action_dim``: ``A``, action dimensions per step (OpenVLA: 7).
* ``num_action_chunks``: ``C``, steps per call (OpenVLA: 1; OFT on LIBERO: 8).
* ``proprio_dim``: length of the proprio state fed through OFT's proprio projector
  as one token after the image patches (0: no projector).
* ``stop_token_id``: the token OFT appends after the action placeholders (``</s>``, 2).
* ``add_value_head``, ``value_type`` (``action_level``: ``C`` values,
  ``chunk_level``: 1), ``value_hidden_dims``: the RL critic head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import AutoConfig, PreTrainedConfig

__all__ = [
    "DINOV2_REG4_ID",
    "SIGLIP_SO400M_ID",
    "OpenVLAConfig",
    "ViTSpec",
    "openvla_7b_text_config",
]

DINOV2_REG4_ID = "vit_large_patch14_reg4_dinov2.lvd142m"
SIGLIP_SO400M_ID = "vit_so400m_patch14_siglip_224"
_DECODE_MODES = ("autoregressive", "parallel")
_VALUE_TYPES = ("action_level", "chunk_level")
_ACTIVATIONS = (None, "gelu", "gelu_tanh", "quick_gelu")
_SIZE_KEYS = (
    "hidden_size",
    "depth",
    "num_heads",
    "mlp_hidden",
    "patch_size",
    "num_registers",
    "layer_scale_init",
)


@dataclass(frozen=True)
class ViTSpec:
    """The shape of one timm ViT tower.

    Attributes:
        timm_id: The timm model id it stands for.
        family: ``dinov2`` (class token, registers, LayerScale) or ``siglip`` (no
            class token, attention-pool head).
        image_size: Square input side in pixels.
        hidden_size: Token width.
        depth: Number of blocks.
        num_heads: Attention heads.
        mlp_hidden: MLP hidden width.
        patch_size: Patch side in pixels.
        num_registers: Register tokens (DINOv2 only).
        layer_scale_init: Initial LayerScale factor (DINOv2 only).
        act: timm activation override (None: exact GELU).
    """

    timm_id: str
    family: str
    image_size: int
    hidden_size: int
    depth: int
    num_heads: int
    mlp_hidden: int
    patch_size: int
    num_registers: int = 0
    layer_scale_init: float = 1e-5
    act: str | None = None

    @property
    def num_patches(self) -> int:
        """Patch tokens per image."""
        return (self.image_size // self.patch_size) ** 2


_KNOWN_TOWERS: dict[str, dict[str, Any]] = {
    DINOV2_REG4_ID: {
        "family": "dinov2",
        "hidden_size": 1024,
        "depth": 24,
        "num_heads": 16,
        "mlp_hidden": 4096,
        "patch_size": 14,
        "num_registers": 4,
    },
    SIGLIP_SO400M_ID: {
        "family": "siglip",
        "hidden_size": 1152,
        "depth": 27,
        "num_heads": 16,
        "mlp_hidden": 4304,  # int(1152 * 3.7362), timm's mlp_ratio
        "patch_size": 14,
    },
}
"""Sizes of the timm towers OpenVLA uses, keyed by timm id (without the pretrained tag too)."""


def _tower_defaults(timm_id: str) -> dict[str, Any] | None:
    if timm_id in _KNOWN_TOWERS:
        return dict(_KNOWN_TOWERS[timm_id])
    base = timm_id.split(".", 1)[0]
    for known, sizes in _KNOWN_TOWERS.items():
        if known.split(".", 1)[0] == base:
            return dict(sizes)
    return None


def openvla_7b_text_config() -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments of openvla-7b's Llama 2 7B (vocabulary padded to 64)."""
    return {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
        "pad_token_id": 32000,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    }


def _default_norm_stats() -> dict[str, Any] | None:
    return None


class OpenVLAConfig(PreTrainedConfig):  # type: ignore[no-untyped-call]
    """Config of an OpenVLA / OpenVLA-OFT model (see the module docstring for every field)."""

    model_type = "openvla"

    vision_backbone_id: str = "dinosiglip-vit-so-224px"
    llm_backbone_id: str = "llama2-7b-pure"
    arch_specifier: str = "no-align+fused-gelu-mlp"
    use_fused_vision_backbone: bool | None = None
    image_resize_strategy: str = "resize-naive"
    timm_model_ids: list[str] = field(default_factory=lambda: [DINOV2_REG4_ID, SIGLIP_SO400M_ID])
    timm_override_act_layers: list[str | None] = field(default_factory=lambda: [None, None])
    image_sizes: list[int] = field(default_factory=lambda: [224, 224])
    text_config: dict[str, Any] = field(default_factory=openvla_7b_text_config)
    llm_max_length: int = 2048
    pad_token_id: int | None = 32000
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256
    norm_stats: dict[str, Any] | None = field(default_factory=_default_norm_stats)
    output_projector_states: bool = False
    vision_configs: list[dict[str, Any]] | None = None
    decode_mode: str = "autoregressive"
    action_dim: int = 7
    num_action_chunks: int = 1
    proprio_dim: int = 0
    stop_token_id: int = 2
    add_value_head: bool = False
    value_type: str = "action_level"
    value_hidden_dims: list[int] = field(default_factory=lambda: [512, 128])

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)  # type: ignore[no-untyped-call]
        self.text_config = {**openvla_7b_text_config(), **dict(self.text_config)}
        self.text_config.pop("model_type", None)
        if self.use_fused_vision_backbone is None:
            self.use_fused_vision_backbone = len(self.timm_model_ids) > 1
        self._check()

    def _check(self) -> None:
        towers = 2 if self.use_fused_vision_backbone else 1
        for key in ("timm_model_ids", "timm_override_act_layers", "image_sizes"):
            value = getattr(self, key)
            if len(value) < towers:
                raise ValueError(
                    f"OpenVLAConfig.{key}={value} has {len(value)} entries but "
                    f"use_fused_vision_backbone={self.use_fused_vision_backbone} needs {towers}; "
                    "give one entry per vision tower"
                )
        if self.decode_mode not in _DECODE_MODES:
            raise ValueError(
                f"OpenVLAConfig.decode_mode={self.decode_mode!r} is not one of "
                f"{list(_DECODE_MODES)}; set decode_mode in config.json to one of them"
            )
        if self.value_type not in _VALUE_TYPES:
            raise ValueError(
                f"OpenVLAConfig.value_type={self.value_type!r} is not one of {list(_VALUE_TYPES)}"
            )
        for key in ("action_dim", "num_action_chunks", "n_action_bins", "pad_to_multiple_of"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"OpenVLAConfig.{key}={getattr(self, key)} must be >= 1")
        if self.proprio_dim < 0:
            raise ValueError(
                f"OpenVLAConfig.proprio_dim={self.proprio_dim} must be >= 0 (0: no proprio token)"
            )
        if self.action_vocab_size <= self.n_action_bins:
            raise ValueError(
                f"OpenVLAConfig.text_config.vocab_size={self.text_config['vocab_size']} minus "
                f"pad_to_multiple_of={self.pad_to_multiple_of} leaves {self.action_vocab_size} "
                f"ids, not more than n_action_bins={self.n_action_bins}; the bins are counted "
                "down from that size"
            )
        if self.vision_configs is not None and len(self.vision_configs) < towers:
            raise ValueError(
                f"OpenVLAConfig.vision_configs has {len(self.vision_configs)} entries for "
                f"{towers} vision towers; give one dict per tower (or null)"
            )
        self.vision_specs()  # validates the towers

    @property
    def action_vocab_size(self) -> int:
        """Vocabulary size the action ids count down from (OpenVLA's ``vocab_size``).

        ``text_config.vocab_size - pad_to_multiple_of`` (32000 for openvla-7b), as in
        OpenVLA's ``predict_action``.
        """
        return int(self.text_config["vocab_size"]) - int(self.pad_to_multiple_of)

    @property
    def num_action_tokens(self) -> int:
        """``C * A``: action tokens per call."""
        return int(self.num_action_chunks) * int(self.action_dim)

    @property
    def value_dim(self) -> int:
        """``V``: values per call."""
        return int(self.num_action_chunks) if self.value_type == "action_level" else 1

    def vision_specs(self) -> list[ViTSpec]:
        """The tower shapes: featurizer, then (fused) the second tower.

        Raises:
            ValueError: A timm id is unknown and ``vision_configs`` gives no sizes for it,
                or an activation override is not supported.
        """
        towers = 2 if self.use_fused_vision_backbone else 1
        specs = []
        for index in range(towers):
            timm_id = self.timm_model_ids[index]
            sizes = _tower_defaults(timm_id) or {}
            overrides = dict(self.vision_configs[index]) if self.vision_configs else {}
            unknown = sorted(set(overrides) - set(_SIZE_KEYS) - {"family"})
            if unknown:
                raise ValueError(
                    f"OpenVLAConfig.vision_configs[{index}] has unknown keys {unknown}; "
                    f"use {list(_SIZE_KEYS)}"
                )
            sizes.update(overrides)
            missing = [k for k in ("family", *_SIZE_KEYS[:5]) if k not in sizes]
            if missing:
                raise ValueError(
                    f"OpenVLAConfig.timm_model_ids[{index}]={timm_id!r} is not a known tower "
                    f"({sorted(_KNOWN_TOWERS)}) and vision_configs[{index}] lacks {missing}; "
                    "give its sizes in vision_configs"
                )
            act = self.timm_override_act_layers[index]
            if act not in _ACTIVATIONS:
                raise ValueError(
                    f"OpenVLAConfig.timm_override_act_layers[{index}]={act!r} is not one of "
                    f"{list(_ACTIVATIONS)}"
                )
            image_size = int(self.image_sizes[index])
            if image_size % int(sizes["patch_size"]):
                raise ValueError(
                    f"OpenVLAConfig.image_sizes[{index}]={image_size} is not a multiple of the "
                    f"tower's patch_size={sizes['patch_size']}"
                )
            specs.append(ViTSpec(timm_id=timm_id, image_size=image_size, act=act, **sizes))
        if towers == 2 and specs[0].num_patches != specs[1].num_patches:
            raise ValueError(
                f"the fused towers give {specs[0].num_patches} and {specs[1].num_patches} "
                "patches; fused features need equal patch grids (image_sizes / patch_size)"
            )
        return specs


AutoConfig.register(OpenVLAConfig.model_type, OpenVLAConfig, exist_ok=True)
