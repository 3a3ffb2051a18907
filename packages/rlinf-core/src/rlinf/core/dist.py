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

Needs torch (the ``rl`` extra of rlinf-core).
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["clip_and_step", "full_tensor", "init_process_group", "select_device"]


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
    norms: dict[str, float] = {}
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        norm = 0.0
        if params:
            norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, bound)))
        norms[f"{group.get('name', default_name)}/grad_norm"] = norm
    stepped = all(math.isfinite(n) for n in norms.values())
    if stepped:
        optimizer.step()
    return norms, stepped
