"""Scalar metrics to TensorBoard (default), wandb and swanlab, plus a one-line console summary.

Example:
    >>> with MetricLogger("logs", "ppo-run") as metrics:  # doctest: +SKIP
    ...     metrics.log({"train/loss": 0.1234, "time/step": 1.21}, step=12)
    2025-01-31 12:00:00 INFO step 12 | train: loss=0.1234 | time: step=1.21s

TensorBoard files go to ``log_path/experiment_name/tensorboard``. wandb and swanlab
are optional packages, imported only when named in ``backends``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from rlinf.core.logging import get_logger

if TYPE_CHECKING:
    from rlinf.core.config.schema import LoggerConfig

__all__ = ["BACKENDS", "MetricLogger", "MissingBackendError", "format_number"]

BACKENDS = ("tensorboard", "wandb", "swanlab")
"""Valid backend names, as in ``runner.logger.logger_backends``."""

_NAMESPACES = ("train", "eval", "env", "rollout", "time")
"""Console summary groups, in display order; other prefixes follow in first-seen order."""


class MissingBackendError(ImportError):
    """A metric backend is configured but its package is not installed."""

    def __init__(self, backend: str, package: str) -> None:
        super().__init__(
            f"logger_backends includes {backend!r} but the {package!r} package is not "
            f"installed; install it with `uv pip install {package}` or "
            f"`pip install 'rlinf-core[{package}]'`, or remove {backend!r} from "
            "runner.logger.logger_backends",
            name=package,
        )
        self.backend = backend
        self.package = package


def format_number(value: float) -> str:
    """Format a number compactly with 4 significant digits.

    Integers below one million print in full; otherwise the shorter of fixed and
    scientific notation wins (ties go to fixed): ``0.1234``, ``3e-4``, ``1.235e7``.

    Args:
        value: The number.

    Returns:
        The formatted number; ``nan``, ``inf`` and ``-inf`` as such.
    """
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    mantissa, exponent = f"{value:.3e}".split("e")
    scientific = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    fixed = f"{value:.4g}" if -4 <= int(exponent) < 4 else scientific
    return fixed if len(fixed) <= len(scientific) else scientific


def _to_float(key: str, value: object) -> float:
    """Convert a metric value to a float, or raise TypeError naming the key."""
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        shape = getattr(value, "shape", ())
        if tuple(shape) != ():
            raise TypeError(
                f"metric {key!r} must be a scalar, got {type(value).__name__} of shape "
                f"{tuple(shape)}; reduce it (e.g. .mean()) before logging"
            )
        value = value.item()
    if isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
        return float(value)
    raise TypeError(
        f"metric {key!r} must be a real number, got {type(value).__name__}: {value!r:.80}"
    )


def _summary_line(metrics: Mapping[str, float], step: int) -> str:
    """``step 12 | train: loss=0.1234 lr=3e-4 | time: step=1.21s``."""
    groups: dict[str, list[str]] = {name: [] for name in ("", *_NAMESPACES)}
    for key, value in metrics.items():
        group, sep, name = key.partition("/")
        if not sep:
            group, name = "", key
        text = format_number(value) + ("s" if group == "time" else "")
        groups.setdefault(group, []).append(f"{name}={text}")
    parts = [f"step {step}"]
    parts += [
        f"{g}: {' '.join(items)}" if g else " ".join(items) for g, items in groups.items() if items
    ]
    return " | ".join(parts)


def _plain_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-safe copy of the run config (paths and other objects become strings)."""
    result: dict[str, Any] = json.loads(json.dumps(dict(run_config), default=str))
    return result


class _Backend(Protocol):
    """What ``MetricLogger`` needs from a metric sink."""

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _drop_tensorboardx_nan_warning(record: logging.LogRecord) -> bool:
    """Filter for tensorboardX's per-value NaN warning; MetricLogger warns once per key."""
    return record.getMessage() != "NaN or Inf found in input tensor."


class _TensorBoardBackend:
    """Writes scalars with tensorboardX to ``experiment_dir/tensorboard``.

    tensorboardX writes from a background thread and its ``flush()`` does not
    wait for that thread's queue, so :meth:`flush` closes the writer (which
    drains the queue) and the next write opens a new event file in the same
    folder; TensorBoard reads the files of a folder as one run. Between
    flushes, events reach the disk within ``_FLUSH_SECS``.
    """

    _FLUSH_SECS = 5

    def __init__(self, experiment_dir: Path, run_config: dict[str, Any] | None) -> None:
        logging.getLogger("tensorboardX.x2num").addFilter(_drop_tensorboardx_nan_warning)
        self.log_dir = experiment_dir / "tensorboard"
        self._writer: Any = None
        self._opened = 0
        if run_config is not None:
            text = json.dumps(run_config, indent=2)
            # Indented lines render as a code block in TensorBoard's text (markdown) tab.
            self._open().add_text("run_config", "\n".join("    " + ln for ln in text.splitlines()))
        else:
            self._open()

    def _open(self) -> Any:
        if self._writer is None:
            from tensorboardX import SummaryWriter

            # Event files are named by second and host; the suffix keeps a reopened
            # writer (same second) from truncating the previous file.
            self._opened += 1
            self._writer = SummaryWriter(
                logdir=str(self.log_dir),
                flush_secs=self._FLUSH_SECS,
                filename_suffix=f".{os.getpid()}.{self._opened:06d}",  # sorts in order
            )
        return self._writer

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self._open()
        for key, value in metrics.items():
            writer.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        self.close()  # everything logged so far is on disk when this returns

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()


# The wandb and swanlab writers cannot be exercised in CI, where neither package is
# installed; the tests only check that a missing package raises MissingBackendError.
class _WandbBackend:
    """Logs to a wandb run; files under ``experiment_dir/wandb``."""

    def __init__(
        self, experiment_dir: Path, project: str, name: str, run_config: dict[str, Any] | None
    ) -> None:
        wandb = _import_backend("wandb", "wandb")
        experiment_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project, name=name, dir=str(experiment_dir), config=run_config
        )

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def flush(self) -> None:
        """Nothing to do: wandb syncs in the background."""

    def close(self) -> None:
        self._run.finish()


class _SwanLabBackend:
    """Logs to a swanlab experiment; files under ``experiment_dir/swanlab``."""

    def __init__(
        self, experiment_dir: Path, project: str, name: str, run_config: dict[str, Any] | None
    ) -> None:
        self._swanlab = _import_backend("swanlab", "swanlab")
        logdir = experiment_dir / "swanlab"
        logdir.mkdir(parents=True, exist_ok=True)  # swanlab requires an existing logdir
        self._swanlab.init(
            project=project, experiment_name=name, logdir=str(logdir), config=run_config
        )

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self._swanlab.log(dict(metrics), step=step)

    def flush(self) -> None:
        """Nothing to do: swanlab syncs in the background."""

    def close(self) -> None:
        self._swanlab.finish()


_PACKAGES = {"wandb": "wandb", "swanlab": "swanlab"}
"""Optional backends and the package each one needs."""


def _check_installed(backend: str, package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise MissingBackendError(backend, package)


def _import_backend(backend: str, package: str) -> ModuleType:
    _check_installed(backend, package)
    return importlib.import_module(package)


class MetricLogger:
    """Writes scalar metrics to every configured backend and summarizes them on the console.

    Args:
        log_path: Root folder for logs; this run writes under ``log_path/experiment_name``.
        experiment_name: The run's name (also the wandb/swanlab run name).
        project_name: The wandb/swanlab project.
        backends: Any of ``"tensorboard"``, ``"wandb"``, ``"swanlab"``; may be empty.
        run_config: The run's configuration, recorded once (TensorBoard text, wandb
            and swanlab config). Values that are not JSON types are stored as strings.
        console: Print a one-line summary through the ``rlinf.metrics`` logger.
        console_every: Print the summary only for steps that are multiples of this.

    Raises:
        ValueError: If a backend name is unknown or ``console_every < 1``.
        MissingBackendError: If ``wandb`` or ``swanlab`` is named but not installed.
    """

    def __init__(
        self,
        log_path: str | Path,
        experiment_name: str,
        project_name: str = "rlinf",
        backends: Sequence[str] = ("tensorboard",),
        run_config: Mapping[str, Any] | None = None,
        console: bool = True,
        console_every: int = 1,
    ) -> None:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(
                f"unknown metric backend(s) {unknown}; valid backends are {list(BACKENDS)}"
            )
        if console_every < 1:
            raise ValueError(f"console_every must be >= 1, got {console_every}")
        names = list(dict.fromkeys(backends))  # drop duplicates, keep order
        for name in names:  # fail before creating any files
            if name in _PACKAGES:
                _check_installed(name, _PACKAGES[name])

        self.experiment_dir = Path(log_path) / experiment_name
        self.backend_names = tuple(names)
        self.console = console
        self.console_every = console_every
        self._logger = get_logger("rlinf.metrics")
        self._warned_non_finite: set[str] = set()
        self._closed = False
        self._backends: list[_Backend] = []
        config = _plain_config(run_config) if run_config is not None else None
        try:
            for name in names:
                if name == "tensorboard":
                    self._backends.append(_TensorBoardBackend(self.experiment_dir, config))
                elif name == "wandb":
                    self._backends.append(
                        _WandbBackend(self.experiment_dir, project_name, experiment_name, config)
                    )
                else:
                    self._backends.append(
                        _SwanLabBackend(self.experiment_dir, project_name, experiment_name, config)
                    )
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(
        cls,
        cfg: LoggerConfig,
        run_config: Mapping[str, Any] | None = None,
        *,
        console: bool = True,
        console_every: int = 1,
    ) -> MetricLogger:
        """Build a logger from the ``runner.logger`` config section.

        Args:
            cfg: The logger config (path, project, experiment and backends).
            run_config: The whole run's config to record, e.g. ``cfg.model_dump(mode="json")``.
            console: See :class:`MetricLogger`.
            console_every: See :class:`MetricLogger`.

        Returns:
            The metric logger.
        """
        return cls(
            log_path=cfg.log_path,
            experiment_name=cfg.experiment_name,
            project_name=cfg.project_name,
            backends=cfg.logger_backends,
            run_config=run_config,
            console=console,
            console_every=console_every,
        )

    @property
    def tensorboard_dir(self) -> Path:
        """Where TensorBoard event files go: ``log_path/experiment_name/tensorboard``."""
        return self.experiment_dir / "tensorboard"

    def log(self, metrics: Mapping[str, object], step: int) -> None:
        """Write scalar metrics for one step to every backend.

        Args:
            metrics: Names to values: Python or numpy numbers, or 0-d arrays/tensors
                (anything with ``.item()``). Use ``train/``, ``eval/``, ``env/``,
                ``rollout/`` and ``time/`` prefixes to group them in the console summary.
            step: The global step.

        Raises:
            TypeError: If a value is not a real scalar; nothing is written then.
            RuntimeError: If the logger is closed.
        """
        if self._closed:
            raise RuntimeError("MetricLogger.log() called after close()")
        values = {key: _to_float(key, value) for key, value in metrics.items()}
        for key, value in values.items():
            if not math.isfinite(value) and key not in self._warned_non_finite:
                self._warned_non_finite.add(key)
                self._logger.warning(
                    "metric %r is %s at step %d; it is logged as-is "
                    "(further non-finite values of this metric are not reported)",
                    key,
                    value,
                    step,
                )
        for backend in self._backends:
            backend.log_scalars(values, step)
        if self.console and values and step % self.console_every == 0:
            self._logger.info(_summary_line(values, step))

    def flush(self) -> None:
        """Push buffered metrics to disk (TensorBoard) or the service."""
        for backend in self._backends:
            backend.flush()

    def close(self) -> None:
        """Flush and close every backend; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for backend in self._backends:
            try:
                backend.close()
            except Exception as exc:  # close the others before reporting
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
