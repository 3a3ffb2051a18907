"""Helpers shared by the reasoning workers: process setup, devices, the weight-sync message."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = [
    "WeightBucket",
    "load_tokenizer",
    "setup_torch_threads",
]


@dataclass
class WeightBucket:
    """One bucket of a weight sync: Hugging Face names and full (unsharded) tensors.

    Attributes:
        version: Weight version being synced (the global step the weights start).
        index: Position of this bucket, ``0..count-1``.
        count: Buckets in this sync.
        tensors: ``(name, tensor)`` pairs, CPU tensors.
    """

    version: int
    index: int
    count: int
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Payload bytes."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors)


def setup_torch_threads(threads: int) -> None:
    """Sets torch's intra-op threads of this process (0 keeps torch's default).

    Args:
        threads: Thread count; small models on a shared CPU run fastest on 1.
    """
    if threads > 0:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Loads a local tokenizer and checks it can pad.

    Args:
        path: Directory written by ``save_pretrained``.

    Returns:
        The tokenizer.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the tokenizer has no pad token (left padding needs one).
    """
    where = Path(path).expanduser()
    if not where.exists():
        raise FileNotFoundError(
            f"tokenizer path {str(where)!r} does not exist (actor.tokenizer_path, or "
            "actor.model_path when that is null); pass a local save_pretrained directory"
        )
    loaded: Any = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    tokenizer: PreTrainedTokenizerBase = loaded
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"the tokenizer in {str(where)!r} has no pad token, which batching needs; add one "
            "and save it again, e.g. tok.pad_token = tok.eos_token; tok.save_pretrained(path), "
            "or point actor.tokenizer_path at a tokenizer that has one"
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"the tokenizer in {str(where)!r} has no eos token, so responses could not end; "
            "set tok.eos_token and save it again"
        )
    return tokenizer
