"""Helpers shared by the reasoning workers: process setup, tokenizer loading."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlinf.core.weight_sync import WeightBucket

__all__ = [
    "WeightBucket",  # re-exported from rlinf.core.weight_sync
    "load_tokenizer",
    "setup_torch_threads",
]


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
