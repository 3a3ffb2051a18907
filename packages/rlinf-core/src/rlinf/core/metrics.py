"""Scalar metrics to TensorBoard (default), wandb and swanlab, plus a one-line console summary.

Example:
    >>> with MetricLogger("logs", "ppo-run") as metrics:  # doctest: +SKIP
    ...     metrics.log({"train/loss": 0.1234, "time/step": 1.21}, step=12)
    2025-01-31 12:00:00 INFO step 12 | train: loss=0.1234 | time: step=1.21s

TensorBoard files go to ``log_path/experiment_name/tensorboard``. wandb and swanlab
are optional packages, imported only when named in ``backends``; their offline modes
(``WANDB_MODE=offline``, ``SWANLAB_MODE=offline``) write runs that can be synced later.

TensorBoard writer: tensorboardX's synchronous ``EventsWriter``, not torch's or tensorboard's
``SummaryWriter``, which would make torch (~1 GB) or tensorboard (~50 MB with its
dependencies) core requirements; every ``log()`` is on disk when it returns.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import math
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from rlinf.core.closing import ClosesOnExit
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


_WRITER_IDS = itertools.count(1)
"""Numbers this process's event files; see ``_TensorBoardBackend``."""


class _TensorBoardBackend:
    """Writes scalars to an event file in ``experiment_dir/tensorboard``.

    Events go straight to the file (no background thread or queue) and every
    ``log_scalars`` call ends with a flush, so what was logged is readable as soon
    as the call returns.
    """

    def __init__(self, experiment_dir: Path, run_config: dict[str, Any] | None) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import text

        self._event: Any = Event
        self._summary: Any = Summary
        self.log_dir = experiment_dir / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Event files are named by second and host and opened with "wb"; the suffix
        # keeps another writer started in the same second from truncating this one.
        self._writer: Any = EventsWriter(
            str(self.log_dir / "events"), filename_suffix=f".{os.getpid()}.{next(_WRITER_IDS):06d}"
        )
        if run_config is not None:
            config_text = json.dumps(run_config, indent=2)
            # Indented lines render as a code block in TensorBoard's text (markdown) tab.
            indented = "\n".join("    " + ln for ln in config_text.splitlines())
            self._write(text("run_config", indented), step=0)
        self._writer.flush()

    def _write(self, summary: Any, step: int) -> None:
        self._writer.write_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        if not metrics:
            return
        values = [self._summary.Value(tag=key, simple_value=v) for key, v in metrics.items()]
        self._write(self._summary(value=values), step)
        self._writer.flush()

    def flush(self) -> None:
        """Nothing to do: every ``log_scalars`` call ends with a flush."""

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()


class _HostedBackend:
    """A wandb or swanlab backend: both write in the background, and ``close()`` waits."""

    _sink: Any  # what ``log`` and ``finish`` are called on: a wandb run, the swanlab module

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self._sink.log(dict(metrics), step=step)

    def flush(self) -> None:
        """Nothing to do: the library writes in the background; close() waits."""

    def close(self) -> None:
        self._sink.finish()


class _WandbBackend(_HostedBackend):
    """Logs to a wandb run; files under ``experiment_dir/wandb``.

    ``WANDB_MODE=offline`` writes the run to ``wandb/offline-run-*/run-*.wandb`` for
    ``wandb sync``.
    """

    def __init__(
        self, experiment_dir: Path, project: str, name: str, run_config: dict[str, Any] | None
    ) -> None:
        wandb = _import_backend("wandb", "wandb")
        experiment_dir.mkdir(parents=True, exist_ok=True)
        self._sink = wandb.init(
            project=project, name=name, dir=str(experiment_dir), config=run_config
        )


class _SwanLabBackend(_HostedBackend):
    """Logs to a swanlab experiment; files under ``experiment_dir/swanlab``.

    ``SWANLAB_MODE=offline`` writes the run to ``swanlab/run-*/run-*.swanlab`` for
    ``swanlab sync``.
    """

    def __init__(
        self, experiment_dir: Path, project: str, name: str, run_config: dict[str, Any] | None
    ) -> None:
        self._sink = _import_backend("swanlab", "swanlab")
        logdir = experiment_dir / "swanlab"
        logdir.mkdir(parents=True, exist_ok=True)  # swanlab requires an existing logdir
        self._sink.init(
            project=project, experiment_name=name, logdir=str(logdir), config=run_config
        )


_PACKAGES = {"wandb": "wandb", "swanlab": "swanlab"}
"""Optional backends and the package each one needs."""


def _check_installed(backend: str, package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise MissingBackendError(backend, package)


def _import_backend(backend: str, package: str) -> ModuleType:
    _check_installed(backend, package)
    return importlib.import_module(package)


class MetricLogger(ClosesOnExit):
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

    def log(
        self, metrics: Mapping[str, object], step: int, *, summarize: bool | None = None
    ) -> None:
        """Write scalar metrics for one step to every backend.

        Args:
            metrics: Names to values: Python or numpy numbers, or 0-d arrays/tensors
                (anything with ``.item()``). Use ``train/``, ``eval/``, ``env/``,
                ``rollout/`` and ``time/`` prefixes to group them in the console summary.
            step: The global step.
            summarize: Whether to print the console summary line for this step;
                ``None`` prints it when ``console`` is on and ``step`` is a multiple
                of ``console_every``.

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
        if summarize is None:
            summarize = self.console and step % self.console_every == 0
        if summarize and values:
            self._logger.info(_summary_line(values, step))

    def flush(self) -> None:
        """Ask every backend to write what it buffers (TensorBoard has written already)."""
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
