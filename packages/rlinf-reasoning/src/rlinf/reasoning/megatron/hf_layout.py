"""Megatron GPT parameter names <-> Hugging Face Qwen2 names, and how each is split over TP.

What: :func:`rule_for` maps one parameter of this rank's ``GPTModel`` (local
spec) to its HF tensor(s) and its tensor-parallel layout; :func:`shard` cuts a
rank's piece out of full HF tensors and :func:`unshard` rebuilds the full HF
tensors from every rank's piece. Loading (:mod:`.hf_load`) and export
(:mod:`.hf_export`) both use these, so the two directions cannot disagree.

Why: Megatron fuses and interleaves. ``linear_qkv`` holds, per query group
(key/value head), that group's query heads, then its key head, then its value
head; a TP rank holds whole groups. ``linear_fc1`` holds, per rank, its slice
of ``gate_proj`` followed by its slice of ``up_proj``. Row-parallel layers
(``linear_proj``, ``linear_fc2``) split the input dimension; the embedding and
the output layer split (padded) vocabulary rows.

Megatron (``decoder.layers.{i}.`` = ``L.``) -> HF (``model.layers.{i + offset}.`` = ``H.``), layout:

* ``embedding.word_embeddings.weight`` -> ``model.embed_tokens.weight``, vocab
* ``L.input_layernorm.weight`` -> ``H.input_layernorm.weight``, full
* ``L.self_attention.linear_qkv.{weight,bias}`` -> ``H.self_attn.{q,k,v}_proj.{weight,bias}``, qkv
* ``L.self_attention.linear_proj.weight`` -> ``H.self_attn.o_proj.weight``, row
* ``L.pre_mlp_layernorm.weight`` -> ``H.post_attention_layernorm.weight``, full
* ``L.mlp.linear_fc1.weight`` -> ``H.mlp.{gate,up}_proj.weight``, gate_up
* ``L.mlp.linear_fc2.weight`` -> ``H.mlp.down_proj.weight``, row
* with transformer-engine's spec, ``L.self_attention.linear_qkv.layer_norm_weight``
  and ``L.mlp.linear_fc1.layer_norm_weight`` replace the two norms above
  (same HF names, full)
* ``decoder.final_layernorm.weight`` -> ``model.norm.weight``, full
* ``output_layer.weight`` -> ``lm_head.weight``, vocab; with tied embeddings it
  exists only on the last stage of a pipeline (a copy of the embedding), is
  loaded from ``model.embed_tokens.weight`` and is not exported.

Cost: views and concatenations of the tensors passed in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from rlinf.reasoning.megatron.hf_config import HFArchitecture

__all__ = ["Layout", "ParamRule", "Sliceable", "rule_for", "shard", "shard_range", "unshard"]

Layout = Literal["full", "vocab", "row", "qkv", "gate_up"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LAYER_PARAMS: dict[str, tuple[Layout, tuple[str, ...]]] = {
    "input_layernorm.weight": ("full", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": (
        "qkv",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    ),
    "self_attention.linear_qkv.bias": (
        "qkv",
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    ),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("full", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("mlp.down_proj.weight",)),
    # transformer-engine's spec: the norms fused into the next linear layer
    "self_attention.linear_qkv.layer_norm_weight": ("full", ("input_layernorm.weight",)),
    "mlp.linear_fc1.layer_norm_weight": ("full", ("post_attention_layernorm.weight",)),
}


class Sliceable(Protocol):
    """A tensor, or a lazy one that reads only the part it is indexed with (a checkpoint slice)."""

    @property
    def shape(self) -> torch.Size:
        """The full shape."""
        ...

    def __getitem__(self, index: Any) -> torch.Tensor:
        """The indexed part, read."""
        ...


@dataclass(frozen=True)
class ParamRule:
    """Where one Megatron parameter comes from in the HF checkpoint.

    Attributes:
        layout: How it is split over tensor-parallel ranks.
        hf_names: Its HF tensors (several when Megatron fuses them).
        exported: False for the tied output layer of the last pipeline stage (a
            copy of the embedding, which the first stage exports).
    """

    layout: Layout
    hf_names: tuple[str, ...]
    exported: bool = True


def rule_for(name: str, layer_offset: int, tied: bool) -> ParamRule:
    """The rule of parameter ``name`` of a ``GPTModel`` (local or transformer-engine spec).

    Args:
        name: As in ``GPTModel.named_parameters()`` (no wrapper prefix).
        layer_offset: Global index of this pipeline stage's first layer.
        tied: Whether the checkpoint ties the LM head to the embedding.

    Returns:
        The rule.

    Raises:
        KeyError: For a parameter this mapping does not know.
    """
    if name == "embedding.word_embeddings.weight":
        return ParamRule("vocab", ("model.embed_tokens.weight",))
    if name == "decoder.final_layernorm.weight":
        return ParamRule("full", ("model.norm.weight",))
    if name == "output_layer.weight":
        if tied:
            return ParamRule("vocab", ("model.embed_tokens.weight",), exported=False)
        return ParamRule("vocab", ("lm_head.weight",))
    match = _LAYER.match(name)
    if match is not None and match.group(2) in _LAYER_PARAMS:
        layout, suffixes = _LAYER_PARAMS[match.group(2)]
        prefix = f"model.layers.{int(match.group(1)) + layer_offset}."
        return ParamRule(layout, tuple(prefix + s for s in suffixes))
    raise KeyError(f"no Hugging Face name for Megatron parameter {name!r}")


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank``'s equal part of ``size`` (which ``world`` divides)."""
    if size % world:
        raise ValueError(f"size {size} does not split over {world} ranks")
    part = size // world
    return rank * part, (rank + 1) * part


def shard(
    layout: Layout,
    full: Sequence[Sliceable],
    arch: HFArchitecture,
    rank: int,
    world: int,
    padded_vocab: int,
) -> torch.Tensor:
    """``rank``'s piece of a parameter from its full HF tensor(s).

    Args:
        layout: The parameter's layout.
        full: Its HF tensors, in :class:`ParamRule` ``hf_names`` order; only the
            rank's part of each is indexed, so lazy checkpoint slices read no more.
        arch: The architecture (head counts and sizes).
        rank: Tensor-parallel rank.
        world: Tensor-parallel size.
        padded_vocab: Vocabulary rows of the Megatron embedding/output layer.

    Returns:
        The rank's local tensor (a new tensor or a view of ``full``).
    """
    if layout == "full":
        return full[0][:]
    if layout == "vocab":
        start, stop = shard_range(padded_vocab, rank, world)
        piece = full[0][start : min(stop, arch.vocab_size)]
        pad = stop - start - piece.shape[0]
        if pad > 0:
            piece = torch.cat([piece, piece.new_zeros((pad, *piece.shape[1:]))])
        return piece
    if layout == "row":
        start, stop = shard_range(full[0].shape[1], rank, world)
        return full[0][:, start:stop]
    if layout == "gate_up":
        start, stop = shard_range(full[0].shape[0], rank, world)
        return torch.cat([full[0][start:stop], full[1][start:stop]])
    q, k, v = full
    g0, g1 = shard_range(arch.num_kv_heads, rank, world)
    per_group = arch.num_heads // arch.num_kv_heads * arch.head_dim
    hd, groups = arch.head_dim, g1 - g0
    tail = q.shape[1:]
    return torch.cat(
        [
            q[g0 * per_group : g1 * per_group].reshape(groups, per_group, *tail),
            k[g0 * hd : g1 * hd].reshape(groups, hd, *tail),
            v[g0 * hd : g1 * hd].reshape(groups, hd, *tail),
        ],
        dim=1,
    ).reshape(-1, *tail)


def unshard(layout: Layout, pieces: list[torch.Tensor], arch: HFArchitecture) -> list[torch.Tensor]:
    """The full HF tensor(s) of a parameter from every TP rank's piece (rank order).

    Args:
        layout: The parameter's layout.
        pieces: Each tensor-parallel rank's local tensor.
        arch: The architecture.

    Returns:
        The HF tensors, in :class:`ParamRule` ``hf_names`` order (vocab rows past
        the real vocabulary dropped).
    """
    if layout == "full":
        return [pieces[0]]
    if layout == "vocab":
        return [torch.cat(pieces)[: arch.vocab_size]]
    if layout == "row":
        return [torch.cat(pieces, dim=1)]
    if layout == "gate_up":
        halves = [p.chunk(2) for p in pieces]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    per_group = arch.num_heads // arch.num_kv_heads * arch.head_dim
    hd = arch.head_dim
    qs, ks, vs = [], [], []
    for piece in pieces:
        tail = piece.shape[1:]
        grouped = piece.reshape(-1, per_group + 2 * hd, *tail)
        qs.append(grouped[:, :per_group].reshape(-1, *tail))
        ks.append(grouped[:, per_group : per_group + hd].reshape(-1, *tail))
        vs.append(grouped[:, per_group + hd :].reshape(-1, *tail))
    return [torch.cat(qs), torch.cat(ks), torch.cat(vs)]
