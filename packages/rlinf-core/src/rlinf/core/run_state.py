"""What a checkpoint records about the run: a typed progress record and the config.

Both runners write the same two files into ``global_step_N/``, beside the
actor's state (:mod:`rlinf.core.train_state`) and before the ``COMPLETE``
marker:

- ``progress.pt``: a :class:`RunProgress` (global step, data cursor, env
  steps, restarts, the driver's RNG), written with ``torch.save``;
- ``config.yaml``: the run's config as it was validated.

On resume the keys that decide what a run computes (every ``seed``,
``global_batch_size``, ``rollout_batch_size``, ``n_minibatches``,
``group_size``, ``num_envs``, ``pipeline_stage_num`` and the ``cluster``
section, which sets the worker group sizes) are compared with the saved
config. A change is reported by name with both values and refused with
:class:`ConfigChangedError`, unless ``runner.allow_config_change`` is set, in
which case it is logged as a warning. Everything else (step budgets, intervals,
logging, timeouts, micro-batch sizes, which only split the same work) may
change freely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlinf.core.logging import get_logger

__all__ = [
    "CONFIG_FILE",
    "PROGRESS_FILE",
    "ConfigChangedError",
    "RunProgress",
    "config_changes",
    "load_run_state",
    "save_run_state",
]

PROGRESS_FILE = "progress.pt"
CONFIG_FILE = "config.yaml"
_WATCHED_NAMES = frozenset(
    {
        "seed",
        "global_batch_size",
        "rollout_batch_size",
        "n_minibatches",
        "group_size",
        "num_envs",
        "pipeline_stage_num",
    }
)
_log = get_logger("rlinf.checkpoint")


@dataclasses.dataclass
class RunProgress:
    """Where a run stands, as its driver saves it with every checkpoint.

    Attributes:
        global_step: Training steps done.
        restarts: Relaunches after a dead worker so far (``runner.max_restarts``).
        total_env_steps: Env steps taken (embodied runs; 0 elsewhere).
        data_cursor: The data sampler's state (reasoning runs; None elsewhere).
        rng: The driver's python/numpy/torch RNG states
            (:func:`rlinf.core.checkpoint.rng_state`).
    """

    global_step: int
    restarts: int = 0
    total_env_steps: int = 0
    data_cursor: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None


class ConfigChangedError(ValueError):
    """Resuming with a config whose run-defining keys differ from the checkpoint's."""


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _watched(path: str) -> bool:
    return path.startswith("cluster.") or path.rsplit(".", 1)[-1] in _WATCHED_NAMES


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Run-defining keys whose values differ, as ``"key: old -> new"`` lines.

    Args:
        saved: The checkpoint's config (nested mapping).
        current: This run's config (nested mapping).

    Returns:
        One line per changed, added or removed watched key, sorted by key.
    """
    old, new = _flatten(saved), _flatten(current)
    missing = object()
    lines = []
    for path in sorted(k for k in old.keys() | new.keys() if _watched(k)):
        before, after = old.get(path, missing), new.get(path, missing)
        if before != after:
            show = [("(unset)" if v is missing else repr(v)) for v in (before, after)]
            lines.append(f"{path}: {show[0]} -> {show[1]}")
    return lines


def save_run_state(path: Path, progress: RunProgress, config: BaseModel) -> None:
    """Writes ``progress.pt`` and ``config.yaml`` into the checkpoint folder ``path``."""
    import torch

    torch.save(dataclasses.asdict(progress), path / PROGRESS_FILE)
    dumped = config.model_dump(mode="json")
    (path / CONFIG_FILE).write_text(yaml.safe_dump(dumped, sort_keys=False))


def load_run_state(path: Path, config: BaseModel, *, allow_config_change: bool) -> RunProgress:
    """Reads the progress record of ``path`` after comparing its config with ``config``.

    Args:
        path: A ``global_step_N`` folder written by :func:`save_run_state`.
        config: This run's config.
        allow_config_change: Resume even if run-defining keys changed (warns).

    Returns:
        The saved progress.

    Raises:
        FileNotFoundError: If ``path`` has no progress record.
        ConfigChangedError: If run-defining keys changed and that is not allowed.
    """
    import torch

    progress_file = path / PROGRESS_FILE
    if not progress_file.is_file():
        raise FileNotFoundError(
            f"checkpoint {path} has no {PROGRESS_FILE}: it was not written by this version "
            "of rlinf (or not by a runner); resume from a checkpoint this version wrote"
        )
    config_file = path / CONFIG_FILE
    if config_file.is_file():
        saved = yaml.safe_load(config_file.read_text()) or {}
        changes = config_changes(saved, config.model_dump(mode="json"))
        if changes:
            listing = "\n  ".join(changes)
            if not allow_config_change:
                raise ConfigChangedError(
                    f"resuming from {path} with a changed config; these keys decide what the "
                    f"run computes and differ from the checkpoint's:\n  {listing}\n"
                    "Set them back, or set runner.allow_config_change=true to resume anyway."
                )
            _log.warning(
                "resuming from %s with changed keys (runner.allow_config_change):\n  %s",
                path,
                listing,
            )
    state = torch.load(progress_file, weights_only=False)
    known = {f.name for f in dataclasses.fields(RunProgress)}
    return RunProgress(**{k: v for k, v in state.items() if k in known})
