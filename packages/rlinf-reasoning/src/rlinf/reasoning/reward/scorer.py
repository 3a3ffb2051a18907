"""Batch math scoring in a process pool with a hard per-sample timeout.

:class:`MathRewardScorer` runs :func:`~rlinf.reasoning.reward.math_verifier.verify` for
each (response, references) pair in a :class:`concurrent.futures.ProcessPoolExecutor`
that uses the ``forkserver`` start method (``spawn`` where there is no forkserver, or on
request), never ``fork`` (the training process holds threads and CUDA state that a fork
would copy).

How the timeout works: at most ``num_workers`` samples are in flight, so a submitted
sample starts on an idle worker at once and its clock starts at submission. When a
sample runs past ``timeout_s`` it scores ``incorrect``; since a single worker of a
:class:`~concurrent.futures.ProcessPoolExecutor` cannot be stopped, all its workers are
killed (SIGKILL, so even a C-level sympy computation stops) and a fresh pool is
started; the other samples that were in flight are resubmitted with a fresh clock. A
worker that crashes (segfault, OOM kill) breaks the pool in the same way: the samples
that were in flight are then re-run one at a time, and the one that crashes alone
scores ``incorrect``. Workers also run under an address-space limit
(``memory_limit_mb``), so a runaway computation fails with ``MemoryError`` (scored
``incorrect``) instead of exhausting the machine.

A fresh pool waits until every worker has imported sympy and math-verify and verified a
sample before the first submission, so start-up never counts against a sample's
timeout. Why ``forkserver`` by default: the first scorer to start the server has it
preload and warm the verifier, so every later pool (one after each timeout) forks
ready workers in milliseconds; with ``spawn`` each worker imports sympy again (seconds
of CPU per worker and restart). The server is a multiprocessing singleton that lives
until the interpreter exits; :meth:`MathRewardScorer.close` ends every *worker*.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from rlinf.core.logging import get_logger
from rlinf.reasoning.reward.config import RewardConfig
from rlinf.reasoning.reward.math_verifier import verify

__all__ = ["MathRewardScorer", "VerifyFn", "default_num_workers"]

VerifyFn = Callable[[str, Sequence[str]], bool]
"""``(response, references) -> correct``; must be picklable (a module-level function)."""

_log = get_logger("rlinf.reasoning.reward")

MpContext = Literal["spawn", "forkserver"]


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
    """Runs once in each worker: limit memory, ignore Ctrl-C, warm the verifier up."""
    global _startup_barrier
    _startup_barrier = barrier
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
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


def _score_one(verify_fn: VerifyFn, response: str, references: Sequence[str]) -> bool:
    return bool(verify_fn(response, references))


@dataclass
class _PoolState:
    """The live executor, kept apart from the scorer so a finalizer can stop it."""

    executor: ProcessPoolExecutor | None = None
    pids: list[int] = field(default_factory=list)

    def stop(self, *, kill: bool, grace_s: float = 5.0) -> None:
        """Stop the executor and make sure every worker process is gone."""
        executor, self.executor, self.pids = self.executor, None, []
        if executor is None:
            return
        processes = _processes_of(executor)
        if kill:
            for proc in processes:
                with contextlib.suppress(Exception):
                    proc.kill()
        else:
            executor.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + grace_s
            for proc in processes:
                proc.join(max(0.0, deadline - time.monotonic()))
            for proc in processes:
                if proc.is_alive():
                    proc.kill()
        executor.shutdown(wait=True, cancel_futures=True)
        for proc in processes:
            proc.join(grace_s)


def _processes_of(executor: ProcessPoolExecutor) -> list[Any]:
    """The executor's worker processes (CPython keeps them in ``_processes``)."""
    for _ in range(3):
        try:
            return list((getattr(executor, "_processes", None) or {}).values())
        except RuntimeError:  # resized by the executor's manager thread meanwhile
            continue
    return []


@dataclass
class _InFlight:
    index: int
    started: float
    isolated: bool


class MathRewardScorer:
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
            startup_timeout_s: How long a (re)started pool may take to import and warm up.
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
        """Pools killed and replaced (timeouts and crashes) since this scorer was made."""
        self.last_timed_out: list[int] = []
        """Indices (into the last :meth:`score` batch) of the samples that timed out."""
        self._closed = False
        self._state = _PoolState()
        self._finalizer = weakref.finalize(self, _PoolState.stop, self._state, kill=True)

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
        """Process ids of the live workers (empty before the pool starts and after close)."""
        return list(self._state.pids)

    def start(self) -> None:
        """Start the pool now and wait until every worker is warm (otherwise lazy).

        Raises:
            RuntimeError: If the scorer is closed or the workers fail to start.
        """
        self._executor()

    def close(self) -> None:
        """Stop the pool; every worker process has exited when this returns. Idempotent."""
        self._closed = True
        self._state.stop(kill=False)
        self._finalizer.detach()

    def __enter__(self) -> MathRewardScorer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _executor(self) -> ProcessPoolExecutor:
        if self._closed:
            raise RuntimeError("this MathRewardScorer is closed; create a new one to score again")
        if self._state.executor is not None:
            return self._state.executor
        ctx = multiprocessing.get_context(self.mp_context)
        if self.mp_context == "forkserver":
            # Only effective if the server is not running yet; then restarts are cheap.
            ctx.set_forkserver_preload(["rlinf.reasoning.reward._preload"])
        limit = None if self.memory_limit_mb is None else self.memory_limit_mb * 1024 * 1024
        executor = ProcessPoolExecutor(
            max_workers=self.num_workers,
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(limit, ctx.Barrier(self.num_workers)),
        )
        self._state.executor = executor
        # One warm-up per worker (they wait for each other): every worker has finished
        # its initializer before the first timed sample is submitted.
        warmups = [
            executor.submit(_worker_ready, self.startup_timeout_s) for _ in range(self.num_workers)
        ]
        done, not_done = wait(warmups, timeout=self.startup_timeout_s)
        failed = [f for f in done if f.exception() is not None]
        if not_done or failed:
            self._state.stop(kill=True)
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
        self._state.pids = sorted({p.pid for p in _processes_of(executor) if p.pid is not None})
        return executor

    def _restart(self) -> None:
        self.num_restarts += 1
        self._state.stop(kill=True)

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
            RuntimeError: If the scorer is closed or its workers cannot start.
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
        if not responses:
            return []
        results: list[bool | None] = [None] * len(responses)
        pending: deque[int] = deque(range(len(responses)))
        suspects: deque[int] = deque()  # in flight when a worker crashed: re-run alone
        inflight: dict[Future[bool], _InFlight] = {}

        def submit(index: int, isolated: bool) -> None:
            fut = self._executor().submit(
                _score_one, self.verify_fn, responses[index], list(references[index])
            )
            inflight[fut] = _InFlight(index, time.monotonic(), isolated)

        try:
            while pending or suspects or inflight:
                if suspects:
                    if not inflight:
                        submit(suspects.popleft(), isolated=True)
                else:
                    while pending and len(inflight) < self.num_workers:
                        submit(pending.popleft(), isolated=False)
                next_deadline = min(job.started for job in inflight.values()) + self.timeout_s
                done, _ = wait(
                    list(inflight),
                    timeout=max(0.0, next_deadline - time.monotonic()),
                    return_when=FIRST_COMPLETED,
                )
                broken = False
                for fut in done:
                    job = inflight.pop(fut)
                    broken |= self._collect(fut, job, results, suspects)
                if broken:
                    # Every other job of a broken pool fails too: re-run them alone as well.
                    for job in sorted(inflight.values(), key=lambda j: j.index):
                        suspects.append(job.index)
                    inflight.clear()
                    self._restart()
                    continue
                now = time.monotonic()
                expired = [f for f, job in inflight.items() if now - job.started >= self.timeout_s]
                if not expired:
                    continue
                for fut in expired:
                    job = inflight.pop(fut)
                    if fut.done():  # finished just in time
                        self._collect(fut, job, results, suspects)
                        continue
                    results[job.index] = False
                    self.last_timed_out.append(job.index)
                    self.num_timeouts += 1
                    _log.warning(
                        "math reward: sample %d timed out after %.1fs; scored incorrect, "
                        "restarting the reward pool",
                        job.index,
                        self.timeout_s,
                    )
                for fut, job in sorted(inflight.items(), key=lambda kv: -kv[1].index):
                    if fut.done() and not isinstance(fut.exception(), BrokenProcessPool):
                        self._collect(fut, job, results, suspects)
                    elif job.isolated:
                        suspects.appendleft(job.index)
                    else:
                        pending.appendleft(job.index)
                inflight.clear()
                self._restart()
        except BaseException:
            # Interrupted (Ctrl-C, an error): drop the pool, whose workers may still be
            # busy with this batch, so the next batch's clocks start on idle workers.
            if inflight:
                self._restart()
            raise
        return [bool(r) for r in results]

    def _collect(
        self,
        fut: Future[bool],
        job: _InFlight,
        results: list[bool | None],
        suspects: deque[int],
    ) -> bool:
        """Store a finished job's result; return whether the pool broke."""
        exc = fut.exception()
        if exc is None:
            results[job.index] = bool(fut.result())
            return False
        if isinstance(exc, BrokenProcessPool):
            if job.isolated:
                _log.warning(
                    "math reward: sample %d crashed its worker; scored incorrect", job.index
                )
                results[job.index] = False
            else:
                suspects.append(job.index)
            return True
        _log.warning("math reward: sample %d raised %r; scored incorrect", job.index, exc)
        results[job.index] = False
        return False
