"""Checkpoint folder conventions (COMPLETE marker, auto resume) and RNG round trips."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from rlinf.core.checkpoint import (
    COMPLETE_MARKER,
    find_latest_checkpoint,
    mark_complete,
    resolve_resume_dir,
    rng_state,
    set_rng_state,
    step_dir,
)


def _save(root: Path, step: int, complete: bool = True) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    if complete:
        mark_complete(path, step)
    return path


def test_latest_ignores_incomplete_and_foreign_folders(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert find_latest_checkpoint(root) is None  # no root yet
    _save(root, 2)
    _save(root, 10)  # numeric, not lexicographic: 10 > 9
    _save(root, 9)
    _save(root, 12, complete=False)  # a crash mid-save
    (root / "global_step_99_tmp").mkdir()
    (root / "notes").mkdir()
    assert find_latest_checkpoint(root) == root / "global_step_10"
    assert (root / "global_step_10" / COMPLETE_MARKER).read_text() == "10\n"


def test_resolve_resume_dir(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert resolve_resume_dir(None, root) is None
    assert resolve_resume_dir("auto", root) is None  # nothing saved yet: start fresh
    saved = _save(root, 3)
    assert resolve_resume_dir("auto", root) == saved
    assert resolve_resume_dir(str(saved), root) == saved
    half = _save(root, 4, complete=False)
    with pytest.raises(FileNotFoundError, match=r"runner\.resume_dir=.*global_step_4.*COMPLETE"):
        resolve_resume_dir(half, root)
    with pytest.raises(FileNotFoundError, match=r"my\.key='/nope'.*'auto'"):
        resolve_resume_dir("/nope", root, key="my.key")


def test_rng_round_trip() -> None:
    torch = pytest.importorskip("torch")
    state = rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    set_rng_state(state)
    again = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    assert again == first


def test_rng_state_without_cuda_leaves_the_gpus_alone() -> None:
    """A driver saves its RNG with cuda=False: no CUDA generator is read (or initialised)."""
    torch = pytest.importorskip("torch")
    state = rng_state(cuda=False)
    assert "cuda" not in state
    set_rng_state(state)
    if not torch.cuda.is_available():
        assert "cuda" not in rng_state()
