"""Hugging Face configs of the two VLA families: ``rlinf_token_vla`` and ``rlinf_flow_vla``.

Both are ``transformers.PreTrainedConfig`` subclasses so a model directory is an
ordinary Hugging Face directory (``config.json`` + weights) that
``AutoConfig``/``AutoModel`` load without ``trust_remote_code``: the classes are
registered with the Auto factories when :mod:`rlinf.embodied.models.vla` is imported.

Sub-models are described by plain dicts (a SigLIP vision config, Llama text and
expert configs) rather than nested config objects: the JSON stays flat and
readable, and the modeling code turns each dict into a config object in one place.
Sizes default to the tiny CPU models (~0.2-0.3 M parameters, 32x32 images, patch 8).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from transformers import AutoConfig, PreTrainedConfig

__all__ = [
    "FlowVLAConfig",
    "TokenVLAConfig",
    "default_expert_config",
    "default_text_config",
    "default_vision_config",
]

_VALUE_TYPES = ("chunk_level", "action_level")
_PROJECTORS = ("linear", "mlp")
_PREFIX_ATTENTION = ("bidirectional", "causal")


def default_vision_config() -> dict[str, Any]:
    """A 2-layer, width-64 SigLIP vision tower for 32x32 images with 8x8 patches (16 tokens)."""
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_channels": 3,
        "image_size": 32,
        "patch_size": 8,
        "vision_use_head": False,
    }


def default_text_config() -> dict[str, Any]:
    """A 2-layer, width-64 Llama (4 heads, 2 KV heads); ``vocab_size`` is set by the builder."""
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def default_expert_config() -> dict[str, Any]:
    """The flow action expert: a 2-layer, width-32 Llama (4 heads, 2 KV heads), no vocabulary."""
    return {**default_text_config(), "hidden_size": 32, "intermediate_size": 64, "vocab_size": 1}


def _check_choice(config: str, key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"{config}.{key}={value!r} is not one of {list(choices)}; pick one of them"
        )


def _check_positive(config: str, key: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{config}.{key}={value} must be >= 1")


class _VLAConfigFields(PreTrainedConfig):  # type: ignore[no-untyped-call]
    """Fields shared by both VLA families (not registered; use a subclass).

    Attributes:
        vision_config: ``SiglipVisionConfig`` keyword arguments (``image_size`` is
            overwritten by :attr:`image_size`).
        text_config: ``LlamaConfig`` keyword arguments of the language backbone.
        projector: ``linear`` or ``mlp`` (Linear-GELU-Linear) from vision width to text width.
        action_dim: ``A``: action dimensions the model predicts.
        num_action_chunks: ``C``: actions executed per call.
        image_size: Square side, in pixels, of the images the vision tower sees.
        state_dim: Length of the proprioceptive state (0: no proprio token).
        wrist_image: Whether the model also sees ``obs["wrist_images"]`` (a second image
            through the same vision tower, told apart by a learned image embedding).
        max_prompt_length: Prompt tokens per instruction (left-padded to this length).
        add_value_head: Whether the model has a value head.
        value_type: ``chunk_level`` (1 value) or ``action_level`` (``C`` values).
        value_hidden_dims: Hidden widths of the value MLP.
    """

    vision_config: dict[str, Any] = field(default_factory=default_vision_config)
    text_config: dict[str, Any] = field(default_factory=default_text_config)
    projector: str = "mlp"
    action_dim: int = 2
    num_action_chunks: int = 4
    image_size: int = 32
    state_dim: int = 0
    wrist_image: bool = False
    max_prompt_length: int = 16
    add_value_head: bool = True
    value_type: str = "action_level"
    value_hidden_dims: list[int] = field(default_factory=lambda: [64])

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)  # type: ignore[no-untyped-call]
        name = type(self).__name__
        self.vision_config = {**default_vision_config(), **dict(self.vision_config)}
        self.vision_config["image_size"] = self.image_size
        self.text_config = {**default_text_config(), **dict(self.text_config)}
        _check_choice(name, "projector", self.projector, _PROJECTORS)
        _check_choice(name, "value_type", self.value_type, _VALUE_TYPES)
        for key in ("action_dim", "num_action_chunks", "image_size", "max_prompt_length"):
            _check_positive(name, key, int(getattr(self, key)))
        if self.state_dim < 0:
            raise ValueError(
                f"{name}.state_dim={self.state_dim} must be >= 0 (0: no proprio token)"
            )
        if self.image_size % int(self.vision_config["patch_size"]) != 0:
            raise ValueError(
                f"{name}.image_size={self.image_size} is not a multiple of "
                f"vision_config.patch_size={self.vision_config['patch_size']}; pick sizes "
                "that divide"
            )

    @property
    def value_dim(self) -> int:
        """``V``: values per call (``C`` for action_level, 1 for chunk_level)."""
        return self.num_action_chunks if self.value_type == "action_level" else 1

    @property
    def num_patches(self) -> int:
        """Image tokens per image."""
        return (self.image_size // int(self.vision_config["patch_size"])) ** 2

    @property
    def num_images(self) -> int:
        """Images per observation: the main camera, plus the wrist camera if used."""
        return 2 if self.wrist_image else 1


class TokenVLAConfig(_VLAConfigFields):  # type: ignore[no-untyped-call]
    """Config of the token-action VLA (OpenVLA-OFT style parallel decoding).

    Attributes:
        n_action_bins: Bins per action dimension; they occupy the last ``n_action_bins``
            ids of ``text_config.vocab_size``.
        prefix_attention: ``bidirectional`` or ``causal`` attention inside the prefix
            (images, proprio, prompt). Action slots always see the whole valid prefix
            and every other slot.
    """

    model_type = "rlinf_token_vla"

    n_action_bins: int = 32
    prefix_attention: str = "bidirectional"

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        _check_positive("TokenVLAConfig", "n_action_bins", self.n_action_bins)
        _check_choice(
            "TokenVLAConfig", "prefix_attention", self.prefix_attention, _PREFIX_ATTENTION
        )
        vocab = int(self.text_config["vocab_size"])
        if vocab <= self.n_action_bins:
            raise ValueError(
                f"TokenVLAConfig.text_config.vocab_size={vocab} must exceed n_action_bins="
                f"{self.n_action_bins}: the bins take the last ids, the words the first ones"
            )

    @property
    def first_bin_id(self) -> int:
        """Vocabulary id of bin 0 (bins take ``[first_bin_id, vocab_size)``)."""
        return int(self.text_config["vocab_size"]) - self.n_action_bins


class FlowVLAConfig(_VLAConfigFields):  # type: ignore[no-untyped-call]
    """Config of the flow-matching VLA (pi0 style).

    Attributes:
        expert_config: ``LlamaConfig`` keyword arguments of the action expert.
        action_horizon: ``H``: actions denoised per call (the first ``C`` are executed).
        action_env_dim: Action dimensions the env executes and RL scores (the first
            ones of ``action_dim``); null means ``action_dim``.
        num_steps: ``N``: Euler steps from t=1 (noise) to t=0 (data); at least 2.
        noise_sigma_range: ``[low, high]`` of the learned per-element standard deviation
            of the ``noise`` sampler.
    """

    model_type = "rlinf_flow_vla"

    expert_config: dict[str, Any] = field(default_factory=default_expert_config)
    action_horizon: int = 4
    action_env_dim: int | None = None
    num_steps: int = 4
    noise_sigma_range: list[float] = field(default_factory=lambda: [0.08, 0.16])

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        self.expert_config = {**default_expert_config(), **dict(self.expert_config)}
        if self.action_env_dim is None:
            self.action_env_dim = self.action_dim
        if not 1 <= self.action_env_dim <= self.action_dim:
            raise ValueError(
                f"FlowVLAConfig.action_env_dim={self.action_env_dim} must be in "
                f"[1, action_dim={self.action_dim}]"
            )
        if self.action_horizon < self.num_action_chunks:
            raise ValueError(
                f"FlowVLAConfig.action_horizon={self.action_horizon} must be >= "
                f"num_action_chunks={self.num_action_chunks} (H >= C)"
            )
        if self.num_steps < 2:
            raise ValueError(
                f"FlowVLAConfig.num_steps={self.num_steps} must be >= 2 (the sde sampler needs "
                "a grid point strictly between 1 and 0)"
            )
        low, high = (float(v) for v in self.noise_sigma_range)
        if not 0 < low <= high:
            raise ValueError(
                f"FlowVLAConfig.noise_sigma_range={self.noise_sigma_range} must be [low, high] "
                "with 0 < low <= high"
            )

    @property
    def executed_action_dim(self) -> int:
        """``A_env``: the action dimensions the env executes."""
        return int(self.action_env_dim if self.action_env_dim is not None else self.action_dim)


AutoConfig.register(TokenVLAConfig.model_type, TokenVLAConfig, exist_ok=True)
AutoConfig.register(FlowVLAConfig.model_type, FlowVLAConfig, exist_ok=True)
