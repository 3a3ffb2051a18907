"""``PolicyConfig``: the ``actor.model`` section that picks and sizes a policy (rollout too).

Observation and action sizes are not part of it: they come from the env's
:class:`~rlinf.core.protocols.embodied.EnvSpec` when the policy is built.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator

from rlinf.core.config import RLinfModel

__all__ = [
    "DEFAULT_LORA_TARGET_MODULES",
    "Activation",
    "FlowSampler",
    "FlowStart",
    "LoRAConfig",
    "PolicyConfig",
    "Precision",
    "ValueType",
]

Activation = Literal["tanh", "relu", "elu", "gelu", "silu"]
"""Hidden-layer nonlinearities a policy can use."""

ValueType = Literal["action_level", "chunk_level"]
"""``action_level``: a value per chunk sub-step (V = C); ``chunk_level``: one per chunk (V = 1)."""

Precision = Literal["fp32", "bf16"]
"""Parameter dtype of the policy."""

FlowSampler = Literal["ode", "sde", "noise"]
"""How pi0 samples in train mode: ``ode`` (deterministic), ``sde`` (one
stochastic denoising step per call, Gaussian log-density), ``noise`` (learned noise
scale, joint log-density over the steps). Eval mode always integrates the ODE."""

FlowStart = Literal["zero", "sampled"]
"""Where pi0's denoising chain starts: ``zero`` (``x_1 = 0``, the noise mean:
every random part of a train-mode action is a scored step, and eval is a
deterministic function of the observation) or ``sampled`` (``x_1 ~ N(0, I)`` as in
openpi; the draw is not part of the log-probability, and eval draws it too)."""

_MAX_CNN_LAYERS = 3


def _default_hidden_dims() -> list[int]:
    return [256, 256, 256]


def _default_cnn_channels() -> list[int]:
    return [32, 64, 64]


DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "out_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "fc1",
    "fc2",
)
"""Module-name suffixes LoRA adapts by default: SigLIP attention (``q/k/v/out_proj``) and
MLP (``fc1/fc2``), Llama attention (``q/k/v/o_proj``) and MLP (``gate/up/down_proj``)."""


class LoRAConfig(RLinfModel):
    """Low-rank adapters on the VLA backbones (``actor.model.lora``; VLAs only).

    With this section set, the backbone weights are frozen and only the adapters
    plus the RL heads (the value head; pi0's noise-std head and its action expert)
    train. Rollout and actor read the same section, so both build the same adapter
    structure.

    Attributes:
        rank: ``r``, the rank of every adapter.
        alpha: ``lora_alpha``; the update is scaled by ``alpha / rank`` (null: ``rank``,
            i.e. scale 1).
        dropout: Dropout on the adapter input. Keep 0 for RL: with dropout the actor's
            train-mode re-scoring no longer matches the rollout's logprobs.
        target_modules: Module-name suffixes to adapt (null:
            :data:`DEFAULT_LORA_TARGET_MODULES`). Every entry must match some module.
        path: A saved adapter directory (``adapter_config.json``, as written by the
            policy's ``save_pretrained`` into ``<out_dir>/adapter``) to load trainable
            instead of starting fresh adapters.
    """

    rank: int = Field(description="LoRA rank r (>= 1).")
    alpha: float | None = Field(
        default=None, description="lora_alpha; the update scale is alpha / rank (null: rank)."
    )
    dropout: float = Field(
        default=0.0, description="Adapter input dropout in [0, 1); keep 0 for RL."
    )
    target_modules: list[str] | None = Field(
        default=None,
        description="Module-name suffixes to adapt (null: SigLIP and Llama projections).",
    )
    path: Path | None = Field(
        default=None, description="Saved adapter directory to load trainable (null: fresh)."
    )

    @field_validator("rank")
    @classmethod
    def _check_rank(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"actor.model.lora.rank={value} must be at least 1; set e.g. "
                "actor.model.lora.rank: 16, or remove actor.model.lora to train without LoRA"
            )
        return value

    @field_validator("alpha")
    @classmethod
    def _check_alpha(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"actor.model.lora.alpha={value} must be a positive finite number; set it to "
                "e.g. the rank, or to null (alpha = rank)"
            )
        return value

    @field_validator("dropout")
    @classmethod
    def _check_dropout(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ValueError(
                f"actor.model.lora.dropout={value} must lie in [0, 1); set "
                "actor.model.lora.dropout: 0 (recommended for RL)"
            )
        return value

    @field_validator("target_modules")
    @classmethod
    def _check_target_modules(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        bad = [name for name in value if not name or name != name.strip()]
        if not value or bad:
            raise ValueError(
                f"actor.model.lora.target_modules={value} must list non-empty module-name "
                "suffixes (no blanks), e.g. [q_proj, v_proj]; set it to null for the default "
                f"{list(DEFAULT_LORA_TARGET_MODULES)}"
            )
        if len(set(value)) != len(value):
            repeated = sorted({name for name in value if value.count(name) > 1})
            raise ValueError(
                f"actor.model.lora.target_modules={value} repeats {repeated}; list each suffix once"
            )
        return value

    @property
    def lora_alpha(self) -> float:
        """The effective ``alpha`` (``rank`` when unset)."""
        return float(self.rank) if self.alpha is None else self.alpha

    @property
    def modules(self) -> list[str]:
        """The effective target suffixes (the default list when unset)."""
        if self.target_modules is None:
            return list(DEFAULT_LORA_TARGET_MODULES)
        return list(self.target_modules)


class PolicyConfig(RLinfModel):
    """Which policy to build and how large (``actor.model``).

    Attributes:
        model_type: Registered policy name (``mlp`` for state obs, ``cnn`` for RGB obs).
        hidden_dims: Widths of the hidden layers of the actor MLP and of the value MLP.
        num_action_chunks: ``C``: actions predicted per call (sub-steps of one chunk step).
        value_type: ``action_level`` (V = C values per step) or ``chunk_level`` (V = 1).
        add_value_head: Whether the policy has a value head (PPO/GAE needs one; GRPO does not).
        init_log_std: Initial state-independent log standard deviation (continuous actions).
        activation: Nonlinearity of the hidden layers.
        cnn_channels: Output channels of the Nature-DQN conv layers (1 to 3 layers with
            kernels 8/4/3 and strides 4/2/1); ``cnn`` only.
        cnn_feature_dim: Width of the linear layer after the convs; ``cnn`` only.
        precision: Parameter dtype, ``fp32`` or ``bf16``. Logprobs and values are always
            returned as float32.
        model_path: VLAs (``pi0``, ``openvla``): the Hugging Face-format directory
            to load (``config.json``, weights, tokenizer, ``dataset_statistics.json``).
        temperature: OpenVLA: sampling temperature in train mode. Rollout and actor
            read this one field, so the actor re-scores with the rollout's warping.
        top_k: OpenVLA: sample among the ``k`` most likely bins (0: all of them).
        unnorm_key: VLAs: the ``dataset_statistics.json`` entry that de-normalises
            actions (null: the only entry).
        flow_sampler: pi0: train-mode sampler (see :data:`FlowSampler`).
        noise_level: pi0: noise scale of the ``sde`` sampler.
        flow_start: pi0: the chain's start (see :data:`FlowStart`).
        lora: VLAs: low-rank adapters on the backbones (null: train every weight);
            see :class:`LoRAConfig`.
    """

    model_type: str = Field(
        default="mlp", description="Registered policy name: mlp (states), cnn (RGB)."
    )
    hidden_dims: list[int] = Field(
        default_factory=_default_hidden_dims,
        description="Hidden layer widths of the actor and value MLPs.",
    )
    num_action_chunks: int = Field(
        default=1, ge=1, description="C: actions predicted per policy call."
    )
    value_type: ValueType = Field(
        default="action_level", description="action_level: V = C values; chunk_level: V = 1."
    )
    add_value_head: bool = Field(default=True, description="Build a value head (needed for GAE).")
    init_log_std: float = Field(
        default=-0.5, allow_inf_nan=False, description="Initial log std of continuous actions."
    )
    activation: Activation = Field(default="tanh", description="Hidden-layer nonlinearity.")
    cnn_channels: list[int] = Field(
        default_factory=_default_cnn_channels,
        description="Conv output channels (1-3 Nature-DQN layers); cnn only.",
    )
    cnn_feature_dim: int = Field(
        default=256, ge=1, description="Linear width after the convs; cnn only."
    )
    precision: Precision = Field(default="fp32", description="Parameter dtype: fp32 or bf16.")
    model_path: Path | None = Field(
        default=None, description="VLAs: Hugging Face-format model directory to load."
    )
    temperature: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="OpenVLA: train sampling temperature.",
    )
    top_k: int = Field(default=0, ge=0, description="OpenVLA: top-k bins (0: all).")
    unnorm_key: str | None = Field(
        default=None, description="VLAs: dataset_statistics.json entry (null: the only one)."
    )
    flow_sampler: FlowSampler = Field(
        default="sde", description="pi0: train-mode sampler (ode, sde, noise)."
    )
    noise_level: float = Field(
        default=0.5, gt=0, allow_inf_nan=False, description="pi0: sde noise scale."
    )
    flow_start: FlowStart = Field(
        default="zero", description="pi0: chain start, zero (noise mean) or sampled."
    )
    lora: LoRAConfig | None = Field(
        default=None, description="VLAs: LoRA adapters on the backbones (null: full training)."
    )

    @field_validator("model_type")
    @classmethod
    def _check_model_type(cls, value: str) -> str:
        from rlinf.embodied.models.registry import available_policies

        names = available_policies()
        if value in names:
            return value
        close = difflib.get_close_matches(value, names, n=1, cutoff=0.4)
        hint = f" Did you mean model_type: {close[0]}?" if close else ""
        raise ValueError(
            f"model_type {value!r} is not a registered policy (registered: "
            f"{', '.join(names)}).{hint} Set model_type to a registered name, or register "
            f"a new policy class with @register_policy({value!r})"
        )

    @field_validator("hidden_dims")
    @classmethod
    def _check_hidden_dims(cls, value: list[int]) -> list[int]:
        if any(width < 1 for width in value):
            raise ValueError(
                f"hidden_dims={value} has a width below 1; every hidden layer needs at "
                "least one unit, e.g. hidden_dims: [64, 64] (an empty list gives linear heads)"
            )
        return value

    @field_validator("cnn_channels")
    @classmethod
    def _check_cnn_channels(cls, value: list[int]) -> list[int]:
        if not 1 <= len(value) <= _MAX_CNN_LAYERS or any(c < 1 for c in value):
            raise ValueError(
                f"cnn_channels={value} must list 1 to {_MAX_CNN_LAYERS} positive channel "
                "counts (one per Nature-DQN conv layer), e.g. cnn_channels: [32, 64, 64]"
            )
        return value

    @property
    def value_dim(self) -> int:
        """``V``: values per step (``num_action_chunks`` for action_level, 1 for chunk_level)."""
        return self.num_action_chunks if self.value_type == "action_level" else 1

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype named by ``precision``."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32
