"""Start-up phases: where the time goes between a run's launch and its first training step.

A main marks the end of each phase it runs (``mark("ray")`` after the cluster
starts, ``mark("groups")`` after the worker groups are up, ...); the runner
marks its own and, when the first step begins, logs one line::

    start-up: 21.4 s from launch to the first step (imports 4.1 s, ray 5.2 s,
    groups 9.0 s, init_workers 2.8 s, first_sync 0.3 s)

Each phase lasts from the previous mark (the first from the process's launch,
read from ``/proc/self/stat``, so the interpreter's own start and the imports
count) to its own. The marks live in this process only.
"""

from __future__ import annotations

import os
import time

__all__ = ["mark", "process_age_s", "report", "reset"]

_marks: list[tuple[str, float]] = []
_reported = False


def process_age_s() -> float:
    """Seconds since this process was launched (since first use where ``/proc`` is missing)."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (after the parenthesised command name): start time in clock ticks.
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _FALLBACK_START


_FALLBACK_START = time.monotonic()


def mark(phase: str) -> None:
    """Records that ``phase`` ended now."""
    _marks.append((phase, process_age_s()))


def reset() -> None:
    """Forgets every mark (tests; a process that starts a second run)."""
    global _reported
    _marks.clear()
    _reported = False


def report(until: str = "the first step") -> tuple[str, dict[str, float]] | None:
    """The start-up line and its phases in seconds, once per process (None afterwards).

    Args:
        until: What the start-up ends with, for the message.

    Returns:
        ``(line, {"total": s, phase: s, ...})``, or None if it was reported already.
    """
    global _reported
    if _reported:
        return None
    _reported = True
    total = process_age_s()
    phases: dict[str, float] = {}
    previous = 0.0
    for phase, at in _marks:
        phases[phase] = phases.get(phase, 0.0) + max(0.0, at - previous)
        previous = at
    listed = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    line = f"start-up: {total:.1f} s from launch to {until}" + (f" ({listed})" if listed else "")
    return line, {"total": total, **phases}
