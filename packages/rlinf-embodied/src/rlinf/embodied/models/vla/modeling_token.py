"""Token-action VLA (OpenVLA-OFT style): a whole action chunk as tokens in one forward pass.

Sequence, per sample::

    [image patches] [proprio token if state_dim > 0] [prompt, left-padded] [C*A action slots]

The slots hold learned slot embeddings (one per position in the chunk, so no
placeholder token and no STOP token are needed). The 4-D attention mask lets the
prefix attend within itself (bidirectionally, or causally when
``prefix_attention: causal``) and never to the slots, and lets every slot see the
whole valid prefix and every other slot; padding is masked as a key. So all
``C*A`` tokens come out of ONE forward (parallel decoding) and the prefix is
unaffected by what happens in the slots.

Readout is "at the slot": slot ``j``'s own hidden state goes through the LM head
and its logits are restricted (elsewhere, :mod:`.token_sampling`) to the
``n_action_bins`` ids at the end of the vocabulary (mapping in
:mod:`.action_bins`). The value head reads the hidden state just before the
first slot, i.e. the last prompt token, which left padding makes a real token in
every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel

from rlinf.embodied.models.vla.action_bins import ActionBins
from rlinf.embodied.models.vla.backbones import (
    ValueMLP,
    additive_attention_mask,
    build_image_embeddings,
    build_prefix_modules,
    prefix_embeddings,
    run_llama,
)
from rlinf.embodied.models.vla.configuration import TokenVLAConfig

__all__ = ["TokenVLAModel", "TokenVLAOutput"]


@dataclass
class TokenVLAOutput:
    """What one forward of :class:`TokenVLAModel` returns.

    Attributes:
        action_logits: ``[B, C*A, vocab_size]`` float32 LM-head logits at the slots.
        values: ``[B, V]`` float32, or None without a value head.
        prefix_hidden: ``[B, P, D]`` hidden states of the prefix positions.
        slot_hidden: ``[B, C*A, D]`` hidden states of the slots.
    """

    action_logits: Tensor
    values: Tensor | None
    prefix_hidden: Tensor
    slot_hidden: Tensor


class TokenVLAModel(PreTrainedModel):  # type: ignore[no-untyped-call]
    """SigLIP + projector + Llama with parallel-decoded action tokens and an optional value head.

    Args:
        config: The model config.
    """

    config_class = TokenVLAConfig
    config: TokenVLAConfig
    base_model_prefix = "token_vla"
    main_input_name = "pixel_values"
    _supports_sdpa = True

    def __init__(self, config: TokenVLAConfig) -> None:
        super().__init__(config)
        width = int(config.text_config["hidden_size"])
        self.vision_tower, self.projector, self.language_model, self.proprio_projector = (
            build_prefix_modules(config, width)
        )
        self.image_embeddings = build_image_embeddings(config, width)
        self.slot_embeddings = nn.Embedding(self.num_slots, width)
        self.lm_head = nn.Linear(width, int(config.text_config["vocab_size"]), bias=False)
        self.value_head = (
            ValueMLP(width, config.value_hidden_dims, config.value_dim)
            if config.add_value_head
            else None
        )
        self.post_init()  # type: ignore[no-untyped-call]

    @property
    def num_slots(self) -> int:
        """``C*A``: action tokens per call."""
        return self.config.num_action_chunks * self.config.action_dim

    @property
    def action_bins(self) -> ActionBins:
        """The bin layout of the vocabulary."""
        return ActionBins(self.config.n_action_bins, int(self.config.text_config["vocab_size"]))

    def embed_prefix(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        states: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Embeds images, proprio and prompt.

        Args:
            pixel_values: ``[B, 3, S, S]`` (or ``[B, 2, 3, S, S]`` with a wrist image) images.
            input_ids: ``[B, L]`` left-padded prompt ids.
            attention_mask: ``[B, L]`` 1 for real prompt tokens.
            states: ``[B, state_dim]`` (required iff ``state_dim > 0``).

        Returns:
            ``[B, P, D]`` embeddings and ``[B, P]`` bool validity.
        """
        dtype = self.lm_head.weight.dtype
        return prefix_embeddings(self, pixel_values, input_ids, attention_mask, states, dtype)

    def _with_slots(self, prefix_valid: Tensor) -> Tensor:
        """``[B, P + C*A]`` bool validity: the prefix's, then every slot valid."""
        slots = prefix_valid.new_ones(prefix_valid.shape[0], self.num_slots)
        return torch.cat([prefix_valid, slots], dim=1)

    def attention_mask_4d(self, prefix_valid: Tensor, dtype: torch.dtype) -> Tensor:
        """The additive ``[B, 1, T, T]`` mask over prefix + slots (see the module docstring)."""
        prefix_len = prefix_valid.shape[1]
        total = prefix_len + self.num_slots
        device = prefix_valid.device
        valid = self._with_slots(prefix_valid)
        is_prefix = torch.arange(total, device=device) < prefix_len
        prefix_rule = is_prefix.unsqueeze(1) & is_prefix.unsqueeze(0)
        if self.config.prefix_attention == "causal":
            prefix_rule = (
                prefix_rule & torch.ones(total, total, dtype=torch.bool, device=device).tril()
            )
        slot_rule = (~is_prefix).unsqueeze(1).expand(total, total)
        allowed = (prefix_rule | slot_rule).unsqueeze(0) & valid.unsqueeze(1)
        return additive_attention_mask(allowed, dtype)

    def forward(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        states: Tensor | None = None,
        slot_embeds: Tensor | None = None,
    ) -> TokenVLAOutput:
        """One parallel-decoding pass.

        Args:
            pixel_values: ``[B, 3, S, S]`` (or ``[B, 2, 3, S, S]`` with a wrist image) images.
            input_ids: ``[B, L]`` left-padded prompt ids.
            attention_mask: ``[B, L]`` prompt validity.
            states: ``[B, state_dim]`` when the model has a proprio token.
            slot_embeds: ``[B, C*A, D]`` slot inputs (default: the learned slot embeddings).

        Returns:
            Slot logits, values and hidden states.
        """
        prefix, prefix_valid = self.embed_prefix(pixel_values, input_ids, attention_mask, states)
        batch, prefix_len = prefix_valid.shape
        if slot_embeds is None:
            slot_embeds = self.slot_embeddings.weight.unsqueeze(0).expand(batch, -1, -1)
        embeds = torch.cat([prefix, slot_embeds.to(prefix.dtype)], dim=1)
        positions = (self._with_slots(prefix_valid).long().cumsum(dim=1) - 1).clamp_min(0)
        mask = self.attention_mask_4d(prefix_valid, embeds.dtype)
        hidden = run_llama(self.language_model, embeds, mask, positions)
        prefix_hidden, slot_hidden = hidden[:, :prefix_len], hidden[:, prefix_len:]
        values = None
        if self.value_head is not None:
            values = self.value_head(prefix_hidden[:, -1])
        return TokenVLAOutput(
            action_logits=self.lm_head(slot_hidden).float(),
            values=values,
            prefix_hidden=prefix_hidden,
            slot_hidden=slot_hidden,
        )


AutoModel.register(TokenVLAConfig, TokenVLAModel, exist_ok=True)
