"""Batch math scoring in a process pool with a hard per-sample timeout.

Pool: pebble's ProcessPool (timeout, kill-and-replace); ours adds warm-up, memory limit, counts.

:class:`MathRewardScorer` runs :func:`~rlinf.reasoning.reward.math_verifier.verify` for
each (response, references) pair in a :class:`pebble.ProcessPool` that uses the
``forkserver`` start method (``spawn`` where there is no forkserver, or on request),
never ``fork`` (the training process holds threads and CUDA state that a fork would
copy).

How the timeout works: every sample of a batch is scheduled at once with
``timeout=timeout_s``; pebble starts a sample's clock when a worker picks it up (never
while it waits in the queue, nor while a fresh worker imports and warms up). A sample
that runs past ``timeout_s`` scores ``incorrect``: pebble stops its worker (SIGTERM,
which our workers do not handle, so even a C-level sympy computation stops at once) and
starts a fresh one; the other workers keep going. A worker that crashes (segfault, OOM
kill) is replaced the same way and only the sample it was running scores ``incorrect``.
Workers also run under an address-space limit (``memory_limit_mb``), so a runaway
computation fails with ``MemoryError`` (scored ``incorrect``) instead of exhausting the
machine. Should pebble's pool itself break, the samples it lost score ``incorrect`` and
the next batch starts a fresh pool. An interrupted batch (Ctrl-C) cancels its remaining
samples; pebble replaces the workers still busy with it.

:meth:`MathRewardScorer.start` (or the first :meth:`~MathRewardScorer.score`) waits
until every worker has imported sympy and math-verify and verified a sample, so a
broken install fails there with a clear error. Why ``forkserver`` by default: the first
scorer to start the server has it preload and warm the verifier
(:mod:`._preload`), so every replacement worker forks ready in milliseconds; with
``spawn`` each one imports sympy again (seconds of CPU). The server is a
multiprocessing singleton that lives until the interpreter exits;
:meth:`MathRewardScorer.close` ends every *worker*.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, wait
from dataclasses import dataclass
from typing import Any, Literal

from pebble import ProcessExpired, ProcessPool

from rlinf.core.closing import ClosesOnExit
from rlinf.core.logging import get_logger
from rlinf.reasoning.reward.config import RewardConfig
from rlinf.reasoning.reward.math_verifier import verify

__all__ = ["MathRewardScorer", "VerifyFn", "default_num_workers"]

VerifyFn = Callable[[str, Sequence[str]], bool]
"""``(response, references) -> correct``; must be picklable (a module-level function)."""

_log = get_logger("rlinf.reasoning.reward")

MpContext = Literal["spawn", "forkserver"]

_POLL_S = 1.0  # how often a waiting judge() checks that the pool is still alive


def default_num_workers() -> int:
    """``min(usable CPUs, 8)``: the CPUs this process may run on, at most 8.

    Returns:
        The default pool size, at least 1.
    """
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere all CPUs
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, min(cpus, 8))


_startup_barrier: Any = None  # set in each worker by _worker_init


def _worker_init(memory_limit_bytes: int | None, barrier: Any) -> None:
    """Runs once in each worker: die at once on SIGTERM, limit memory, warm the verifier up."""
    global _startup_barrier
    _startup_barrier = barrier
    # pebble stops a worker with SIGTERM and waits 3 s before SIGKILL; its handler runs
    # only between bytecodes, the default action ends even a long C-level computation.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    if memory_limit_bytes is not None:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = (
            memory_limit_bytes if hard == resource.RLIM_INFINITY else min(hard, memory_limit_bytes)
        )
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    # Import sympy/math-verify and fill their caches now, not inside a timed sample.
    verify(r"\boxed{x+\frac{1}{2}}", ["0.5+x"])


def _worker_ready(timeout_s: float) -> int:
    """The warm-up task: wait until every worker runs one, so each worker gets exactly one."""
    _startup_barrier.wait(timeout_s)
    return os.getpid()


def _score_one(
    verify_fn: VerifyFn, response: str, references: Sequence[str]
) -> tuple[bool, str | None]:
    """``(correct, None)``, or ``(False, repr(error))`` when the verifier raised.

    Verifier errors come back as values, so every exception on a future is the pool's.
    """
    try:
        return bool(verify_fn(response, references)), None
    except Exception as exc:  # MemoryError under the address-space limit, a parser bug...
        return False, repr(exc)


@dataclass
class _PoolState:
    """The live pool, kept apart from the scorer so a finalizer can stop it."""

    pool: ProcessPool | None = None

    def stop(self) -> None:
        """Stop the pool; every worker process has exited when this returns."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
            pool.join()


def _worker_processes(pool: ProcessPool) -> list[Any]:
    """The pool's current worker processes (pebble keeps them in its worker manager)."""
    manager = getattr(getattr(pool, "_pool_manager", None), "worker_manager", None)
    workers = getattr(manager, "workers", None) or {}
    for _ in range(3):
        try:
            return list(workers.values())
        except RuntimeError:  # changed by pebble's manager thread meanwhile
            continue
    return []


class MathRewardScorer(ClosesOnExit):
    r"""Score math responses against references in a process pool, with a hard timeout.

    A response scores ``correct * reward_scale`` when its final answer matches any of
    its references, and ``incorrect * reward_scale`` otherwise (also on a timeout, a
    crash or a verifier error). The pool starts on the first :meth:`score` (or
    :meth:`start`) and lives until :meth:`close`; use the scorer as a context manager.

    Example:
        >>> with MathRewardScorer(num_workers=2, timeout_s=5.0) as scorer:  # doctest: +SKIP
        ...     scorer.score([r"so \boxed{\frac12}", "I give up"], [["0.5"], ["3"]])
        [1.0, 0.0]
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 5.0,
        reward_scale: float = 1.0,
        correct: float = 1.0,
        incorrect: float = 0.0,
        *,
        mp_context: MpContext | None = None,
        memory_limit_mb: int | None = 4096,
        startup_timeout_s: float = 300.0,
        verify_fn: VerifyFn | None = None,
    ) -> None:
        """Configure the scorer; no process starts until the first :meth:`score`.

        Args:
            num_workers: Worker processes; ``None`` means :func:`default_num_workers`.
            timeout_s: Hard limit for one response (against all its references).
            reward_scale: Multiplies both ``correct`` and ``incorrect``.
            correct: Score of a correct response, before scaling.
            incorrect: Score of a wrong, unparsable or timed-out response, before scaling.
            mp_context: ``"forkserver"`` (the default where the platform has it) or
                ``"spawn"`` (the default elsewhere); see the module docstring.
            memory_limit_mb: Address-space limit of each worker, or ``None`` for none.
            startup_timeout_s: How long a (re)started pool may take to import and warm
                up; also how long :meth:`judge` waits without any sample finishing
                (beyond ``timeout_s``) before it gives up on the pool.
            verify_fn: The check to run, ``verify`` by default; must be picklable.

        Raises:
            ValueError: If a number is out of range or ``mp_context`` is unknown.
        """
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1, or None for the default")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
        if not startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s={startup_timeout_s} must be > 0 seconds")
        if memory_limit_mb is not None and memory_limit_mb < 256:
            raise ValueError(
                f"memory_limit_mb={memory_limit_mb} is too small for python with sympy; "
                "use >= 256, or None for no limit"
            )
        if mp_context is None:
            methods = multiprocessing.get_all_start_methods()
            mp_context = "forkserver" if "forkserver" in methods else "spawn"
        if mp_context not in ("spawn", "forkserver"):
            raise ValueError(
                f"mp_context={mp_context!r} is not supported; use 'spawn' or 'forkserver' "
                "(never 'fork': the training process holds threads and CUDA state)"
            )
        self.num_workers: int = num_workers if num_workers is not None else default_num_workers()
        self.timeout_s = float(timeout_s)
        self.reward_scale = float(reward_scale)
        self.correct = float(correct)
        self.incorrect = float(incorrect)
        self.mp_context: MpContext = mp_context
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = float(startup_timeout_s)
        self.verify_fn: VerifyFn = verify_fn if verify_fn is not None else verify
        self.num_timeouts = 0
        """Samples that hit the timeout since this scorer was made."""
        self.num_restarts = 0
        """Workers replaced (after a timeout or a crash) and pools restarted since made."""
        self.last_timed_out: list[int] = []
        """Indices (into the last :meth:`score` batch) of the samples that timed out."""
        self._closed = False
        self._state = _PoolState()
        self._finalizer = weakref.finalize(self, _PoolState.stop, self._state)

    @classmethod
    def from_config(cls, cfg: RewardConfig, **kwargs: Any) -> MathRewardScorer:
        """Build a scorer from the ``reward`` config section.

        Args:
            cfg: The validated config.
            **kwargs: Extra keyword arguments for the constructor (``correct``, ...).

        Returns:
            A scorer (not started).
        """
        return cls(
            num_workers=cfg.num_workers,
            timeout_s=cfg.timeout_s,
            reward_scale=cfg.reward_scale,
            **kwargs,
        )

    # -- lifecycle -----------------------------------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (empty before the pool starts and after close)."""
        pool = self._state.pool
        if pool is None:
            return []
        return sorted(p.pid for p in _worker_processes(pool) if p.pid is not None)

    def start(self) -> None:
        """Start the pool now and wait until every worker is warm (otherwise lazy).

        Raises:
            RuntimeError: If the scorer is closed or the workers fail to start.
        """
        self._pool()

    def close(self) -> None:
        """Stop the pool; every worker process has exited when this returns. Idempotent."""
        self._closed = True
        self._state.stop()
        self._finalizer.detach()

    def _pool(self) -> ProcessPool:
        """The live pool; a new one (started and warm) when there is none or it broke."""
        if self._closed:
            raise RuntimeError("this MathRewardScorer is closed; create a new one to score again")
        pool = self._state.pool
        if pool is not None:
            if pool.active:
                return pool
            _log.warning("math reward: the reward pool broke; starting a fresh one")
            self.num_restarts += 1
            self._state.stop()
        ctx = multiprocessing.get_context(self.mp_context)
        if self.mp_context == "forkserver":
            # Only effective if the server is not running yet; then replacements are cheap.
            ctx.set_forkserver_preload(["rlinf.reasoning.reward._preload"])
        limit = None if self.memory_limit_mb is None else self.memory_limit_mb * 1024 * 1024
        pool = ProcessPool(
            max_workers=self.num_workers,
            initializer=_worker_init,
            initargs=(limit, ctx.Barrier(self.num_workers)),
            context=ctx,
        )
        self._state.pool = pool
        # One warm-up per worker (they wait for each other): every worker has finished
        # its initializer before start() returns.
        warmups = [
            pool.schedule(_worker_ready, (self.startup_timeout_s,)) for _ in range(self.num_workers)
        ]
        done, not_done = wait(warmups, timeout=self.startup_timeout_s)
        failed = [f for f in done if f.exception() is not None]
        if not_done or failed:
            self._state.stop()
            cause = failed[0].exception() if failed else None
            why = (
                f"failed: {cause!r}"
                if cause is not None
                else f"did not start within startup_timeout_s={self.startup_timeout_s:g}s"
            )
            raise RuntimeError(
                f"reward workers ({self.num_workers}, {self.mp_context}) {why}; "
                "check that sympy and math-verify import in a fresh python, raise "
                "memory_limit_mb or startup_timeout_s, or lower num_workers"
            ) from cause
        return pool

    # -- scoring -------------------------------------------------------------------

    def score(self, responses: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
        r"""Score each response against its references.

        Args:
            responses: Model responses (full text; the final answer is extracted).
            references: One list of gold answers per response; any match is correct.

        Returns:
            One float per response, in order: ``correct * reward_scale`` or
            ``incorrect * reward_scale``.

        Raises:
            ValueError: If the two sequences differ in length.
            TypeError: If a reference entry is a string instead of a list of strings.
            RuntimeError: If the scorer is closed or its workers cannot start.
        """
        flags = self.judge(responses, references)
        good, bad = self.correct * self.reward_scale, self.incorrect * self.reward_scale
        return [good if ok else bad for ok in flags]

    def judge(self, responses: Sequence[str], references: Sequence[Sequence[str]]) -> list[bool]:
        """Like :meth:`score`, but return whether each response is correct.

        Args:
            responses: Model responses.
            references: One list of gold answers per response.

        Returns:
            One bool per response; a timeout, crash or error counts as ``False``.

        Raises:
            ValueError: If the two sequences differ in length.
            TypeError: If a reference entry is a string instead of a list of strings.
            RuntimeError: If the scorer is closed, its workers cannot start, or no
                sample finishes for ``startup_timeout_s + timeout_s`` seconds.
        """
        if len(responses) != len(references):
            raise ValueError(
                f"got {len(responses)} responses but {len(references)} reference lists; "
                "pass one list of references per response"
            )
        for i, refs in enumerate(references):
            if isinstance(refs, str):
                raise TypeError(
                    f"references[{i}] is a string ({refs[:40]!r}); each entry must be a "
                    f"list of reference answers, e.g. [{refs[:40]!r}]"
                )
        self.last_timed_out = []
        results = [False] * len(responses)
        if not responses:
            return results
        pool = self._pool()
        futures: dict[Future[Any], int] = {}
        try:
            for i, (response, refs) in enumerate(zip(responses, references, strict=True)):
                args = (self.verify_fn, response, list(refs))
                futures[pool.schedule(_score_one, args, timeout=self.timeout_s)] = i
            self._collect(pool, futures, results)
        except BaseException:
            # Interrupted (Ctrl-C, an error): cancelled samples never start, and pebble
            # replaces the workers still busy with this batch.
            for fut in futures:
                fut.cancel()
            raise
        self.last_timed_out.sort()
        return results

    def _collect(
        self, pool: ProcessPool, futures: dict[Future[Any], int], results: list[bool]
    ) -> None:
        """Wait for ``futures`` and store their verdicts in ``results``."""
        pending = set(futures)
        last_progress = time.monotonic()
        while pending:
            # ALL_COMPLETED with a poll interval: one O(pending) wait per second at most.
            done, pending = wait(pending, timeout=_POLL_S)
            for fut in done:
                self._store(fut, futures[fut], results)
            now = time.monotonic()
            if done:
                last_progress = now
            elif not pool.active:  # pebble's pool broke: nothing more will finish
                _log.warning(
                    "math reward: the reward pool broke; %d samples scored incorrect, the "
                    "next batch starts a fresh pool",
                    len(pending),
                )
                return
            elif now - last_progress > self.startup_timeout_s + self.timeout_s:
                raise RuntimeError(
                    f"math reward: no sample finished in {now - last_progress:.0f}s "
                    f"(timeout_s={self.timeout_s:g}, startup_timeout_s="
                    f"{self.startup_timeout_s:g}): the reward workers cannot start; "
                    "check memory_limit_mb and that sympy imports in a fresh python"
                )

    def _store(self, fut: Future[Any], index: int, results: list[bool]) -> None:
        """Store a finished sample's verdict (``False`` unless the verifier said correct)."""
        exc = CancelledError() if fut.cancelled() else fut.exception()
        if exc is None:
            results[index], error = fut.result()
            if error is not None:
                _log.warning("math reward: sample %d raised %s; scored incorrect", index, error)
        elif isinstance(exc, TimeoutError):
            self.last_timed_out.append(index)
            self.num_timeouts += 1
            self.num_restarts += 1
            _log.warning(
                "math reward: sample %d timed out after %.1fs; scored incorrect, "
                "its worker was replaced",
                index,
                self.timeout_s,
            )
        elif isinstance(exc, ProcessExpired):
            self.num_restarts += 1
            _log.warning(
                "math reward: sample %d crashed its worker (exit code %s); scored incorrect",
                index,
                exc.exitcode,
            )
        else:  # the pool broke (BrokenProcessPool), or the sample was cancelled
            _log.warning("math reward: sample %d was lost (%r); scored incorrect", index, exc)
