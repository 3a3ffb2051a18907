"""Checkpoint folder conventions, integrity checks and RNG state, shared by every runner and actor.

A run writes ``<log_path>/<experiment_name>/checkpoints/global_step_N/``; the
runner writes the ``COMPLETE`` marker last, so a folder without it (a crash
mid-save) is never resumed from. ``runner.resume_dir`` takes such a folder,
``auto`` (the newest intact one, or a fresh start) or null.

The marker is a small JSON manifest: the step and, for every other file of the
folder, its size and SHA-256. Resuming verifies them, so a checkpoint that was
damaged after it was written (a truncated or overwritten file, a file gone) is
named instead of failing deep inside ``torch.load``: with ``auto`` the runner
warns and falls back to the newest intact checkpoint; with an explicit path it
raises :class:`CheckpointCorruptError` naming the file. Hashing reads each file
once more after saving (SHA-256 runs at about 1.8 GB/s on one core here); a
marker written by an older version (the bare step number) is accepted without
verification.

The RNG helpers import torch when called (torch is the ``rl`` extra of
rlinf-core).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlinf.core.logging import get_logger

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointCorruptError",
    "find_latest_checkpoint",
    "mark_complete",
    "new_checkpoint",
    "resolve_resume_dir",
    "restart_resume_dir",
    "resume_from",
    "rng_state",
    "set_rng_state",
    "step_dir",
    "verify_checkpoint",
]

COMPLETE_MARKER = "COMPLETE"
"""File written last into a checkpoint folder; only folders that have it are resumed."""

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_MANIFEST_VERSION = 1
_HASH_CHUNK = 8 << 20
_log = get_logger("rlinf.checkpoint")


class CheckpointCorruptError(RuntimeError):
    """A complete checkpoint whose files no longer match the manifest written with them.

    Attributes:
        checkpoint: The ``global_step_N`` folder.
        file: The damaged file, relative to ``checkpoint``.
    """

    def __init__(self, checkpoint: Path, file: str, reason: str, hint: str = "") -> None:
        super().__init__(f"checkpoint {checkpoint} is damaged: {file} {reason}{hint}")
        self.checkpoint, self.file, self.reason = checkpoint, file, reason


def step_dir(checkpoint_root: Path, step: int) -> Path:
    """``checkpoint_root / f"global_step_{step}"``."""
    return checkpoint_root / f"global_step_{step}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _checkpoint_files(path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(path))
        for p in path.rglob("*")
        if p.is_file() and p.relative_to(path) != Path(COMPLETE_MARKER)
    )


def mark_complete(path: Path, step: int) -> None:
    """Writes the ``COMPLETE`` manifest (call after every file of the checkpoint is written).

    The manifest records the size and SHA-256 of every file under ``path``.

    Args:
        path: The ``global_step_N`` folder.
        step: Its global step.
    """
    files = {
        name: {"bytes": (path / name).stat().st_size, "sha256": _sha256(path / name)}
        for name in _checkpoint_files(path)
    }
    manifest = {"version": _MANIFEST_VERSION, "step": step, "files": files}
    tmp = path / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(path / COMPLETE_MARKER)  # atomic: a reader never sees half a manifest


def _read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a complete folder, or None for an old bare-step marker."""
    text = (path / COMPLETE_MARKER).read_text()
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointCorruptError(
            path, COMPLETE_MARKER, f"is not a valid manifest ({err})"
        ) from None
    if isinstance(manifest, int):  # written before manifests existed: "N\n"
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointCorruptError(path, COMPLETE_MARKER, "is not a valid manifest")
    return manifest


def verify_checkpoint(path: Path) -> None:
    """Checks every file of a complete checkpoint against its manifest.

    Args:
        path: A ``global_step_N`` folder with a ``COMPLETE`` marker.

    Raises:
        CheckpointCorruptError: A file is missing, has another size or another
            SHA-256 than when it was saved; the message names the file.
    """
    manifest = _read_manifest(path)
    if manifest is None:
        return
    for name, expected in sorted(manifest["files"].items()):
        file = path / name
        if not file.is_file():
            raise CheckpointCorruptError(path, name, "is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointCorruptError(
                path, name, f"has {size} bytes, {expected['bytes']} were saved"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointCorruptError(path, name, "does not match the SHA-256 saved with it")


def _complete_checkpoints(checkpoint_root: Path) -> list[Path]:
    """Complete ``global_step_N`` folders, newest (largest N) first."""
    if not checkpoint_root.is_dir():
        return []
    found = []
    for child in checkpoint_root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE_MARKER).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found, reverse=True)]


def find_latest_checkpoint(checkpoint_root: Path, verify: bool = True) -> Path | None:
    """The intact complete ``global_step_N`` folder with the largest N under ``checkpoint_root``.

    A newer checkpoint that fails :func:`verify_checkpoint` is skipped with a
    warning that names the damaged file.

    Args:
        checkpoint_root: ``log_path/experiment_name/checkpoints``.
        verify: Check files against the manifests (False: trust the markers).

    Returns:
        The folder, or None when there is no intact complete checkpoint (or no root).
    """
    for path in _complete_checkpoints(checkpoint_root):
        if not verify:
            return path
        try:
            verify_checkpoint(path)
        except CheckpointCorruptError as err:
            _log.warning("%s; falling back to an older checkpoint", err)
            continue
        return path
    return None


@contextlib.contextmanager
def new_checkpoint(checkpoint_root: Path, step: int) -> Iterator[Path]:
    """An empty ``global_step_N`` folder to write into, marked complete when the block ends.

    A folder of the same step is replaced. If the block raises, no marker is
    written, so the partial folder is never resumed from.

    Args:
        checkpoint_root: The run's ``checkpoints`` folder.
        step: The global step.

    Yields:
        The folder.
    """
    path = step_dir(checkpoint_root, step)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    yield path
    mark_complete(path, step)
    _log.info("saved checkpoint %s", path)


def resolve_resume_dir(
    resume_dir: str | Path | None, checkpoint_root: Path, key: str = "runner.resume_dir"
) -> Path | None:
    """Turns the ``resume_dir`` setting into the folder to resume from, verified.

    Args:
        resume_dir: A ``global_step_N`` folder, ``"auto"`` or None.
        checkpoint_root: Where ``auto`` looks.
        key: The config key, for the error message.

    Returns:
        The folder, or None to start fresh (None given, or ``auto`` found no
        intact checkpoint).

    Raises:
        FileNotFoundError: ``resume_dir`` is a path without the ``COMPLETE`` marker
            (missing, or a save that did not finish); the message names the key.
        CheckpointCorruptError: ``resume_dir`` is a path whose files do not match
            their manifest; the message names the file.
    """
    if resume_dir is None:
        return None
    if str(resume_dir) == "auto":
        found = find_latest_checkpoint(checkpoint_root)
        if found is None:
            _log.info(f"{key}=auto: no checkpoint in {checkpoint_root}, starting fresh")
        return found
    path = Path(resume_dir).expanduser()
    if not (path / COMPLETE_MARKER).is_file():
        raise FileNotFoundError(
            f"{key}={str(resume_dir)!r} is not a complete checkpoint folder (no "
            f"{COMPLETE_MARKER} marker in it); pass a global_step_N folder under "
            f"{checkpoint_root}, 'auto' (newest complete one, else start fresh), or null"
        )
    try:
        verify_checkpoint(path)
    except CheckpointCorruptError as err:
        raise CheckpointCorruptError(
            err.checkpoint,
            err.file,
            err.reason,
            hint=f" ({key}); pass an older global_step_N folder under {checkpoint_root}, "
            "or 'auto' to take the newest intact one",
        ) from None
    return path


def resume_from(
    resume_dir: str | Path | None, checkpoint_root: Path, load: Callable[[Path], object]
) -> Path | None:
    """Calls ``load`` with the folder ``resume_dir`` names (see :func:`resolve_resume_dir`).

    Returns:
        The folder loaded, or None (a fresh start).
    """
    path = resolve_resume_dir(resume_dir, checkpoint_root)
    if path is not None:
        load(path)
    return path


def restart_resume_dir(checkpoint_root: Path, configured: str | Path | None) -> str | Path | None:
    """Where a run relaunched after a dead worker resumes from.

    Args:
        checkpoint_root: The run's ``checkpoints`` folder.
        configured: ``runner.resume_dir`` as configured.

    Returns:
        The run's newest intact checkpoint; else ``configured`` (the run started
        from it and saved nothing since); else None (start again from step 0,
        with a warning).
    """
    latest = find_latest_checkpoint(checkpoint_root)
    if latest is not None:
        return latest
    if configured is None:
        _log.warning(
            "no checkpoint in %s: training starts again from step 0 "
            "(set runner.save_interval to lose fewer steps)",
            checkpoint_root,
        )
    return configured


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
