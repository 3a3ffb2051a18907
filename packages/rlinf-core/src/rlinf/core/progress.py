"""Progress bars over tqdm that stay quiet in logs and cheap when off.

A bar shows ``desc: 40%|####      | 4/10 [00:02<00:03, 1.9step/s, loss=0.1234]``.
By default bars are drawn only when stderr is a terminal; set ``RLINF_PROGRESS=1``
to force them on (e.g. under a job scheduler) or ``RLINF_PROGRESS=0`` to force them off.
tqdm's own ``TQDM_DISABLE`` (any non-empty value, as tqdm reads it) also turns them off.

We keep ``RLINF_PROGRESS`` because tqdm's ``TQDM_*`` variables (4.70.1, ``tqdm.utils.envwrap``)
only change tqdm's default arguments, read once at import: the "only on a terminal" rule needs
an explicit ``disable=``, which overrides them, and any non-empty ``TQDM_DISABLE`` means off.

A training loop feeds a :class:`TrainingConsole` once per step instead: every metric
goes to the metric logger's backends; on a terminal the bar shows the few numbers a
person watches, and without one a one-line summary of every metric is printed every
``summary_interval`` steps.
Log records of the ``rlinf`` loggers clear the bar, print, and redraw it (see
:mod:`rlinf.core.logging`), so a line never starts in the middle of the bar.

Example:
    >>> with progress_bar(total=100, desc="train") as bar:  # doctest: +SKIP
    ...     for step in range(100):
    ...         bar.update(loss=0.1234, env=rate_postfix(4096, 0.5, "steps"))
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

from rlinf.core.closing import ClosesOnExit
from rlinf.core.metrics import MetricLogger, format_number

__all__ = [
    "PROGRESS_ENV_VAR",
    "TQDM_DISABLE_ENV_VAR",
    "ProgressBar",
    "TrainingConsole",
    "progress_bar",
    "progress_enabled",
    "rate_postfix",
    "track",
    "training_console",
]

PROGRESS_ENV_VAR = "RLINF_PROGRESS"
TQDM_DISABLE_ENV_VAR = "TQDM_DISABLE"
"""tqdm's own switch: any non-empty value turns the bars off while ``RLINF_PROGRESS`` is unset."""

T = TypeVar("T")


def progress_enabled(file: TextIO | None = None) -> bool:
    """Whether bars are drawn when ``disable`` is not given.

    Args:
        file: The stream the bar writes to; ``None`` means ``sys.stderr``.

    Returns:
        ``False`` if ``RLINF_PROGRESS=0``, ``True`` if ``RLINF_PROGRESS=1``; when it is
        unset, ``False`` if ``TQDM_DISABLE`` is set (non-empty), otherwise whether the
        stream is a terminal.

    Raises:
        ValueError: If ``RLINF_PROGRESS`` is set to something other than ``0`` or ``1``.
    """
    env = os.environ.get(PROGRESS_ENV_VAR, "").strip()
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise ValueError(f"{PROGRESS_ENV_VAR}={env!r} is invalid; use 1 (force on) or 0 (off)")
    if os.environ.get(TQDM_DISABLE_ENV_VAR):  # tqdm's switch; ours wins when both are set
        return False
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def rate_postfix(count: float, seconds: float, unit: str = "it") -> str:
    """Format a throughput for a postfix, e.g. ``rate_postfix(4096, 0.5, "steps")``.

    Args:
        count: How many units were processed.
        seconds: In how long.
        unit: The unit's name.

    Returns:
        ``"8192 steps/s"``, or ``"? steps/s"`` when ``seconds`` is not positive.
    """
    rate = format_number(count / seconds) if seconds > 0 else "?"
    return f"{rate} {unit}/s"


def _postfix_value(value: float | str) -> str:
    """A postfix value as a person reads it: ``0.1234``, ``17650`` (not ``1.765e4``)."""
    if isinstance(value, str):
        return value
    if math.isfinite(value) and abs(value) >= 1000:
        return format_number(round(value))
    return format_number(value)


class ProgressBar(ClosesOnExit):
    """A tqdm bar whose ``update`` also sets compactly formatted postfix values.

    Create it with :func:`progress_bar`.
    """

    def __init__(self, bar: tqdm[Any]) -> None:
        self._bar = bar
        self._n = int(bar.n)  # tqdm stops counting when disabled; keep our own count

    @property
    def disabled(self) -> bool:
        """True when nothing is drawn."""
        return bool(self._bar.disable)

    @property
    def n(self) -> int:
        """Units completed so far (including ``initial``)."""
        return self._n

    def update(self, n: int = 1, **postfix: float | str) -> None:
        """Advance the bar and replace its postfix.

        Args:
            n: Units completed since the last update.
            **postfix: Values to show after the rate, e.g. ``loss=0.1234``; numbers
                are printed with 4 significant digits.
        """
        if postfix and not self._bar.disable:
            self._bar.set_postfix_str(
                ", ".join(f"{k}={_postfix_value(v)}" for k, v in postfix.items()),
                refresh=False,
            )
        self._n += n
        self._bar.update(n)

    def close(self) -> None:
        """Draw the final state and release the line; calling it again does nothing."""
        self._bar.close()


def progress_bar(
    total: int | None,
    desc: str,
    unit: str = "step",
    initial: int = 0,
    disable: bool | None = None,
    file: TextIO | None = None,
) -> ProgressBar:
    """Create a progress bar showing count/total, rate and ETA.

    Args:
        total: Expected number of units, or ``None`` if unknown (no percentage or ETA).
        desc: Label in front of the bar.
        unit: Name of one unit, shown in the rate (``step/s``).
        initial: Starting count, e.g. the step a resumed run continues from.
        disable: ``True`` hides the bar, ``False`` forces it on; ``None`` decides with
            :func:`progress_enabled`.
        file: Stream to draw on; ``None`` means ``sys.stderr``.

    Returns:
        The bar; use it as a context manager or call :meth:`ProgressBar.close`.
    """
    if disable is None:
        disable = not progress_enabled(file)
    return ProgressBar(
        tqdm(
            total=total,
            desc=desc,
            unit=unit,
            initial=initial,
            disable=disable,
            file=file,
            dynamic_ncols=True,
        )
    )


def track(
    iterable: Iterable[T],
    desc: str,
    total: int | None = None,
    unit: str = "step",
    disable: bool | None = None,
    file: TextIO | None = None,
) -> Iterator[T]:
    """Yield the items of ``iterable`` while advancing a progress bar.

    Args:
        iterable: The items.
        desc: Label in front of the bar.
        total: Number of items; defaults to ``len(iterable)`` when it has a length.
        unit: Name of one item.
        disable: See :func:`progress_bar`.
        file: See :func:`progress_bar`.

    Yields:
        The items of ``iterable``, in order; the bar counts an item once the caller
        asks for the next one.
    """
    if total is None and isinstance(iterable, Sized):
        total = len(iterable)
    with progress_bar(total, desc, unit=unit, disable=disable, file=file) as bar:
        for item in iterable:
            yield item
            bar.update()


class TrainingConsole(ClosesOnExit):
    """What a person sees of a training loop, fed once per finished step.

    Each :meth:`step` writes every metric to the metric logger's backends (TensorBoard,
    W&B, SwanLab) and then shows the step in one of two ways:

    - on a terminal, it advances the bar, whose postfix holds only the ``watch``
      metrics; a watched metric keeps its last value until the next step that reports
      it (eval results, for example, arrive every few steps);
    - otherwise (CI, a log file) no bar is drawn, and the metric logger prints its
      one-line summary of every metric when the step is a multiple of
      ``summary_interval`` or the last one.

    Create it with :func:`training_console`.

    Args:
        metrics: The run's metric logger.
        bar: The bar to advance (disabled when the console is not a terminal).
        total: The step the loop ends at.
        watch: Postfix label to metric name, in display order, e.g.
            ``{"return": "env/return", "loss": "train/actor/total_loss"}``.
        summary_interval: Steps between summary lines (``runner.summary_interval``).

    Raises:
        ValueError: If ``summary_interval < 1``.
    """

    def __init__(
        self,
        metrics: MetricLogger,
        bar: ProgressBar,
        total: int,
        watch: Mapping[str, str],
        summary_interval: int,
    ) -> None:
        if summary_interval < 1:
            raise ValueError(f"summary_interval must be >= 1, got {summary_interval}")
        self.metrics = metrics
        self.bar = bar
        self.total = total
        self.watch = dict(watch)
        self.summary_interval = summary_interval
        self._shown: dict[str, float | str] = {}

    def step(self, metrics: Mapping[str, float], step: int) -> None:
        """Records one finished step: backends, the summary line when due, the bar.

        Args:
            metrics: The step's metrics.
            step: The global step just finished.
        """
        due = step % self.summary_interval == 0 or step == self.total
        self.metrics.log(metrics, step, summarize=due and self.bar.disabled)
        for label, key in self.watch.items():
            if key in metrics:
                self._shown[label] = metrics[key]
        postfix = {label: self._shown[label] for label in self.watch if label in self._shown}
        self.bar.update(1, **postfix)

    def close(self) -> None:
        """Closes the bar and flushes the metric logger; calling it again does nothing."""
        self.bar.close()
        self.metrics.flush()


def training_console(
    metrics: MetricLogger,
    *,
    total: int,
    desc: str,
    watch: Mapping[str, str],
    summary_interval: int,
    initial: int = 0,
    disable: bool | None = None,
    file: TextIO | None = None,
) -> TrainingConsole:
    """Create the console of a training loop: a bar of ``total`` steps and summary lines.

    Args:
        metrics: The run's metric logger.
        total: The step the loop ends at.
        desc: Label in front of the bar.
        watch: See :class:`TrainingConsole`.
        summary_interval: See :class:`TrainingConsole`.
        initial: The step a resumed run continues from.
        disable: See :func:`progress_bar`; by default the bar is drawn only on a terminal.
        file: See :func:`progress_bar`.

    Returns:
        The console; use it as a context manager or call :meth:`TrainingConsole.close`.
    """
    bar = progress_bar(total, desc, unit="step", initial=initial, disable=disable, file=file)
    return TrainingConsole(metrics, bar, total, watch, summary_interval)
