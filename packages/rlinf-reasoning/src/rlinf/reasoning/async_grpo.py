"""Asynchronous GRPO with bounded staleness (``algorithm.max_staleness`` = k > 0).

The :class:`~rlinf.reasoning.runner.ReasoningRunner` uses an
:class:`AsyncPipeline` instead of starting the three stages once per step:

* the rollout runs one long :meth:`~rlinf.reasoning.workers.RolloutWorker.generate_stream`
  and the reward one long :meth:`~rlinf.reasoning.workers.RewardWorker.score_stream`;
  the actor runs one ``run_training`` per step on the groups as they arrive;
* the runner requests the prompts of step ``t`` once weights of version
  ``t - k`` have been *loaded* by the rollout, i.e. it keeps the prompts of at
  most ``k + 1`` steps (``k + 1`` batches of N prompts) requested ahead of the
  trained ones, and a batch is never generated with weights older than
  ``t - k``;
* after each step the actor's new weights (version = the next step) go to the
  rollout; the runner waits only for the actor to send them, then starts the
  actor's step: the rollout receives them on another thread and loads them
  between two generation chunks; the runner waits for that load (while the
  actor trains) before it requests the next batch;
* every group carries the version that generated it; at step ``t`` the actor
  drops any group older than ``t - k`` (counted in
  ``rollout/dropped_stale_groups``) and puts its prompt back on the request
  channel, so it never trains on older data and no prompt is lost.

Collocated placement is refused (:func:`check_async_placement`): rollout and
actor take turns on the same devices there, so there is nothing to overlap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlinf.core.logging import get_logger
from rlinf.reasoning.config import ReasoningConfig
from rlinf.sched import GroupFuture, wait_all

if TYPE_CHECKING:
    from rlinf.reasoning.runner import ReasoningRunner

__all__ = ["AsyncPipeline", "check_async_placement", "staleness_metrics"]

_log = get_logger("rlinf.reasoning.async_grpo")

_POLL_S = 0.05
"""How often the runner checks the background stages while the actor trains."""
_STOP_TIMEOUT_S = 120.0


def check_async_placement(cfg: ReasoningConfig, collocated: bool) -> None:
    """Refuses asynchronous GRPO on a collocated placement.

    Args:
        cfg: The validated config.
        collocated: Whether actor and rollout share devices.

    Raises:
        ValueError: Naming ``algorithm.max_staleness`` and ``cluster.component_placement``.
    """
    if cfg.algorithm.is_async and collocated:
        raise ValueError(
            f"algorithm.max_staleness={cfg.algorithm.max_staleness} (asynchronous GRPO) needs "
            "rollout and actor on different devices, but cluster.component_placement "
            f"{cfg.cluster.component_placement} places them together (collocated: they take "
            "turns, so nothing would overlap); give the rollout its own slots or set "
            "algorithm.max_staleness: 0"
        )


def staleness_metrics(
    staleness: Sequence[int], dropped: int, max_staleness: int
) -> dict[str, float]:
    """``rollout/staleness_*`` metrics of the groups one step trained on.

    Args:
        staleness: ``actor version - generating version`` of each trained group.
        dropped: Groups dropped as older than ``max_staleness`` in the step.
        max_staleness: k; the histogram has one bin per value ``0..k``.

    Returns:
        ``rollout/staleness_mean``, ``rollout/staleness_max``,
        ``rollout/staleness_hist_0`` .. ``rollout/staleness_hist_k`` (group
        counts) and ``rollout/dropped_stale_groups``.
    """
    out: dict[str, float] = {
        "rollout/staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "rollout/staleness_max": float(max(staleness, default=0)),
        "rollout/dropped_stale_groups": float(dropped),
    }
    for value in range(max_staleness + 1):
        out[f"rollout/staleness_hist_{value}"] = float(sum(s == value for s in staleness))
    return out


class AsyncPipeline:
    """The background rollout and reward streams, request gating and overlapped syncs.

    Args:
        runner: The runner it belongs to (its groups, channels, sampler).
    """

    def __init__(self, runner: ReasoningRunner) -> None:
        self.runner = runner
        self.cfg = runner.cfg
        self._streams: list[GroupFuture] = []
        self._pending_sync: GroupFuture | None = None
        self._issued = 0  # batches (steps) whose prompts have been requested
        self._cursors: dict[int, dict[str, Any]] = {}
        self.stream_reports: list[dict[str, Any]] = []
        """What each rollout/reward stream returned when it was stopped (tests)."""

    @property
    def running(self) -> bool:
        """Whether the background streams are running."""
        return bool(self._streams)

    # ------------------------------------------------------------------ lifecycle
    def start(self, step: int) -> None:
        """Syncs version ``step`` (fully) and starts the streams, if not running yet.

        Args:
            step: The step training starts (or resumes) at.
        """
        if self._streams:
            return
        runner = self.runner
        if runner.synced_version != step:
            runner.update_rollout_weights(step)
        self._issued = step
        self._cursors.clear()
        self._streams = [
            runner.rollout.generate_stream(
                runner.requests, runner.generated, runner.proximal, runner.actor.world_size
            ),
            runner.reward.score_stream(runner.generated, runner.rewarded),
        ]

    def stop(self) -> None:
        """Stops the streams (the rollout after its current chunk) and waits for them.

        What is still queued (requests, generated or rewarded groups) stays on
        the channels and is dropped with them.
        """
        if not self._streams:
            return
        runner = self.runner
        rollout_stream, reward_stream = self._streams
        self._streams = []
        timeout = _STOP_TIMEOUT_S
        runner.rollout.stop_stream().wait(timeout)
        for _ in range(runner.rollout.world_size):  # wakes a rank waiting for a request
            runner.requests.put(None, timeout=timeout)
        reports = wait_all([rollout_stream], timeout, on_error=runner._res.close_channels)[0]
        for _ in range(runner.reward.world_size):
            runner.generated.put(None, timeout=timeout)
        reports += wait_all([reward_stream], timeout, on_error=runner._res.close_channels)[0]
        self.stream_reports.extend(reports)
        self.wait_synced()

    def abort(self) -> None:
        """After a failure: asks the rollout to stop (no wait) and forgets the streams."""
        if self._streams:
            try:
                self.runner.rollout.stop_stream()
            except Exception as err:  # a dead group: nothing to stop
                _log.debug("stop_stream after a failure: %s", err)
        self.reset()

    def reset(self) -> None:
        """Forgets the streams and pending work (after a relaunch or a resume)."""
        self._streams = []
        self._pending_sync = None
        self._cursors.clear()

    # ------------------------------------------------------------------ weights
    def sync(self, version: int) -> float:
        """Sends version ``version`` to the rollout; waits for the actor side only.

        The previous sync's load is waited for first, so two syncs never interleave.

        Args:
            version: The new weight version (the step it starts).

        Returns:
            Seconds the runner waited (previous load + this send).
        """
        runner = self.runner
        t0 = time.perf_counter()
        self.wait_synced()
        actor_fut = runner.actor.sync_model_to_rollout(
            runner.rollout.name, runner.rollout.world_size, version
        )
        self._pending_sync = runner.rollout.sync_model_from_actor(runner.actor.name)
        actor_out = wait_all(
            [actor_fut],
            self.cfg.runner.step_timeout_s,
            on_error=runner._res.close_channels,
            hint="raise runner.step_timeout_s if the run is just slow",
        )[0]
        seconds = time.perf_counter() - t0
        runner.sync_history.append({"actor": actor_out[0], "rollout": None, "seconds": seconds})
        runner.synced_version = version
        return seconds

    def wait_synced(self) -> None:
        """Waits until the rollout has loaded the last weights sent."""
        if self._pending_sync is None:
            return
        pending, self._pending_sync = self._pending_sync, None
        out = wait_all(
            [pending], self.cfg.runner.step_timeout_s, on_error=self.runner._res.close_channels
        )[0]
        for report in reversed(self.runner.sync_history):
            if report["rollout"] is None:
                report["rollout"] = out
                break

    # ------------------------------------------------------------------ requests
    def issue(self, step: int) -> None:
        """Requests the prompts of steps up to ``step + max_staleness`` (at most the last).

        Call it only once the rollout has loaded weights of version ``step``
        (:meth:`wait_synced`): a request taken by the rollout before that load
        would be generated with version ``step - 1`` and be one version too old
        when its step trains (it would be dropped and generated again).

        Args:
            step: The step being trained (weights of this version were loaded).
        """
        runner = self.runner
        last = min(step + self.cfg.algorithm.max_staleness, runner.total_steps - 1)
        while self._issued <= last:
            self._cursors[self._issued] = runner.sampler.state_dict()
            runner._put_requests(runner._next_indices(), self._issued)
            self._issued += 1
        for old in [b for b in self._cursors if b < step]:
            del self._cursors[old]

    def cursor_for(self, step: int) -> dict[str, Any]:
        """The sampler state before the prompts of ``step`` were requested.

        A checkpoint at ``step`` saves it, so a resumed run requests those
        prompts again (the generations in flight at the save are lost, the
        prompts are not).

        Args:
            step: The first step the checkpoint has not trained.

        Returns:
            A :meth:`ResumableSampler.state_dict`.
        """
        return self._cursors.get(step, self.runner.sampler.state_dict())

    # ------------------------------------------------------------------ training
    def train(self, step: int) -> list[dict[str, Any]]:
        """Runs the actor's step ``step`` while watching the streams.

        Starts the actor's training first (its groups were requested earlier),
        then waits for the rollout to load version ``step`` and requests the
        prompts up to ``step + max_staleness`` (:meth:`issue`).

        Args:
            step: The step (= the actor's weight version).

        Returns:
            The actor ranks' reports.

        Raises:
            RuntimeError: If a stream ended while the actor still waited for data.
            rlinf.sched.WorkerError: A stage failed (the channels are closed).
        """
        runner = self.runner
        cfg = self.cfg
        fut = runner.actor.run_training(runner.rewarded, step, runner.requests, runner.proximal)
        deadline = time.monotonic() + cfg.runner.step_timeout_s
        self.wait_synced()  # version ``step`` is loaded: what is requested now is not too old
        self.issue(step)
        # Waits on the actor's future itself (returns the moment it finishes),
        # looking at the streams every _POLL_S.
        while not fut.done(timeout=_POLL_S) and time.monotonic() < deadline:
            for stream in self._streams:
                if stream.done():
                    wait_all([stream], 10.0, on_error=runner._res.close_channels)
                    runner._res.close_channels()
                    raise RuntimeError(
                        f"{stream.group}.{stream.method}() ended while the actor trained step "
                        f"{step}; asynchronous GRPO needs it running"
                    )
        remaining = max(1.0, deadline - time.monotonic())
        out: list[dict[str, Any]] = wait_all(
            [fut],
            remaining,
            on_error=runner._res.close_channels,
            hint="raise runner.step_timeout_s if the run is just slow; is a stage stuck?",
        )[0]
        return out
