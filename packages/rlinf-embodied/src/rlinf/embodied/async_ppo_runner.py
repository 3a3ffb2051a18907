"""``AsyncPPORunner``: on-policy PPO/GRPO whose generation runs ahead of training.

``runner.mode: async`` with ``algorithm.loss_type`` ``actor_critic`` or ``actor``.
The sync :class:`~rlinf.embodied.runner.EmbodiedRunner` alternates a rollout and
an update; here the driver keeps two things in flight on different groups:

* a *generation*: ``env.interact`` + ``rollout.generate`` (the same workers and
  channels as the sync runner) produce one batch with the weights the rollout
  holds; the trajectories wait in the actor channel, which acts as the queue of
  batches received but not yet trained on;
* an *actor step*: ``actor.train_next_batch`` takes the oldest queued batch,
  drops it if it is older than ``algorithm.max_staleness`` = k versions, else
  trains on it with the decoupled PPO loss (see
  :mod:`rlinf.embodied.workers.actor_worker`).

A generation meant for step ``s`` (the step that will train on it) starts once
the rollout holds weights of version ``>= s - k``; with k = 1 (the default) the
env and the rollout generate batch ``s + 1`` while the actor trains on batch
``s``. Weights go to the rollout whenever neither a generation nor an actor step
is running and the actor is ahead of the rollout (the newest version there
is), so a generation waits at most for the sync itself. k = 0 gives the sync
schedule (generation waits for every update).

Eval and checkpoints happen at step ends: the runner first lets a running
generation finish. A checkpoint holds what the sync runner's holds plus the
actor's dropped-batch count; batches generated but not yet trained on (in the
actor channel or in flight) are not saved: a resumed run generates them again
from the env state of the checkpoint, with the checkpoint's weights.

Collocated placements (actor and rollout on the same devices) are refused at
:meth:`AsyncPPORunner.init_workers`: the two take turns on shared devices, so
nothing would overlap.

Metrics per step: the sync runner's ``train/*``, ``rollout/*``, ``eval/*`` and
``time/*``, plus
``rollout/staleness_mean``, ``rollout/staleness_max`` (versions between the
batch's weights and the actor's), ``rollout/dropped_batches`` (cumulative),
``rollout/trained_version``, ``rollout/env_steps_per_s`` (env steps of the
generations that finished during the step over the step's wall time: the
run's throughput; 0 at the last step, which generates nothing), and
``time/wait_for_batch`` (the actor idle, waiting for a batch). ``env/*``,
``time/generate_rollouts`` (the generation's own duration) and the worker busy
times come with the step during which a generation finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf.core import startup
from rlinf.core.config import ConfigError, ConfigIssue
from rlinf.core.config.errors import NO_VALUE
from rlinf.core.logging import get_logger
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import _CONSOLE_WATCH, EmbodiedRunner, _devices
from rlinf.sched import GroupFuture

__all__ = ["AsyncPPORunner", "check_async_ppo_placement"]

_log = get_logger("rlinf.embodied.async_ppo_runner")

_ASYNC_CONSOLE_WATCH = {**_CONSOLE_WATCH, "staleness": "rollout/staleness_mean"}
"""What the progress bar shows: the sync runner's numbers and the batches' staleness."""


def check_async_ppo_placement(cfg: EmbodiedConfig, shared: bool) -> None:
    """Refuses a config the async PPO runner cannot run.

    Args:
        cfg: The validated config.
        shared: Whether the placed actor shares devices (CPU slots or GPUs) with the rollout.

    Raises:
        ConfigError: Naming ``runner.mode`` (not async PPO/GRPO) or
            ``cluster.component_placement`` (actor and rollout share devices: they
            take turns there, so nothing would overlap).
    """
    if cfg.runner.mode != "async" or cfg.algorithm.loss_type == "sac":
        raise ConfigError(
            [
                ConfigIssue(
                    "runner.mode",
                    "AsyncPPORunner runs async PPO/GRPO: set runner.mode: async with "
                    f"algorithm.loss_type actor_critic or actor (got {cfg.algorithm.loss_type!r})",
                    cfg.runner.mode,
                )
            ]
        )
    if shared:
        raise ConfigError(
            [
                ConfigIssue(
                    "cluster.component_placement",
                    f"{cfg.cluster.component_placement} places the actor on devices of the "
                    "rollout; async PPO (runner.mode: async) overlaps generation and training, "
                    "which take turns on shared devices; give the actor its own slots (e.g. "
                    "actor: 0, env: 1, rollout: 1) or set runner.mode: sync",
                    NO_VALUE,
                )
            ]
        )


@dataclass
class _InFlight:
    """The driver's state between events: what runs, what is queued, the step's totals."""

    generation: tuple[list[GroupFuture], float] | None = None
    """The running generation's futures and start time."""
    training: tuple[GroupFuture, float] | None = None
    """The running actor step's future and start time."""
    ready: int = 0
    """Whole batches waiting in the actor channel."""
    gen_metrics: dict[str, float] = field(default_factory=dict)
    """The last finished generation's metrics, reported with the next step."""
    env_mark: int = 0
    time_mark: float = 0.0
    sync_s: float = 0.0
    wait_s: float = 0.0
    idle_since: float | None = None
    """Since when the actor waits for a batch (None while it trains)."""
    drops_in_a_row: int = 0

    @property
    def outstanding(self) -> int:
        """Batches queued or in flight: generated, generating or training."""
        return self.ready + (self.generation is not None) + (self.training is not None)

    def running(self) -> list[list[GroupFuture]]:
        """The calls in flight, one list per unit (generation, actor step)."""
        units = []
        if self.generation is not None:
            units.append(self.generation[0])
        if self.training is not None:
            units.append([self.training[0]])
        return units


class AsyncPPORunner(EmbodiedRunner):
    """Drives async PPO/GRPO: generation of the next batch overlaps training on the last.

    Takes the same groups as :class:`EmbodiedRunner` (the actor group runs
    :class:`~rlinf.embodied.workers.EmbodiedFSDPActor`).

    Attributes:
        max_staleness: k, ``algorithm.max_staleness`` (null: 1).
        dropped_batches: Batches the actor dropped as too stale (cumulative, resumed).
        trained_versions: ``(step, oldest weight version)`` of every batch trained on
            by this runner object, in order (for tests and diagnostics).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_staleness = self.cfg.algorithm.staleness_bound("async")
        self.dropped_batches = 0
        self.trained_versions: list[tuple[int, int]] = []

    def init_workers(self, resume_dir: str | Path | None = None) -> None:
        """Refuses a collocated placement, then :meth:`EmbodiedRunner.init_workers`.

        Raises:
            ConfigError: Naming ``cluster.component_placement`` when the actor shares
                devices (CPU slots or GPUs) with the rollout.
        """
        check_async_ppo_placement(self.cfg, bool(_devices(self.actor) & _devices(self.rollout)))
        super().init_workers(resume_dir)

    def load_checkpoint(self, path: str | Path) -> int:
        """:meth:`EmbodiedRunner.load_checkpoint`; the dropped count comes with the actor."""
        step = super().load_checkpoint(path)
        self.dropped_batches = 0  # the actor's count is reported with its next step
        return step

    # ------------------------------------------------------------------ pieces

    def _launch_generation(self, seed_step: int) -> tuple[list[GroupFuture], float]:
        ch = self._res.channels
        futures = [
            self.env.interact(ch["rollout"], ch["env"], ch["actor"], seed_step),
            self.rollout.generate(ch["rollout"], ch["env"], seed_step, "train"),
        ]
        return futures, time.perf_counter()

    def _schedule(self, f: _InFlight) -> None:
        """Syncs weights when both groups idle, then starts what may start now."""
        total, k = self.cfg.runner.total_steps, self.max_staleness
        # The newest weights go to the rollout while both groups are idle.
        if f.generation is None and f.training is None and self._synced_version < self.global_step:
            f.sync_s += self.update_rollout_weights()
        target = self.global_step + f.outstanding  # the step that trains the next batch
        if f.generation is None and target < total and self._synced_version >= target - k:
            f.generation = self._launch_generation(target)
        if f.training is None and f.ready > 0:
            f.training = (
                self.actor.train_next_batch(self._res.channels["actor"]),
                time.perf_counter(),
            )
            f.ready -= 1
            if f.idle_since is not None:
                f.wait_s += time.perf_counter() - f.idle_since
                f.idle_since = None

    def _finish_generation(self, f: _InFlight) -> None:
        """Waits for the running generation; its batch joins the queue."""
        assert f.generation is not None
        futures, started = f.generation
        results = self._wait(futures)
        f.generation = None
        f.ready += 1
        f.gen_metrics = self._rollout_metrics(results[0], results[1], time.perf_counter() - started)

    def _finish_training(self, f: _InFlight) -> tuple[dict[str, float], float]:
        """Collects the ended actor step: its metrics and its duration in seconds."""
        assert f.training is not None
        out = dict(self._wait([f.training[0]])[0][0])
        train_s = time.perf_counter() - f.training[1]
        f.training, f.idle_since = None, time.perf_counter()
        self.dropped_batches = int(out.pop("rollout/dropped_batches", 0))
        return out, train_s

    def _note_dropped(self, out: dict[str, float], f: _InFlight) -> bool:
        """Whether the actor dropped the batch as too stale (then the weights are resent)."""
        if not out.pop("dropped", 0.0):
            f.drops_in_a_row = 0
            return False
        k = self.max_staleness
        _log.warning(
            "step %d: dropped a batch of weight version %d (older than "
            "algorithm.max_staleness=%d versions); resending the weights",
            self.global_step,
            int(out["rollout/trained_version"]),
            k,
        )
        # The schedule never generates that far ahead, so the rollout's weights
        # did not arrive: send them again before the next generation.
        self._synced_version = -1
        f.drops_in_a_row += 1
        if f.drops_in_a_row > k + 2:
            raise RuntimeError(
                f"step {self.global_step}: {f.drops_in_a_row} batches in a row were "
                f"older than algorithm.max_staleness={k} versions although the "
                "weights were resent; the rollout does not load the actor's weights"
            )
        return True

    def _add_throughput(self, metrics: dict[str, float], f: _InFlight) -> None:
        """Adds the step's env throughput and times, and starts the next step's count."""
        now = time.perf_counter()
        metrics["rollout/env_steps"] = float(self.total_env_steps)
        metrics["rollout/env_steps_per_s"] = (self.total_env_steps - f.env_mark) / max(
            now - f.time_mark, 1e-9
        )
        metrics["time/step"] = now - f.time_mark
        metrics["time/sync_weights"] = f.sync_s
        metrics["time/wait_for_batch"] = f.wait_s
        f.env_mark, f.time_mark, f.sync_s, f.wait_s = self.total_env_steps, now, 0.0, 0.0
        if self.cfg.runner.max_restarts > 0:
            metrics["train/restarts"] = float(self.restarts)

    # ------------------------------------------------------------------ the loop

    def _run_attempt(self) -> dict[str, float]:
        cfg = self.cfg.runner
        total = cfg.total_steps
        _log.info(
            "async PPO: max_staleness %d (generation runs up to %d version(s) ahead); "
            "TensorBoard logs: %s",
            self.max_staleness,
            self.max_staleness,
            self.tensorboard_dir,
        )
        last = self._eval_before_train()
        console = self._console("embodied-async-ppo", _ASYNC_CONSOLE_WATCH)
        now = time.perf_counter()
        f = _InFlight(env_mark=self.total_env_steps, time_mark=now, idle_since=now)
        try:
            while self.global_step < total:
                reported = startup.report()
                if reported is not None:
                    _log.info(reported[0])
                # ---- start what may start: weight sync, generation, actor step
                self._schedule(f)
                # ---- wait for whichever ends first
                self._wait_any(f.running(), time.monotonic() + cfg.step_timeout_s)
                if f.generation is not None and all(x.done() for x in f.generation[0]):
                    self._finish_generation(f)
                if f.training is None or not f.training[0].done():
                    continue
                # ---- an actor step ended: a dropped batch, or a trained one
                out, train_s = self._finish_training(f)
                if self._note_dropped(out, f):
                    continue
                self.trained_versions.append(
                    (self.global_step, int(out["rollout/trained_version"]))
                )
                self.global_step += 1
                # ---- step end: eval, checkpoint, metrics
                step_end = self.global_step >= total
                eval_due, save_due = self._due(step_end)
                if (eval_due or save_due or step_end) and f.generation is not None:
                    self._finish_generation(f)  # env and rollout must be idle
                metrics = {**f.gen_metrics, **out}
                f.gen_metrics = {}  # env/* and generation times: once per finished generation
                metrics["rollout/dropped_batches"] = float(self.dropped_batches)
                metrics["time/actor_training"] = train_s
                self._eval_and_save(metrics, eval_due, save_due)
                self._add_throughput(metrics, f)
                console.step(metrics, self.global_step)
                last = metrics
            if f.generation is not None:  # none is launched for steps past the last, but be safe
                self._finish_generation(f)
        finally:
            console.close()
        return last
