"""Free-form instructions carried in observations: ``obs["instruction_text"]``.

Observations travel as tensors, so an env that phrases its own instructions
(per episode, perturbed, or produced by the simulator) sends each env's text as
UTF-8 bytes, zero-padded: ``instruction_text`` ``[n, L]`` uint8. A language policy
reads it when present (and ``task_ids`` into ``EnvSpec.instructions`` otherwise),
so the text may be one nobody listed before training. It rides along in
``forward_inputs`` like any observation entry, so the actor reads what the
rollout read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["INSTRUCTION_TEXT_KEY", "decode_instruction_text", "encode_instruction_text"]

INSTRUCTION_TEXT_KEY = "instruction_text"
"""The observation key."""


def encode_instruction_text(texts: Sequence[str], length: int = 128) -> torch.Tensor:
    """UTF-8 bytes of each text, zero-padded to ``length``: ``[len(texts), length]`` uint8.

    Raises:
        ValueError: A text is longer than ``length`` bytes or contains a NUL character.
    """
    out = torch.zeros(len(texts), length, dtype=torch.uint8)
    for row, text in enumerate(texts):
        data = text.encode("utf-8")
        if len(data) > length or b"\x00" in data:
            raise ValueError(
                f"instruction {text[:40]!r}... is {len(data)} UTF-8 bytes (limit {length}) or "
                "contains NUL; shorten it or raise the length"
            )
        out[row, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_instruction_text(rows: torch.Tensor) -> list[str]:
    """The texts of an ``instruction_text`` tensor (``[n, L]`` uint8).

    Raises:
        ValueError: Not a 2-D uint8 tensor, or a row that is not UTF-8.
    """
    if rows.dtype != torch.uint8 or rows.ndim != 2:
        raise ValueError(
            f"obs['instruction_text'] must be uint8 [n, L] (UTF-8, zero-padded), got "
            f"{rows.dtype} {tuple(rows.shape)}"
        )
    texts = []
    for row in rows.cpu().numpy():
        texts.append(bytes(row).rstrip(b"\x00").decode("utf-8"))
    return texts
