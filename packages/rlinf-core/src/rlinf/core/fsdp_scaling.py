"""Moving a training state between two FSDP2 layouts of one model (online scaling).

Online scaling keeps two copies of the actor's training parts: the *base* ones,
sharded over the base ranks' device mesh, and the *grown* ones, sharded over
every rank's. :func:`move_train_state` copies parameters, buffers, optimizer
state (AdamW moments and step counts, any per-parameter state), the param
groups' hyper-parameters and the LR scheduler's state from one layout into the
other, in memory, without building anything: both sets of parts are built once
by the caller and kept.

How the tensors travel (all collectives, no pickled tensors):

* each tensor is gathered to its full value over the source mesh
  (``DTensor.full_tensor``: an all-gather among the ranks holding the source);
* when some rank of ``group`` holds no source (growing: the extra ranks), the
  full tensor is broadcast from the group's first rank (``dist.broadcast``);
* each destination rank keeps its shard (``distribute_tensor`` with
  ``src_data_rank=None``: a local slice, no communication) and copies it into
  the destination tensor in place.

Only the small metadata (names, shapes, dtypes, scalar step counts, param-group
hyper-parameters, the scheduler's ``state_dict``) goes once per call with
``broadcast_object_list``. Each rank briefly holds one full tensor at a time,
never the whole state. A source optimizer that has not stepped yet moves no
state (the destination's is cleared), so the first update after a move is the
same as without it.

Both layouts must come from the same constructor (same parameter names and
order, same optimizer param groups). Every rank of ``group`` calls
:func:`move_train_state`; the group's first rank must hold the source.

Needs torch (the ``rl`` extra of rlinf-core).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["TrainParts", "move_train_state"]


@dataclasses.dataclass
class TrainParts:
    """One layout's training parts: the (FSDP2-wrapped) model, its optimizer and schedule.

    Attributes:
        model: The model; its parameters are DTensors (FSDP2) or plain tensors.
        optimizer: The optimizer over ``model``'s parameters.
        scheduler: The LR scheduler driving ``optimizer`` (``None``: none).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None


def _is_dtensor(value: object) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of ``tensor`` (a collective over its mesh when it is a DTensor)."""
    if _is_dtensor(tensor):
        full: torch.Tensor = tensor.full_tensor()  # type: ignore[attr-defined]
        return full.detach()
    return tensor.detach()


@torch.no_grad()
def _copy_into(dst: torch.Tensor, full: torch.Tensor) -> None:
    """Copies this rank's shard of ``full`` into ``dst`` (a DTensor) or all of it (a tensor)."""
    if _is_dtensor(dst):
        from torch.distributed.tensor import distribute_tensor

        mesh, placements = dst.device_mesh, dst.placements  # type: ignore[attr-defined]
        dst.copy_(
            distribute_tensor(full.to(dst.device, dst.dtype), mesh, placements, src_data_rank=None)
        )
    else:
        dst.copy_(full.to(dst.device, dst.dtype))


def _comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """The device collectives of ``group`` take tensors on (CUDA for NCCL, else the CPU)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ordered_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(model.named_parameters()) + list(model.named_buffers())


def _metadata(src: TrainParts, extra: dict[str, Any] | None) -> dict[str, Any]:
    """What the destination ranks must know before the tensors arrive (no big tensors)."""
    states: list[dict[str, tuple[str, Any]]] = []
    for p in _ordered_params(src.optimizer):
        entry: dict[str, tuple[str, Any]] = {}
        for key, value in src.optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                entry[key] = ("sharded", (tuple(value.shape), value.dtype))
            elif isinstance(value, torch.Tensor):
                entry[key] = ("scalar", (value.detach().cpu().clone(), value.device.type))
            else:
                entry[key] = ("object", value)
        states.append(entry)
    return {
        "tensors": [(name, tuple(t.shape), t.dtype) for name, t in _tensors(src.model)],
        "states": states,
        "param_groups": [
            {k: v for k, v in g.items() if k != "params"} for g in src.optimizer.param_groups
        ],
        "scheduler": None if src.scheduler is None else src.scheduler.state_dict(),
        "extra": extra,
    }


def move_train_state(
    src: TrainParts | None,
    dst: TrainParts | None,
    *,
    group: dist.ProcessGroup | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Copies ``src``'s training state into ``dst``; collective over ``group``.

    Every rank of ``group`` calls it: ranks holding the source layout pass
    ``src``, ranks holding the destination pass ``dst`` (a rank may hold both,
    or only one). Growing from base ranks onto all: base ranks pass both, extra
    ranks ``src=None``. Shrinking back: every rank passes ``src`` (the grown
    parts), base ranks also ``dst``.

    Args:
        src: The parts holding the state now (``None`` on ranks without them).
        dst: The parts to load it into (``None`` on ranks that drop it).
        group: The process group spanning every rank of both layouts (default: world).
        extra: Small picklable facts the first rank sends along (step counters).

    Returns:
        ``{"extra": the first rank's extra, "bytes": full bytes moved per rank,
        "seconds": wall time}``.

    Raises:
        ValueError: The group's first rank holds no source, or the layouts differ
            (tensor names or param groups).
    """
    start = time.perf_counter()
    me = dist.get_rank(group)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    if me == 0 and src is None:
        raise ValueError(
            "move_train_state: the group's first rank must hold the source layout (src)"
        )
    device = _comm_device(group)
    missing = torch.tensor([0 if src is not None else 1], dtype=torch.int64, device=device)
    dist.all_reduce(missing, group=group)
    broadcast = int(missing.item()) > 0
    box: list[Any] = [_metadata(src, extra) if src is not None and me == 0 else None]
    dist.broadcast_object_list(box, src=root, group=group)
    meta: dict[str, Any] = box[0]
    if dst is not None:
        names = [name for name, _ in _tensors(dst.model)]
        if names != [name for name, _, _ in meta["tensors"]]:
            raise ValueError(
                "move_train_state: source and destination models differ (tensor names); "
                "build both layouts with the same constructor"
            )
        if len(dst.optimizer.param_groups) != len(meta["param_groups"]):
            raise ValueError(
                "move_train_state: source and destination optimizers have different param "
                "groups; build both with the same constructor"
            )
    moved = 0

    def move(
        src_t: torch.Tensor | None, dst_t: torch.Tensor | None, shape: Any, dtype: Any
    ) -> None:
        nonlocal moved
        full = _full(src_t) if src_t is not None else None
        if broadcast:
            if full is None:
                full = torch.empty(shape, dtype=dtype, device=device)
            else:
                full = full.to(device).contiguous()
            dist.broadcast(full, src=root, group=group)
        assert full is not None
        moved += full.numel() * full.element_size()
        if dst_t is not None:
            _copy_into(dst_t, full)
        del full

    src_tensors = _tensors(src.model) if src is not None else None
    dst_tensors = _tensors(dst.model) if dst is not None else None
    for i, (_, shape, dtype) in enumerate(meta["tensors"]):
        move(
            src_tensors[i][1] if src_tensors is not None else None,
            dst_tensors[i][1] if dst_tensors is not None else None,
            shape,
            dtype,
        )
    src_params = _ordered_params(src.optimizer) if src is not None else None
    dst_params = _ordered_params(dst.optimizer) if dst is not None else None
    for i, entry in enumerate(meta["states"]):
        src_state = src.optimizer.state.get(src_params[i], {}) if src and src_params else {}
        new: dict[str, Any] = {}
        dst_p = dst_params[i] if dst_params is not None else None
        old = dst.optimizer.state.get(dst_p, {}) if dst is not None and dst_p is not None else {}
        for key, (kind, payload) in entry.items():
            if kind == "sharded":
                shape, dtype = payload
                target = None
                if dst_p is not None:
                    target = old.get(key)
                    if not isinstance(target, torch.Tensor) or target.shape != dst_p.shape:
                        target = torch.zeros_like(dst_p.detach(), dtype=dtype)
                move(src_state.get(key), target, shape, dtype)
                new[key] = target
            elif kind == "scalar":
                value, device_type = payload
                on = "cpu" if device_type == "cpu" or dst_p is None else dst_p.device
                new[key] = value.clone().to(on)
            else:
                new[key] = payload
        if dst is not None and dst_p is not None:
            if new:
                dst.optimizer.state[dst_p] = new
            else:
                dst.optimizer.state.pop(dst_p, None)
    if dst is not None:
        for g, saved in zip(dst.optimizer.param_groups, meta["param_groups"], strict=True):
            g.update(saved)
        if dst.scheduler is not None and meta["scheduler"] is not None:
            dst.scheduler.load_state_dict(meta["scheduler"])
    return {"extra": meta["extra"], "bytes": moved, "seconds": time.perf_counter() - start}
