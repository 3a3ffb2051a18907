"""``EmbodiedRunner``: the driver loop of embodied training.

Usage (the programming flow of ``examples/embodiment/train_embodied_agent.py``)::

    cluster = Cluster(num_nodes=cfg.cluster.num_nodes, cluster_cfg=cfg.cluster)
    placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
    actor = EmbodiedFSDPActor.create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("actor"))
    rollout = MultiStepRolloutWorker.create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("rollout"))
    env = EnvWorker.create_group(cfg).launch(
        cluster, placement_strategy=placement.get_strategy("env"))
    runner = EmbodiedRunner(cfg=cfg, actor=actor, rollout=rollout, env=env)
    runner.init_workers()
    runner.run()
    runner.close()

With the policy in the env workers (``rollout.in_env_process: true``) there is
no rollout group (``rollout=None``):
each env rank runs the policy itself, the weight syncs go to the env group, and
a rollout is ``env.interact`` and ``actor.recv_rollout_batch`` alone.

Each step of :meth:`EmbodiedRunner.run`: :meth:`~EmbodiedRunner.update_rollout_weights`,
:meth:`~EmbodiedRunner.generate_rollouts` (``env.interact``, ``rollout.generate``
and ``actor.recv_rollout_batch`` run concurrently, connected by three
channels), :meth:`~EmbodiedRunner.compute_advantages_and_returns`,
:meth:`~EmbodiedRunner.run_training`; then eval every
``runner.val_check_interval`` steps, a checkpoint every ``runner.save_interval``
steps under ``log_path/experiment_name/checkpoints/global_step_N/``, and the
step's metrics (``train/ eval/ env/ rollout/ time/``) to the metric backends.

With ``runner.online_scaling`` (sync PPO/GRPO; the actor group launched by
:func:`~rlinf.embodied.autoplace_profile.launch_embodied_groups` with extra ranks
on the rollout's resources) the rollout's trajectories go to every actor rank;
then the actor grows onto all ranks
(:meth:`~rlinf.embodied.workers.EmbodiedFSDPActor.scale_up`), computes
advantages and trains there, and shrinks back
(:meth:`~rlinf.embodied.workers.EmbodiedFSDPActor.scale_down`) before the next
weight sync. Weight sync and checkpoints use the base ranks. Logged:
``time/scale_up``, ``time/scale_down``, ``actor/world_size_generate`` and
``actor/world_size_train``; a rank failing while re-sharding raises
:class:`rlinf.sched.ScalingError` (see docs/online_scaling.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rlinf.core import startup
from rlinf.core.checkpoint import (
    find_latest_checkpoint,
    new_checkpoint,
    resume_from,
    rng_state,
    set_rng_state,
)
from rlinf.core.closing import ClosesOnExit
from rlinf.core.heap import freeze_heap
from rlinf.core.logging import get_logger
from rlinf.core.progress import TrainingConsole, training_console
from rlinf.core.protocols.workers import (
    EmbodiedActorWorker,
    EmbodiedEnvWorker,
    EmbodiedPolicyEnvWorker,
    EmbodiedRolloutWorker,
    check_implements,
)
from rlinf.core.run_resources import RunResources
from rlinf.core.run_state import RunProgress, load_run_state, save_run_state
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.pipelining import in_env_process_advice, pipeline_advice
from rlinf.sched import (
    GroupFuture,
    WorkerGroup,
    scale_actor,
    wait_all,
    wait_for_progress,
)
from rlinf.sched.recovery import resume_from_newest, run_with_restarts

__all__ = ["EmbodiedRunner", "find_latest_checkpoint"]

_log = get_logger("rlinf.embodied.runner")

_CONSOLE_WATCH = {
    "env_steps/s": "rollout/env_steps_per_s",
    "return": "env/return",
    "success": "env/success_once",
    "eval_return": "eval/return",
    "eval_success": "eval/success_once",
    "loss": "train/actor/total_loss",
}
"""What the progress bar shows (label: metric); every metric goes to TensorBoard."""

_POLL_S = 1.0
"""How often the async runners' wait for any unit looks at its futures (s)."""


def _devices(group: WorkerGroup, ranks: Sequence[int] | None = None) -> set[tuple[Any, ...]]:
    out: set[tuple[Any, ...]] = set()
    placements = group.placements
    for p in placements if ranks is None else [placements[r] for r in ranks]:
        if p.resource_ranks:
            out.update((p.node_rank, p.node_group, p.resource_kind, r) for r in p.resource_ranks)
        else:
            out.add((p.node_rank, "node"))
    return out


def _check_policy_group(cfg: EmbodiedConfig, rollout: WorkerGroup | None) -> None:
    """Whether ``rollout`` (a group, or None: the env workers act) fits ``rollout.in_env_process``.

    Raises:
        ValueError: They do not fit; the message names the key and the fix.
    """
    if cfg.rollout.in_env_process and rollout is not None:
        raise ValueError(
            f"rollout.in_env_process=true runs the policy in the env workers, but a "
            f"rollout group ({rollout.name}) was given; pass rollout=None (and do not "
            "launch it), or set rollout.in_env_process: false"
        )
    if not cfg.rollout.in_env_process and rollout is None:
        raise ValueError(
            "rollout=None runs the policy in the env workers, but rollout.in_env_process="
            "false; launch a MultiStepRolloutWorker group, or set rollout.in_env_process: true"
        )


class EmbodiedRunner(ClosesOnExit):
    """Drives env, rollout and actor groups through training, eval and checkpoints.

    The groups may be reused by another runner afterwards: ``init_workers``
    rebuilds every worker's state from the runner's config.

    Args:
        cfg: The validated run config.
        actor: Launched :class:`~rlinf.embodied.workers.EmbodiedFSDPActor` group.
        rollout: Launched :class:`~rlinf.embodied.workers.MultiStepRolloutWorker` group;
            None to run the policy in the env group (``rollout.in_env_process: true``).
        env: Launched :class:`~rlinf.embodied.workers.EnvWorker` group.

    Raises:
        ValueError: ``rollout`` does not fit ``rollout.in_env_process`` (a group with
            ``true``; None with ``false``).

    Attributes:
        global_step: Training steps done (the weight version of the next sync).
        total_env_steps: Env sub-steps that advanced a live episode, over the run.
        restarts: Relaunches after a dead worker so far (``runner.max_restarts``).
        mode: ``collocated``, ``hybrid`` or ``disaggregated``, from the placements.
        collocated: Whether the actor shares devices with the rollout (then the
            rollout offloads between rollouts and both take device locks).
    """

    actor_protocol: ClassVar[type] = EmbodiedActorWorker
    """The role protocol the actor group's class must implement."""

    def __init__(
        self,
        cfg: EmbodiedConfig,
        actor: WorkerGroup,
        rollout: WorkerGroup | None,
        env: WorkerGroup,
    ) -> None:
        check_implements(actor.worker_cls, self.actor_protocol)
        check_implements(env.worker_cls, EmbodiedEnvWorker)
        _check_policy_group(cfg, rollout)
        if rollout is None:
            check_implements(env.worker_cls, EmbodiedPolicyEnvWorker)
        else:
            check_implements(rollout.worker_cls, EmbodiedRolloutWorker)
        self.cfg = cfg
        self.actor, self.env = actor, env
        self._rollout = rollout
        self.policy_group: WorkerGroup = env if rollout is None else rollout
        """The group that runs the policy: the rollout group, or the env group."""
        self.global_step = 0
        self.total_env_steps = 0
        self.restarts = 0
        self.collocated = False
        self.mode = "disaggregated"
        self.spec: Any = None
        self._res = RunResources(cfg.runner.logger, cfg)
        self._synced_version = -1
        self._evaluated = False
        self._initialized = False
        self._train_rollouts = 0
        self.base_actor_ranks = list(range(actor.world_size))
        """The actor ranks that hold the policy between steps (fewer with online scaling)."""

    @property
    def rollout(self) -> WorkerGroup:
        """The rollout group.

        Raises:
            RuntimeError: ``rollout.in_env_process`` runs the policy in the env group.
        """
        if self._rollout is None:
            raise RuntimeError("rollout.in_env_process: this run has no rollout group")
        return self._rollout

    @property
    def groups(self) -> tuple[WorkerGroup, ...]:
        """The launched groups: actor, rollout (unless ``in_env_process``), env."""
        return tuple(g for g in (self.actor, self._rollout, self.env) if g is not None)

    # ------------------------------------------------------------------ paths

    @property
    def experiment_dir(self) -> Path:
        """``log_path/experiment_name``: everything this run writes."""
        return self.cfg.runner.logger.experiment_dir

    @property
    def checkpoint_root(self) -> Path:
        """``log_path/experiment_name/checkpoints``."""
        return self.experiment_dir / "checkpoints"

    @property
    def tensorboard_dir(self) -> Path:
        """Where TensorBoard event files go."""
        return self.experiment_dir / "tensorboard"

    # ------------------------------------------------------------------ setup

    def _wait(self, futures: Sequence[GroupFuture]) -> list[list[Any]]:
        """:func:`~rlinf.sched.wait_all` within ``runner.step_timeout_s``; failures close channels.

        Closing the channels wakes workers blocked on them, so one failing rank
        does not leave its peers waiting until their timeout.
        """
        return wait_all(
            futures,
            self.cfg.runner.step_timeout_s,
            on_error=self._res.close_channels,
            hint=f"step {self.global_step}: raise runner.step_timeout_s if the run is just slow",
        )

    def _wait_any(self, units: list[list[GroupFuture]], deadline: float) -> None:
        """Returns once every future of one unit is done; a failed rank raises at once.

        The async runners' wait: a unit is what their loop acts on as a whole (a
        rollout epoch is the env's and the rollout's futures). Blocks on the ranks
        still running, so a half-finished unit is not polled in a loop.
        """
        while True:
            for unit in units:
                for future in unit:
                    if future.done():
                        self._wait([future])  # a failed rank surfaces now, not at the timeout
                if all(future.done() for future in unit):
                    return
            wait_for_progress([f for unit in units for f in unit], _POLL_S)
            if time.monotonic() > deadline:
                self._wait([f for unit in units for f in unit])  # names the ranks still running
                return

    def init_workers(self, resume_dir: str | Path | None = None) -> None:
        """Builds envs, policies and optimizer on every rank, then resumes if asked.

        Checks the rules that need world sizes (:meth:`EmbodiedConfig.check_world_sizes`),
        creates the three channels, decides offloading from the placement
        (components that share devices offload between phases), and loads
        ``runner.resume_dir`` (a checkpoint folder, or ``auto`` for the newest one).

        Args:
            resume_dir: Resume from this instead of ``runner.resume_dir``.
        """
        cfg = self.cfg
        sizes = {
            "actor": self.actor.world_size,
            "env": self.env.world_size,
            "rollout": self.policy_group.world_size,
        }
        cfg.check_world_sizes(**sizes)
        self._open_channels()
        if cfg.runner.online_scaling:
            self._check_scaling()
        offload_rollout, offload_actor = self._place()
        specs = self._wait([self.env.init_worker(cfg, self.actor.world_size)])[0]
        self.spec = specs[0]
        cfg.check_world_sizes(**sizes, max_episode_steps=self.spec.max_episode_steps)
        self.check_spec(self.spec)
        policy_init = (
            self.env.init_policy(cfg, self.spec, self.actor.name)
            if self._rollout is None
            else self._rollout.init_worker(
                cfg, self.spec, self.actor.name, self.env.world_size, offload_rollout
            )
        )
        actor_init = self.actor.init_worker(
            cfg,
            self.spec,
            self.policy_group.name,
            self.policy_group.world_size,
            self.env.world_size,
            offload_actor,
        )
        self._wait([policy_init, actor_init])
        self.global_step = 0
        self.total_env_steps = 0
        self._synced_version = -1
        _log.info(
            "embodied run (%s): actor x%d, env x%d, %s, %d pipeline stage(s)%s",
            self.mode,
            self.actor.world_size,
            self.env.world_size,
            "policy in the env processes"
            if self._rollout is None
            else f"rollout x{self._rollout.world_size}",
            cfg.rollout.pipeline_stage_num,
            "; offload between phases" if offload_actor or offload_rollout else "",
        )
        resume = self.cfg.runner.resume_dir if resume_dir is None else resume_dir
        resume_from(resume, self.checkpoint_root, self.load_checkpoint)
        self._freeze_heaps()
        self._initialized = True
        startup.mark("init_workers")

    def _open_channels(self) -> None:
        """Creates the rollout, env and actor channels (fresh ones on a second init)."""
        self._res.drop_channels()
        run_id = uuid.uuid4().hex[:10]
        stages = self.cfg.rollout.pipeline_stage_num
        keys = max(64, self.env.world_size * stages + 8, self.actor.world_size + 8)
        for name in ("rollout", "env", "actor"):
            self._res.channel(name, f"embodied-{run_id}-{name}", max_keys=keys)

    def _place(self) -> tuple[bool, bool]:
        """Sets :attr:`mode` and :attr:`collocated` from the placements.

        Returns:
            ``(offload_rollout, offload_actor)``: components that share devices
            offload between phases, unless ``enable_offload`` says otherwise.
        """
        cfg = self.cfg
        actor_dev = _devices(self.actor, self.base_actor_ranks)
        rollout_dev = _devices(self.policy_group)
        env_dev = _devices(self.env)
        self.collocated = bool(actor_dev & rollout_dev)
        shared = [self.collocated, bool(actor_dev & env_dev), bool(env_dev & rollout_dev)]
        self.mode = "collocated" if all(shared) else "hybrid" if any(shared) else "disaggregated"
        offload_rollout = (
            self.collocated if cfg.rollout.enable_offload is None else cfg.rollout.enable_offload
        )
        offload_actor = (
            bool(actor_dev & (rollout_dev | env_dev))
            if cfg.actor.enable_offload is None
            else cfg.actor.enable_offload
        )
        if cfg.runner.online_scaling:
            offload_actor = False  # the config refuses actor.enable_offload: true
        return offload_rollout, offload_actor

    def _freeze_heaps(self) -> None:
        """``runner.freeze_gc_heap``: set-up objects leave the cyclic collector's passes.

        Freezes (:mod:`rlinf.core.heap`) the driver and every worker at the end
        of :meth:`init_workers`.
        """
        if not self.cfg.runner.freeze_gc_heap:
            return
        self._wait([group.freeze_heap() for group in self.groups])
        freeze_heap()

    def _check_scaling(self) -> None:
        """Online scaling: the actor group has extra ranks, none beside its base ranks' devices."""
        info = self._wait([self.actor.scaling_info()])[0][0]
        base = int(info["base_world_size"])
        if base >= self.actor.world_size:
            raise ValueError(
                f"runner.online_scaling=true but all {self.actor.world_size} actor ranks hold "
                "the policy: launch the actor group with "
                "rlinf.embodied.autoplace_profile.launch_embodied_groups (it places extra ranks "
                "on the rollout's resources), or set runner.online_scaling: false"
            )
        self.base_actor_ranks = list(range(base))
        shared = _devices(self.actor, self.base_actor_ranks) & _devices(self.rollout)
        if shared:
            raise ValueError(
                "runner.online_scaling=true needs disaggregated placement, but the actor shares "
                f"resources with the rollout ({sorted(map(str, shared))}); place them apart in "
                "cluster.component_placement or set runner.online_scaling: false"
            )

    def _base_actor(self) -> WorkerGroup:
        """The actor group limited to the ranks that hold the policy between steps."""
        if len(self.base_actor_ranks) == self.actor.world_size:
            return self.actor
        return self.actor.execute_on(*self.base_actor_ranks)

    def _scale(self, phase: str) -> float:
        """``scale_up`` / ``scale_down`` on every actor rank (:func:`rlinf.sched.scale_actor`)."""
        timeout = self.cfg.runner.step_timeout_s
        return scale_actor(self.actor, phase, timeout, on_error=self._res.close_channels)

    def check_spec(self, spec: Any) -> None:
        """Checks the env's spec against the algorithm before policies are built (a hook).

        Args:
            spec: The train env's :class:`~rlinf.core.protocols.embodied.EnvSpec`.
        """

    def load_checkpoint(self, path: str | Path) -> int:
        """Restores the actor, the envs, the env-step count and the step from ``path``.

        Args:
            path: A ``global_step_N`` directory written by :meth:`save_checkpoint`.

        Returns:
            The restored global step.
        """
        path = Path(path)
        allow = self.cfg.runner.allow_config_change
        progress = load_run_state(path, self.cfg, allow_config_change=allow)
        steps = self._wait(
            [self._base_actor().load_checkpoint(str(path)), self.env.load_checkpoint(str(path))]
        )
        self.global_step = int(steps[0][0])
        self.total_env_steps = progress.total_env_steps
        self.restarts = max(self.restarts, progress.restarts)
        if progress.rng is not None:
            set_rng_state(progress.rng)
        _log.info("resumed from %s at step %d", path, self.global_step)
        return self.global_step

    # ------------------------------------------------------------------ one step

    def update_rollout_weights(self) -> float:
        """Sends the actor's weights to the rollout group (skipped if already current).

        Returns:
            Seconds spent.
        """
        start = time.perf_counter()
        if self._synced_version != self.global_step:
            first = self._synced_version < 0
            if first:
                target = "rollout" if self._rollout is not None else "env, which runs the policy"
                _log.info("first weight sync (actor -> %s) ...", target)
            versions = self._wait(
                [
                    self.policy_group.sync_model_from_actor(),
                    self._base_actor().sync_model_to_rollout(),
                ]
            )
            self._synced_version = int(versions[1][0])
            if first:
                _log.info("first weight sync done in %.1f s", time.perf_counter() - start)
        return time.perf_counter() - start

    def _console(self, desc: str, watch: Mapping[str, str] = _CONSOLE_WATCH) -> TrainingConsole:
        """The loop's progress bar and summary lines (``runner.log_interval``)."""
        return training_console(
            self._res.logger,
            total=self.cfg.runner.total_steps,
            desc=desc,
            watch=watch,
            summary_interval=self.cfg.runner.summary_interval,
            initial=self.global_step,
        )

    def _eval_before_train(self) -> dict[str, float]:
        """Evaluates at step 0 when ``runner.val_before_train`` asks for it (logged at step 0)."""
        if not (
            self.cfg.runner.val_before_train
            and self.cfg.env.eval is not None
            and self.global_step == 0
        ):
            return {}
        start = time.perf_counter()
        metrics = self.evaluate()
        metrics["time/eval"] = time.perf_counter() - start
        self._res.logger.log(metrics, step=0)
        startup.mark("eval_before_train")
        return metrics

    def generate_rollouts(self) -> dict[str, float]:
        """One training rollout: env and rollout exchange obs/actions, trajectories reach the actor.

        Returns:
            ``env/*`` episode metrics, ``rollout/env_steps`` and the step's env steps/s.
        """
        ch = self._res.channels
        step = self.global_step
        start = time.perf_counter()
        if self._rollout is None:  # the env ranks act themselves and report infer_time
            env_results = self._wait(
                [
                    self.env.interact(ch["rollout"], ch["env"], ch["actor"], step),
                    self.actor.recv_rollout_batch(ch["actor"]),
                ]
            )[0]
            policy_results = env_results
        else:
            env_results, policy_results, _ = self._wait(
                [
                    self.env.interact(ch["rollout"], ch["env"], ch["actor"], step),
                    self._rollout.generate(ch["rollout"], ch["env"], step, "train"),
                    self.actor.recv_rollout_batch(ch["actor"]),
                ]
            )
        elapsed = time.perf_counter() - start
        return self._rollout_metrics(env_results, policy_results, elapsed)

    def _rollout_metrics(
        self, env_results: list[Any], rollout_results: list[Any], elapsed: float
    ) -> dict[str, float]:
        """Episode, throughput and timing metrics of one finished training rollout."""
        self._train_rollouts += 1
        env_steps = sum(int(r["env_steps"]) for r in env_results)
        env_times = [r.get("env_time") for r in env_results]
        policy_times = [r.get("infer_time") for r in rollout_results]
        busy: dict[str, float] = {}
        if None not in env_times + policy_times:  # custom workers may not report them
            busy["time/env_chunk_steps"] = max(float(t) for t in env_times)
            busy["time/policy_calls"] = max(float(t) for t in policy_times)
        # Once, after the first rollout (which includes the first resets and inferences).
        if self._train_rollouts == 2 and busy:
            costs = {
                "env_seconds": busy["time/env_chunk_steps"],
                "policy_seconds": busy["time/policy_calls"],
                "rollout_seconds": elapsed,
            }
            advice = pipeline_advice(self.cfg.rollout.pipeline_stage_num, **costs)
            # (one stage here, so pipeline_advice said nothing)
            if self._rollout is not None and self.cfg.allows_policy_in_env_process:
                advice = in_env_process_advice(**costs)
            if advice:
                _log.warning(advice)
        self.total_env_steps += env_steps
        metrics = _episode_metrics("env", [r["episodes"] for r in env_results])
        metrics["rollout/env_steps"] = float(self.total_env_steps)
        metrics["rollout/env_steps_per_s"] = env_steps / elapsed if elapsed > 0 else 0.0
        metrics["time/generate_rollouts"] = elapsed
        return {**metrics, **busy}

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Advantages on every actor rank; returns the ``rollout/*`` metrics (rank 0's)."""
        return dict(self._wait([self.actor.compute_advantages_and_returns()])[0][0])

    def run_training(self) -> dict[str, float]:
        """The update on every actor rank; returns the ``train/*`` metrics (rank 0's)."""
        return dict(self._wait([self.actor.run_training()])[0][0])

    def evaluate(self) -> dict[str, float]:
        """Syncs weights, then runs the eval envs with deterministic actions.

        Returns:
            ``eval/return``, ``eval/episode_len``, ``eval/reward``,
            ``eval/success_once`` (where defined) and ``eval/num_episodes``.

        Raises:
            RuntimeError: ``env.eval`` is null.
        """
        if self.cfg.env.eval is None:
            raise RuntimeError("env.eval is null: set an eval env to evaluate")
        first, start = not self._evaluated, time.perf_counter()
        if first:
            _log.info("first eval (step %d) ...", self.global_step)
        self.update_rollout_weights()
        ch = self._res.channels
        step = self.global_step
        if self._rollout is None:
            results = self._wait([self.env.evaluate(ch["rollout"], ch["env"], step)])
        else:
            results = self._wait(
                [
                    self.env.evaluate(ch["rollout"], ch["env"], step),
                    self._rollout.generate(ch["rollout"], ch["env"], step, "eval"),
                ]
            )
        metrics = _episode_metrics("eval", results[0])
        metrics["eval/num_episodes"] = metrics.pop("eval/num_trajectories")
        self._evaluated = True
        if first:
            _log.info("first eval done in %.1f s", time.perf_counter() - start)
        return metrics

    def save_checkpoint(self) -> Path:
        """Writes ``checkpoints/global_step_N/`` (actor, env, progress and config, then a marker).

        Returns:
            The checkpoint folder.
        """
        with new_checkpoint(self.checkpoint_root, self.global_step) as path:
            self._wait(
                [
                    self._base_actor().save_checkpoint(str(path), self.global_step),
                    self.env.save_checkpoint(str(path), self.global_step),
                ]
            )
            progress = RunProgress(
                global_step=self.global_step,
                restarts=self.restarts,
                total_env_steps=self.total_env_steps,
                rng=rng_state(cuda=False),  # the driver leaves the GPUs to the workers
            )
            save_run_state(path, progress, self.cfg)
        return path

    def _worker_timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        named = [("actor", self.actor), ("rollout", self._rollout), ("env", self.env)]
        groups = [(name, group) for name, group in named if group is not None]
        per_group = self._wait([group.pop_timings() for _, group in groups])  # concurrently
        for (name, _), timings in zip(groups, per_group, strict=True):
            for rank_timings in timings:
                for tag, seconds in rank_timings.items():
                    key = f"time/{name}/{tag}"
                    out[key] = max(out.get(key, 0.0), float(seconds))
        return out

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, float]:
        """Trains until ``runner.total_steps``; returns the last step's metrics.

        With ``runner.max_restarts`` > 0, a dead worker does not end the run:
        the three groups are relaunched on the same placement and training goes
        on from the newest intact checkpoint (``train/restarts`` counts them).

        Raises:
            RuntimeError: :meth:`init_workers` was not called.
        """
        if not self._initialized:
            raise RuntimeError("call runner.init_workers() before runner.run()")
        return run_with_restarts(
            self._run_attempt,
            groups=self.groups,
            max_restarts=self.cfg.runner.max_restarts,
            resume=resume_from_newest(self, self.cfg.runner.resume_dir),
        )

    def _run_attempt(self) -> dict[str, float]:
        _log.info(
            "TensorBoard logs: %s (tensorboard --logdir %s)",
            self.tensorboard_dir,
            self.tensorboard_dir,
        )
        last = self._eval_before_train()
        with self._console("embodied") as console:
            while self.global_step < self.cfg.runner.total_steps:
                last = self._step()
                console.step(last, self.global_step)
        return last

    def _step(self) -> dict[str, float]:
        cfg = self.cfg.runner
        total = cfg.total_steps
        step_start = time.perf_counter()
        started = startup.report()  # once per process: the first step begins
        if started is not None:
            _log.info(started[0])
        metrics: dict[str, float] = {"time/sync_weights": self.update_rollout_weights()}
        metrics.update(self.generate_rollouts())
        scaling = self.cfg.runner.online_scaling
        if scaling:  # grow onto the rollout's devices for the training phase
            metrics["time/scale_up"] = self._scale("scale_up")
        start = time.perf_counter()
        metrics.update(self.compute_advantages_and_returns())
        metrics["time/cal_adv_and_returns"] = time.perf_counter() - start
        start = time.perf_counter()
        metrics.update(self.run_training())
        metrics["time/actor_training"] = time.perf_counter() - start
        if scaling:  # shrink back before the next weight sync and generation
            metrics["time/scale_down"] = self._scale("scale_down")
            metrics["actor/world_size_generate"] = float(len(self.base_actor_ranks))
            metrics["actor/world_size_train"] = float(self.actor.world_size)
        self.global_step += 1
        self._eval_and_save(metrics, *self._due(self.global_step >= total))
        metrics.update(self._worker_timings())
        if self.cfg.runner.max_restarts > 0:
            metrics["train/restarts"] = float(self.restarts)
        metrics["time/step"] = time.perf_counter() - step_start
        return metrics

    def _due(self, last_step: bool) -> tuple[bool, bool]:
        """Whether eval and a checkpoint are due after ``global_step`` steps: ``(eval, save)``."""
        cfg, step = self.cfg.runner, self.global_step
        eval_due = (
            cfg.val_check_interval > 0
            and self.cfg.env.eval is not None
            and (step % cfg.val_check_interval == 0 or last_step)
        )
        return eval_due, cfg.save_interval > 0 and (step % cfg.save_interval == 0 or last_step)

    def _eval_and_save(self, metrics: dict[str, float], eval_due: bool, save_due: bool) -> None:
        """Evaluates and saves a checkpoint where due, timing each into ``metrics``."""
        if eval_due:
            start = time.perf_counter()
            metrics.update(self.evaluate())
            metrics["time/eval"] = time.perf_counter() - start
        if save_due:
            start = time.perf_counter()
            self.save_checkpoint()
            metrics["time/save_checkpoint"] = time.perf_counter() - start

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Closes the metric logger and removes the channels (idempotent).

        The worker groups belong to the caller: shut them down afterwards.
        """
        self._res.close()


def _episode_metrics(prefix: str, per_rank: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    pooled: dict[str, list[float]] = {}
    for episodes in per_rank:
        for key, values in episodes.items():
            pooled.setdefault(key, []).extend(values)
    count = max((len(v) for v in pooled.values()), default=0)
    out = {f"{prefix}/{k}": float(np.mean(v)) for k, v in pooled.items() if v}
    out[f"{prefix}/num_trajectories"] = float(count)
    return out
