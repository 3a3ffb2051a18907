"""Exporting this rank's Megatron parameters (or gradients) as full, HF-named tensors, by bucket.

What: :func:`iter_hf_buckets` walks this rank's ``GPTModel`` and yields lists
of ``(hf_name, full_tensor)``; each list is one bucket of about
``bucket_bytes`` of full tensors, gathered over the tensor-parallel group in one
collective. Under pipeline parallelism each stage yields its own layers, named
with their global layer index (and the embedding or LM head it holds).

Why: weight sync to the rollout engine (which loads HF names) and tests that
compare parameters or gradients with HF's. One ``all_gather`` per bucket
instead of one per parameter keeps the number of collectives small; the
bucket bounds the extra memory.

Cost: per bucket, one all-gather of the bucket's TP-sharded parameters over the
TP group (every rank of the group must iterate in step) and a copy to
re-interleave q/k/v and gate/up. Replicated parameters (norms) are not
gathered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from rlinf.reasoning.megatron.hf_config import HFArchitecture
from rlinf.reasoning.megatron.hf_layout import ParamRule, rule_for, unshard
from rlinf.reasoning.megatron.hf_load import layer_offset, unwrap_model

__all__ = ["count_hf_buckets", "export_hf_state_dict", "iter_hf_buckets"]


@dataclass
class _Entry:
    rule: ParamRule
    local: torch.Tensor

    @property
    def sharded(self) -> bool:
        return self.rule.layout != "full"


def _local_value(name: str, param: nn.Parameter, grads: bool) -> torch.Tensor:
    if not grads:
        return param.detach()
    grad = getattr(param, "main_grad", None)  # Megatron DDP accumulates here
    grad = param.grad if grad is None else grad
    if grad is None:
        raise ValueError(f"parameter {name} has no gradient to export")
    return grad.detach()


def _buckets(entries: list[_Entry], bucket_bytes: int, tp_size: int) -> Iterator[list[_Entry]]:
    bucket: list[_Entry] = []
    size = 0
    for entry in entries:
        nbytes = entry.local.numel() * entry.local.element_size()
        nbytes *= tp_size if entry.sharded else 1
        same_dtype = not bucket or bucket[0].local.dtype == entry.local.dtype
        if bucket and (size + nbytes > bucket_bytes or not same_dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(entry)
        size += nbytes
    if bucket:
        yield bucket


def _gather(
    bucket: list[_Entry], tp_size: int, group: dist.ProcessGroup | None
) -> list[list[torch.Tensor]]:
    """Every TP rank's piece of each sharded entry of ``bucket`` (one all-gather)."""
    sharded = [e for e in bucket if e.sharded]
    if tp_size == 1 or not sharded:
        return [[e.local] for e in sharded]
    flat = torch.cat([e.local.reshape(-1) for e in sharded])
    gathered = [torch.empty_like(flat) for _ in range(tp_size)]
    dist.all_gather(gathered, flat, group=group)
    pieces: list[list[torch.Tensor]] = [[] for _ in sharded]
    for rank_flat in gathered:
        start = 0
        for i, e in enumerate(sharded):
            n = e.local.numel()
            pieces[i].append(rank_flat[start : start + n].view_as(e.local))
            start += n
    return pieces


def _entries(model: nn.Module, arch: HFArchitecture, grads: bool) -> list[_Entry]:
    gpt = unwrap_model(model)
    offset = layer_offset(gpt)
    entries: list[_Entry] = []
    for name, param in gpt.named_parameters():
        rule = rule_for(name, offset, arch.tie_word_embeddings)
        if rule.exported:
            entries.append(_Entry(rule, _local_value(name, param, grads)))
    return entries


def count_hf_buckets(
    model: nn.Module, arch: HFArchitecture, *, bucket_bytes: int, tp_size: int = 1
) -> int:
    """How many buckets :func:`iter_hf_buckets` yields with these arguments (no collective)."""
    return sum(1 for _ in _buckets(_entries(model, arch, False), bucket_bytes, tp_size))


def iter_hf_buckets(
    model: nn.Module,
    arch: HFArchitecture,
    *,
    bucket_bytes: int,
    tp_size: int = 1,
    tp_group: dist.ProcessGroup | None = None,
    grads: bool = False,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """This rank's parameters (or gradients) as full HF-named tensors, one bucket at a time.

    Every rank of the tensor-parallel group must consume the generator in step
    (each bucket is a collective). Tensors of a bucket are fresh copies when TP
    gathered them, else views of the parameters: copy before changing them.

    Args:
        model: This rank's ``GPTModel`` (wrappers are looked through).
        arch: Its architecture.
        bucket_bytes: Bytes of full tensors per bucket (a larger tensor is a bucket alone).
        tp_size: Tensor-parallel size.
        tp_group: The tensor-parallel group (``None``: the default group).
        grads: Export gradients (``main_grad`` under Megatron DDP, else ``.grad``).

    Yields:
        Lists of ``(hf_name, tensor)``; vocabulary padding is dropped and the
        tied output layer of a last pipeline stage is skipped.
    """
    entries = _entries(model, arch, grads)
    for bucket in _buckets(entries, bucket_bytes, tp_size):
        pieces = iter(_gather(bucket, tp_size, tp_group))
        out: list[tuple[str, torch.Tensor]] = []
        for entry in bucket:
            full = (
                unshard(entry.rule.layout, next(pieces), arch) if entry.sharded else [entry.local]
            )
            out.extend(zip(entry.rule.hf_names, full, strict=True))
        yield out


def export_hf_state_dict(
    model: nn.Module,
    arch: HFArchitecture,
    *,
    tp_size: int = 1,
    tp_group: dist.ProcessGroup | None = None,
    grads: bool = False,
    bucket_bytes: int = 256 << 20,
) -> dict[str, torch.Tensor]:
    """All of :func:`iter_hf_buckets` in one dict (this pipeline stage's tensors)."""
    return {
        name: tensor
        for bucket in iter_hf_buckets(
            model, arch, bucket_bytes=bucket_bytes, tp_size=tp_size, tp_group=tp_group, grads=grads
        )
        for name, tensor in bucket
    }
