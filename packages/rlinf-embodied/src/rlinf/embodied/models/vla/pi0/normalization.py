"""pi0's state and action normalisation, from openpi's ``norm_stats.json`` or our statistics file.

A pi0 checkpoint acts in a normalised space. Two files say how to map back:

* openpi's ``norm_stats.json``: ``{"norm_stats": {"state": {"mean", "std", "q01",
  "q99"}, "actions": {...}}}``; pi0 uses the mean/std (z-score) statistics;
* our ``dataset_statistics.json`` (:mod:`rlinf.embodied.models.vla.statistics`):
  ``{unnorm_key: {"action": {"q01", "q99", "mask", ...}, "proprio": {...}}}``,
  quantiles mapped onto ``[-1, 1]``, dimensions with a false ``mask`` unchanged.

Both are affine per dimension, ``normalized = (x - offset) / scale``, so one
module serves both (:class:`AffineNormalizer`); its tensors are non-persistent
buffers (the JSON file stays their source of truth).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from rlinf.embodied.models.vla.statistics import STATISTICS_FILE, resolve_unnorm_key

__all__ = ["NORM_STATS_FILE", "AffineNormalizer", "Pi0Statistics", "load_pi0_statistics"]

NORM_STATS_FILE = "norm_stats.json"
_EPS = 1e-6

Kind = Literal["mean_std", "quantile"]


class AffineNormalizer(nn.Module):
    """``normalized = (x - offset) / scale`` on the dimensions in ``mask``, identity elsewhere.

    Args:
        offset: ``[D]`` per-dimension offset.
        scale: ``[D]`` per-dimension scale (> 0).
        mask: ``[D]`` True where the map applies.
        clip: Clip normalised values to ``[-1, 1]`` (quantile statistics).
    """

    offset: Tensor
    scale: Tensor
    mask: Tensor

    def __init__(self, offset: Tensor, scale: Tensor, mask: Tensor, *, clip: bool) -> None:
        super().__init__()
        if not offset.shape == scale.shape == mask.shape or offset.ndim != 1:
            raise ValueError(
                f"normalisation statistics need equal 1-D shapes, got {tuple(offset.shape)}, "
                f"{tuple(scale.shape)}, {tuple(mask.shape)}"
            )
        self.register_buffer("offset", offset.float(), persistent=False)
        self.register_buffer("scale", scale.float(), persistent=False)
        self.register_buffer("mask", mask.bool(), persistent=False)
        self.clip = clip

    @classmethod
    def from_statistics(
        cls, stats: Mapping[str, Sequence[float]], kind: Kind, where: str
    ) -> AffineNormalizer:
        """Builds the map from a statistics block (``mean``/``std`` or ``q01``/``q99``).

        Raises:
            ValueError: The block lacks the fields ``kind`` needs (names them and ``where``).
        """
        needed = ("mean", "std") if kind == "mean_std" else ("q01", "q99")
        missing = [name for name in needed if name not in stats]
        if missing:
            raise ValueError(f"{where} lacks {missing}; {kind} normalisation needs {list(needed)}")
        a = torch.tensor(stats[needed[0]], dtype=torch.float32)
        b = torch.tensor(stats[needed[1]], dtype=torch.float32)
        if kind == "mean_std":
            offset, scale = a, b + _EPS
        else:
            offset, scale = (a + b) / 2, ((b - a) / 2).clamp_min(_EPS)
        mask = torch.tensor(stats.get("mask", [True] * len(a)), dtype=torch.bool)
        return cls(offset, scale, mask, clip=kind == "quantile")

    @property
    def dim(self) -> int:
        """Dimensions the statistics cover."""
        return int(self.offset.shape[0])

    def normalize(self, x: Tensor) -> Tensor:
        """``[..., D]`` raw values to the model's space (float32)."""
        x = x.float()
        y = (x - self.offset) / self.scale
        if self.clip:
            y = y.clamp(-1.0, 1.0)
        return torch.where(self.mask, y, x)

    def denormalize(self, y: Tensor) -> Tensor:
        """``[..., D]`` model-space values to raw units (float32)."""
        y = y.float()
        return torch.where(self.mask, y * self.scale + self.offset, y)


class Pi0Statistics(nn.Module):
    """The action map and, when the file has state statistics, the state map.

    Args:
        actions: Action normaliser.
        state: State normaliser, or None (states go in unchanged).
        source: Where they came from (for messages), e.g. ``norm_stats.json``.
    """

    def __init__(
        self, actions: AffineNormalizer, state: AffineNormalizer | None, source: str
    ) -> None:
        super().__init__()
        self.actions = actions
        self.state = state
        self.source = source


def load_pi0_statistics(directory: str | Path, unnorm_key: str | None) -> Pi0Statistics:
    """Reads ``norm_stats.json`` (openpi, preferred) or ``dataset_statistics.json``.

    Args:
        directory: The checkpoint directory.
        unnorm_key: The ``dataset_statistics.json`` entry (``actor.model.unnorm_key``;
            unused for ``norm_stats.json``, which holds one dataset).

    Returns:
        The normalisers.

    Raises:
        FileNotFoundError: Neither file exists.
        ValueError: A malformed file (names the file and the missing field).
    """
    root = Path(directory)
    openpi = root / NORM_STATS_FILE
    if openpi.is_file():
        data = json.loads(openpi.read_text())
        stats = data.get("norm_stats", data)
        if "actions" not in stats:
            raise ValueError(f"{openpi} has no 'actions' statistics (keys: {sorted(stats)})")
        actions = AffineNormalizer.from_statistics(
            stats["actions"], "mean_std", f"{openpi} actions"
        )
        state = (
            AffineNormalizer.from_statistics(stats["state"], "mean_std", f"{openpi} state")
            if "state" in stats
            else None
        )
        return Pi0Statistics(actions, state, NORM_STATS_FILE)
    ours = root / STATISTICS_FILE
    if not ours.is_file():
        raise FileNotFoundError(
            f"{root} has neither {NORM_STATS_FILE} (openpi) nor {STATISTICS_FILE}; a pi0 "
            "checkpoint needs action statistics to de-normalise its actions"
        )
    data = json.loads(ours.read_text())
    key = resolve_unnorm_key(list(data), unnorm_key)
    entry = data[key]
    if "action" not in entry:
        raise ValueError(f"{ours}: entry {key!r} has no 'action' statistics")
    actions = AffineNormalizer.from_statistics(
        entry["action"], "quantile", f"{ours} [{key}].action"
    )
    state = (
        AffineNormalizer.from_statistics(entry["proprio"], "quantile", f"{ours} [{key}].proprio")
        if "proprio" in entry
        else None
    )
    return Pi0Statistics(actions, state, f"{STATISTICS_FILE} [{key}]")
