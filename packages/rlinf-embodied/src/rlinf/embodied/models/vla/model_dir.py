"""What both VLA policies do with a checkpoint directory: find it, and copy its side files.

A VLA policy loads ``actor.model.model_path`` (``config.json``, weights, tokenizer,
processor config, statistics) and its ``save_pretrained`` writes a directory that
loads the same way: the weights are written fresh, the other files are copied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlinf.embodied.models.config import PolicyConfig

__all__ = ["copy_side_files", "require_model_path"]


def require_model_path(cfg: PolicyConfig, what: str, make_hint: str) -> Path:
    """``cfg.model_path`` as a directory with a ``config.json``.

    Args:
        cfg: The policy config.
        what: The directory's kind, for messages (e.g. ``"a pi0 checkpoint directory"``).
        make_hint: How to make a tiny one (e.g. ``"make-tiny-vla --kind pi0 --out DIR"``).

    Raises:
        ValueError: ``model_path`` is unset or has no ``config.json`` (names the key and the fix).
    """
    if cfg.model_path is None:
        raise ValueError(
            f"actor.model.model_path is not set; model_type {cfg.model_type!r} loads {what}. "
            f"Set actor.model.model_path to one (make a tiny one with `{make_hint}`)"
        )
    path = Path(cfg.model_path)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"actor.model.model_path={str(path)!r} has no config.json; point it at {what}"
        )
    return path


def copy_side_files(source: Path, out: Path) -> None:
    """Copies ``source``'s files except ``config.json`` and the weights into ``out``.

    Weights are ``*.safetensors`` and a sharded checkpoint's ``*.index.json``: the
    caller writes them fresh, and a stale index would point at shards that are not
    there. Nothing happens when ``out`` is ``source``.
    """
    if out.resolve() == source.resolve():
        return
    for item in source.iterdir():
        weights = item.suffix == ".safetensors" or item.name.endswith(".index.json")
        if item.is_file() and item.name != "config.json" and not weights:
            shutil.copy2(item, out / item.name)
