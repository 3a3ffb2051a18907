"""``OpenVLAModel``: the prismatic port's module tree on stock ``LlamaForCausalLM``.

Attributes and checkpoint prefixes: ``vision_backbone`` (:mod:`.vision`),
``projector`` (``fc1``/``fc2``/``fc3`` fused, ``fc1``/``fc2`` single tower),
``language_model`` (a ``LlamaForCausalLM``: ``language_model.model.*`` and
``language_model.lm_head``), and, added by RLinf, ``proprio_projector``
(OpenVLA-OFT's ``fc1``/``fc2``; ``proprio_dim > 0``) and ``value_head``.

Sequence, per sample (prompts are left-padded so the last prefix position is
the last prompt token in every row)::

    [pad...] [<s>] [image patches] [proprio?] [prompt tokens after <s>] | tail

OpenVLA inserts the patches right after ``<s>``. The tail is
``autoregressive``: the action tokens themselves (decoded one by one with a KV
cache; re-scored teacher-forced); ``parallel`` (OFT): ``C*A`` placeholder
positions whose input embeddings are zeros, then the STOP token, in one forward.
Either way position ``P - 1 + j`` (``P`` = prefix length) predicts action token
``j`` (next-token shift) and attention is the LLM's causal attention; padding
is masked as a key (each query also sees itself, so no row is fully masked).
The value head reads the last-layer hidden state at ``P - 1``, the position
before the first action token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoModel, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from rlinf.embodied.models.vla.backbones import ValueMLP
from rlinf.embodied.models.vla.openvla.configuration import OpenVLAConfig
from rlinf.embodied.models.vla.openvla.vision import (
    AttentionPoolLatent,
    LayerScale,
    TimmViT,
    VisionBackbone,
    init_vit_parameters,
)

__all__ = [
    "LAYOUT_NOTE",
    "OpenVLAModel",
    "OpenVLAOutput",
    "Projector",
    "ProprioProjector",
    "parameter_layout",
]


class Projector(nn.Module):
    """The prismatic projector: fused ``fc1``-GELU-``fc2``-GELU-``fc3``, else ``fc1``-GELU-``fc2``.

    Args:
        vision_dim: Feature width of the vision backbone.
        llm_dim: Width of the language model.
        fused: The fused (three-layer) variant.
    """

    def __init__(self, vision_dim: int, llm_dim: int, *, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3: nn.Linear | None = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)
            self.fc3 = None
        self.act_fn = nn.GELU()

    def forward(self, features: Tensor) -> Tensor:
        """``[..., vision_dim]`` -> ``[..., llm_dim]``."""
        out: Tensor = self.fc2(self.act_fn(self.fc1(features)))
        if self.fc3 is not None:
            out = self.fc3(self.act_fn(out))
        return out


class ProprioProjector(nn.Module):
    """OpenVLA-OFT's proprio projector: ``fc1`` (proprio -> llm) - GELU - ``fc2`` (llm -> llm)."""

    def __init__(self, proprio_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.act_fn = nn.GELU()
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: Tensor) -> Tensor:
        """``[B, proprio_dim]`` -> ``[B, llm_dim]``."""
        out: Tensor = self.fc2(self.act_fn(self.fc1(proprio)))
        return out


@dataclass
class OpenVLAOutput:
    """Action-token logits and values of one call.

    Attributes:
        action_logits: ``[B, C*A, vocab]`` float32 logits predicting each action token.
        values: ``[B, V]`` float32, or None without a value head.
        value_features: ``[B, D]`` last-layer hidden state the value head reads.
    """

    action_logits: Tensor
    values: Tensor | None
    value_features: Tensor


class OpenVLAModel(PreTrainedModel):  # type: ignore[no-untyped-call]
    """OpenVLA / OpenVLA-OFT (see the module docstring).

    Args:
        config: The model config.
    """

    config_class = OpenVLAConfig
    config: OpenVLAConfig
    base_model_prefix = "openvla"
    main_input_name = "pixel_values"
    _supports_sdpa = True

    def __init__(self, config: OpenVLAConfig) -> None:
        super().__init__(config)
        text = {**config.text_config, "attn_implementation": "sdpa"}
        self.vision_backbone = VisionBackbone(config.vision_specs())
        width = int(config.text_config["hidden_size"])
        self.projector = Projector(
            self.vision_backbone.embed_dim, width, fused=bool(config.use_fused_vision_backbone)
        )
        self.language_model = LlamaForCausalLM(LlamaConfig(**text))
        self.proprio_projector = (
            ProprioProjector(config.proprio_dim, width) if config.proprio_dim > 0 else None
        )
        self.value_head = (
            ValueMLP(width, config.value_hidden_dims, config.value_dim)
            if config.add_value_head
            else None
        )
        self.post_init()  # type: ignore[no-untyped-call]

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, LayerScale | TimmViT | AttentionPoolLatent):
            init_vit_parameters(module)
        else:
            super()._init_weights(module)  # type: ignore[no-untyped-call]

    @property
    def num_prefix_fixed(self) -> int:
        """Prefix positions that are not prompt tokens: patches (+ the proprio token)."""
        return self.vision_backbone.num_patches + (self.proprio_projector is not None)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """Word embeddings ``[..., D]`` of token ids."""
        out: Tensor = self.language_model.model.embed_tokens(ids)
        return out

    def embed_prefix(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        proprio: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``[pad...] [<s>] [patches] [proprio?] [rest of the prompt]``.

        Args:
            pixel_values: ``[B, 3 or 6, S, S]`` normalised pixels.
            input_ids: ``[B, L]`` left-padded prompt ids starting with ``<s>``.
            attention_mask: ``[B, L]`` 1 for real prompt tokens.
            proprio: ``[B, proprio_dim]`` (required iff the model has a proprio projector).

        Returns:
            ``[B, L + N, D]`` embeddings and ``[B, L + N]`` bool validity.

        Raises:
            ValueError: ``proprio`` is missing for a model with a proprio projector.
        """
        dtype = self.language_model.lm_head.weight.dtype
        patches = self.projector(self.vision_backbone(pixel_values.to(dtype)))
        if self.proprio_projector is not None:
            if proprio is None:
                raise ValueError(
                    f"the model has a proprio projector (proprio_dim={self.config.proprio_dim}) "
                    "but no proprio states were given"
                )
            token = self.proprio_projector(proprio.to(dtype)).unsqueeze(1)
            patches = torch.cat([patches, token], dim=1)
        words = self.embed_tokens(input_ids)
        batch, length = input_ids.shape
        fixed = patches.shape[1]
        pads = (length - attention_mask.long().sum(dim=1)).unsqueeze(1)  # [B, 1]
        t = torch.arange(length + fixed, device=input_ids.device).unsqueeze(0)
        source = torch.where(
            t <= pads, t, torch.where(t <= pads + fixed, length + t - pads - 1, t - fixed)
        )
        stacked = torch.cat([words, patches], dim=1)
        index = source.unsqueeze(-1).expand(batch, -1, stacked.shape[-1])
        embeds = stacked.gather(1, index)
        valid_all = torch.cat(
            [attention_mask.bool(), attention_mask.new_ones(batch, fixed, dtype=torch.bool)], dim=1
        )
        return embeds, valid_all.gather(1, source.expand(batch, -1))

    def hidden_states(self, embeds: Tensor, valid: Tensor, past: Any = None) -> tuple[Tensor, Any]:
        """Runs the Llama trunk causally over new positions.

        Args:
            embeds: ``[B, q, D]`` inputs of the positions ``[k - q, k)``.
            valid: ``[B, k]`` bool validity of every position so far (past and new).
            past: The KV cache of the first ``k - q`` positions (None: start fresh).

        Returns:
            ``[B, q, D]`` last hidden states (after the final norm) and the cache (None
            when ``past`` is None and the whole sequence is given).
        """
        total, new = valid.shape[1], embeds.shape[1]
        start = total - new
        keys = torch.arange(total, device=embeds.device).unsqueeze(0)
        queries = keys[:, start:].transpose(0, 1)  # [q, 1]
        allowed = ((keys <= queries).unsqueeze(0) & valid.unsqueeze(1)) | (keys == queries)
        additive = torch.zeros(allowed.shape, dtype=embeds.dtype, device=embeds.device)
        additive = additive.masked_fill(~allowed, torch.finfo(embeds.dtype).min).unsqueeze(1)
        positions = (valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, start:]
        out = self.language_model.model(
            inputs_embeds=embeds,
            attention_mask=additive,
            position_ids=positions,
            past_key_values=past,
            use_cache=past is not None,
        )
        return out.last_hidden_state, out.past_key_values

    def logits(self, hidden: Tensor) -> Tensor:
        """float32 LM-head logits ``[..., vocab]``."""
        out: Tensor = self.language_model.lm_head(hidden)
        return out.float()

    def _values(self, features: Tensor) -> Tensor | None:
        return None if self.value_head is None else self.value_head(features)

    def parallel_tail(self, batch: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """OFT's tail ``[B, C*A + 1, D]``: zero embeddings at the placeholders, then STOP."""
        width = int(self.config.text_config["hidden_size"])
        zeros = torch.zeros(batch, self.config.num_action_tokens, width, dtype=dtype, device=device)
        stop = torch.full((batch, 1), self.config.stop_token_id, dtype=torch.long, device=device)
        return torch.cat([zeros, self.embed_tokens(stop).to(dtype)], dim=1)

    def forward(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        proprio: Tensor | None = None,
        action_ids: Tensor | None = None,
    ) -> OpenVLAOutput:
        """One forward: parallel decoding, or teacher-forced re-scoring of autoregressive tokens.

        Args:
            pixel_values: ``[B, 3 or 6, S, S]`` normalised pixels.
            input_ids: ``[B, L]`` left-padded prompt ids.
            attention_mask: ``[B, L]`` prompt validity.
            proprio: ``[B, proprio_dim]`` when the model has a proprio projector.
            action_ids: ``[B, C*A]`` action tokens (``autoregressive`` only; required there).

        Returns:
            Logits predicting each action token and the values.

        Raises:
            ValueError: ``action_ids`` is missing in ``autoregressive`` mode.
        """
        prefix, valid = self.embed_prefix(pixel_values, input_ids, attention_mask, proprio)
        batch, length = valid.shape
        count = self.config.num_action_tokens
        if self.config.decode_mode == "parallel":
            tail = self.parallel_tail(batch, prefix.dtype, prefix.device)
        else:
            if action_ids is None or tuple(action_ids.shape) != (batch, count):
                got = None if action_ids is None else tuple(action_ids.shape)
                raise ValueError(
                    f"autoregressive re-scoring needs action_ids [B={batch}, C*A={count}], "
                    f"got {got}"
                )
            tail = self.embed_tokens(action_ids[:, :-1].to(prefix.device)).to(prefix.dtype)
        embeds = torch.cat([prefix, tail], dim=1)
        valid = torch.cat([valid, valid.new_ones(batch, tail.shape[1])], dim=1)
        hidden, _ = self.hidden_states(embeds, valid)
        readout = hidden[:, length - 1 : length - 1 + count]
        features = hidden[:, length - 1]
        return OpenVLAOutput(self.logits(readout), self._values(features), features)

    def decode_autoregressive(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        proprio: Tensor | None,
        pick: Callable[[Tensor], Tensor],
    ) -> tuple[Tensor, OpenVLAOutput]:
        """OpenVLA's decoding: ``C*A`` tokens one after the other, with a KV cache.

        Args:
            pixel_values: ``[B, 3 or 6, S, S]`` normalised pixels.
            input_ids: ``[B, L]`` left-padded prompt ids.
            attention_mask: ``[B, L]`` prompt validity.
            proprio: ``[B, proprio_dim]`` when the model has a proprio projector.
            pick: Chooses ``[B]`` ids from ``[B, vocab]`` float32 logits (greedy or sampled).

        Returns:
            The ids ``[B, C*A]`` and the logits each was picked from (plus values).
        """
        prefix, valid = self.embed_prefix(pixel_values, input_ids, attention_mask, proprio)
        hidden, past = self.hidden_states(prefix, valid, _fresh_cache())
        features = hidden[:, -1]
        step_logits = self.logits(features)
        ids: list[Tensor] = []
        all_logits: list[Tensor] = []
        for step in range(self.config.num_action_tokens):
            chosen = pick(step_logits)
            ids.append(chosen)
            all_logits.append(step_logits)
            if step + 1 == self.config.num_action_tokens:
                break
            valid = torch.cat([valid, valid.new_ones(valid.shape[0], 1)], dim=1)
            embeds = self.embed_tokens(chosen.unsqueeze(1)).to(prefix.dtype)
            hidden, past = self.hidden_states(embeds, valid, past)
            step_logits = self.logits(hidden[:, -1])
        output = OpenVLAOutput(torch.stack(all_logits, dim=1), self._values(features), features)
        return torch.stack(ids, dim=1), output


LAYOUT_NOTE = (
    "Generated by rlinf.embodied.models.vla.openvla.modeling.parameter_layout from the "
    "documented openvla-7b layout (OpenVLAConfig() defaults: DINOv2 ViT-L/14 reg4 + SigLIP "
    "so400m/14 at 224 px, fused projector, Llama 2 7B with vocab 32064), built on the meta "
    "device; NOT read from a downloaded checkpoint."
)


def parameter_layout(config: OpenVLAConfig) -> dict[str, list[int]]:
    """State-dict key -> shape of the model ``config`` describes, built on the meta device.

    No memory is allocated, so the 7.5 B layout of openvla-7b is cheap to list.
    """
    with torch.device("meta"):
        model = OpenVLAModel(config)
    return {key: list(value.shape) for key, value in model.state_dict().items()}


def _fresh_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


AutoModel.register(OpenVLAConfig, OpenVLAModel, exist_ok=True)
