"""Online scaling of an FSDP2 actor: one re-sharding mechanism for both stacks.

An actor with online scaling keeps two copies of its training parts
(:class:`TrainParts`): the *base* ones, sharded over ranks ``0..base-1``, and the
*grown* ones, sharded over every rank; both are built once by the caller and
kept. :func:`setup_scaling` creates the process group and device meshes they
are sharded over (:class:`ScalingMeshes`); :func:`grow` copies the base ranks'
training state into the grown parts before a training phase and :func:`shrink`
copies it back after. What moves: parameters, AdamW state (moments and the 0-d
step counts), the param groups' hyper-parameters, the LR scheduler's state,
persistent buffers and small caller counters (``extra``). An optimizer that
has not stepped moves no state (the destination's is cleared): creating it, as
``get_optimizer_state_dict`` would, bumps the step counts and changes the first
update.

How (tensor collectives over flat buffers, one per dtype):

* growing, rank 0 pickles the small state (optimizer layout and step counts,
  param-group hyper-parameters, scheduler ``state_dict``, persistent buffers,
  ``extra``) and broadcasts it to every rank (one ``broadcast_object_list``);
  shrinking, every rank holds it already and takes its own;
* every source rank packs its FSDP2 shards (``Shard(0)`` over a 1-D mesh) of
  the parameters and moments into one flat buffer per dtype; rank 0 gathers
  them (one ``gather`` per dtype; nothing to gather from one rank);
* rank 0 packs each destination rank's rows (FSDP2's dim-0 chunks) into one
  flat buffer per dtype and scatters them (one ``scatter`` per dtype; a plain
  copy with one destination rank); each rank copies its rows into its shards.

Cost: about two messages of the full training state on rank 0 per move (its
peak memory is one full copy of parameters and moments), one shard's worth on
every other rank; a few collectives per dtype whatever the number of tensors.
On a GPU the grown parts wait in host memory between phases (:func:`park`).

Replicated state (data-parallel replicas that each hold whole tensors, as the
Megatron actor's CPU path) needs no re-sharding: :func:`replicate` broadcasts
one replica's state to the others (the same small state, then one flat
buffer per dtype).

Needs torch (the ``rl`` extra of rlinf-core).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf.core.optim import move_optimizer_state

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "ScalingMeshes",
    "TrainParts",
    "base_ranks",
    "check_phase",
    "grow",
    "park",
    "replicate",
    "require_state",
    "setup_scaling",
    "shrink",
]


@dataclasses.dataclass
class TrainParts:
    """One layout's training parts: the (FSDP2-wrapped) model, its optimizer and schedule.

    Attributes:
        model: The model; its parameters are DTensors sharded on dim 0 (FSDP2).
        optimizer: The optimizer over ``model``'s parameters.
        scheduler: The LR scheduler driving ``optimizer`` (``None``: none).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None


@dataclasses.dataclass
class ScalingMeshes:
    """The process group and device meshes of an actor with online scaling.

    Attributes:
        rank: This rank (in the default group).
        world_size: Every rank of the actor.
        base_world_size: The ranks ``0..base_world_size-1`` that hold the state
            between training phases.
        base_group: Their subgroup (``None`` on the other ranks, or without scaling).
        base_mesh: Their 1-D device mesh (``None`` likewise).
        world_mesh: The 1-D mesh over every rank (``None`` without scaling).
    """

    rank: int
    world_size: int
    base_world_size: int
    base_group: dist.ProcessGroup | None = None
    base_mesh: DeviceMesh | None = None
    world_mesh: DeviceMesh | None = None

    @property
    def scaling(self) -> bool:
        """Whether online scaling is on (fewer base ranks than ranks)."""
        return self.base_world_size < self.world_size

    @property
    def is_base(self) -> bool:
        """Whether this rank is a base rank."""
        return self.rank < self.base_world_size


def setup_scaling(base_world_size: int | None, device: torch.device) -> ScalingMeshes:
    """The base subgroup and both meshes; collective over the default group.

    Every rank calls it once, after ``init_process_group`` (``new_group`` and the
    world mesh are collectives of the default group). Without scaling
    (``base_world_size`` ``None`` or the world size) it creates nothing.

    Args:
        base_world_size: Ranks holding the state between phases (``None``: all).
        device: This rank's device (its type names the meshes' device type).

    Returns:
        The groups and meshes.

    Raises:
        ValueError: ``base_world_size`` is not an integer in ``1..world size``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    out = ScalingMeshes(rank, world, base_ranks(base_world_size, world))
    if not out.scaling:
        return out
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    group = dist.new_group(list(range(out.base_world_size)))
    out.world_mesh = init_device_mesh(device.type, (world,))
    if out.is_base:
        assert isinstance(group, dist.ProcessGroup)
        out.base_group = group
        out.base_mesh = DeviceMesh.from_group(group, device.type)
    return out


def base_ranks(base_world_size: int | None, world_size: int) -> int:
    """The number of base ranks, checked: ``base_world_size``, or every rank for ``None``.

    Raises:
        ValueError: It is not an integer in ``1..world_size``.
    """
    base = world_size if base_world_size is None else base_world_size
    if isinstance(base, bool) or not isinstance(base, numbers.Integral):
        raise ValueError(f"base_world_size={base!r} must be an integer (a number of ranks)")
    if not 1 <= int(base) <= world_size:
        raise ValueError(
            f"base_world_size={base} must be in 1..{world_size} (the actor's ranks); "
            "launch the group with fewer base ranks than ranks, or none"
        )
    return int(base)


def check_phase(method: str, rank: int, scaling: bool, grown: bool) -> None:
    """Raises unless an actor may run ``scale_up`` (not grown) or ``scale_down`` (grown).

    Args:
        method: ``"scale_up"`` or ``"scale_down"``.
        rank: The actor rank (for the message).
        scaling: Whether online scaling is on.
        grown: Whether the actor is grown now.

    Raises:
        RuntimeError: Without online scaling, or in the wrong phase.
    """
    up = method == "scale_up"
    if not scaling or grown == up:
        why = "already grown" if up else "not grown"
        raise RuntimeError(
            f"{method}() on actor rank {rank}: "
            + ("runner.online_scaling is off" if not scaling else why)
        )


def require_state(method: str, rank: int, base_world_size: int, holds: bool, what: str) -> None:
    """Raises unless this actor rank holds its training state now (``holds``).

    Args:
        method: The call that needs the state (for the message).
        rank: The actor rank.
        base_world_size: The base ranks (they hold the state between phases).
        holds: Whether this rank holds the state now.
        what: What the state is called in the message (``"policy"``, ``"model"``).

    Raises:
        RuntimeError: On an extra rank outside a training phase.
    """
    if not holds:
        raise RuntimeError(
            f"{method}() on extra actor rank {rank}: with runner.online_scaling only "
            f"the base ranks 0..{base_world_size - 1} hold the {what} between training "
            "phases; call it on those (WorkerGroup.execute_on) or after scale_up()"
        )


def park(parts: TrainParts, device: torch.device) -> None:
    """Moves ``parts``' model and optimizer state to ``device`` (host memory between phases)."""
    parts.model.to(device)
    move_optimizer_state(parts.optimizer, device)


def grow(
    meshes: ScalingMeshes,
    base: TrainParts | None,
    grown: TrainParts,
    device: torch.device,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Copies the base ranks' state into the grown parts; every rank calls it.

    On a GPU the grown parts are moved from host memory to ``device`` first.

    Args:
        meshes: From :func:`setup_scaling`.
        base: The base parts (base ranks), ``None`` on the other ranks.
        grown: The grown parts (every rank).
        device: This rank's training device.
        extra: Small picklable counters; rank 0's reach every rank.

    Returns:
        ``{"extra": rank 0's extra, "bytes": full state bytes, "seconds": wall time}``.
    """
    if device.type != "cpu":
        park(grown, device)
    return _move(
        base,
        meshes.base_group,
        meshes.base_world_size,
        grown,
        None,
        meshes.world_size,
        extra,
        broadcast=True,
    )


def shrink(
    meshes: ScalingMeshes,
    grown: TrainParts,
    base: TrainParts | None,
    device: torch.device,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Copies the grown parts' state back into the base parts; every rank calls it.

    The small state is the same on every rank and taken locally (no broadcast);
    the grown gradients are dropped; on a GPU the grown parts then wait in host
    memory until the next :func:`grow`.

    Args:
        meshes: From :func:`setup_scaling`.
        grown: The grown parts (every rank).
        base: The base parts (base ranks), ``None`` on the other ranks.
        device: This rank's training device.
        extra: Small picklable counters; rank 0's reach every rank.

    Returns:
        ``{"extra": rank 0's extra, "bytes": full state bytes, "seconds": wall time}``.
    """
    grown.optimizer.zero_grad(set_to_none=True)
    out = _move(
        grown,
        None,
        meshes.world_size,
        base,
        meshes.base_group,
        meshes.base_world_size,
        extra,
        broadcast=False,  # every rank holds the grown parts' small state already
    )
    if device.type != "cpu":
        park(grown, torch.device("cpu"))
    return out


def _move(
    src: TrainParts | None,
    src_group: dist.ProcessGroup | None,
    src_size: int,
    dst: TrainParts | None,
    dst_group: dist.ProcessGroup | None,
    dst_size: int,
    extra: dict[str, Any] | None,
    broadcast: bool,
) -> dict[str, Any]:
    start = time.perf_counter()
    rank = dist.get_rank()
    meta: dict[str, Any] | None = None
    if rank == 0 or not broadcast:
        if src is None:
            raise ValueError(f"online scaling: rank {rank} must hold the source parts")
        meta = _small_state(src, extra)
    if broadcast:
        box: list[Any] = [meta]
        dist.broadcast_object_list(box, src=0)
        meta = box[0]
    assert meta is not None
    fulls: list[torch.Tensor] | None = None
    nbytes = 0
    if src is not None:
        sources = _state_tensors(src.model, src.optimizer, meta["optim"], create=False)
        nbytes = sum(t.numel() * t.element_size() for t in sources)
        fulls = _gather_rows(sources, src_group, src_size, rank)
    if dst is not None:
        targets = _state_tensors(dst.model, dst.optimizer, meta["optim"], create=True)
        nbytes = sum(t.numel() * t.element_size() for t in targets)
        _scatter_rows(fulls, targets, dst_group, dst_size, rank)
        _load_small_state(dst, meta)
    del fulls
    return {"extra": meta["extra"], "bytes": nbytes, "seconds": time.perf_counter() - start}


def replicate(
    parts: TrainParts, group: dist.ProcessGroup, src: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Copies rank ``src``'s training state to every rank of ``group``; they all call it.

    For replicated state: data-parallel replicas that each hold whole tensors
    (the Megatron actor's CPU path, without the distributed optimizer). ``src``
    broadcasts the small state (as :func:`grow`), then the parameters and
    optimizer moments as one flat buffer per dtype.

    Args:
        parts: This rank's training parts (the same layout on every rank).
        group: The replicas' group.
        src: The global rank whose state the others take.
        extra: Small picklable counters; ``src``'s reach every rank.

    Returns:
        ``{"extra": src's extra, "bytes": state bytes, "seconds": wall time}``.
    """
    start = time.perf_counter()
    sender = dist.get_rank() == src
    box: list[Any] = [_small_state(parts, extra) if sender else None]
    dist.broadcast_object_list(box, src=src, group=group)
    meta: dict[str, Any] = box[0]
    tensors = _state_tensors(parts.model, parts.optimizer, meta["optim"], create=not sender)
    with torch.no_grad():
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            same = [t for t in tensors if t.dtype == dtype]
            if sender:
                flat = torch.cat([t.detach().reshape(-1) for t in same])
            else:
                numel = sum(t.numel() for t in same)
                flat = torch.empty(numel, dtype=dtype, device=same[0].device)
            dist.broadcast(flat, src=src, group=group)
            if not sender:
                for t, part in zip(same, torch.split(flat, [t.numel() for t in same]), strict=True):
                    t.copy_(part.view_as(t))
    if not sender:
        _load_small_state(parts, meta)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return {"extra": meta["extra"], "bytes": nbytes, "seconds": time.perf_counter() - start}


def _small_state(src: TrainParts, extra: dict[str, Any] | None) -> dict[str, Any]:
    """What moves pickled: optimizer layout, param-group values, schedule, buffers, ``extra``."""
    return {
        "optim": _optim_layout(src.model, src.optimizer),
        "param_groups": [
            {k: v for k, v in g.items() if k != "params"} for g in src.optimizer.param_groups
        ],
        "scheduler": None if src.scheduler is None else src.scheduler.state_dict(),
        "buffers": {n: b.detach().cpu().clone() for n, b in _persistent_buffers(src.model)},
        "extra": extra,
    }


def _load_small_state(dst: TrainParts, meta: dict[str, Any]) -> None:
    """Sets ``dst``'s buffers, param-group values and schedule from :func:`_small_state`."""
    with torch.no_grad():
        named = dict(_persistent_buffers(dst.model))
        for name, value in meta["buffers"].items():
            named[name].copy_(value)
    for g, saved in zip(dst.optimizer.param_groups, meta["param_groups"], strict=True):
        g.update(saved)
    if dst.scheduler is not None and meta["scheduler"] is not None:
        dst.scheduler.load_state_dict(meta["scheduler"])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a ``DTensor`` (FSDP2: ``Shard(0)``), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    if not callable(to_local):
        return tensor
    placements: tuple[Any, ...] = getattr(tensor, "placements", ())
    if len(placements) != 1 or not placements[0].is_shard(0):
        raise RuntimeError(
            f"online scaling re-shards FSDP2 tensors sharded on dim 0 over a 1-D mesh; got "
            f"placements {placements} for a tensor of shape {tuple(tensor.shape)}"
        )
    local: torch.Tensor = to_local()
    return local


def _rows(n: int, parts: int, index: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of dim 0 (size ``n``) in shard ``index`` of ``parts`` (FSDP2 chunks)."""
    size = -(-n // parts)
    lo = min(index * size, n)
    return lo, min(lo + size, n)


def _row_numel(shape: torch.Size, parts: int, index: int) -> int:
    if len(shape) == 0:
        return 1
    lo, hi = _rows(shape[0], parts, index)
    return (hi - lo) * math.prod(shape[1:])


def _optim_layout(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> list[dict[str, Any]] | None:
    """Per parameter (``named_parameters`` order): 0-d state values and moment names.

    ``None`` before the first step (then no state moves).
    """
    if not optimizer.state:
        return None
    out: list[dict[str, Any]] = []
    for name, param in model.named_parameters():
        scalars: dict[str, tuple[torch.Tensor, bool]] = {}
        sharded: list[str] = []
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                scalars[key] = (value.detach().cpu().clone(), value.device.type != "cpu")
            elif isinstance(value, torch.Tensor) and value.shape == param.shape:
                sharded.append(key)
            else:
                raise RuntimeError(
                    f"online scaling cannot re-shard optimizer state {key!r} of {name} "
                    f"({type(value).__name__}); only 0-d values and tensors shaped like the "
                    "parameter (AdamW's) are supported"
                )
        out.append({"scalars": scalars, "sharded": sorted(sharded)})
    return out


def _state_tensors(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    layout: list[dict[str, Any]] | None,
    create: bool,
) -> list[torch.Tensor]:
    """The parameters and optimizer state tensors in ``layout``'s order (each a shard).

    With ``create`` (a destination) the optimizer's state is made to match
    ``layout`` first: 0-d values set, missing moments created (zeros, filled by
    the caller), no state at all for ``None``.
    """
    params: list[torch.Tensor] = [p for _, p in model.named_parameters()]
    if layout is None:
        if create:
            optimizer.state.clear()
        return params
    if len(layout) != len(params):
        raise RuntimeError(
            f"online scaling: the optimizer layout has {len(layout)} parameters, the model "
            f"{len(params)}; build the base and grown parts with the same constructor"
        )
    out: list[torch.Tensor] = []
    for param, entry in zip(params, layout, strict=True):
        out.append(param)
        if not create:
            out.extend(optimizer.state[param][key] for key in entry["sharded"])
            continue
        if not entry["scalars"] and not entry["sharded"]:
            optimizer.state.pop(param, None)
            continue
        state = optimizer.state[param]
        for key, (value, on_device) in entry["scalars"].items():
            state[key] = value.to(_local(param).device) if on_device else value.clone()
        for key in entry["sharded"]:
            current = state.get(key)
            if not isinstance(current, torch.Tensor) or current.shape != param.shape:
                state[key] = torch.zeros_like(param, memory_format=torch.preserve_format)
            out.append(state[key])
    return out


def _gather_rows(
    sources: list[torch.Tensor], group: dist.ProcessGroup | None, size: int, rank: int
) -> list[torch.Tensor] | None:
    """Full tensors on rank 0 from every rank's shards (one ``gather`` per dtype).

    Args:
        sources: This rank's sharded tensors (the same list, in order, on every rank).
        group: The group they are sharded over, holding rank 0 (``None``: the default one).
        size: Its size.
        rank: This rank's index in it (the groups are ranks ``0..size-1``).

    Returns:
        The full tensors on rank 0 (detached views when ``size`` is 1), else ``None``.
    """
    locals_ = [_local(t).detach() for t in sources]
    if size == 1:
        return locals_
    shapes = [t.shape for t in sources]
    fulls: list[torch.Tensor | None] = [None] * len(sources)
    for dtype in sorted({t.dtype for t in locals_}, key=str):
        idx = [j for j, t in enumerate(locals_) if t.dtype == dtype]
        counts = [[_row_numel(shapes[j], size, d) for j in idx] for d in range(size)]
        width = max(1, max(sum(c) for c in counts))
        flat = torch.zeros(width, dtype=dtype, device=locals_[idx[0]].device)
        mine = torch.cat([locals_[j].reshape(-1) for j in idx])
        flat[: mine.numel()] = mine
        bufs = [torch.empty_like(flat) for _ in range(size)] if rank == 0 else None
        dist.gather(flat, bufs, dst=0, group=group)
        if bufs is None:
            continue
        pieces: list[list[torch.Tensor]] = [[] for _ in idx]
        for d, buf in enumerate(bufs):
            for k, part in enumerate(torch.split(buf[: sum(counts[d])], counts[d])):
                rest = shapes[idx[k]][1:]
                pieces[k].append(part.view(-1, *rest) if shapes[idx[k]] else part.view(()))
        for k, j in enumerate(idx):
            fulls[j] = torch.cat(pieces[k]) if shapes[j] else pieces[k][0]
    if rank != 0:
        return None
    return [f for f in fulls if f is not None]


def _scatter_rows(
    fulls: list[torch.Tensor] | None,
    targets: list[torch.Tensor],
    group: dist.ProcessGroup | None,
    size: int,
    rank: int,
) -> None:
    """Copies rank 0's full tensors into every rank's shards (one ``scatter`` per dtype).

    Args:
        fulls: The full tensors (rank 0), in ``targets``' order; else ``None``.
        targets: This rank's sharded tensors to overwrite (same list on every rank).
        group: The group they are sharded over, holding rank 0 (``None``: the default one).
        size: Its size.
        rank: This rank's index in it.
    """
    locals_ = [_local(t) for t in targets]
    with torch.no_grad():
        if size == 1:
            assert fulls is not None
            for dst, src in zip(locals_, fulls, strict=True):
                dst.copy_(src)
            return
        shapes = [t.shape for t in targets]
        for dtype in sorted({t.dtype for t in locals_}, key=str):
            idx = [j for j, t in enumerate(locals_) if t.dtype == dtype]
            counts = [[_row_numel(shapes[j], size, d) for j in idx] for d in range(size)]
            width = max(1, max(sum(c) for c in counts))
            device = locals_[idx[0]].device
            recv = torch.empty(width, dtype=dtype, device=device)
            bufs: list[torch.Tensor] | None = None
            if rank == 0:
                assert fulls is not None
                bufs = []
                for d in range(size):
                    parts = []
                    for j in idx:
                        full = fulls[j]
                        if shapes[j]:
                            lo, hi = _rows(shapes[j][0], size, d)
                            full = full[lo:hi]
                        parts.append(full.reshape(-1).to(device))
                    buf = torch.zeros(width, dtype=dtype, device=device)
                    mine = torch.cat(parts)
                    buf[: mine.numel()] = mine
                    bufs.append(buf)
            dist.scatter(recv, bufs, src=0, group=group)
            for k, part in enumerate(torch.split(recv[: sum(counts[rank])], counts[rank])):
                dst = locals_[idx[k]]
                if dst.numel() != part.numel():
                    raise RuntimeError(
                        f"online scaling: shard {rank}/{size} of a tensor of shape "
                        f"{tuple(shapes[idx[k]])} holds {dst.numel()} elements, expected "
                        f"{part.numel()} (FSDP2 dim-0 chunks)"
                    )
                dst.copy_(part.view_as(dst))


def _persistent_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``model``'s buffers that are in its state dict (FSDP2 does not shard them)."""
    out: list[tuple[str, torch.Tensor]] = []
    for prefix, module in model.named_modules():
        skip: set[str] = getattr(module, "_non_persistent_buffers_set", set())
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and name not in skip:
                out.append((f"{prefix}.{name}" if prefix else name, buf))
    return out
