"""``AsyncEmbodiedRunner``: off-policy (SAC) training while env and rollout keep running.

Why: an off-policy learner does not need fresh on-policy batches, so the env
and the rollout need not wait for training. The driver keeps two things in
flight at once:

* rollout epochs: ``env.interact`` + ``rollout.generate`` (the same workers and
  channels as the sync :class:`~rlinf.embodied.runner.EmbodiedRunner`), launched
  back to back; each ships its trajectories to the actor channel. Epochs before
  ``algorithm.warmup_steps`` env steps act uniformly at random (rollout mode
  ``random``).
* actor steps: ``actor.train_step`` ingests what arrived into the replay buffer
  and runs ``algorithm.updates_per_step`` updates, waiting for env steps only
  when it is ahead of ``algorithm.replay_ratio`` updates per env step.

A runner step is one actor step. At its end, once ``weight_sync_interval``
updates were made since the last refresh (or eval / a checkpoint is due), the
actor pauses until the current rollout epoch ends, then the runner syncs the
weights (the existing broadcast path), evaluates, saves and goes on. The env
waits only then, and before a rollout epoch while the actor is more than
``algorithm.max_update_lag`` updates behind (never when that is null).

Metrics per step: the actor's ``train/*`` (``q_loss``, ``actor_loss``,
``alpha``...) and ``replay/*`` (``size``, ``updates_per_env_step``...), ``env/*``
of the episodes that ended since the last step, ``rollout/env_steps`` and
``rollout/env_steps_per_s`` (env throughput over the step), ``eval/*`` and ``time/*``.

Cost: one extra driver poll per finished future; checkpoints hold the replay
buffer (see :mod:`rlinf.embodied.workers.sac_actor_worker`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from rlinf.core import startup
from rlinf.core.config import ConfigError, ConfigIssue
from rlinf.core.logging import get_logger
from rlinf.core.protocols.embodied import EnvSpec
from rlinf.core.protocols.workers import OffPolicyEmbodiedActorWorker
from rlinf.embodied.runner import EmbodiedRunner, _episode_metrics
from rlinf.sched import GroupFuture

__all__ = ["AsyncEmbodiedRunner", "env_gated", "update_lag_bound"]

_log = get_logger("rlinf.embodied.async_runner")

_SAC_CONSOLE_WATCH = {
    "env_steps/s": "rollout/env_steps_per_s",
    "return": "env/return",
    "eval_return": "eval/return",
    "q_loss": "train/q_loss",
    "actor_loss": "train/actor_loss",
}
"""What the progress bar shows (label: metric); every metric goes to TensorBoard."""


def update_lag_bound(
    max_update_lag: int | None, updates_per_step: int, replay_ratio: float, epoch_env_steps: int
) -> float | None:
    """``max_update_lag`` raised to the smallest bound that cannot stall the actor.

    While the actor waits for data it is fewer than ``updates_per_step +
    replay_ratio * epoch_env_steps`` updates behind the env's next epoch, so a
    bound at least that large never holds back the epoch the actor waits for.

    Args:
        max_update_lag: ``algorithm.max_update_lag`` (None: no back-pressure).
        updates_per_step: Updates per actor step.
        replay_ratio: Updates per env step.
        epoch_env_steps: Most env steps one rollout epoch adds.

    Returns:
        The bound in updates, or None.
    """
    if max_update_lag is None:
        return None
    floor = updates_per_step + math.ceil(replay_ratio * epoch_env_steps)
    return float(max(max_update_lag, floor))


def env_gated(
    *,
    env_steps: int,
    epoch_env_steps: int,
    updates: int,
    warmup_steps: int,
    replay_ratio: float,
    bound: float | None,
) -> bool:
    """Whether the next rollout epoch waits: the actor would lag more than ``bound`` updates.

    Args:
        env_steps: Env steps of the finished epochs.
        epoch_env_steps: Most env steps the next epoch adds.
        updates: Updates of the finished actor steps.
        warmup_steps: Env steps before learning starts.
        replay_ratio: Updates per env step after warm-up.
        bound: From :func:`update_lag_bound` (None: never wait).
    """
    if bound is None:
        return False
    due = replay_ratio * max(0, env_steps + epoch_env_steps - warmup_steps)
    return due - updates > bound


@dataclass
class _SACInFlight:
    """The driver's state between events: what runs, the ended step, the step's totals."""

    rollout: list[GroupFuture] | None = None
    """The running rollout epoch (env and rollout futures)."""
    train: GroupFuture | None = None
    """The running actor step."""
    finished: dict[str, float] | None = None
    """An ended actor step's metrics, waiting for the step end (sync, eval, save)."""
    episodes: list[dict[str, list[float]]] = field(default_factory=list)
    mark_env: int = 0
    mark_time: float = 0.0
    gated_s: float = 0.0

    def running(self) -> list[list[GroupFuture]]:
        """The calls in flight, one list per unit (rollout epoch, actor step)."""
        units = []
        if self.rollout:
            units.append(self.rollout)
        if self.train is not None:
            units.append([self.train])
        return units


class AsyncEmbodiedRunner(EmbodiedRunner):
    """Drives SAC: continuous rollout epochs, actor steps from the replay buffer.

    Takes the same groups as :class:`EmbodiedRunner`; the actor group runs
    :class:`~rlinf.embodied.workers.EmbodiedSACActor` (any class implementing
    :class:`~rlinf.core.protocols.workers.OffPolicyEmbodiedActorWorker`).
    ``global_step`` counts actor steps of ``algorithm.updates_per_step`` updates.
    """

    actor_protocol = OffPolicyEmbodiedActorWorker

    def check_spec(self, spec: EnvSpec) -> None:
        """SAC needs continuous, bounded actions.

        Raises:
            ConfigError: Naming ``algorithm.loss_type`` for a discrete or unbounded env.
        """
        if spec.num_actions is not None or spec.action_low is None:
            kind = "discrete" if spec.num_actions is not None else "unbounded"
            raise ConfigError(
                [
                    ConfigIssue(
                        "algorithm.loss_type",
                        f"SAC here needs continuous, bounded actions but env.train "
                        f"({self.cfg.env.train.env_id}) has {kind} actions; use a continuous "
                        "env (e.g. Pendulum-v1), or PPO: runner.mode: sync, "
                        "algorithm.loss_type: actor_critic, actor.model.model_type: mlp",
                        self.cfg.algorithm.loss_type,
                    )
                ]
            )

    # ------------------------------------------------------------------ pieces

    def _epoch_env_steps(self) -> int:
        """Upper bound of the env steps one rollout epoch adds (all env ranks)."""
        split = self.cfg.env.train
        steps = split.max_steps_per_rollout_epoch or self.spec.max_episode_steps
        return int(split.num_envs * self.env.world_size * steps)

    def _env_gated(self) -> bool:
        """Whether the next rollout epoch must wait for the actor to catch up."""
        alg = self.cfg.algorithm
        epoch = self._epoch_env_steps()
        return env_gated(
            env_steps=self.total_env_steps,
            epoch_env_steps=epoch,
            updates=self.global_step * alg.updates_per_step,
            warmup_steps=alg.warmup_steps,
            replay_ratio=alg.replay_ratio,
            bound=update_lag_bound(
                alg.max_update_lag, alg.updates_per_step, alg.replay_ratio, epoch
            ),
        )

    def _launch_rollout(self) -> list[GroupFuture]:
        ch = self._res.channels
        mode = "random" if self.total_env_steps < self.cfg.algorithm.warmup_steps else "train"
        seed_step = self.total_env_steps  # distinct per epoch, restored on resume
        return [
            self.env.interact(ch["rollout"], ch["env"], ch["actor"], seed_step),
            self.rollout.generate(ch["rollout"], ch["env"], seed_step, mode),
        ]

    def save_checkpoint(self) -> Any:
        """Moves waiting trajectories into the replay buffer, then saves (see the base)."""
        self._wait([self.actor.ingest(self._res.channels["actor"])])
        return super().save_checkpoint()

    def _collect_rollout(self, f: _SACInFlight) -> None:
        """Waits for the ended rollout epoch; counts its env steps and keeps its episodes."""
        assert f.rollout is not None
        results = self._wait(f.rollout)
        f.rollout = None
        self.total_env_steps += sum(int(r["env_steps"]) for r in results[0])
        f.episodes.extend(r["episodes"] for r in results[0])

    def _add_throughput(self, metrics: dict[str, float], f: _SACInFlight) -> None:
        """Adds the step's episodes, env throughput and times; starts the next step's count."""
        now = time.perf_counter()
        metrics.update(_episode_metrics("env", f.episodes))
        f.episodes = []
        metrics["rollout/env_steps"] = float(self.total_env_steps)
        metrics["rollout/env_steps_per_s"] = (self.total_env_steps - f.mark_env) / max(
            now - f.mark_time, 1e-9
        )
        metrics["time/step"] = now - f.mark_time
        metrics["time/env_gated"] = f.gated_s
        f.mark_env, f.mark_time, f.gated_s = self.total_env_steps, now, 0.0
        if self.cfg.runner.max_restarts > 0:
            metrics["train/restarts"] = float(self.restarts)

    # ------------------------------------------------------------------ the loop

    def _run_attempt(self) -> dict[str, float]:
        cfg, alg = self.cfg.runner, self.cfg.algorithm
        total = cfg.total_steps
        _log.info(
            "async SAC: %d updates per step, replay_ratio %g, warm-up %d env steps; "
            "TensorBoard logs: %s",
            alg.updates_per_step,
            alg.replay_ratio,
            alg.warmup_steps,
            self.tensorboard_dir,
        )
        last: dict[str, float] = {}
        if cfg.val_before_train and self.cfg.env.eval is not None and self.global_step == 0:
            last = self.evaluate()
            self._res.logger.log(last, step=0)
        self.update_rollout_weights()
        synced_updates = self.global_step * alg.updates_per_step
        console = self._console("embodied-async", _SAC_CONSOLE_WATCH)
        f = _SACInFlight(mark_env=self.total_env_steps, mark_time=time.perf_counter())
        try:
            while self.global_step < total:
                started = startup.report()
                if started is not None:
                    _log.info(started[0])
                # ---- start a rollout epoch (unless gated) and an actor step
                if f.rollout is None and f.finished is None and not self._env_gated():
                    f.rollout = self._launch_rollout()
                if f.train is None and f.finished is None:
                    f.train = self.actor.train_step(self._res.channels["actor"])
                # ---- wait for whichever ends first
                if f.running():
                    waited = time.perf_counter()
                    self._wait_any(f.running(), time.monotonic() + cfg.step_timeout_s)
                    if f.rollout is None:
                        f.gated_s += time.perf_counter() - waited
                if f.rollout is not None and all(x.done() for x in f.rollout):
                    self._collect_rollout(f)
                if f.train is not None and f.train.done():
                    f.finished = dict(self._wait([f.train])[0][0])
                    f.train = None
                    self.global_step += 1
                if f.finished is None:
                    continue
                # ---- step end: weight sync, eval, checkpoint, metrics
                updates = self.global_step * alg.updates_per_step
                step_end = self.global_step >= total
                eval_due, save_due = self._due(step_end)
                sync_due = updates - synced_updates >= alg.weight_sync_interval
                if (eval_due or save_due or sync_due or step_end) and f.rollout is not None:
                    continue  # the actor pauses until the rollout epoch ends
                metrics, f.finished = f.finished, None
                if sync_due or eval_due:
                    metrics["time/sync_weights"] = self.update_rollout_weights()
                    synced_updates = updates
                self._eval_and_save(metrics, eval_due, save_due)
                self._add_throughput(metrics, f)
                console.step(metrics, self.global_step)
                last = metrics
        finally:
            console.close()
        return last
