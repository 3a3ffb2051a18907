"""Loading a Hugging Face safetensors checkpoint straight into this rank's Megatron shards.

What: :func:`load_hf_weights` fills every parameter of this rank's ``GPTModel``
(its tensor-parallel piece, its pipeline stage's layers) from the checkpoint
directory, one ``safetensors`` file or a sharded one with
``model.safetensors.index.json``.

Why: no offline conversion step; the actor starts from the same directory the
rollout engine loads. Each rank reads only its slices (``safe_open`` slices are
read lazily), so a rank's reading is about its share of the model.

Cost: reading this rank's share of the checkpoint once, plus the interleaving
copies of q/k/v and gate/up.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from rlinf.reasoning.megatron.hf_config import HFArchitecture
from rlinf.reasoning.megatron.hf_layout import rule_for, shard

__all__ = ["layer_offset", "load_hf_weights", "unwrap_model"]


class _LazyTensor:
    """A checkpoint tensor that reads only the part it is indexed with."""

    def __init__(self, handle: Any, name: str) -> None:
        self._slice = handle.get_slice(name)
        self.shape = torch.Size(self._slice.get_shape())

    def __getitem__(self, index: Any) -> torch.Tensor:
        part: torch.Tensor = self._slice[index]
        return part


@contextmanager
def _open_checkpoint(model_dir: Path) -> Iterator[dict[str, _LazyTensor]]:
    """Every tensor of the checkpoint in ``model_dir``, lazily, by HF name."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors checkpoint in {str(model_dir)!r}")
    with ExitStack() as stack:
        tensors: dict[str, _LazyTensor] = {}
        for file in files:
            handle = stack.enter_context(safe_open(str(model_dir / file), framework="pt"))
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                tensors[name] = _LazyTensor(handle, name)
        yield tensors


def unwrap_model(model: nn.Module) -> nn.Module:
    """The ``GPTModel`` inside Megatron's wrappers (DDP, Float16Module: ``.module``)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def layer_offset(model: nn.Module) -> int:
    """Global index of this pipeline stage's first decoder layer."""
    gpt: Any = unwrap_model(model)
    layers = gpt.decoder.layers
    return int(layers[0].layer_number) - 1 if len(layers) else 0


@torch.no_grad()
def load_hf_weights(
    model: nn.Module,
    model_dir: str | Path,
    arch: HFArchitecture,
    *,
    tp_rank: int,
    tp_size: int,
    padded_vocab: int,
) -> list[str]:
    """Copies this rank's piece of every HF tensor into ``model``'s parameters.

    Args:
        model: This rank's ``GPTModel`` (wrappers are looked through).
        model_dir: The ``save_pretrained`` directory.
        arch: Its architecture.
        tp_rank: This rank's tensor-parallel rank.
        tp_size: Tensor-parallel size.
        padded_vocab: The model's (padded) vocabulary size.

    Returns:
        The Megatron names of the parameters filled (all of them).

    Raises:
        KeyError: If the checkpoint lacks a tensor the model needs, or the model
            has a parameter the mapping does not know.
        ValueError: If a tensor's shape does not match the model's.
    """
    gpt = unwrap_model(model)
    offset = layer_offset(gpt)
    filled: list[str] = []
    with _open_checkpoint(Path(model_dir)) as tensors:
        for name, param in gpt.named_parameters():
            rule = rule_for(name, offset, arch.tie_word_embeddings)
            missing = [n for n in rule.hf_names if n not in tensors]
            if missing:
                raise KeyError(f"checkpoint {str(model_dir)!r} has no tensor {missing[0]!r}")
            full = [tensors[n] for n in rule.hf_names]
            piece = shard(rule.layout, full, arch, tp_rank, tp_size, padded_vocab)
            if piece.shape != param.shape:
                raise ValueError(
                    f"{rule.hf_names[0]}: rank {tp_rank} piece {tuple(piece.shape)} does not fit "
                    f"Megatron {name} {tuple(param.shape)}"
                )
            param.copy_(piece)
            filled.append(name)
    return filled
