"""Distributed helpers the actors of both stacks share: device, process group, clip-and-skip.

One rule for each, so the stacks cannot drift apart:

* **Device** (:func:`select_device`): the worker's CUDA device when the scheduler
  gave it one (``CUDA_VISIBLE_DEVICES`` set and not empty), else the CPU. A
  worker placed on a CPU slot of a GPU node stays on the CPU.
* **Process group** (:func:`init_process_group`): backend ``auto`` is NCCL on
  CUDA and gloo on the CPU; the collectives time out after ``timeout_s``
  (both actors pass ``runner.step_timeout_s``), so a hung peer fails the step
  with an error instead of blocking for torch's default of 10 to 30 minutes.
* **Clip and skip** (:func:`clip_and_step`): one gradient norm per optimizer
  param group (clipped when ``max_norm`` is set); when any norm is not finite
  the optimizer does not step (the gradients are dropped either way) and the
  caller counts the skipped step: both actors log ``actor/skipped_steps``.
  FSDP2-sharded gradients are measured and scaled on their local shards with
  one all-reduce for all groups (torch's ``clip_grad_norm_`` dispatches every
  op through ``DTensor`` and reduces once per group); other gradients go
  through ``clip_grad_norm_``.

Needs torch (the ``rl`` extra of rlinf-core).
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "clip_and_step",
    "full_tensor",
    "init_process_group",
    "reshard_fsdp",
    "select_device",
]


def select_device() -> torch.device:
    """This worker's device: its CUDA device when it was given one, else the CPU.

    Returns:
        ``cuda:<current>`` when CUDA is available and ``CUDA_VISIBLE_DEVICES`` names
        devices (the scheduler sets it for ranks placed on accelerators), else ``cpu``.
    """
    if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") != "":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_process_group(backend: str, device: torch.device, timeout_s: float) -> str:
    """Joins the default process group of this worker's group (a no-op if already joined).

    The scheduler sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.

    Args:
        backend: ``"auto"`` (NCCL on CUDA, gloo on the CPU), ``"nccl"`` or ``"gloo"``.
        device: The worker's device (from :func:`select_device`).
        timeout_s: Seconds a collective may wait for its peers before it fails.

    Returns:
        The backend in use.
    """
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return str(dist.get_backend())


def full_tensor(value: Any) -> Any:
    """The full tensor of a sharded ``DTensor`` (a collective); other values as they are."""
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


def clip_and_step(
    optimizer: torch.optim.Optimizer, max_norm: float | None, default_name: str = "actor"
) -> tuple[dict[str, float], bool]:
    """Clips each param group's gradient norm; steps the optimizer if every norm is finite.

    Every rank must call it (under FSDP the norm is a collective); all ranks then
    see the same norms and make the same decision. It does not zero the gradients.

    Args:
        optimizer: The optimizer whose param groups are clipped and stepped.
        max_norm: Clip each group's norm to this; ``None`` (or 0) only measures.
        default_name: Metric prefix of a param group without a ``name``.

    Returns:
        ``({"<group name>/grad_norm": norm before clipping, ...}, stepped)``; a group
        without gradients has norm 0.
    """
    bound = max_norm if max_norm else math.inf
    groups = optimizer.param_groups
    grads = [[p.grad for p in group["params"] if p.grad is not None] for group in groups]
    names = [f"{group.get('name', default_name)}/grad_norm" for group in groups]
    sharded = _sharded_grad_norms(grads)
    norms: dict[str, float] = {}
    if sharded is not None:  # one all-reduce for every group, on the local shards
        for name, group_grads, norm in zip(names, grads, sharded, strict=True):
            norms[name] = float(norm)
            if group_grads and math.isfinite(bound):
                coef = torch.clamp(bound / (norm + 1e-6), max=1.0)
                torch._foreach_mul_([g.to_local() for g in group_grads], coef)
    else:
        for name, group in zip(names, groups, strict=True):
            params = [p for p in group["params"] if p.grad is not None]
            norm = 0.0
            if params:
                norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, bound)))
            norms[name] = norm
    stepped = all(math.isfinite(n) for n in norms.values())
    if stepped:
        optimizer.step()
    return norms, stepped


def reshard_fsdp(model: torch.nn.Module) -> None:
    """Frees every FSDP2 unit's gathered parameters, so the next forward gathers the shards.

    Call it before an optimizer step. A unit with ``reshard_after_forward=False``
    stays gathered after a forward until a backward reshards it; after a
    no-grad forward (a logprob recomputation) nothing does, and the forward
    after the optimizer step would reuse the gathered copy of the weights
    from before the step. A no-op for units already resharded and for modules
    that are not FSDP2 units.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _sharded_grad_norms(grads: list[list[torch.Tensor]]) -> torch.Tensor | None:
    """Each list's gradient 2-norm, when all are FSDP2 shards (``DTensor``) of one 1-D mesh.

    Sums the squares of the local shards per list and all-reduces them at once:
    one collective for every param group and no ``DTensor`` dispatch
    (``clip_grad_norm_`` on ``DTensor`` gradients, measured with py-spy, made
    up a third of a two-rank PPO update of the CartPole MLP). ``None`` when
    the fast path does not apply (plain tensors, other placements or meshes,
    no gradients): the caller uses torch's own.
    """
    from torch.distributed.tensor import DTensor, Shard

    flat = [g for group in grads for g in group]
    if not flat or not all(isinstance(g, DTensor) for g in flat):
        return None
    meshes = {g.device_mesh for g in flat}  # type: ignore[attr-defined]
    if len(meshes) != 1:
        return None
    mesh = meshes.pop()
    if mesh.ndim != 1 or not all(
        isinstance(p, Shard)
        for g in flat
        for p in g.placements  # type: ignore[attr-defined]
    ):
        return None
    squares = []
    for group in grads:
        local = [g.to_local().float() for g in group]  # type: ignore[attr-defined]
        norms = torch._foreach_norm(local) if local else []
        squares.append(
            torch.stack(list(norms)).square().sum()
            if norms
            else torch.zeros((), device=flat[0].device)
        )
    total = torch.stack(squares)
    dist.all_reduce(total, group=mesh.get_group())
    return total.sqrt()
