"""Turning prompt groups into padded actor tensors.

Layout (the actor's and the engine's shared convention): prompts left-padded
to ``P`` columns, responses right-padded after them to ``R`` columns, so every
response starts at column ``P``; the attention mask is 1 on real tokens; the
response mask ``[B, R]`` is true on generated tokens. Logprobs are aligned with
``input_ids[:, P:]`` (see :mod:`rlinf.reasoning.models.logprobs`).

Multi-turn (agent) responses interleave generated tokens with observation
tokens (tool responses): the observations stay in ``input_ids`` and the
attention mask (the model reads them) but are false in the response mask, so
no loss, ratio, KL or entropy term ever touches them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlinf.core.protocols.reasoning import RolloutResult

__all__ = [
    "PackedBatch",
    "Sample",
    "group_key",
    "pack_samples",
    "pad_rows",
    "response_logprobs",
]


@dataclass
class Sample:
    """One response with everything the loss needs (per-token tensors have its length).

    Attributes:
        prompt_ids: The prompt's token ids.
        response_ids: The response's token ids.
        rollout_logprobs: ``[L]`` float32 logprobs reported by the engine.
        old_logprobs: ``[L]`` float32 logprobs of the sampling policy used in the ratio
            (recomputed by the actor, or the engine's).
        advantages: ``[L]`` float32 advantages.
        reward: The response's reward.
        is_end: Whether it ended on a stop token.
        ref_logprobs: ``[L]`` float32 logprobs under the reference weights, when KL is on.
        generated_mask: ``L`` flags, false on observation tokens (multi-turn
            responses); None when the model generated every token.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    reward: float
    is_end: bool
    ref_logprobs: torch.Tensor | None = None
    generated_mask: list[bool] | None = None

    @property
    def response_length(self) -> int:
        """Generated tokens."""
        return len(self.response_ids)


@dataclass
class PackedBatch:
    """Padded tensors of a list of (prompt, response) pairs.

    Attributes:
        input_ids: ``[B, P + R]`` int64.
        attention_mask: ``[B, P + R]`` int64, 1 on real tokens.
        response_mask: ``[B, R]`` bool, true on response tokens.
        response_start: ``P``, the column where responses begin.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    response_start: int

    def to(self, device: torch.device) -> PackedBatch:
        """The same batch on ``device``."""
        return PackedBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.response_start,
        )


def pack_samples(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_token_id: int,
    generated_masks: Sequence[Sequence[bool] | None] | None = None,
) -> PackedBatch:
    """Pads ``(prompt_ids, response_ids)`` pairs into the actor layout.

    Args:
        pairs: At least one pair; responses may be empty (then all-masked).
        pad_token_id: Id written into padding (its value never matters: it is masked).
        generated_masks: Per pair, one flag per response token (false: an
            observation token, left out of the response mask), or None for a
            pair whose tokens were all generated.

    Returns:
        The padded batch (``R >= 1`` even if every response is empty).

    Raises:
        ValueError: If ``pairs`` is empty or a prompt is empty.
    """
    if not pairs:
        raise ValueError("cannot pack an empty list of responses")
    p = max(len(prompt) for prompt, _ in pairs)
    r = max(1, max(len(resp) for _, resp in pairs))
    ids = torch.full((len(pairs), p + r), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), p + r), dtype=torch.long)
    rmask = torch.zeros((len(pairs), r), dtype=torch.bool)
    for row, (prompt, resp) in enumerate(pairs):
        if not prompt:
            raise ValueError(f"response {row} has an empty prompt")
        ids[row, p - len(prompt) : p] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, p - len(prompt) : p + len(resp)] = 1
        if resp:
            ids[row, p : p + len(resp)] = torch.as_tensor(list(resp), dtype=torch.long)
            generated = None if generated_masks is None else generated_masks[row]
            if generated is None:
                rmask[row, : len(resp)] = True
            else:
                rmask[row, : len(resp)] = torch.as_tensor(list(generated), dtype=torch.bool)
    return PackedBatch(ids, mask, rmask, p)


def group_key(result: RolloutResult) -> tuple[int, int]:
    """Names one generated group by its content: ``(dataset index, hash of its token ids)``.

    The dataset index alone does not: with prefetch across an epoch boundary, or
    a stale group generated again, one prompt has several groups of one weight
    version in flight. Groups with equal keys have the same prompt and
    responses, so the same logprobs under the same weights. (Hashes of int
    tuples do not depend on ``PYTHONHASHSEED``: every process computes the same.)
    """
    tokens = (tuple(result.prompt_ids), tuple(tuple(ids) for ids in result.response_ids))
    return result.index, hash(tokens)


def pad_rows(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Right-pads 1-D float tensors with zeros into ``[len(rows), width]`` float32.

    Args:
        rows: 1-D tensors no longer than ``width``.
        width: Output columns.

    Returns:
        The padded matrix.
    """
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row.float()
    return out


def response_logprobs(
    model: torch.nn.Module,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_token_id: int,
    temperature: float,
    micro_batch_size: int,
    generated_masks: Sequence[Sequence[bool] | None] | None = None,
) -> list[torch.Tensor]:
    """Teacher-forced logprobs of each response under ``model`` (no grad).

    The actor's layout (:func:`pack_samples`) and token logprobs
    (``log_softmax(logits / temperature)``), ``micro_batch_size`` pairs per
    forward, on the model's device.

    Returns:
        One ``[len(response)]`` float32 CPU tensor per pair (0 on observation
        tokens, as the actor reports them).
    """
    from rlinf.reasoning.models import compute_token_logprobs

    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for i in range(0, len(pairs), micro_batch_size):
            chunk = pairs[i : i + micro_batch_size]
            masks = None if generated_masks is None else generated_masks[i : i + micro_batch_size]
            packed = pack_samples(chunk, pad_token_id, masks).to(device)
            lp = compute_token_logprobs(
                model,
                packed.input_ids,
                packed.attention_mask,
                response_start=packed.response_start,
                temperature=temperature,
                response_mask=packed.response_mask,
            )
            out += [lp[k, : len(resp)].float().cpu() for k, (_, resp) in enumerate(chunk)]
    return out
