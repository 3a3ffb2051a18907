"""Progress bars over tqdm that stay quiet in logs and cheap when off.

A bar shows ``desc: 40%|####      | 4/10 [00:02<00:03, 1.9step/s, loss=0.1234]``.
By default bars are drawn only when stderr is a terminal; set ``RLINF_PROGRESS=1``
to force them on (e.g. under a job scheduler) or ``RLINF_PROGRESS=0`` to force them off.
tqdm's own ``TQDM_DISABLE`` (any non-empty value, as tqdm reads it) also turns them off.

We keep ``RLINF_PROGRESS`` because tqdm's ``TQDM_*`` variables (4.70.1, ``tqdm.utils.envwrap``)
only change tqdm's default arguments, read once at import: the "only on a terminal" rule needs
an explicit ``disable=``, which overrides them, and any non-empty ``TQDM_DISABLE`` means off.

Example:
    >>> with progress_bar(total=100, desc="train") as bar:  # doctest: +SKIP
    ...     for step in range(100):
    ...         bar.update(loss=0.1234, env=rate_postfix(4096, 0.5, "steps"))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

from rlinf.core.closing import ClosesOnExit
from rlinf.core.metrics import format_number

__all__ = [
    "PROGRESS_ENV_VAR",
    "TQDM_DISABLE_ENV_VAR",
    "ProgressBar",
    "progress_bar",
    "progress_enabled",
    "rate_postfix",
    "track",
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
                ", ".join(
                    f"{k}={v if isinstance(v, str) else format_number(v)}"
                    for k, v in postfix.items()
                ),
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
