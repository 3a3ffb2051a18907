"""Checkpoint folder conventions and RNG state, shared by every runner and actor.

A run writes ``<log_path>/<experiment_name>/checkpoints/global_step_N/``; the
runner writes the ``COMPLETE`` marker last, so a folder without it (a crash
mid-save) is never resumed from. ``runner.resume_dir`` takes such a folder,
``auto`` (the newest complete one, or a fresh start) or null.

The RNG helpers import torch when called (torch is the ``rl`` extra of
rlinf-core).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "COMPLETE_MARKER",
    "find_latest_checkpoint",
    "mark_complete",
    "resolve_resume_dir",
    "rng_state",
    "set_rng_state",
    "step_dir",
]

COMPLETE_MARKER = "COMPLETE"
"""File written last into a checkpoint folder; only folders that have it are resumed."""

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(checkpoint_root: Path, step: int) -> Path:
    """``checkpoint_root / f"global_step_{step}"``."""
    return checkpoint_root / f"global_step_{step}"


def mark_complete(path: Path, step: int) -> None:
    """Writes the ``COMPLETE`` marker (call after every file of the checkpoint is written)."""
    (path / COMPLETE_MARKER).write_text(f"{step}\n")


def find_latest_checkpoint(checkpoint_root: Path) -> Path | None:
    """The complete ``global_step_N`` folder with the largest N under ``checkpoint_root``.

    Args:
        checkpoint_root: ``log_path/experiment_name/checkpoints``.

    Returns:
        The folder, or None when there is no complete checkpoint (or no root).
    """
    if not checkpoint_root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in checkpoint_root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE_MARKER).is_file():
            step = int(match.group(1))
            if best is None or step > best[0]:
                best = (step, child)
    return None if best is None else best[1]


def resolve_resume_dir(
    resume_dir: str | Path | None, checkpoint_root: Path, key: str = "runner.resume_dir"
) -> Path | None:
    """Turns the ``resume_dir`` setting into the folder to resume from.

    Args:
        resume_dir: A ``global_step_N`` folder, ``"auto"`` or None.
        checkpoint_root: Where ``auto`` looks.
        key: The config key, for the error message.

    Returns:
        The folder, or None to start fresh (None given, or ``auto`` found nothing).

    Raises:
        FileNotFoundError: ``resume_dir`` is a path without the ``COMPLETE`` marker
            (missing, or a save that did not finish); the message names the key.
    """
    if resume_dir is None:
        return None
    if str(resume_dir) == "auto":
        return find_latest_checkpoint(checkpoint_root)
    path = Path(resume_dir).expanduser()
    if not (path / COMPLETE_MARKER).is_file():
        raise FileNotFoundError(
            f"{key}={str(resume_dir)!r} is not a complete checkpoint folder (no "
            f"{COMPLETE_MARKER} marker in it); pass a global_step_N folder under "
            f"{checkpoint_root}, 'auto' (newest complete one, else start fresh), or null"
        )
    return path


def rng_state(cuda: bool = True) -> dict[str, Any]:
    """The Python, numpy and torch RNG states of this process (and CUDA's).

    Args:
        cuda: Include the CUDA generators when a GPU is visible. Pass False in a
            process that should not touch the GPUs (a driver): reading them
            initialises CUDA there.
    """
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned.

    CUDA generators are restored when they were saved and a GPU is visible, for
    as many devices as both sides have (a resume may see fewer or more GPUs).
    """
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
