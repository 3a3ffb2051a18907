"""Checkpoint folder conventions (COMPLETE marker, auto resume) and RNG round trips."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from rlinf.core.checkpoint import (
    COMPLETE_MARKER,
    CheckpointCorruptError,
    find_latest_checkpoint,
    mark_complete,
    resolve_resume_dir,
    rng_state,
    set_rng_state,
    step_dir,
    verify_checkpoint,
)


def _save(root: Path, step: int, complete: bool = True) -> Path:
    path = step_dir(root, step)
    (path / "actor").mkdir(parents=True)
    (path / "actor" / "state.pt").write_bytes(bytes(range(256)) * (step + 1))
    (path / "runner.json").write_text(json.dumps({"global_step": step}))
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
    manifest = json.loads((root / "global_step_10" / COMPLETE_MARKER).read_text())
    assert manifest["step"] == 10
    assert sorted(manifest["files"]) == ["actor/state.pt", "runner.json"]
    assert manifest["files"]["actor/state.pt"]["bytes"] == 256 * 11


def test_damaged_newest_checkpoint_falls_back_with_auto(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "checkpoints"
    intact = _save(root, 5)
    newest = _save(root, 10)
    with (newest / "actor" / "state.pt").open("r+b") as f:
        f.truncate(100)  # a partial copy, a full disk, a bad sync
    with caplog.at_level(logging.WARNING, logger="rlinf"):
        assert resolve_resume_dir("auto", root) == intact
    warning = caplog.text
    assert "global_step_10" in warning and "actor/state.pt" in warning
    assert "has 100 bytes, 2816 were saved" in warning
    assert "falling back" in warning


def test_explicit_damaged_checkpoint_fails_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    path = _save(root, 4)
    data = bytearray((path / "actor" / "state.pt").read_bytes())
    data[7] ^= 0xFF  # same size, other bytes
    (path / "actor" / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"actor/state\.pt does not match the SHA-256"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointCorruptError, match=r"global_step_4.*actor/state\.pt.*resume_dir"):
        resolve_resume_dir(str(path), root)
    data[7] ^= 0xFF  # repaired ...
    (path / "actor" / "state.pt").write_bytes(bytes(data))
    verify_checkpoint(path)
    (path / "runner.json").unlink()  # ... and another file lost
    with pytest.raises(CheckpointCorruptError, match=r"runner\.json is missing"):
        resolve_resume_dir(str(path), root)
    assert find_latest_checkpoint(root) is None  # nothing intact: start fresh


def test_marker_of_an_older_version_is_trusted(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    path = _save(root, 3, complete=False)
    (path / COMPLETE_MARKER).write_text("3\n")  # before manifests
    assert resolve_resume_dir("auto", root) == path
    assert resolve_resume_dir(str(path), root) == path


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
