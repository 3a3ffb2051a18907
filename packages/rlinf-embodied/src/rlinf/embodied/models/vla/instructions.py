"""The instruction tokenizer: a word-level ``tokenizers`` model built in code, and a prompt cache.

Tiny VLAs cannot ship a hub tokenizer (no network, millions of unused ids), so
the vocabulary is made from the env's own instruction strings: lower-cased
words and punctuation split on whitespace, plus ``[PAD]``, ``[UNK]`` and
``[BOS]``. It is saved as an ordinary ``tokenizer.json`` that
``AutoTokenizer.from_pretrained(model_dir)`` reloads offline, so a real
checkpoint's tokenizer would load through the very same call.

Envs send ``task_ids`` indices into ``EnvSpec.instructions`` instead of strings;
:func:`encode_instructions` tokenizes each instruction once, left-padded (the
last prompt position is then always a real token, which is where the token
VLA's value head reads), and refuses words the vocabulary does not know, since
an ``[UNK]`` would silently erase the task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "BOS_TOKEN",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "build_instruction_tokenizer",
    "encode_instructions",
    "instruction_words",
    "load_instruction_tokenizer",
]

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
BOS_TOKEN = "[BOS]"
_SPECIALS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN)


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Lowercase()


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Whitespace()


def instruction_words(instructions: Iterable[str]) -> list[str]:
    """The distinct words of ``instructions`` as the tokenizer splits them, in first-seen order."""
    normalizer, splitter = _normalizer(), _pre_tokenizer()
    words: dict[str, None] = {}
    for text in instructions:
        for word, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)):
            words.setdefault(word, None)
    return list(words)


def build_instruction_tokenizer(
    instructions: Iterable[str], extra_words: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose vocabulary covers ``instructions``.

    Ids: ``[PAD]`` 0, ``[UNK]`` 1, ``[BOS]`` 2, then the words in first-seen order.
    Encoding prepends ``[BOS]``; padding is on the left.

    Args:
        instructions: The task instructions the model will read.
        extra_words: More words to reserve ids for (e.g. held-out instructions).

    Returns:
        The tokenizer; ``save_pretrained(dir)`` writes ``tokenizer.json`` and
        ``tokenizer_config.json``.
    """
    words = instruction_words([*instructions, *extra_words])
    vocab = {token: index for index, token in enumerate([*_SPECIALS, *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.normalizer = _normalizer()
    backend.pre_tokenizer = _pre_tokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
    )


def load_instruction_tokenizer(directory: str | Path) -> PreTrainedTokenizerBase:
    """Loads the tokenizer saved in a model directory, offline.

    Raises:
        ValueError: The tokenizer has no pad token (left padding needs one).
    """
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"the tokenizer in {directory} has no pad token; add one (pad_token in "
            "tokenizer_config.json) so prompts can be left-padded"
        )
    return tokenizer


def encode_instructions(
    tokenizer: PreTrainedTokenizerBase, instructions: Sequence[str], max_length: int
) -> tuple[Tensor, Tensor]:
    """Tokenizes every instruction once, left-padded to ``max_length``.

    Args:
        tokenizer: The model's tokenizer.
        instructions: ``EnvSpec.instructions``.
        max_length: ``config.max_prompt_length``.

    Returns:
        ``input_ids`` and ``attention_mask``, both ``[len(instructions), max_length]`` int64.

    Raises:
        ValueError: An instruction has a word outside the vocabulary (named), or is
            longer than ``max_length`` tokens.
    """
    pad_id = int(tokenizer.pad_token_id)
    unk_id = tokenizer.unk_token_id
    ids = torch.full((len(instructions), max_length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(instructions), max_length), dtype=torch.long)
    for row, text in enumerate(instructions):
        encoding = tokenizer(text, return_offsets_mapping=True)
        tokens = list(encoding["input_ids"])
        offsets = list(encoding["offset_mapping"])
        unknown = [text[s:e] for tok, (s, e) in zip(tokens, offsets, strict=True) if tok == unk_id]
        if unknown:
            raise ValueError(
                f"instruction {text!r} has words the model's tokenizer does not know: "
                f"{unknown}; use a model whose vocabulary covers the env's instructions "
                "(make_tiny_vla --instructions ...) or rephrase the instruction"
            )
        if len(tokens) > max_length:
            raise ValueError(
                f"instruction {text!r} is {len(tokens)} tokens but the model's "
                f"max_prompt_length is {max_length}; shorten it or use a model with a "
                "larger max_prompt_length"
            )
        if tokens:
            ids[row, max_length - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, max_length - len(tokens) :] = 1
    return ids, mask
