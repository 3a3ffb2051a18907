"""``EnvWorker``: owns ``pipeline_stage_num`` vectorized envs and steps them in chunks.

One training rollout (:meth:`EnvWorker.interact`), per stage ``s`` of this rank:

1. Reset: send the first observation (a fresh reset, or the observation the
   previous rollout ended on when ``auto_reset``) under key ``"rank.s"``.
2. ``T`` times, for each stage in turn: receive the stage's action chunk, step
   the stage's env by one chunk, send the new observation, then receive the
   full policy output of that chunk and record both. While this rank steps stage ``s``, the rollout
   computes the actions of the other stages: simulation and inference overlap.
3. Receive the policy output on the last observation (sent as a ``LastObs``:
   the policy only computes its values, which close the ``T + 1`` value rows;
   no action is sampled for it), end the stream with ``None``, and ship the stage's
   :class:`~rlinf.core.protocols.embodied.Trajectory` to the actor channel,
   cut into the pieces each actor rank is due (see :mod:`.common`).

Eval (:meth:`EnvWorker.evaluate`) runs the eval envs from deterministic seeds
with the rollout in ``eval`` mode; a stage's stream ends early once all its
episodes are over (without auto-reset).

Both loops talk to the policy through a
:class:`~rlinf.embodied.workers.common.PolicyLink`: the observation and action
channels of a rollout group, or, with ``rollout.in_env_process`` (no rollout
group), an :class:`~rlinf.embodied.workers.policy_host.InProcessPolicy` over the
policy that :meth:`EnvWorker.init_policy` builds in this process (the actor's
weight syncs reach it through :meth:`EnvWorker.sync_model_from_actor`). The
loops are the same either way, so both modes sample the same actions.

Both loops run under ``torch.inference_mode()`` (nothing in them needs
autograd). Tensors made here are inference tensors: what leaves the process
(observations, trajectories) arrives as ordinary tensors, and what stays (the
envs' last outputs) is only read, or copied before a write, outside these loops.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlinf.core.channel import Channel
from rlinf.core.dist import select_device
from rlinf.core.protocols.embodied import EnvOutput, EnvSpec, Trajectory
from rlinf.embodied.config import EmbodiedConfig, EnvSplitConfig
from rlinf.embodied.envs import VectorEnv, make_env
from rlinf.embodied.workers.common import (
    ChannelLink,
    LastObs,
    PolicyLink,
    actor_pieces,
    chunk_steps,
    obs_message,
    setup_process,
    split_trajectory,
    stream_key,
)
from rlinf.embodied.workers.policy_host import InProcessPolicy, PolicyHost, sampling_generator
from rlinf.embodied.workers.trajectory import TrajectoryBuilder
from rlinf.sched import Worker, WorkerGroup

__all__ = ["EnvWorker"]


class EnvWorker(Worker):
    """Env rank: ``S`` train stages (and ``S`` eval stages) of vectorized envs.

    Args:
        cfg: The run config.
    """

    max_concurrent_calls = 1
    """Calls run on the main thread, one at a time (see :class:`~rlinf.sched.Worker`):
    nothing then takes the GIL from the simulator every 10 ms. The runners send an
    env rank one call at a time."""

    @classmethod
    def create_group(cls, cfg: EmbodiedConfig) -> WorkerGroup:
        """The env group; its ranks run ``env.python_env``'s interpreter when that is set."""
        group = super().create_group(cfg)
        return group.use_python_env(cfg.env.python_env, key="env.python_env")

    def __init__(self, cfg: EmbodiedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        setup_process(cfg)
        self.train_envs: list[VectorEnv] = []
        self.eval_envs: list[VectorEnv] = []
        self._last: list[EnvOutput | None] = []
        """Per train env: the output its last rollout ended on."""
        self._seed_epochs: list[int] = []
        """Per train env: its reset-seed epoch."""
        self._actor_world_size = 1
        self.host: PolicyHost | None = None
        """The policy, with ``rollout.in_env_process`` (see :meth:`init_policy`)."""
        self._actor_group = ""

    # ------------------------------------------------------------------ lifecycle

    def init_worker(self, cfg: EmbodiedConfig, actor_world_size: int) -> EnvSpec:
        """(Re)builds the train and eval envs of this rank from ``cfg``.

        Args:
            cfg: The run config (the runner's).
            actor_world_size: Actor ranks the trajectories are split over.

        Returns:
            The train env's spec (what the policy is built for).
        """
        self.close_envs()
        self.cfg = cfg
        self.host = None  # init_policy() builds one (rollout.in_env_process)
        setup_process(cfg)  # plugin modules of this config
        self._actor_world_size = actor_world_size
        stages = cfg.rollout.pipeline_stage_num
        with self.worker_timer("init"):
            self.train_envs = self._build(cfg.env.train, cfg.stage_num_envs("train"))
            if cfg.env.eval is not None:
                self.eval_envs = self._build(cfg.env.eval, cfg.stage_num_envs("eval"))
        self._last = [None] * stages
        self._seed_epochs = [0] * stages
        return self.train_envs[0].spec

    def _advance_seed_epochs(self, epochs: list[int]) -> None:
        """Moves each train env's reset seeds on to ``epochs[i]`` (from where it stands)."""
        for i, (env, epoch) in enumerate(zip(self.train_envs, epochs, strict=True)):
            for _ in range(epoch - self._seed_epochs[i]):
                env.update_reset_seeds()
            self._seed_epochs[i] = epoch

    def _close_train_envs(self) -> None:
        for env in self.train_envs:
            env.close()
        self.train_envs = []

    def init_policy(self, cfg: EmbodiedConfig, spec: EnvSpec, actor_group: str) -> None:
        """Builds the policy in this process (``rollout.in_env_process``); weights come with syncs.

        Args:
            cfg: The run config (the runner's).
            spec: The train env's spec.
            actor_group: Name of the actor group (rank 0 sends the weights).
        """
        self._actor_group = actor_group
        self.host = PolicyHost(cfg, spec, self.rank, select_device())

    def sync_model_from_actor(self) -> int:
        """Receives the actor's weights into the :meth:`init_policy` policy; returns the version."""
        timeout = self.cfg.runner.channel_timeout_s
        return self._require_host().sync_from_actor(self, self._actor_group, timeout)

    def _require_host(self) -> PolicyHost:
        if self.host is None:
            raise RuntimeError(
                "this env worker has no policy: init_policy() runs with rollout.in_env_process"
            )
        return self.host

    def _link(
        self, obs_channel: Channel, action_channel: Channel, step: int, mode: str
    ) -> PolicyLink:
        """Where observations go and actions come from: the channels, or the in-process policy."""
        if self.host is None:
            return ChannelLink(obs_channel, action_channel, self.cfg.runner.channel_timeout_s)
        generator = sampling_generator(self.cfg, step, self.rank, mode, self.host.device)
        return InProcessPolicy(self.host, mode, generator)

    def _build(self, split: EnvSplitConfig, n: int) -> list[VectorEnv]:
        stages = self.cfg.rollout.pipeline_stage_num
        envs: list[VectorEnv] = []
        try:
            for s in range(stages):
                envs.append(
                    make_env(split, num_envs=n, seed_offset=self.rank * stages + s, stage_id=s)
                )
        except BaseException:
            for env in envs:
                env.close()
            raise
        return envs

    def close_envs(self) -> None:
        """Closes every env of this rank (idempotent)."""
        self._close_train_envs()
        for env in self.eval_envs:
            env.close()
        self.eval_envs = []

    def teardown(self) -> None:
        """Closes the envs, then releases the worker's channels."""
        try:
            self.close_envs()
        finally:
            super().teardown()

    # ------------------------------------------------------------------ training rollout

    def interact(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        actor_channel: Channel,
        step: int = 0,
    ) -> dict[str, Any]:
        """Runs one training rollout of every stage of this rank (see the module docstring).

        Args:
            obs_channel: Env -> rollout observations (keys ``"rank.stage"``).
            action_channel: Rollout -> env action chunks, each followed by its full
                policy output (same keys).
            actor_channel: Env -> actor trajectory pieces (key: actor rank).
            step: Global step: seeds the in-process policy's sampling as the rollout
                worker's (``rollout.in_env_process``; unused otherwise).

        Returns:
            ``{"env_steps": sub-steps that advanced a live episode, "env_time": seconds in
            ``chunk_step``, "episodes": {metric: [values of the episodes that finished]}}``;
            with the in-process policy also ``"infer_time"``, seconds inside it.
        """
        link = self._link(obs_channel, action_channel, step, "train")
        chunks = self.cfg.actor.model.num_action_chunks
        steps = chunk_steps(self.cfg.env.train, self.train_envs[0].spec, chunks)
        report = _RolloutReport()
        with self.worker_timer("interact"), torch.inference_mode():
            # -- reset: every stage sends its first observation
            streams = [self._open_stream(stage, link) for stage in range(len(self.train_envs))]
            # -- for t: act, step, record, stage by stage (the policy acts on one stage
            #    while this rank steps another); a stream whose last observation went
            #    out finishes in the next round: its last values, its end, the shipment
            for t in range(steps + 1):
                for stream in [s for s in streams if not s.done]:
                    if stream.sent_last:
                        self._finish_stream(stream, link, actor_channel, steps)
                    else:
                        self._step_stream(stream, link, report, last=t == steps - 1)
            # -- the next rollout's episodes (without auto-reset) start from new seeds
            self._advance_reset_seeds()
        return report.as_dict(self.host)

    def _open_stream(self, stage: int, link: PolicyLink) -> _Stream:
        """Starts stage ``stage``'s stream: sends its first observation."""
        env, last = self.train_envs[stage], self._last[stage]
        out = last if last is not None and env.auto_reset else env.reset()
        cfg = self.cfg
        builder = TrajectoryBuilder(
            env.num_envs,
            cfg.actor.model.num_action_chunks,
            cfg.algorithm.gamma,
            cfg.algorithm.bootstrap_type,
            collect_next_obs=cfg.algorithm.loss_type == "sac",
        )
        stream = _Stream(stage, env, stream_key(self.rank, stage), builder)
        link.send_obs(stream.key, obs_message(out))
        return stream

    def _step_stream(
        self, stream: _Stream, link: PolicyLink, report: _RolloutReport, last: bool
    ) -> None:
        """Act, step, record: one chunk step of a train stream."""
        actions = link.recv_actions(stream.key)
        started = time.perf_counter()
        out, finished = stream.env.chunk_step(actions)
        report.env_time += time.perf_counter() - started
        # Without auto-reset, a stream whose episodes all ended stops early (the rest of
        # its trajectory is padding outside the loss mask). Its last observation is only
        # read for its values (no action is sampled on it).
        ended = not stream.env.auto_reset and bool(out.dones[:, -1].all())
        stream.sent_last = last or ended
        message = obs_message(out)
        link.send_obs(stream.key, LastObs(message) if stream.sent_last else message)
        alive = stream.env.last_alive_mask
        stream.builder.add_policy_output(link.recv_output(stream.key))
        stream.builder.add_chunk(out, alive)
        report.record(finished, int(alive.sum()))
        self._last[stream.stage] = out

    def _finish_stream(
        self, stream: _Stream, link: PolicyLink, actor_channel: Channel, steps: int
    ) -> None:
        """Closes a stream: its last observation's values end the trajectory, which ships."""
        final = link.recv_output(stream.key)
        link.send_obs(stream.key, None)
        traj = stream.builder.finish(final, self._group_ids(stream.stage), steps)
        self._ship(stream.stage, traj, actor_channel)
        stream.done = True

    def _advance_reset_seeds(self) -> None:
        for i, env in enumerate(self.train_envs):
            if not env.auto_reset:
                env.update_reset_seeds()
                self._seed_epochs[i] += 1

    def _group_ids(self, stage: int) -> torch.Tensor:
        """Group ids of a train stage, unique over ranks and stages."""
        env = self.train_envs[stage]
        stages = self.cfg.rollout.pipeline_stage_num
        return env.group_ids + (self.rank * stages + stage) * env.num_groups

    def _ship(self, stage: int, traj: Trajectory, channel: Channel) -> None:
        """Puts a stage's trajectory, cut into pieces, under their actor ranks."""
        stages = self.cfg.rollout.pipeline_stage_num
        timeout = self.cfg.runner.channel_timeout_s
        split_num, per_actor = actor_pieces(self._actor_world_size, self.world_size, stages)
        for j, piece in enumerate(split_trajectory(traj, split_num)):
            index = (self.rank * stages + stage) * split_num + j
            channel.put((index, piece), key=str(index // per_actor), timeout=timeout)

    # ------------------------------------------------------------------ eval

    def evaluate(
        self, obs_channel: Channel, action_channel: Channel, step: int = 0
    ) -> dict[str, list[float]]:
        """Runs the eval envs from their deterministic seeds with the rollout in eval mode.

        The arguments are :meth:`interact`'s. Returns, per metric, the values of
        every eval episode that finished.

        Raises:
            RuntimeError: The run has no eval envs (``env.eval`` is null).
        """
        if not self.eval_envs:
            raise RuntimeError("env.eval is null: this run has no eval envs")
        link = self._link(obs_channel, action_channel, step, "eval")
        cfg = self.cfg
        assert cfg.env.eval is not None
        chunks = cfg.actor.model.num_action_chunks
        steps = chunk_steps(cfg.env.eval, self.eval_envs[0].spec, chunks)
        report = _RolloutReport()
        keys = [stream_key(self.rank, stage) for stage in range(len(self.eval_envs))]
        with self.worker_timer("evaluate"), torch.inference_mode():
            # -- reset from the eval seeds
            for env, key in zip(self.eval_envs, keys, strict=True):
                link.send_obs(key, obs_message(env.reset(seed=cfg.env.eval.seed)))
            # -- for t: act, step; a stage ends at the last step or once its episodes are over
            active = list(range(len(self.eval_envs)))
            for t in range(steps):
                for stage in list(active):
                    env, key = self.eval_envs[stage], keys[stage]
                    out, finished = env.chunk_step(link.recv_actions(key))
                    report.record(finished, 0)
                    over = not env.auto_reset and bool(out.dones[:, -1].all())
                    if over or t == steps - 1:
                        link.send_obs(key, None)
                        active.remove(stage)
                    else:
                        link.send_obs(key, obs_message(out))
            for env in self.eval_envs:
                env.flush_video()
        return dict(report.episodes)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: str, step: int) -> None:
        """Writes this rank's env state under ``path/env/``.

        The simulators themselves are pickled when they can be (gymnasium
        classic control), so a resumed ``auto_reset`` run continues the same
        episodes; otherwise only the reset-seed schedule is saved and the
        resumed run starts new episodes (see ``docs/embodied.md``).
        """
        folder = Path(path) / "env"
        folder.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "step": step,
            "seed_epochs": list(self._seed_epochs),
        }
        try:
            state["envs"] = pickle.dumps((self.train_envs, self._last))
        except Exception as exc:  # simulators with native handles cannot be pickled
            self.log_info(
                "env state is not picklable (%s: %s); the resumed run starts new episodes",
                type(exc).__name__,
                exc,
            )
        with open(folder / f"rank_{self.rank}.pt", "wb") as f:
            torch.save(state, f)

    def load_checkpoint(self, path: str) -> int:
        """Restores this rank's env state saved by :meth:`save_checkpoint`; returns its step."""
        file = Path(path) / "env" / f"rank_{self.rank}.pt"
        state = torch.load(file, weights_only=False)
        stages = self.cfg.rollout.pipeline_stage_num
        envs_blob = state.get("envs")
        if envs_blob is not None:
            envs, last = pickle.loads(envs_blob)
            if len(envs) == stages:
                self._close_train_envs()
                self.train_envs, self._last = list(envs), list(last)
                self._seed_epochs = list(state["seed_epochs"])
                return int(state["step"])
        # Not picklable: replay the reset-seed schedule; episodes restart.
        epochs = [int(epoch) for epoch in state["seed_epochs"]]
        if len(epochs) != stages:
            epochs = [max(epochs)] * stages
        for env in self.train_envs:
            env.reset(seed=self.cfg.env.train.seed)  # epoch 0 of the seed stream
        self._seed_epochs = [0] * stages
        self._advance_seed_epochs(epochs)
        self._last = [None] * stages
        return int(state["step"])


@dataclass
class _Stream:
    """One train stage's stream during a rollout: its env, key and trajectory so far."""

    stage: int
    env: VectorEnv
    key: str
    builder: TrajectoryBuilder
    sent_last: bool = False
    """Its last observation went out: the next round finishes the stream."""
    done: bool = False
    """Its trajectory has shipped."""


@dataclass
class _RolloutReport:
    """What a rollout or eval counted: live env sub-steps, time in the envs, finished episodes."""

    env_steps: int = 0
    env_time: float = 0.0
    episodes: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def record(self, finished: dict[str, torch.Tensor], env_steps: int) -> None:
        """Adds one chunk step's live sub-steps and the metrics of the episodes it finished."""
        self.env_steps += env_steps
        for name, values in finished.items():
            if len(values):  # most chunk steps finish no episode
                self.episodes[name].extend(values.tolist())

    def as_dict(self, host: PolicyHost | None) -> dict[str, Any]:
        """:meth:`EnvWorker.interact`'s report (with ``infer_time`` of an in-process policy)."""
        report: dict[str, Any] = {
            "env_steps": self.env_steps,
            "env_time": self.env_time,
            "episodes": dict(self.episodes),
        }
        if host is not None:
            report["infer_time"] = host.take_infer_time()
        return report
