"""``EnvWorker``: owns ``pipeline_stage_num`` vectorized envs and steps them in chunks.

One training rollout (:meth:`EnvWorker.interact`), per stage ``s`` of this rank:

1. Send the first observation (a fresh reset, or the observation the previous
   rollout ended on when ``auto_reset``) to the rollout under key ``"rank.s"``.
2. ``T`` times, for each stage in turn: receive the stage's action chunk, step
   the stage's env by one chunk, send the new observation, then receive the
   complete policy output of that chunk (the rollout finished it while the env
   stepped) and record both. While this rank steps stage ``s``, the rollout
   computes the actions of the other stages: simulation and inference overlap.
3. Receive the policy output on the last observation (sent as a ``LastObs``:
   the policy only computes its values, which close the ``T + 1`` value rows;
   no action is sampled for it), end the stream with ``None``, and ship the stage's
   :class:`~rlinf.core.protocols.embodied.Trajectory` to the actor channel,
   cut into the pieces each actor rank is due (see :mod:`.common`).

With ``merged`` (``rollout.adaptive_stages``) the stages run as one stream
(key ``"rank.0"``); for the stage trial's merged rollout, and for good when it
wins, :meth:`EnvWorker.merge_train_stages` rebuilds them as one env, so a
round is one env call, as with one stage.

Eval (:meth:`EnvWorker.evaluate`) runs the eval envs from deterministic seeds
with the rollout in ``eval`` mode; a stage's stream ends early once all its
episodes are over (without auto-reset).

With ``rollout.in_env_process`` there is no rollout group: :meth:`EnvWorker.init_policy`
builds the policy in this process, the actor's weight syncs reach it
(:meth:`EnvWorker.sync_model_from_actor`), and the same loops act through an
:class:`~rlinf.embodied.workers.policy_host.InProcessPolicy` instead of the
observation and action channels, so nothing crosses a process per step. There
the training rollout keeps each chunk step's policy output (computed on call)
and env output, and builds the stream's trajectory from them in one pass at the
stream's end (``_Deferred``): nothing overlaps the env in this process, and that
work ran slower right after each simulator step than in one pass.

Both loops run under ``torch.inference_mode()`` (nothing in them needs
autograd): the wrapper's and the in-process policy's small torch ops skip
autograd's per-op bookkeeping. By hand, per PickCube env step (medians of eight
alternating blocks of 150 steps, one process): the chunk step 1,804 against
1,833 us, the act 171 against 178, ``complete()`` 32.5 against 36.3. Tensors
made here are inference tensors: what leaves the process (observations,
trajectories) arrives as ordinary tensors, and what stays (the envs' last
outputs) is only read, or copied before a write, outside these loops.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlinf.core.channel import Channel
from rlinf.core.dist import select_device
from rlinf.core.protocols.embodied import EnvOutput, EnvSpec, PolicyOutput, Trajectory
from rlinf.embodied.config import EmbodiedConfig, EnvSplitConfig
from rlinf.embodied.envs import VectorEnv, make_env
from rlinf.embodied.workers.common import (
    LastObs,
    actor_pieces,
    chunk_steps,
    concat_env_outputs,
    obs_message,
    setup_process,
    split_rows,
    split_trajectory,
    stream_key,
)
from rlinf.embodied.workers.policy_host import InProcessPolicy, PolicyHost, sampling_generator
from rlinf.embodied.workers.trajectory import TrajectoryBuilder
from rlinf.sched import Worker

__all__ = ["EnvWorker"]


class EnvWorker(Worker):
    """Env rank: ``S`` train stages (and ``S`` eval stages) of vectorized envs.

    Args:
        cfg: The run config.
    """

    max_concurrent_calls = 1
    """Calls run on the main thread, one at a time (see :class:`~rlinf.sched.Worker`):
    nothing then takes the GIL from the simulator every 10 ms. The runners send an
    env rank one call at a time. On the 2-core VM the PickCube MLP rollout read
    0.83-0.85x of the bare simulator with it against 0.79-0.85x without (six
    alternating runs each; ``docs/embodied_hot_path.md``)."""

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
        self._env_stages: list[list[int]] = []
        """Per train env: the pipeline stages it holds (one each, or all once merged)."""
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
        self._env_stages = [[s] for s in range(stages)]
        return self.train_envs[0].spec

    def merge_train_stages(self) -> None:
        """Rebuilds this rank's train stages as one env of all their envs (idempotent).

        For the merged stage trial, and after it when merged wins
        (``rollout.adaptive_stages``): one env call per round instead of one per
        stage, as with one stage. The rows stay in stage order, so trajectories
        still reach the actor cut by stage; the episodes restart once, from the
        merged env's own seeds.
        """
        if len(self.train_envs) < 2:
            return
        stages, epoch = len(self.train_envs), max(self._seed_epochs)
        merged = make_env(
            self.cfg.env.train,
            num_envs=stages * self.cfg.stage_num_envs("train"),
            seed_offset=self.rank * stages,
            stage_id=0,
        )
        self._close_train_envs()
        self.train_envs = [merged]
        self._last, self._seed_epochs = [None], [0]
        self._env_stages = [list(range(stages))]
        self._advance_seed_epochs([epoch])
        self.log_info("train stages merged into one env of %d envs", merged.num_envs)

    def split_train_stages(self) -> None:
        """Undoes :meth:`merge_train_stages`: one env per stage again (idempotent).

        The episodes restart once, from the stages' seeds at the epoch reached
        (not their first epoch again).
        """
        stages = self.cfg.rollout.pipeline_stage_num
        if len(self.train_envs) == stages:
            return
        epoch = max(self._seed_epochs)
        self._close_train_envs()
        self.train_envs = self._build(self.cfg.env.train, self.cfg.stage_num_envs("train"))
        self._last, self._seed_epochs = [None] * stages, [0] * stages
        self._env_stages = [[s] for s in range(stages)]
        self._advance_seed_epochs([epoch] * stages)

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

    def _links(
        self, obs_channel: Channel, action_channel: Channel, step: int, mode: str
    ) -> tuple[Any, Any]:
        """Where observations go and actions come from: the channels, or the in-process policy."""
        if self.host is None:
            return obs_channel, action_channel
        generator = sampling_generator(self.cfg, step, self.rank, mode, self.host.device)
        # Train mode: the value network runs once per stream, at its end (no overlap to win here).
        local = InProcessPolicy(self.host, mode, generator, defer_values=mode == "train")
        return local, local

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

    # ------------------------------------------------------------------ streams

    def _streams(
        self, envs: list[VectorEnv], env_stages: list[list[int]], merged: bool
    ) -> list[_Stream]:
        """One stream per env (stage), or one stream of all when ``merged``."""
        if merged or len(envs) == 1:
            return [_Stream(envs, list(range(len(envs))), env_stages, stream_key(self.rank, 0))]
        return [
            _Stream([env], [i], [stages], stream_key(self.rank, stages[0]))
            for i, (env, stages) in enumerate(zip(envs, env_stages, strict=True))
        ]

    # ------------------------------------------------------------------ training rollout

    def interact(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        actor_channel: Channel,
        merged: bool = False,
        step: int = 0,
    ) -> dict[str, Any]:
        """Runs one training rollout of every stage of this rank (see the module docstring).

        Args:
            obs_channel: Env -> rollout observations (keys ``"rank.stage"``).
            action_channel: Rollout -> env action chunks, each followed by its complete
                policy output (same keys).
            actor_channel: Env -> actor trajectory pieces (key: actor rank).
            merged: Run the stages as one stream (key ``"rank.0"``): one hand-off per
                round instead of one per stage. Trajectories reach the actor cut by
                stage as when pipelined.
            step: Global step: seeds the in-process policy's sampling as the rollout
                worker's (``rollout.in_env_process``; unused otherwise).

        Returns:
            ``{"env_steps": sub-steps that advanced a live episode, "env_time": seconds in
            ``chunk_step``, "episodes": {metric: [values of the episodes that finished]}}``;
            with the in-process policy also ``"infer_time"``, seconds inside it.
        """
        if not merged and len(self.train_envs) < self.cfg.rollout.pipeline_stage_num:
            raise RuntimeError(
                "interact(merged=False) after merge_train_stages(): this rank's stages are "
                "one env now, so the rollout must take them as one stream (merged=True)"
            )
        obs_channel, action_channel = self._links(obs_channel, action_channel, step, "train")
        cfg = self.cfg
        timeout = cfg.runner.channel_timeout_s
        chunks = cfg.actor.model.num_action_chunks
        steps = chunk_steps(cfg.env.train, self.train_envs[0].spec, chunks)
        episodes: dict[str, list[float]] = defaultdict(list)
        streams = self._streams(self.train_envs, self._env_stages, merged)
        values_of = None if self.host is None else self.host.values_of
        builders: list[TrajectoryBuilder] = []
        closing = [False] * len(streams)
        env_steps, env_time = 0, 0.0
        # With the policy in this process nothing overlaps the env, so a stream's
        # bookkeeping (policy outputs, trajectory rows) waits for its end and runs
        # there in one pass, while the caches are warm, not after every simulator
        # step (see _Deferred).
        deferred = (
            [_Deferred() for _ in streams] if isinstance(action_channel, InProcessPolicy) else None
        )
        with self.worker_timer("interact"), torch.inference_mode():
            for stream in streams:
                last = [self._last[i] for i in stream.env_ids]
                outs = [
                    out if out is not None and env.auto_reset else env.reset()
                    for env, out in zip(stream.envs, last, strict=True)
                ]
                obs_channel.put(
                    obs_message(concat_env_outputs(outs)), key=stream.key, timeout=timeout
                )
                builders.append(
                    TrajectoryBuilder(
                        stream.num_envs,
                        chunks,
                        cfg.algorithm.gamma,
                        cfg.algorithm.bootstrap_type,
                        collect_next_obs=cfg.algorithm.loss_type == "sac",
                        values_of=values_of,
                    )
                )
            # Round t < steps acts on the obs after chunk t - 1; the last request of a
            # stream (round ``steps``, or the round after all its episodes ended without
            # auto-reset) only brings the values of its last observation.
            active = list(range(len(streams)))
            for t in range(steps + 1):
                for i in list(active):
                    stream, key = streams[i], streams[i].key
                    if t == steps or closing[i]:  # the values of the LastObs sent last round
                        if deferred is not None:
                            env_steps += deferred[i].replay(builders[i])
                        policy_out = action_channel.get(key=key, timeout=timeout)
                        obs_channel.put(None, key=key, timeout=timeout)
                        traj = builders[i].finish(policy_out, self._group_ids(stream), steps)
                        self._ship(stream, traj, actor_channel, timeout)  # streams to the actor
                        active.remove(i)
                        continue
                    actions = action_channel.get(key=key, timeout=timeout)
                    started = time.perf_counter()
                    outs, metrics = stream.chunk_step(actions)
                    env_time += time.perf_counter() - started
                    out = concat_env_outputs(outs)
                    # Without auto-reset, a stream whose episodes all ended stops early
                    # (the rest of its trajectory is padding outside the loss mask).
                    closing[i] = not stream.auto_reset and bool(out.dones[:, -1].all())
                    # Hand the obs over first: the bookkeeping below overlaps the policy
                    # call (it only reads ``out``, and the next chunk step copies it).
                    # The last one is only read for its values (no action is sampled).
                    message = obs_message(out)
                    is_last = t == steps - 1 or closing[i]
                    obs_channel.put(
                        LastObs(message) if is_last else message, key=key, timeout=timeout
                    )
                    alive = stream.last_alive_mask()
                    if deferred is not None:
                        deferred[i].add(action_channel.get_later(key), out, alive)
                    else:
                        policy_out = action_channel.get(key=key, timeout=timeout)
                        _record(builders[i], policy_out, out, alive)
                        env_steps += int(alive.sum())
                    for name, values in metrics.items():
                        episodes[name].extend(values)
                    for env_id, env_out in zip(stream.env_ids, outs, strict=True):
                        self._last[env_id] = env_out
            for i, env in enumerate(self.train_envs):
                if not env.auto_reset:
                    env.update_reset_seeds()
                    self._seed_epochs[i] += 1
        report: dict[str, Any] = {
            "env_steps": env_steps,
            "env_time": env_time,
            "episodes": dict(episodes),
        }
        if self.host is not None:
            report["infer_time"] = self.host.take_infer_time()
        return report

    def _group_ids(self, stream: _Stream) -> torch.Tensor:
        """Group ids unique over ranks and stages (the same whether stages are merged or not)."""
        stages = self.cfg.rollout.pipeline_stage_num
        return torch.cat(
            [
                env.group_ids + (self.rank * stages + held[0]) * (env.num_groups // len(held))
                for env, held in zip(stream.envs, stream.env_stages, strict=True)
            ]
        )

    def _ship(self, stream: _Stream, traj: Trajectory, channel: Channel, timeout: float) -> None:
        """Puts a stream's trajectory, cut by stage and into pieces, under their actor ranks."""
        stages = self.cfg.rollout.pipeline_stage_num
        split_num, per_actor = actor_pieces(self._actor_world_size, self.world_size, stages)
        by_stage = [traj] if len(stream.stages) == 1 else split_trajectory(traj, len(stream.stages))
        for stage, stage_traj in zip(stream.stages, by_stage, strict=True):
            for j, piece in enumerate(split_trajectory(stage_traj, split_num)):
                index = (self.rank * stages + stage) * split_num + j
                channel.put((index, piece), key=str(index // per_actor), timeout=timeout)

    # ------------------------------------------------------------------ eval

    def evaluate(
        self, obs_channel: Channel, action_channel: Channel, merged: bool = False, step: int = 0
    ) -> dict[str, list[float]]:
        """Runs the eval envs from their deterministic seeds with the rollout in eval mode.

        The arguments are :meth:`interact`'s. Returns, per metric, the values of
        every eval episode that finished.

        Raises:
            RuntimeError: The run has no eval envs (``env.eval`` is null).
        """
        if not self.eval_envs:
            raise RuntimeError("env.eval is null: this run has no eval envs")
        obs_channel, action_channel = self._links(obs_channel, action_channel, step, "eval")
        cfg = self.cfg
        assert cfg.env.eval is not None
        timeout = cfg.runner.channel_timeout_s
        chunks = cfg.actor.model.num_action_chunks
        steps = chunk_steps(cfg.env.eval, self.eval_envs[0].spec, chunks)
        episodes: dict[str, list[float]] = defaultdict(list)
        streams = self._streams(self.eval_envs, [[s] for s in range(len(self.eval_envs))], merged)
        with self.worker_timer("evaluate"), torch.inference_mode():
            for stream in streams:
                outs = [env.reset(seed=cfg.env.eval.seed) for env in stream.envs]
                obs_channel.put(
                    obs_message(concat_env_outputs(outs)), key=stream.key, timeout=timeout
                )
            active = list(range(len(streams)))
            for t in range(steps):
                for i in list(active):
                    stream, key = streams[i], streams[i].key
                    actions = action_channel.get(key=key, timeout=timeout)
                    outs, metrics = stream.chunk_step(actions)
                    for name, values in metrics.items():
                        episodes[name].extend(values)
                    out = concat_env_outputs(outs)
                    over = not stream.auto_reset and bool(out.dones[:, -1].all())
                    if over or t == steps - 1:
                        obs_channel.put(None, key=key, timeout=timeout)
                        active.remove(i)
                    else:
                        obs_channel.put(obs_message(out), key=key, timeout=timeout)
            for env in self.eval_envs:
                env.flush_video()
        return dict(episodes)

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
            "env_stages": self._env_stages,
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
        env_stages = state.get("env_stages", [[s] for s in range(len(state["seed_epochs"]))])
        envs_blob = state.get("envs")
        if envs_blob is not None:
            envs, last = pickle.loads(envs_blob)
            if sum(len(held) for held in env_stages) == stages:
                self._close_train_envs()
                self.train_envs, self._last = list(envs), list(last)
                self._seed_epochs, self._env_stages = list(state["seed_epochs"]), env_stages
                return int(state["step"])
        # Not picklable: replay the reset-seed schedule on the saved layout; episodes restart.
        if len(env_stages) == 1 < stages:  # saved after the stage trial chose merged
            self.merge_train_stages()
        else:
            self.split_train_stages()
        for env in self.train_envs:
            env.reset(seed=self.cfg.env.train.seed)  # epoch 0 of the seed stream
        self._seed_epochs = [0] * len(self.train_envs)
        self._advance_seed_epochs([int(epoch) for epoch in state["seed_epochs"]])
        self._last = [None] * len(self.train_envs)
        return int(state["step"])


def _record(
    builder: TrajectoryBuilder, policy_out: PolicyOutput, out: EnvOutput, alive: torch.Tensor
) -> None:
    """Adds one chunk step (its policy output, then the env's output) to a stream's trajectory."""
    builder.add_policy_output(policy_out)
    builder.add_chunk(out, alive)


class _Deferred:
    """A stream's chunk steps whose bookkeeping waits for the stream's end.

    With the policy in the env process, the policy output of each chunk (its
    logprobs, the ``PolicyOutput``) and the trajectory rows were computed right
    after each simulator step, which leaves the caches cold; done in one pass at
    the stream's end they cost about 40 us less per env step (of ~2.2 ms, one
    by-hand run on the hot-path VM). The env outputs and alive masks are fresh
    objects per step (envs never write a handed-out tensor), so keeping them
    until then is safe.
    """

    def __init__(self) -> None:
        self.steps: list[tuple[Callable[[], PolicyOutput], EnvOutput, torch.Tensor]] = []

    def add(
        self, policy_out: Callable[[], PolicyOutput], out: EnvOutput, alive: torch.Tensor
    ) -> None:
        """Keeps one chunk step: its policy output (computed on call), env output and mask."""
        self.steps.append((policy_out, out, alive))

    def replay(self, builder: TrajectoryBuilder) -> int:
        """Records the kept steps in order; returns their live env sub-steps."""
        if not self.steps:
            return 0
        for policy_out, out, alive in self.steps:
            _record(builder, policy_out(), out, alive)
        live = int(torch.stack([alive for _, _, alive in self.steps]).sum())  # one count
        self.steps.clear()
        return live


class _Stream:
    """The envs behind one stream key: one stage, or every stage of the rank merged.

    Args:
        envs: The envs, in stage order.
        env_ids: Their indices in the rank's env list.
        env_stages: The stages each env holds (one, or several once merged).
        key: The stream's channel key.
    """

    def __init__(
        self, envs: list[VectorEnv], env_ids: list[int], env_stages: list[list[int]], key: str
    ) -> None:
        self.envs, self.env_ids, self.env_stages, self.key = envs, env_ids, env_stages, key
        self.stages = [stage for held in env_stages for stage in held]
        self.sizes = [env.num_envs for env in envs]
        self.num_envs = sum(self.sizes)
        self.auto_reset = envs[0].auto_reset

    def chunk_step(self, actions: torch.Tensor) -> tuple[list[EnvOutput], dict[str, list[float]]]:
        """Steps each env by its rows of ``actions``; returns the outputs and episode metrics."""
        outs: list[EnvOutput] = []
        metrics: dict[str, list[float]] = defaultdict(list)
        for env, part in zip(self.envs, split_rows(actions, self.sizes), strict=True):
            out, finished = env.chunk_step(part)
            outs.append(out)
            for name, values in finished.items():
                if len(values):  # most chunk steps finish no episode
                    metrics[name].extend(values.tolist())
        return outs, metrics

    def last_alive_mask(self) -> torch.Tensor:
        """[n, C] bool of the last chunk over the stream's envs."""
        if len(self.envs) == 1:
            return self.envs[0].last_alive_mask
        return torch.cat([env.last_alive_mask for env in self.envs])
