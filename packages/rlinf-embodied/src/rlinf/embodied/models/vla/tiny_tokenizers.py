"""Tiny tokenizers in the real checkpoints' formats, trained in code (no hub access).

Real VLAs ship SentencePiece-style BPE tokenizers: OpenVLA a Llama 2 one
(``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, 256 byte-fallback tokens, ``▁`` for spaces,
plus a ``<PAD>`` added after the base vocabulary), pi0 PaliGemma's Gemma one
(``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, byte fallback). The
locked ``transformers`` builds both from a vocabulary and a merge list
(``LlamaTokenizer(vocab=..., merges=...)``, ``GemmaTokenizer(...)``), so a tiny
one is a BPE trained here on a small corpus (the instructions plus some common
words) and saved with ``save_pretrained``; ``AutoTokenizer`` then reloads it from
the model directory exactly as it would a downloaded checkpoint's. Byte
fallback means any string, including instructions never seen in training,
tokenizes without ``<unk>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GemmaTokenizer, LlamaTokenizer

__all__ = ["BASE_CORPUS", "build_gemma_tokenizer", "build_llama_tokenizer", "train_bpe"]

BASE_CORPUS = (
    "In: What action should the robot take to",
    "Out:",
    "pick up the cube and place it on the plate",
    "put the bowl in the drawer and close it",
    "open the top drawer of the cabinet",
    "push the button then turn on the stove",
    "move the object to the left of the right side",
    "grasp the yellow orange purple black white brown pink item",
    "stack a small large block onto another one near the table",
)
"""Sentences every tiny tokenizer is trained on besides the env's instructions."""

_BYTE_TOKENS = tuple(f"<0x{value:02X}>" for value in range(256))


def train_bpe(
    texts: Iterable[str], special_tokens: Sequence[str], vocab_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Trains a SentencePiece-style BPE (``▁`` spaces, byte fallback) on ``texts``.

    Args:
        texts: The training corpus.
        special_tokens: Tokens that take the first ids, in order (then the 256 byte tokens).
        vocab_size: Upper bound on the vocabulary size (at least specials + 256 + alphabet).

    Returns:
        ``(vocab, merges)`` in the form ``LlamaTokenizer``/``GemmaTokenizer`` accept.
    """
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token=special_tokens[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*special_tokens, *_BYTE_TOKENS],
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [
        (pair[0], pair[1]) if isinstance(pair, list) else tuple(pair.split(" ", 1))
        for pair in model["merges"]
    ]
    return dict(model["vocab"]), merges


def build_llama_tokenizer(
    instructions: Iterable[str], *, vocab_size: int = 512, pad_token: str = "<PAD>"
) -> LlamaTokenizer:
    """A Llama 2-format tokenizer (OpenVLA's), with ``pad_token`` added after the base vocabulary.

    Encoding prepends ``<s>`` (id 1), as OpenVLA's prompts expect.

    Args:
        instructions: Strings the vocabulary should cover well (others still encode, by bytes).
        vocab_size: Size of the trained base vocabulary (before the pad token).
        pad_token: The added padding token (OpenVLA adds ``<PAD>``).

    Returns:
        The tokenizer; ``save_pretrained(dir)`` writes ``tokenizer.json`` and its config.
    """
    vocab, merges = train_bpe([*BASE_CORPUS, *instructions], ("<unk>", "<s>", "</s>"), vocab_size)
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False)
    tokenizer.add_special_tokens({"pad_token": pad_token})
    return tokenizer


def build_gemma_tokenizer(instructions: Iterable[str], *, vocab_size: int = 512) -> GemmaTokenizer:
    """A Gemma-format tokenizer (PaliGemma's, hence pi0's): ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2.

    Args:
        instructions: Strings the vocabulary should cover well (others still encode, by bytes).
        vocab_size: Size of the trained vocabulary.

    Returns:
        The tokenizer; ``save_pretrained(dir)`` writes ``tokenizer.json`` and its config.
    """
    vocab, merges = train_bpe(
        [*BASE_CORPUS, *instructions], ("<pad>", "<eos>", "<bos>", "<unk>"), vocab_size
    )
    merge_list: Any = merges  # the class takes (left, right) pairs; its hint says strings
    return GemmaTokenizer(vocab=vocab, merges=merge_list)
