"""Loggers for RLinf: one ``rlinf`` logger tree, with a ``[group rank]`` prefix for workers.

Every logger handed out here is a child of the ``rlinf`` logger, which writes to
stderr as ``2025-01-31 12:00:00 INFO message``. Its level comes from the
``RLINF_LOG_LEVEL`` environment variable (default ``INFO``). The ``rlinf`` logger
does not propagate to the root logger, so a framework that configures the root
logger (Hydra, Ray) does not print every message twice. While a progress bar is
drawn in the process, a record clears the bar, prints on its own line and redraws
the bar (what ``tqdm.contrib.logging.logging_redirect_tqdm`` does for the loggers
it is given), so a line never starts in the middle of the bar.

Example:
    >>> log = get_worker_logger("actor", 3)
    >>> log.info("loss=%.1f", 0.1)  # doctest: +SKIP
    2025-01-31 12:00:00 INFO [actor 3] loss=0.1
"""

from __future__ import annotations

# This module is ``rlinf.core.logging``; with absolute imports (the Python 3 default)
# ``import logging`` below is the standard library, not this file.
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

from tqdm import tqdm

__all__ = [
    "LEVEL_ENV_VAR",
    "ROOT_LOGGER_NAME",
    "WorkerLoggerAdapter",
    "get_logger",
    "get_worker_logger",
    "setup_logging",
]

ROOT_LOGGER_NAME = "rlinf"
LEVEL_ENV_VAR = "RLINF_LOG_LEVEL"

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class _StderrHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    Looking ``sys.stderr`` up late keeps the handler working when stderr is swapped
    (pytest capture, ``contextlib.redirect_stderr``) after logging was set up. While
    tqdm bars are drawn, the record is written in tqdm's external write mode (as
    ``tqdm.write`` does): the bars are cleared first and redrawn below the line.
    """

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        if not getattr(tqdm, "_instances", None):  # no bar drawn (disabled bars are not kept)
            super().emit(record)
            return
        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def _parse_level(value: str, source: str) -> int:
    name = value.strip().upper()
    if name not in _LEVELS:
        raise ValueError(
            f"{source}={value!r} is not a valid log level; "
            f"choose one of {', '.join(_LEVELS)} (case-insensitive)"
        )
    return int(getattr(logging, name))


def setup_logging(level: str | int | None = None) -> None:
    """Configure the ``rlinf`` logger: a stderr handler (added once) and its level.

    Safe to call repeatedly; later calls only change the level.

    Args:
        level: A level name (``"debug"``, ``"INFO"``, ...) or number. ``None`` reads
            ``RLINF_LOG_LEVEL`` from the environment, defaulting to ``INFO``.

    Raises:
        ValueError: If the level name, or the value of ``RLINF_LOG_LEVEL``, is not a
            known level.
    """
    if level is None:
        env_value = os.environ.get(LEVEL_ENV_VAR, "")
        resolved = _parse_level(env_value, LEVEL_ENV_VAR) if env_value.strip() else logging.INFO
    elif isinstance(level, str):
        resolved = _parse_level(level, "level")
    else:
        resolved = level

    root = logging.getLogger(ROOT_LOGGER_NAME)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
        root.addHandler(handler)
    root.setLevel(resolved)
    root.propagate = False


def get_logger(name: str = ROOT_LOGGER_NAME) -> logging.Logger:
    """Return a logger in the ``rlinf`` tree, setting logging up on first use.

    Args:
        name: ``"rlinf"``, a dotted child such as ``"rlinf.metrics"``, or a bare
            suffix such as ``"metrics"`` (which becomes ``"rlinf.metrics"``).

    Returns:
        The logger; it inherits the ``rlinf`` logger's handler and level.

    Raises:
        ValueError: If logging was not set up yet and ``RLINF_LOG_LEVEL`` is invalid.
    """
    root = logging.getLogger(ROOT_LOGGER_NAME)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        setup_logging()
    if name != ROOT_LOGGER_NAME and not name.startswith(ROOT_LOGGER_NAME + "."):
        name = f"{ROOT_LOGGER_NAME}.{name}"
    return logging.getLogger(name)


class WorkerLoggerAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message with ``[group rank]`` and adds both to the record.

    The record gets ``group`` and ``rank`` attributes, so handlers and filters can
    select one worker's messages.
    """

    def __init__(self, logger: logging.Logger, group: str, rank: int) -> None:
        super().__init__(logger, {"group": group, "rank": rank})
        self.group = group
        self.rank = rank
        self.prefix = f"[{group} {rank}]"

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Add the ``[group rank]`` prefix and merge the worker fields into ``extra``."""
        kwargs["extra"] = {"group": self.group, "rank": self.rank, **kwargs.get("extra", {})}
        return f"{self.prefix} {msg}", kwargs


def get_worker_logger(group: str, rank: int, name: str = "rlinf.worker") -> WorkerLoggerAdapter:
    """Return a logger for one worker whose messages read ``[group rank] message``.

    Args:
        group: The worker group's name, e.g. ``"actor"``.
        rank: The worker's rank within its group.
        name: The underlying logger (see :func:`get_logger`).

    Returns:
        A :class:`logging.LoggerAdapter`; use it like a logger (``info``, ``warning``, ...).
    """
    return WorkerLoggerAdapter(get_logger(name), group, rank)
