"""Recovery from a dead worker: relaunch the groups and go on from a checkpoint.

Both runners use :func:`run_with_restarts` for ``runner.max_restarts``. One
attempt runs the training loop; when it fails and a rank of one of the groups
is dead (killed, crashed, out of memory), every group is shut down and launched
again on the same placement (:func:`rlinf.sched.launch.relaunch_groups`), and the runner
rebuilds its workers and resumes from its newest intact checkpoint. Failures
with every rank alive (a bug, a bad config, a timeout) are raised at once:
running them again would fail again.

A whole-run restart, not a per-rank one: the surviving ranks hold process
groups, channels and half-finished collectives that refer to the dead one, and
a fresh start of every group is the one state known to be consistent. It costs
the worker start-up (seconds) and the steps since the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from rlinf.core.checkpoint import restart_resume_dir
from rlinf.core.logging import get_logger
from rlinf.sched.launch import relaunch_groups
from rlinf.sched.worker import WorkerDiedError, WorkerGroup

__all__ = ["find_dead_rank", "resume_from_newest", "run_with_restarts"]

_T = TypeVar("_T")
_log = get_logger("rlinf.sched.recovery")


def find_dead_rank(groups: Sequence[WorkerGroup], timeout: float = 10.0) -> str | None:
    """Names the first dead rank of ``groups`` (``"EnvGroup[rank 0]"``), or None if all live.

    Args:
        groups: The groups to check.
        timeout: Seconds to wait for each group's answers.
    """
    for group in groups:
        dead = group.dead_ranks(timeout)
        if dead:
            return f"{group.name}[rank {dead[0]}]"
    return None


def run_with_restarts(
    attempt: Callable[[], _T],
    *,
    groups: Sequence[WorkerGroup],
    max_restarts: int,
    resume: Callable[[int], None],
) -> _T:
    """Runs ``attempt``; after a dead rank, relaunches ``groups``, calls ``resume`` and retries.

    Args:
        attempt: One try of the work (a runner's training loop).
        groups: Every group the attempt uses; all are relaunched together.
        max_restarts: How many relaunches to allow; 0 raises the first failure.
        resume: Called after a relaunch with the number of restarts so far; it
            rebuilds the workers' state (e.g. ``init_workers`` from the newest
            checkpoint).

    Returns:
        What the first successful attempt returned.

    Raises:
        Exception: A failure with every rank alive, or the failure after
            ``max_restarts`` relaunches.
    """
    restarts = 0
    while True:
        try:
            return attempt()
        except Exception as err:
            if restarts >= max_restarts:
                raise
            if isinstance(err, WorkerDiedError):
                dead: str | None = f"{err.group}[rank {err.rank}]"
            else:
                dead = find_dead_rank(groups)
            if dead is None:
                raise
            restarts += 1
            _log.warning(
                "%s died (%s); restart %d of %d (runner.max_restarts): relaunching %s "
                "on the same placement",
                dead,
                str(err).splitlines()[0],
                restarts,
                max_restarts,
                ", ".join(group.name for group in groups),
            )
            relaunch_groups(groups)
            resume(restarts)


class Restartable(Protocol):
    """What :func:`resume_from_newest` needs of a runner."""

    restarts: int

    @property
    def checkpoint_root(self) -> Path:
        """Where the run's ``global_step_N`` folders are."""

    def init_workers(self, resume_dir: str | Path | None = None) -> None:
        """Rebuilds every worker's state, resuming from ``resume_dir``."""


def resume_from_newest(runner: Restartable, configured: str | Path | None) -> Callable[[int], None]:
    """The ``resume`` of :func:`run_with_restarts` for a runner.

    After a relaunch it records the restart count on the runner and calls its
    ``init_workers`` with the newest intact checkpoint of the run (if none was
    saved yet, the configured ``runner.resume_dir``; else a fresh start).

    Args:
        runner: The runner whose groups were relaunched.
        configured: ``runner.resume_dir``.
    """

    def resume(restarts: int) -> None:
        runner.restarts = restarts
        runner.init_workers(resume_dir=restart_resume_dir(runner.checkpoint_root, configured))

    return resume
