"""Config sections that rlinf-core owns: the base model, ``runner`` and ``runner.logger``.

Every package contributes its own sections by subclassing these models (for
example an embodied ``RunnerConfig`` adds ``task_type``) and registering its
top-level schema under the ``rlinf.config_schemas`` entry-point group.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LoggerBackend = Literal["tensorboard", "wandb", "swanlab"]

_DEFAULT_LOG_INTERVAL = 10
"""Steps between console summary lines when neither ``log_interval`` nor eval is set."""


def _default_backends() -> list[LoggerBackend]:
    return ["tensorboard"]


def rename_deprecated_key(data: Any, section: str, old: str, new: str) -> Any:
    """Maps a section's old key to its new name, with a ``DeprecationWarning``.

    For a ``@model_validator(mode="before")`` of the section's model: a config
    that sets ``old`` keeps working; one that sets both keys is refused.

    Args:
        data: The section's raw input (left as is unless a dict holding ``old``).
        section: The section's dotted path, for the messages (e.g. ``algorithm``).
        old: The deprecated key.
        new: The key that replaces it.

    Returns:
        ``data``, with ``old`` moved to ``new`` when it was set.

    Raises:
        ValueError: Both ``old`` and ``new`` are set.
    """
    if not isinstance(data, dict) or old not in data:
        return data
    if new in data:
        raise ValueError(f"{section}.{old} is the old name of {section}.{new}: set only {new}")
    warnings.warn(
        f"{section}.{old} is deprecated; use {section}.{new}", DeprecationWarning, stacklevel=2
    )
    data = dict(data)
    data[new] = data.pop(old)
    return data


class RLinfModel(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class LoggerConfig(RLinfModel):
    """Where metrics and logs go (``runner.logger``)."""

    log_path: Path = Field(
        Path("logs"), description="Root folder for logs, metrics and checkpoints."
    )
    project_name: str = Field("rlinf", min_length=1, description="Project name for wandb/swanlab.")
    experiment_name: str = Field(
        "default", min_length=1, description="Run name; outputs go to log_path/experiment_name."
    )
    logger_backends: list[LoggerBackend] = Field(
        default_factory=_default_backends,
        description="Metric sinks: any of tensorboard, wandb, swanlab.",
    )

    @property
    def experiment_dir(self) -> Path:
        """``log_path/experiment_name``: the root of everything this run writes."""
        return self.log_path / self.experiment_name


class RunnerConfig(RLinfModel):
    """The training loop's schedule (``runner``)."""

    max_epochs: int = Field(1, ge=1, description="Passes over the data (embodied: training steps).")
    max_steps: int = Field(-1, ge=-1, description="Cap on global steps; -1 means no cap.")
    seed: int = Field(1234, ge=0, description="Global seed for python, numpy and torch.")
    logger: LoggerConfig = Field(default_factory=LoggerConfig)  # type: ignore[arg-type]
    save_interval: int = Field(-1, ge=-1, description="Checkpoint every k steps; -1 disables.")
    val_check_interval: int = Field(-1, ge=-1, description="Evaluate every k steps; -1 disables.")
    log_interval: int | None = Field(
        None,
        description="Without a terminal (CI, a log file), print a one-line summary of every "
        "metric each k steps and at the last; null means val_check_interval, or "
        f"{_DEFAULT_LOG_INTERVAL} when evaluation is off. On a terminal a progress bar shows "
        "the main numbers instead.",
    )
    resume_dir: Path | Literal["auto"] | None = Field(
        None, description="Checkpoint folder to resume from, 'auto' for the latest, or null."
    )
    allow_config_change: bool = Field(
        False,
        description="Resume even if seeds, batch sizes or group sizes differ from the "
        "checkpoint's config (the changes are logged); false refuses such a resume.",
    )
    max_restarts: int = Field(
        0,
        ge=0,
        description="Relaunch the groups and resume from the newest checkpoint this many "
        "times when a worker dies; 0 ends the run at the first death.",
    )
    freeze_gc_heap: bool = Field(
        False,
        description="Once the workers are set up, freeze every object then alive (imports, "
        "envs, models) out of Python's cyclic garbage collector in the driver and every "
        "worker process (gc.freeze), so its full passes walk only newer objects; costs one "
        "full collection per process. Opt-in: its benchmark gain is within the noise.",
    )

    @property
    def summary_interval(self) -> int:
        """Steps between console summary lines: ``log_interval`` with its default resolved."""
        if self.log_interval is not None:
            return self.log_interval
        if self.val_check_interval > 0:
            return self.val_check_interval
        return _DEFAULT_LOG_INTERVAL

    @model_validator(mode="after")
    def _check_intervals(self) -> RunnerConfig:
        if self.log_interval is not None and self.log_interval < 1:
            raise ValueError(
                f"runner.log_interval={self.log_interval} is not allowed: use a positive "
                "number of steps, or null to log every runner.val_check_interval steps"
            )
        for key in ("max_steps", "save_interval", "val_check_interval"):
            if getattr(self, key) == 0:
                raise ValueError(
                    f"runner.{key}=0 is not allowed: "
                    "use a positive number of steps, or -1 to disable"
                )
        save, val = self.save_interval, self.val_check_interval
        if save > 0 and val > 0 and save % val != 0:
            raise ValueError(
                f"runner.save_interval ({save}) must be a multiple of "
                f"runner.val_check_interval ({val}) so that every "
                "checkpoint has eval metrics; "
                f"e.g. set save_interval={val * max(1, round(save / val))}"
            )
        return self


class CoreConfig(RLinfModel):
    """Top-level schema of rlinf-core: just ``runner``. Packages extend it with their sections."""

    runner: RunnerConfig = Field(default_factory=RunnerConfig)  # type: ignore[arg-type]
