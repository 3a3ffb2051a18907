"""Running a Megatron ``GPTModel`` on the actor's padded batches, and its token logprobs.

What: :func:`pack_left` / :func:`unpack_left` move each row's real tokens to
column 0 and back; :func:`gpt_logits` runs the model on a left-padded batch
that way; :func:`vocab_parallel_token_logprobs` and :func:`gather_vocab_logits`
turn this rank's vocabulary shard of the logits into token logprobs or full
logits over the real vocabulary.

Why: Megatron's rotary embedding ignores ``position_ids`` (positions are
``0..T-1`` for every row), and its attention takes a causal mask. With the
real tokens moved to the front of each row, their positions are exactly the
HF positions (:func:`rlinf.reasoning.models.position_ids_from_attention_mask`)
and the causal mask alone keeps them from seeing padding, so no ``[B, T, T]``
mask is built. The logprobs follow :mod:`rlinf.reasoning.models.logprobs`:
``log_softmax(logits.float() / temperature)`` of the token; the padded
vocabulary columns are masked out so the softmax runs over the real
vocabulary, as in HF.

Cost: two row gathers of the batch (ids in, logits out); the logprobs do three
all-reduces of ``[B, T]`` over the TP group (Megatron's vocab-parallel cross
entropy) and never materialise the full vocabulary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel import (
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    vocab_parallel_cross_entropy,
)
from torch import nn

__all__ = [
    "gather_vocab_logits",
    "gpt_logits",
    "pack_left",
    "unpack_left",
    "vocab_parallel_entropy",
    "vocab_parallel_token_logprobs",
]


def _row_shift(attention_mask: torch.Tensor) -> torch.Tensor:
    """Leading padding columns of each row of a ``[B, T]`` mask."""
    real = attention_mask.bool()
    first = real.long().argmax(dim=1)
    return torch.where(real.any(dim=1), first, torch.zeros_like(first))


def _roll_rows(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Row ``b`` of ``x`` (``[B, T, ...]``) rolled left by ``shift[b]`` columns."""
    seq = x.shape[1]
    index = (torch.arange(seq, device=x.device).unsqueeze(0) + shift.unsqueeze(1)) % seq
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


def pack_left(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``x`` (``[B, T, ...]``) with each row's leading padding rolled to its end."""
    return _roll_rows(x, _row_shift(attention_mask))


def unpack_left(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_left`: columns back where ``attention_mask`` has them."""
    seq = x.shape[1]
    return _roll_rows(x, (seq - _row_shift(attention_mask)) % seq)


def gpt_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """This rank's vocabulary shard of the logits of a left-padded ``[B, T]`` batch.

    Real tokens must be contiguous in each row (left padding, then the prompt and
    response, then right padding). Single-stage models only; under pipeline
    parallelism, pack the ids with :func:`pack_left` in the forward step.

    Args:
        model: A ``GPTModel`` with ``pre_process`` and ``post_process``.
        input_ids: ``[B, T]`` token ids.
        attention_mask: ``[B, T]`` 1 on real tokens.

    Returns:
        ``[B, T, padded_vocab / tp]`` logits aligned with ``input_ids``
        (garbage at padding positions).
    """
    packed = pack_left(input_ids, attention_mask)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(packed)
    logits: torch.Tensor = model(packed, positions, attention_mask=None)
    return unpack_left(logits, attention_mask)


def _mask_padded_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``logits`` in float32, with the columns of padded vocabulary ids set to ``-inf``."""
    part = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * part
    x = logits.float()
    if start + part <= vocab_size:
        return x
    ids = torch.arange(start, start + part, device=logits.device)
    return x.masked_fill(ids >= vocab_size, float("-inf"))


def vocab_parallel_token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, vocab_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[token]`` from this rank's vocabulary shard.

    All ranks of the TP group must call it together. Differentiable.

    Args:
        logits: ``[..., padded_vocab / tp]`` this rank's logits.
        tokens: ``[...]`` token ids (< ``vocab_size``).
        vocab_size: The real vocabulary size (the rest is padding).
        temperature: Sampling temperature (> 0).

    Returns:
        ``[...]`` float32 log-probabilities.
    """
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    # A fresh tensor: Megatron's cross entropy works in place on its input.
    scaled = _mask_padded_vocab(logits, vocab_size) / temperature
    nll: torch.Tensor = vocab_parallel_cross_entropy(scaled, tokens.long())
    return -nll


def gather_vocab_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The full logits over the real vocabulary from every TP rank's shard (differentiable).

    Args:
        logits: ``[..., padded_vocab / tp]`` this rank's logits.
        vocab_size: The real vocabulary size.

    Returns:
        ``[..., vocab_size]`` logits, same dtype.
    """
    full: torch.Tensor = gather_from_tensor_model_parallel_region(logits)
    return full[..., :vocab_size]


def vocab_parallel_entropy(
    logits: torch.Tensor, vocab_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` over the real vocabulary, from shards.

    ``log S - (sum_k e_k z_k) / S`` with ``z`` the scaled logits shifted by their
    global maximum, ``e = exp(z)`` and ``S = sum_k e_k`` (the entropy of
    :func:`rlinf.core.algorithms.entropy_from_logits`). The two sums over the
    vocabulary are all-reduced over the TP group with Megatron's
    ``reduce_from_tensor_model_parallel_region`` (identity backward: what follows
    them is the same on every rank, so each shard gets its own gradient).
    Padded vocabulary columns contribute exactly 0, forward and backward.
    All ranks of the TP group must call it together. Differentiable.

    Args:
        logits: ``[..., padded_vocab / tp]`` this rank's logits.
        vocab_size: The real vocabulary size.
        temperature: Sampling temperature (> 0).

    Returns:
        ``[...]`` float32 entropies in nats.
    """
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    x = _mask_padded_vocab(logits, vocab_size) / temperature
    padded = torch.isinf(x)
    with torch.no_grad():
        top = x.max(dim=-1, keepdim=True).values
        if ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    z = (x - top).masked_fill(padded, 0.0)  # finite everywhere: no 0 * inf
    e = torch.exp(z).masked_fill(padded, 0.0)
    # Both sums are reduced before they are combined, so everything after the
    # reductions is the same on every rank and the identity backward is exact
    # (normalising the local terms by the global sum first would drop the other
    # ranks' terms from the gradient through that sum).
    total: torch.Tensor = reduce_from_tensor_model_parallel_region(e.sum(dim=-1))
    weighted: torch.Tensor = reduce_from_tensor_model_parallel_region((e * z).sum(dim=-1))
    return torch.log(total) - weighted / total
