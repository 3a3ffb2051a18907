"""``wait_all``: one fail-fast wait for several group calls, on Ray's own waiting.

A runner starts the stages of a step at once (``env.interact()``,
``rollout.generate()``, ``actor.recv_rollout_batch()``...) and waits for all of
them. If one rank fails, the others are usually blocked on a channel that the
failed rank will never fill: waiting for them first would hang until the step
timeout. :func:`wait_all` waits on every rank's ``ObjectRef`` together with
``ray.wait`` (no polling), raises the first failure at once, and runs
``on_error`` first (the runners close their channels there, which wakes the
blocked ranks).

Example::

    env_out, rollout_out = wait_all(
        [env.interact(ch), rollout.generate(ch)], timeout=600, on_error=close_channels
    )
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from rlinf.core.logging import get_logger
from rlinf.sched.worker.group import _DEFAULT_TIMEOUT_S, GroupFuture

__all__ = ["wait_all", "wait_for_progress"]

_DISCARD_TIMEOUT_S = 5.0
"""After ``on_error``, how long the calls still running get to end before they are dropped."""

_log = get_logger("rlinf.sched.wait")


def wait_all(
    futures: Sequence[GroupFuture],
    timeout: float | None = _DEFAULT_TIMEOUT_S,
    on_error: Callable[[], object] | None = None,
    *,
    hint: str = "pass a larger timeout",
    progress: Callable[[int, int, float], object] | None = None,
    progress_every: float = 20.0,
) -> list[list[Any]]:
    """Waits for every rank of every future; the first failure raises at once.

    Args:
        futures: The group calls to wait for.
        timeout: Seconds to wait for all of them together; None waits without
            a bound (a dead rank still ends the wait: Ray reports it in seconds).
        on_error: Runs once, before the error propagates, on a failure, a
            timeout or Ctrl-C (e.g. closes channels to wake blocked ranks). The
            calls still running then get a few seconds to end,
            and their outcomes are dropped (so Ray does not print them later).
            Without ``on_error`` they are left running.
        hint: What to do about a timeout; ends the ``TimeoutError``'s message.
        progress: Called every ``progress_every`` seconds while ranks are still
            running, with ``(ranks_done, ranks_total, seconds_waited)``.
        progress_every: Seconds between ``progress`` calls.

    Returns:
        One list per future (in the order given), of its ranks' results in rank order.

    Raises:
        WorkerError: The first rank (of any future) that raised, naming group and rank.
        WorkerDiedError: The first rank whose process died.
        TimeoutError: After ``timeout`` s, naming the calls and ranks still running.
        ValueError: The same future is passed twice.
    """
    futures = list(futures)
    where = _rank_of_each_ref(futures)
    results: list[list[Any]] = [[None] * len(fut.refs) for fut in futures]
    pending = list(where)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    next_report = start + progress_every if progress is not None else None
    try:
        while pending:
            wake = min((t for t in (deadline, next_report) if t is not None), default=None)
            left = None if wake is None else max(0.0, wake - time.monotonic())
            # One completion at a time, so a failed or dead rank surfaces at once
            # instead of after the slowest one.
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            _collect(ready, where, futures, results)
            now = time.monotonic()
            if ready or not pending:
                continue
            if deadline is not None and now >= deadline:
                # Everything that has finished counts (an error beats a timeout).
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                _collect(ready, where, futures, results)
                if pending:
                    raise TimeoutError(
                        f"{_describe(futures, where, pending)} after {timeout:g} s; {hint}"
                    )
            elif progress is not None and next_report is not None and now >= next_report:
                progress(len(where) - len(pending), len(where), now - start)
                next_report = now + progress_every
    except BaseException:
        if on_error is not None:
            _run_on_error(on_error, pending)
        raise
    return results


def _rank_of_each_ref(futures: list[GroupFuture]) -> dict[Any, tuple[int, int]]:
    """Maps each rank's ``ObjectRef`` to (index of its future, index of the rank)."""
    where: dict[Any, tuple[int, int]] = {}
    for f, fut in enumerate(futures):
        for i, ref in enumerate(fut.refs):
            if ref in where:
                raise ValueError(f"{fut.group}.{fut.method}() is passed to wait_all twice")
            where[ref] = (f, i)
    return where


def _collect(
    ready: list[Any],
    where: dict[Any, tuple[int, int]],
    futures: list[GroupFuture],
    results: list[list[Any]],
) -> None:
    """Stores the results of the ranks in ``ready`` (raises a failed rank's error)."""
    for ref in ready:
        f, i = where[ref]
        results[f][i] = futures[f].result(i)


def _run_on_error(on_error: Callable[[], object], pending: list[Any]) -> None:
    """Runs ``on_error`` (its own error is logged, not raised), then drops ``pending``."""
    try:
        on_error()
    except Exception as exc:  # the original failure is the one to report
        _log.warning("wait_all: on_error raised %r (ignored)", exc)
    _discard(pending, _DISCARD_TIMEOUT_S)


def wait_for_progress(futures: Sequence[GroupFuture], timeout: float) -> None:
    """Blocks until one more rank of ``futures`` finishes, at most ``timeout`` s.

    For drivers that keep several calls in flight and act on whichever ends
    first (the async embodied runner): it returns at once when no rank is still
    running, and does not fetch results or raise (collect them with
    :func:`wait_all`, which raises a failed rank's error).

    Args:
        futures: The calls in flight.
        timeout: Seconds to block at most.
    """
    refs = [ref for future in futures for ref in future.refs]
    if not refs:
        return
    _, running = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    if running:
        ray.wait(running, num_returns=1, timeout=timeout, fetch_local=False)


def _describe(
    futures: list[GroupFuture], where: dict[Any, tuple[int, int]], refs: list[Any]
) -> str:
    """``"env.interact() still running on ranks [0]; rollout.generate() ... on ranks [1]"``."""
    still: dict[int, list[int]] = {}
    for ref in refs:
        f, i = where[ref]
        still.setdefault(f, []).append(futures[f].ranks[i])
    return "; ".join(
        f"{futures[f].group}.{futures[f].method}() still running on ranks {sorted(ranks)}"
        for f, ranks in sorted(still.items())
    )


def _discard(refs: list[Any], timeout: float) -> None:
    """Waits up to ``timeout`` s for ``refs`` and drops their results and errors."""
    if not refs:
        return
    with contextlib.suppress(Exception):
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in ready:
            with contextlib.suppress(Exception):
                ray.get(ref)
