r"""pi0's prompt: camera placeholders, ``<bos>``, the cleaned instruction and a newline.

PaliGemma (pi0's VLM) reads ``[image tokens] <bos> task \n``: one
``image_token_id`` placeholder per SigLIP patch of each present camera, which
the model swaps for the camera features, then the instruction. openpi cleans
the instruction first (strip, ``_`` and newlines to spaces). Prompts are
right-padded to a fixed length, so the prefix of a row never depends on what it
is batched with (rollout and actor then compute identical numbers).

:class:`PromptCache` tokenizes each distinct instruction string once, with the
checkpoint's own tokenizer (whatever ``AutoTokenizer`` loads from the model
directory), so an env may send an instruction the model never saw.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_PROMPT_LENGTH", "PromptCache", "clean_instruction"]

DEFAULT_PROMPT_LENGTH = 48
"""Text tokens per prompt when the tokenizer names no ``model_max_length`` (lerobot's 48)."""


def clean_instruction(text: str) -> str:
    """Openpi's cleaning: strip, and turn ``_`` and newlines into spaces."""
    return text.strip().replace("_", " ").replace("\n", " ")


class PromptCache:
    r"""Token ids and masks of ``[image tokens] <bos> instruction \n`` per instruction string.

    Args:
        tokenizer: The checkpoint's tokenizer (needs a BOS and a pad token).
        image_token_id: The VLM's ``image_token_id``.
        image_tokens: Placeholders per prompt (patches per camera x cameras).
        text_length: Text positions after the placeholders (``<bos>`` included).

    Raises:
        ValueError: The tokenizer has no BOS or pad token.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        image_token_id: int,
        image_tokens: int,
        text_length: int,
    ) -> None:
        if tokenizer.bos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError(
                f"the pi0 tokenizer needs a BOS and a pad token, got bos={tokenizer.bos_token!r}, "
                f"pad={tokenizer.pad_token!r}; use PaliGemma's tokenizer (or one in its format)"
            )
        self.tokenizer = tokenizer
        self.image_token_id = image_token_id
        self.image_tokens = image_tokens
        self.text_length = text_length
        self._cache: dict[str, tuple[Tensor, Tensor]] = {}

    @property
    def length(self) -> int:
        """Prompt positions ``P``."""
        return self.image_tokens + self.text_length

    def encode(self, text: str) -> tuple[Tensor, Tensor]:
        """``(ids, mask)``, both ``[P]`` int64, of one instruction (cached).

        Raises:
            ValueError: The instruction is longer than ``text_length`` tokens.
        """
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        words = self.tokenizer(clean_instruction(text) + "\n", add_special_tokens=False)
        tokens = [int(self.tokenizer.bos_token_id), *(int(i) for i in words["input_ids"])]
        if len(tokens) > self.text_length:
            raise ValueError(
                f"instruction {text!r} is {len(tokens)} tokens with <bos> and newline, more than "
                f"the model's prompt length {self.text_length} (the tokenizer's model_max_length); "
                "shorten the instruction or raise model_max_length in tokenizer_config.json"
            )
        ids = torch.full((self.length,), int(self.tokenizer.pad_token_id), dtype=torch.long)
        mask = torch.zeros(self.length, dtype=torch.long)
        ids[: self.image_tokens] = self.image_token_id
        end = self.image_tokens + len(tokens)
        ids[self.image_tokens : end] = torch.tensor(tokens, dtype=torch.long)
        mask[:end] = 1
        self._cache[text] = (ids, mask)
        return ids, mask

    def batch(self, texts: Sequence[str], device: torch.device) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)``, both ``[len(texts), P]``, on ``device``."""
        pairs = [self.encode(text) for text in texts]
        ids = torch.stack([pair[0] for pair in pairs]).to(device)
        mask = torch.stack([pair[1] for pair in pairs]).to(device)
        return ids, mask
