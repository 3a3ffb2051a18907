"""Neural building blocks shared by both VLA families.

The vision tower and the transformers are stock ``transformers`` classes built
from config dicts with random weights (SigLIP vision, Llama), so the models are
real in structure while tiny in size. This module owns how a dict becomes a
module, the projector from vision to text width, the value MLP, the sinusoidal
time embedding of the flow expert, and the additive 4-D attention mask that
stock Llama accepts as a custom mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaModel, SiglipVisionConfig, SiglipVisionModel

__all__ = [
    "PrefixModules",
    "Projector",
    "ValueMLP",
    "additive_attention_mask",
    "build_image_embeddings",
    "build_llama",
    "build_prefix_modules",
    "build_vision_tower",
    "prefix_embeddings",
    "run_llama",
    "sinusoidal_embedding",
]


def build_vision_tower(vision_config: dict[str, Any]) -> SiglipVisionModel:
    """A randomly initialised SigLIP vision tower.

    Args:
        vision_config: ``SiglipVisionConfig`` keyword arguments.

    Returns:
        The tower; its ``last_hidden_state`` is ``[n, patches, hidden_size]``.
    """
    return SiglipVisionModel(SiglipVisionConfig(**{**vision_config, "attn_implementation": "sdpa"}))


def build_llama(text_config: dict[str, Any]) -> LlamaModel:
    """A randomly initialised Llama trunk (no LM head), fed with ``inputs_embeds``.

    Args:
        text_config: ``LlamaConfig`` keyword arguments.

    Returns:
        The trunk.
    """
    return LlamaModel(LlamaConfig(**{**text_config, "attn_implementation": "sdpa"}))


def run_llama(model: LlamaModel, embeds: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
    """Runs a Llama trunk over embeddings with a custom mask.

    Args:
        model: The trunk.
        embeds: ``[B, T, D]`` input embeddings.
        mask: ``[B, 1, T, T]`` additive mask (see :func:`additive_attention_mask`).
        positions: ``[B, T]`` rotary position ids.

    Returns:
        ``[B, T, D]`` last hidden states (after the final norm).
    """
    out = model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False)
    hidden: Tensor = out.last_hidden_state
    return hidden


def additive_attention_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Turns a boolean ``[B, T, T]`` (query, key) matrix into an additive ``[B, 1, T, T]`` mask.

    Every query is also allowed to see itself, so rows of padding queries (whose
    outputs are never read) stay finite instead of becoming NaN.

    Args:
        allowed: True where the query may attend to the key.
        dtype: The dtype of the attention scores.

    Returns:
        0 where allowed, the most negative finite value elsewhere.
    """
    eye = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)
    allowed = allowed | eye
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


class Projector(nn.Module):
    """Maps vision features to the text width: ``linear`` or ``mlp`` (Linear-GELU-Linear).

    Args:
        kind: ``linear`` or ``mlp``.
        in_dim: Vision width.
        out_dim: Text width.
    """

    def __init__(self, kind: str, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if kind == "linear":
            self.net: nn.Module = nn.Linear(in_dim, out_dim)
        elif kind == "mlp":
            self.net = nn.Sequential(
                nn.Linear(in_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim)
            )
        else:
            raise ValueError(f"projector={kind!r} is not 'linear' or 'mlp'")

    def forward(self, features: Tensor) -> Tensor:
        """Projects ``[..., in_dim]`` to ``[..., out_dim]``."""
        out: Tensor = self.net(features)
        return out


class ValueMLP(nn.Module):
    """Value head: GELU MLP whose last layer has no bias and N(0, 0.02) weights.

    Args:
        in_dim: Input width.
        hidden_dims: Hidden widths.
        out_dim: ``V`` values.
    """

    def __init__(self, in_dim: int, hidden_dims: Sequence[int], out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for hidden in hidden_dims:
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        last = nn.Linear(width, out_dim, bias=False)
        nn.init.normal_(last.weight, std=0.02)
        layers.append(last)
        self.net = nn.Sequential(*layers)

    def forward(self, features: Tensor) -> Tensor:
        """Values ``[n, V]`` in float32 from ``[n, in_dim]`` features."""
        out: Tensor = self.net(features)
        return out.float()


def sinusoidal_embedding(t: Tensor, dim: int, max_period: float = 100.0) -> Tensor:
    """Sine-cosine features of scalar times in ``[0, 1]``.

    Args:
        t: ``[n]`` times.
        dim: Even output width.
        max_period: Longest period; periods are geometric between ``4e-3`` and it.

    Returns:
        ``[n, dim]`` float32 features.
    """
    half = dim // 2
    periods = torch.exp(torch.linspace(math.log(4e-3), math.log(max_period), half, device=t.device))
    angles = 2 * math.pi * t.float().unsqueeze(-1) / periods
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class PrefixModules(Protocol):
    """What both VLA families embed their prefix with (vision, proprio, prompt)."""

    vision_tower: SiglipVisionModel
    projector: Projector
    language_model: LlamaModel
    proprio_projector: nn.Linear | None
    image_embeddings: nn.Embedding | None


def build_prefix_modules(
    config: Any, width: int
) -> tuple[SiglipVisionModel, Projector, LlamaModel, nn.Linear | None]:
    """The vision tower, projector, language backbone and proprio projector of a VLA config.

    Args:
        config: A ``TokenVLAConfig`` or ``FlowVLAConfig``.
        width: The language backbone's hidden size.

    Returns:
        ``(vision_tower, projector, language_model, proprio_projector)``; the last is
        None without a proprio token (``state_dim == 0``).
    """
    return (
        build_vision_tower(config.vision_config),
        Projector(config.projector, int(config.vision_config["hidden_size"]), width),
        build_llama(config.text_config),
        nn.Linear(config.state_dim, width) if config.state_dim > 0 else None,
    )


def build_image_embeddings(config: Any, width: int) -> nn.Embedding | None:
    """Learned per-image embeddings (main, wrist) added to each image's tokens.

    Args:
        config: A ``TokenVLAConfig`` or ``FlowVLAConfig``.
        width: The language backbone's hidden size.

    Returns:
        An ``nn.Embedding(num_images, width)`` (N(0, 0.02) weights), or None for a
        model that sees one image.
    """
    if config.num_images == 1:
        return None
    embeddings = nn.Embedding(config.num_images, width)
    nn.init.normal_(embeddings.weight, std=0.02)
    return embeddings


def prefix_embeddings(
    model: PrefixModules,
    pixel_values: Tensor,
    input_ids: Tensor,
    attention_mask: Tensor,
    states: Tensor | None,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Embeds ``[image patches] [proprio token?] [prompt]`` into the language width.

    Args:
        model: The modules (a VLA model).
        pixel_values: ``[B, 3, S, S]`` normalised images, or ``[B, K, 3, S, S]`` for a
            model with ``K`` images (main, wrist): their patches follow one another.
        input_ids: ``[B, L]`` left-padded prompt ids.
        attention_mask: ``[B, L]`` 1 for real prompt tokens.
        states: ``[B, state_dim]``; required iff the model has a proprio token.
        dtype: The parameter dtype inputs are cast to.

    Returns:
        ``[B, P, D]`` embeddings and ``[B, P]`` bool validity (patches and proprio
        always valid, prompt positions as ``attention_mask``).

    Raises:
        ValueError: The model has a proprio token but ``states`` is None, or the number
            of images is not the model's.
    """
    images = pixel_values if pixel_values.ndim == 5 else pixel_values.unsqueeze(1)
    batch, count = images.shape[:2]
    expected = 1 if model.image_embeddings is None else model.image_embeddings.num_embeddings
    if count != expected:
        raise ValueError(f"the model takes {expected} image(s) per observation, got {count}")
    flat = images.flatten(0, 1).to(dtype)
    patches = model.projector(model.vision_tower(pixel_values=flat).last_hidden_state)
    patches = patches.view(batch, count, patches.shape[1], patches.shape[2])
    if model.image_embeddings is not None:
        patches = patches + model.image_embeddings.weight.view(1, count, 1, -1)
    parts = [patches.flatten(1, 2)]
    if model.proprio_projector is not None:
        if states is None:
            raise ValueError(
                f"the model has a proprio token (state_dim={model.proprio_projector.in_features}) "
                "but no states were given"
            )
        parts.append(model.proprio_projector(states.to(dtype)).unsqueeze(1))
    parts.append(model.language_model.embed_tokens(input_ids))
    embeds = torch.cat(parts, dim=1)
    batch, fixed = input_ids.shape[0], embeds.shape[1] - input_ids.shape[1]
    always = torch.ones(batch, fixed, dtype=torch.bool, device=embeds.device)
    return embeds, torch.cat([always, attention_mask.bool()], dim=1)
