"""Action statistics (``dataset_statistics.json``) and the normaliser built from them.

VLA checkpoints predict actions in a normalised space ``[-1, 1]``; the file
beside the weights says, per dataset (``unnorm_key``), how to map back::

    {unnorm_key: {"action": {"q01": [...], "q99": [...], "min": [...], "max": [...],
                             "mask": [...]}}}

``x in [-1, 1]`` becomes ``low + (x + 1) / 2 * (high - low)`` with ``(low, high)``
= ``(q01, q99)`` by default (``min``/``max`` on request); dimensions whose
``mask`` is false (grippers, typically) pass through unchanged. Picking the
wrong dataset silently ruins every action, so a missing or ambiguous key is an
error that lists the keys the file has.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "STATISTICS_FILE",
    "ActionNormalizer",
    "load_action_normalizer",
    "read_model_json",
    "resolve_unnorm_key",
    "write_dataset_statistics",
]

STATISTICS_FILE = "dataset_statistics.json"

Bounds = Literal["q99", "min_max"]
_FIELDS = ("q01", "q99", "min", "max", "mask")


def read_model_json(directory: str | Path, name: str, hint: str) -> tuple[Path, Any]:
    """``(path, parsed content)`` of the JSON file ``name`` in a VLA model directory.

    Raises:
        FileNotFoundError: The file is missing (the message names it and ends with ``hint``).
    """
    path = Path(directory) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; a VLA model directory needs {name} {hint}")
    return path, json.loads(path.read_text())


def resolve_unnorm_key(available: Sequence[str], unnorm_key: str | None) -> str:
    """Picks the statistics entry to use.

    ``None`` picks the only entry; a key that is missing falls back to
    ``<key>_no_noops`` when that exists (the OpenVLA naming of filtered datasets).

    Args:
        available: Keys of ``dataset_statistics.json``.
        unnorm_key: The requested key (``actor.model.unnorm_key``).

    Returns:
        The key to use.

    Raises:
        ValueError: The key is missing, or None while the file has several entries.
    """
    keys = sorted(available)
    if unnorm_key is None:
        if len(keys) == 1:
            return keys[0]
        raise ValueError(
            f"{STATISTICS_FILE} has {len(keys)} entries {keys}; set actor.model.unnorm_key "
            "to the one the model should de-normalise actions with"
        )
    if unnorm_key in keys:
        return unnorm_key
    if f"{unnorm_key}_no_noops" in keys:
        return f"{unnorm_key}_no_noops"
    raise ValueError(
        f"actor.model.unnorm_key={unnorm_key!r} is not in {STATISTICS_FILE}; available "
        f"keys: {keys}. Set actor.model.unnorm_key to one of them"
    )


class ActionNormalizer(nn.Module):
    """Maps actions between ``[-1, 1]`` and env units, per dimension.

    The bounds are non-persistent buffers, so they follow ``.to(device)`` without
    entering checkpoints (the JSON file is their source of truth).

    Args:
        low: ``[A]`` lower bounds (``q01`` or ``min``).
        high: ``[A]`` upper bounds (``q99`` or ``max``).
        mask: ``[A]`` True for dimensions to (de-)normalise, False to pass through.
    """

    low: Tensor
    high: Tensor
    mask: Tensor

    def __init__(self, low: Tensor, high: Tensor, mask: Tensor) -> None:
        super().__init__()
        if not low.shape == high.shape == mask.shape or low.ndim != 1:
            raise ValueError(
                f"action statistics need equal 1-D shapes, got low {tuple(low.shape)}, "
                f"high {tuple(high.shape)}, mask {tuple(mask.shape)}"
            )
        self.register_buffer("low", low.float(), persistent=False)
        self.register_buffer("high", high.float(), persistent=False)
        self.register_buffer("mask", mask.bool(), persistent=False)

    @property
    def action_dim(self) -> int:
        """Dimensions ``A`` the statistics cover."""
        return int(self.low.shape[0])

    def denormalize(self, normalized: Tensor) -> Tensor:
        """``[..., A]`` values in ``[-1, 1]`` to env units (float32)."""
        x = normalized.float()
        scaled = self.low + (x + 1.0) * 0.5 * (self.high - self.low)
        return torch.where(self.mask, scaled, x)

    def normalize(self, actions: Tensor, clip: bool = True) -> Tensor:
        """``[..., A]`` env actions to ``[-1, 1]`` (clipped unless ``clip`` is False), float32."""
        a = actions.float()
        span = (self.high - self.low).clamp_min(1e-8)
        scaled = 2.0 * (a - self.low) / span - 1.0
        if clip:
            scaled = scaled.clamp(-1.0, 1.0)
        return torch.where(self.mask, scaled, a)


def load_action_normalizer(
    directory: str | Path, unnorm_key: str | None, bounds: Bounds = "q99"
) -> tuple[str, ActionNormalizer]:
    """Reads ``dataset_statistics.json`` and builds the normaliser of one entry.

    Args:
        directory: The model directory.
        unnorm_key: Entry to use (see :func:`resolve_unnorm_key`).
        bounds: ``q99`` (q01/q99, the default) or ``min_max``.

    Returns:
        The resolved key and the normaliser.

    Raises:
        FileNotFoundError: No statistics file.
        ValueError: Bad key (lists the available ones) or malformed entry.
    """
    path, data = read_model_json(directory, STATISTICS_FILE, "to de-normalise actions")
    key = resolve_unnorm_key(list(data), unnorm_key)
    entry = data[key].get("action")
    if not isinstance(entry, Mapping):
        raise ValueError(f"{path}: entry {key!r} has no 'action' statistics")
    low_name, high_name = ("q01", "q99") if bounds == "q99" else ("min", "max")
    missing = [name for name in (low_name, high_name) if name not in entry]
    if missing:
        raise ValueError(f"{path}: entry {key!r} lacks action statistics {missing}")
    low = torch.tensor(entry[low_name], dtype=torch.float32)
    high = torch.tensor(entry[high_name], dtype=torch.float32)
    mask = torch.tensor(entry.get("mask", [True] * len(low)), dtype=torch.bool)
    return key, ActionNormalizer(low, high, mask)


def write_dataset_statistics(
    directory: str | Path, statistics: Mapping[str, Mapping[str, Sequence[float | bool]]]
) -> Path:
    """Writes ``dataset_statistics.json`` with one ``action`` block per dataset key.

    Args:
        directory: The model directory.
        statistics: ``{unnorm_key: {q01, q99, min, max, mask}}``.

    Returns:
        The written path.

    Raises:
        ValueError: A block lacks one of the five fields.
    """
    payload: dict[str, dict[str, dict[str, list[float | bool]]]] = {}
    for key, block in statistics.items():
        missing = [name for name in _FIELDS if name not in block]
        if missing:
            raise ValueError(f"statistics[{key!r}] lacks {missing}; give all of {list(_FIELDS)}")
        payload[key] = {"action": {name: list(block[name]) for name in _FIELDS}}
    path = Path(directory) / STATISTICS_FILE
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
