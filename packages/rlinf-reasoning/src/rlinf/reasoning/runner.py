"""``ReasoningRunner``: the GRPO loop over rollout, reward and actor groups.

One step (``N = algorithm.rollout_batch_size`` prompts, ``G = group_size``):

1. take the next ``N`` prompts from the resumable sampler;
2. push the actor's weights to the rollout (version = the step), in buckets;
3. put one :class:`~rlinf.core.protocols.reasoning.RolloutRequest` per prompt on
   the request channel and start the three stages at once: rollout (requests ->
   generated groups), reward (groups -> rewarded groups) and actor training
   (rewarded groups -> updates). The prompt group is the unit on every channel,
   so each stage works on a group as soon as it arrives: in *disaggregated*
   placement the stages overlap; in *collocated* placement rollout and actor
   take turns on the devices (device lock; offload/onload on GPUs);
4. log ``rollout/*``, ``actor/*``, ``time/*`` (and ``eval/*``) metrics, evaluate
   every ``runner.val_check_interval`` steps, checkpoint every
   ``runner.save_interval`` steps.

Every sample of a step comes from the weights synced at its start (checked:
the actor reports the versions it trained on).

With ``runner.online_scaling`` (disaggregated placement; the FSDP actor, or the
Megatron actor with PP = 1) the actor group is launched over the actor's and the
rollout's devices (:func:`rlinf.sched.grown_actor_strategy`); a step then runs
generation and reward first, grows the actor onto the rollout's devices
(:meth:`~rlinf.reasoning.workers.FSDPActor.scale_up`), trains on all ranks and
shrinks back (``scale_down``) before the next weight sync; it logs
``time/scale_up``, ``time/scale_down``, ``actor/world_size_generate`` and
``actor/world_size_train``. A failure while re-sharding raises
:class:`rlinf.sched.ScalingError` (see docs/online_scaling.md).

With ``algorithm.max_staleness`` = k > 0 the run is *asynchronous GRPO*
(:mod:`rlinf.reasoning.async_grpo`): rollout and reward run continuously in the
background, up to k steps ahead of the actor; a step trains on groups
generated with weights at most k versions old (older ones are dropped and
regenerated) and logs ``rollout/staleness_*`` and ``rollout/dropped_stale_groups``.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlinf.core import startup
from rlinf.core.channel import Channel
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
from rlinf.core.progress import training_console
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult
from rlinf.core.protocols.workers import (
    ReasoningActorWorker,
    ReasoningRewardWorker,
    ReasoningRolloutWorker,
    check_implements,
)
from rlinf.core.run_resources import RunResources
from rlinf.core.run_state import RunProgress, load_run_state, save_run_state
from rlinf.reasoning.async_grpo import AsyncPipeline, check_async_placement, staleness_metrics
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.data import MathDataset, ResumableSampler
from rlinf.reasoning.tools.factory import build_registry
from rlinf.reasoning.workers.common import load_tokenizer
from rlinf.sched import (
    Cluster,
    Worker,
    WorkerGroup,
    grown_actor_strategy,
    launch_groups,
    scale_actor,
    wait_all,
)
from rlinf.sched.placement import ModelParallelComponentPlacement, PlacementStrategy
from rlinf.sched.recovery import resume_from_newest, run_with_restarts

__all__ = [
    "ReasoningRunner",
    "find_latest_checkpoint",
    "launch_reasoning_groups",
    "launch_tool_group",
]

_log = get_logger("rlinf.reasoning.runner")

_CONSOLE_WATCH = {
    "reward": "rollout/reward_scores",
    "acc": "eval/accuracy",
    "loss": "actor/final_loss",
    "tokens/s": "train/tokens_per_s",
}
"""What the progress bar shows (label: metric); every metric goes to TensorBoard."""

_TIMEOUT_HINT = "raise runner.step_timeout_s if the run is just slow; is a stage stuck?"


def launch_reasoning_groups(
    cfg: ReasoningConfig,
    cluster: Cluster,
    name_prefix: str = "",
    timeout: float = 600.0,
    reward_cls: type[Worker] | None = None,
    *,
    rollout_cls: type[Worker] | None = None,
    actor_cls: type[Worker] | None = None,
) -> tuple[ModelParallelComponentPlacement, WorkerGroup, WorkerGroup, WorkerGroup]:
    """Places and launches the rollout, reward and actor groups of ``cfg`` (concurrently).

    Args:
        cfg: The validated config.
        cluster: The cluster.
        name_prefix: Prefix of the group names (several runs on one cluster).
        timeout: Seconds to wait for every worker process to start (imports of
            torch and transformers take a while on a loaded machine).
        reward_cls: The reward worker class (a :class:`RewardWorker` subclass with
            your ``score``); default the math reward.
        rollout_cls: The rollout worker class (a :class:`RolloutWorker` subclass);
            default :class:`RolloutWorker`.
        actor_cls: The actor worker class (an :class:`FSDPActor` or
            :class:`MegatronActor` subclass); default by ``actor.training_backend``.

    Returns:
        ``(placement, actor, rollout, reward)``.

    Raises:
        ValueError: If the placement does not fit the cluster or the world sizes do
            not divide the batch (the message names the key).
        TypeError: If a given class does not implement its role's protocol.
    """
    from rlinf.reasoning.workers import FSDPActor, MegatronActor, RewardWorker, RolloutWorker

    # fail before anything is placed
    for cls, protocol in (
        (reward_cls, ReasoningRewardWorker),
        (rollout_cls, ReasoningRolloutWorker),
        (actor_cls, ReasoningActorWorker),
    ):
        if cls is not None:
            check_implements(cls, protocol)
    megatron = cfg.actor.training_backend == "megatron"
    placement = _place(cfg, cluster)
    cfg.check_world_sizes(
        actor=placement.actor_world_size,
        rollout=placement.rollout_world_size,
        reward=placement.reward_world_size,
    )
    collocated = placement.is_collocated
    check_async_placement(cfg, collocated)
    actor_strategy, actor_args = _actor_strategy(cfg, placement)
    # The three groups start at once (worker start-up dominates small runs); if one
    # fails, none is left running.
    groups = launch_groups(
        cluster,
        {
            f"{name_prefix}RolloutGroup": (
                (rollout_cls or RolloutWorker).create_group(cfg, collocated),
                placement.get_strategy("rollout"),
            ),
            f"{name_prefix}RewardGroup": (
                (reward_cls or RewardWorker).create_group(cfg),
                placement.get_strategy("reward"),
            ),
            f"{name_prefix}ActorGroup": (
                (actor_cls or (MegatronActor if megatron else FSDPActor)).create_group(
                    cfg, collocated, **actor_args
                ),
                actor_strategy,
            ),
        },
        timeout=timeout,
    )
    rollout, reward, actor = groups.values()
    return placement, actor, rollout, reward


def launch_tool_group(
    cfg: ReasoningConfig,
    cluster: Cluster,
    name_prefix: str = "",
    timeout: float = 600.0,
    tool_cls: type[Worker] | None = None,
) -> WorkerGroup | None:
    """Launches the tool worker group where ``cluster.component_placement`` places ``tool``.

    Without a ``tool`` entry (or without an ``agent`` section) the rollout ranks
    run their tool calls themselves and this returns None.

    Args:
        cfg: The validated config.
        cluster: The cluster.
        name_prefix: Prefix of the group name.
        timeout: Seconds to wait for the workers to start.
        tool_cls: The tool worker class; default :class:`~rlinf.reasoning.workers.ToolWorker`.

    Returns:
        The group, or None.
    """
    if cfg.agent is None or not cfg.places_tool_workers:
        return None
    from rlinf.reasoning.workers import ToolWorker

    placement = _place(cfg, cluster)
    groups = launch_groups(
        cluster,
        {
            f"{name_prefix}ToolGroup": (
                (tool_cls or ToolWorker).create_group(cfg),
                placement.get_strategy("tool"),
            )
        },
        timeout=timeout,
    )
    return next(iter(groups.values()))


def _place(cfg: ReasoningConfig, cluster: Cluster) -> ModelParallelComponentPlacement:
    """The placement of ``cfg.cluster.component_placement`` on ``cluster``.

    It checks that the actor ranks are a multiple of TP * PP (Megatron lays TP
    ranks out consecutively, so a TP group is one contiguous range).

    Raises:
        ValueError: If the placement does not fit; for Megatron's TP * PP, the
            message names the keys to change.
    """
    megatron = cfg.actor.training_backend == "megatron"
    parallel = cfg.actor.model
    try:
        return ModelParallelComponentPlacement(
            cfg.cluster.component_placement,
            cluster.info,
            actor_tp_size=parallel.tensor_model_parallel_size if megatron else 1,
            actor_pp_size=parallel.pipeline_model_parallel_size if megatron else 1,
        )
    except ValueError as err:
        if megatron and "'actor'" in str(err) and "tp_size * pp_size" in str(err):
            raise ValueError(
                f"{err}: actor.model.tensor_model_parallel_size "
                f"({parallel.tensor_model_parallel_size}) * pipeline_model_parallel_size "
                f"({parallel.pipeline_model_parallel_size}) must divide the actor ranks; "
                "change them or cluster.component_placement.actor"
            ) from err
        raise


def _actor_strategy(
    cfg: ReasoningConfig, placement: ModelParallelComponentPlacement
) -> tuple[PlacementStrategy, dict[str, Any]]:
    """The actor group's placement and extra constructor arguments.

    With ``runner.online_scaling`` the actor also spans the rollout's resources
    (:func:`~rlinf.sched.grown_actor_strategy`) and its base ranks are the
    placement's actor ranks.

    Raises:
        ValueError: If the grown actor's ranks do not divide the batch.
    """
    if not cfg.runner.online_scaling:
        return placement.get_strategy("actor"), {}
    strategy = grown_actor_strategy(placement)
    grown = len(strategy.hardware_ranks_list)
    try:
        cfg.check_world_sizes(
            actor=grown,
            rollout=placement.rollout_world_size,
            reward=placement.reward_world_size,
        )
    except ValueError as err:
        raise ValueError(
            f"runner.online_scaling=true trains on {grown} actor ranks (actor + rollout "
            f"resources): {err}"
        ) from err
    return strategy, {"base_world_size": placement.actor_world_size}


class ReasoningRunner(ClosesOnExit):
    """Drives GRPO training of launched actor, rollout and reward groups.

    Args:
        cfg: The validated config.
        actor: The :class:`~rlinf.reasoning.workers.FSDPActor` (or ``MegatronActor``) group.
        rollout: The :class:`~rlinf.reasoning.workers.RolloutWorker` group.
        reward: The :class:`~rlinf.reasoning.workers.RewardWorker` group.
        collocated: Whether actor and rollout share devices (from the placement).

    Example::

        placement, actor, rollout, reward = launch_reasoning_groups(cfg, cluster)
        runner = ReasoningRunner(cfg, actor, rollout, reward, collocated=placement.is_collocated)
        runner.init_workers()
        runner.run()
        runner.close(groups=True)
    """

    def __init__(
        self,
        cfg: ReasoningConfig,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        reward: WorkerGroup,
        *,
        collocated: bool = False,
        tool: WorkerGroup | None = None,
    ) -> None:
        if cfg.places_tool_workers and tool is None:
            raise ValueError(
                "cluster.component_placement places tool workers but no tool group was given; "
                "launch it with launch_tool_group(cfg, cluster) and pass tool= to ReasoningRunner"
            )
        check_implements(actor.worker_cls, ReasoningActorWorker)
        check_implements(rollout.worker_cls, ReasoningRolloutWorker)
        check_implements(reward.worker_cls, ReasoningRewardWorker)
        check_async_placement(cfg, collocated)
        if cfg.algorithm.is_async:
            for group, method in ((rollout, "generate_stream"), (reward, "score_stream")):
                if not callable(getattr(group.worker_cls, method, None)):
                    raise TypeError(
                        f"algorithm.max_staleness > 0 (asynchronous GRPO) needs "
                        f"{group.worker_cls.__qualname__}.{method}(); subclass the default "
                        "RolloutWorker / RewardWorker or set algorithm.max_staleness: 0"
                    )
        self.cfg = cfg
        self.actor, self.rollout, self.reward = actor, rollout, reward
        self.tool = tool
        self._tool_serving: Any = None  # the tool group's serve() futures
        self.collocated = collocated
        self.global_step = 0
        self.restarts = 0
        """Relaunches after a dead worker so far (``runner.max_restarts``)."""
        self.synced_version: int | None = None
        self.data_history: list[list[int]] = []
        """Dataset indices of the prompts of each step run by this runner (in order)."""
        self.metrics_history: list[dict[str, float]] = []
        """Metrics logged at each step by this runner."""
        self.sync_history: list[dict[str, Any]] = []
        """What each weight sync reported (actor side and rollout side)."""
        self.experiment_dir = cfg.runner.logger.experiment_dir
        self.checkpoint_root = self.experiment_dir / "checkpoints"
        self._res = RunResources(cfg.runner.logger, cfg)
        self._initialized = False
        self._evaluated = False
        self._async = AsyncPipeline(self) if cfg.algorithm.is_async else None
        if cfg.runner.online_scaling and collocated:
            raise ValueError(
                "runner.online_scaling=true needs disaggregated placement (the actor grows "
                "onto the rollout's devices), but the placement is collocated; set "
                "runner.online_scaling: false or place actor and rollout apart"
            )
        self.base_actor_ranks = list(range(actor.world_size))
        """The actor ranks that hold the model between steps (fewer with online scaling)."""
        self.checkpoint_actor_ranks = list(range(actor.world_size))
        """The actor ranks that save and load checkpoints (the base ones with FSDP scaling)."""

    # ------------------------------------------------------------------ setup
    def init_workers(self, resume_dir: str | Path | None = None) -> None:
        """Builds the datasets, starts every worker, creates the channels, resumes.

        Args:
            resume_dir: Resume from this instead of ``runner.resume_dir``.

        Raises:
            FileNotFoundError: A model, tokenizer or data path does not exist.
            ValueError: A bad tokenizer, data or batch-size combination.
            rlinf.sched.WorkerError: A worker failed to start (names group and rank).
        """
        cfg = self.cfg
        self._initialized = False  # also after a relaunch: state comes from the checkpoint
        if self._async is not None:
            self._async.reset()
        self.global_step = 0
        self.synced_version = None
        _check_model_dir(cfg.actor.model_path, "actor.model_path")
        if cfg.rollout.model_path is not None:
            _check_model_dir(cfg.rollout.model_path, "rollout.model_path")
        total = self.total_steps = self._load_data()
        cfg.check_world_sizes(
            actor=self.actor.world_size,
            rollout=self.rollout.world_size,
            reward=self.reward.world_size,
        )
        rollout_info, reward_info, actor_info = wait_all(
            [self.rollout.init_worker(), self.reward.init_worker(), self.actor.init_worker(total)],
            cfg.runner.step_timeout_s,
            hint=_TIMEOUT_HINT,
        )
        if cfg.runner.online_scaling:
            self._take_base_ranks(actor_info[0])
        _log.info(
            "workers ready: actor %s, rollout %s, reward %s (%s placement), %d steps",
            actor_info[0],
            rollout_info[0],
            reward_info[0],
            "collocated" if self.collocated else "disaggregated",
            total,
        )
        self._open_channels()
        self._start_tool_workers()
        resume = self.cfg.runner.resume_dir if resume_dir is None else resume_dir
        resume_from(resume, self.checkpoint_root, self.load_checkpoint)
        if cfg.runner.freeze_gc_heap:  # set-up objects leave the cyclic collector's passes
            wait_all(
                [group.freeze_heap() for group in (self.actor, self.rollout, self.reward)],
                cfg.runner.step_timeout_s,
                hint=_TIMEOUT_HINT,
            )
            freeze_heap()  # rlinf.core.heap
        self._initialized = True
        startup.mark("init_workers")

    def _load_data(self) -> int:
        """Loads the tokenizer, datasets and sampler; returns the run's total steps.

        Raises:
            ValueError: If the batch is larger than the training set.
        """
        cfg = self.cfg
        self.tokenizer = load_tokenizer(cfg.actor.tokenizer_dir)
        tools = None
        if cfg.agent is not None:  # the prompt lists the tools (the chat template's tools=)
            if not cfg.data.apply_chat_template:
                raise ValueError(
                    "agent needs data.apply_chat_template: true (the chat template renders "
                    "the tools into the prompt and formats their answers)"
                )
            tools = build_registry(cfg.agent).schemas()
        self.train_set = MathDataset.from_config(cfg.data, self.tokenizer, "train", tools)
        n = cfg.algorithm.rollout_batch_size
        if len(self.train_set) < n:
            raise ValueError(
                f"algorithm.rollout_batch_size={n} is larger than the {len(self.train_set)} "
                "training prompts; lower it or add data"
            )
        self.val_set: MathDataset | None = None
        if cfg.data.val_files and (
            cfg.runner.val_check_interval > 0 or cfg.runner.val_before_train
        ):
            self.val_set = MathDataset.from_config(cfg.data, self.tokenizer, "val", tools)
        self.sampler = ResumableSampler(
            len(self.train_set), shuffle=cfg.data.shuffle, seed=cfg.data.seed
        )
        self._order = iter(self.sampler)
        steps_per_epoch = len(self.train_set) // n
        total = cfg.runner.max_epochs * steps_per_epoch
        if cfg.runner.max_steps > 0:
            total = min(total, cfg.runner.max_steps)
        return total

    def _take_base_ranks(self, actor_info: dict[str, Any]) -> None:
        """Online scaling: the actor ranks that hold the model and checkpoint it.

        Raises:
            ValueError: If every actor rank holds the model (no extra ranks).
        """
        base = int(actor_info.get("base_world_size", self.actor.world_size))
        if base >= self.actor.world_size:
            raise ValueError(
                f"runner.online_scaling=true but the actor group's {self.actor.world_size} "
                "ranks all hold the model; launch it with launch_reasoning_groups (which "
                "places extra ranks on the rollout's devices)"
            )
        self.base_actor_ranks = list(range(base))
        ckpt = int(actor_info.get("checkpoint_world_size", base))
        self.checkpoint_actor_ranks = list(range(ckpt))

    def _open_channels(self) -> None:
        """Fresh request, rollout and reward channels (and proximal ones for async GRPO)."""
        self._res.drop_channels()  # a second init_workers() starts with fresh channels
        tag = f"rlinf-reasoning-{uuid.uuid4().hex[:10]}"
        items = max(4096, 4 * self.cfg.algorithm.rollout_batch_size)
        self.requests = self._res.channel("requests", f"{tag}.requests", max_items=items)
        self.generated = self._res.channel("rollout", f"{tag}.rollout", max_items=items)
        self.rewarded = self._res.channel("reward", f"{tag}.reward", max_items=items)
        self.proximal: Channel | None = None  # async: the rollout's proximal logprobs
        if self.cfg.scores_proximal_on_rollout:
            self.proximal = self._res.channel("proximal", f"{tag}.proximal", max_items=items)

    def _start_tool_workers(self) -> None:
        """Agentic runs with a tool group: it serves the rollout ranks' calls from now on."""
        if self.tool is None:
            return
        timeout = self.cfg.runner.step_timeout_s
        self._stop_tool_workers()  # a second init_workers() restarts the serving
        wait_all([self.tool.init_worker()], timeout, hint=_TIMEOUT_HINT)
        tag = f"rlinf-tools-{uuid.uuid4().hex[:10]}"
        keys = max(64, self.rollout.world_size + 1)
        requests = self._res.channel("tool_requests", f"{tag}.requests", max_items=8192)
        replies = self._res.channel("tool_replies", f"{tag}.replies", max_keys=keys)
        self._tool_requests = requests
        self._tool_serving = self.tool.serve(requests, replies)
        wait_all([self.rollout.attach_tool_workers(requests, replies)], timeout, hint=_TIMEOUT_HINT)

    def _stop_tool_workers(self) -> None:
        """Ends the tool group's serve() calls (one ``None`` per rank)."""
        if self.tool is None or self._tool_serving is None:
            return
        serving, self._tool_serving = self._tool_serving, None
        try:
            for _ in range(self.tool.world_size):
                self._tool_requests.put(None, timeout=self.cfg.runner.channel_timeout_s)
            wait_all([serving], self.cfg.runner.step_timeout_s, hint=_TIMEOUT_HINT)
        except Exception as err:  # closing anyway: the channels go next
            _log.warning("stopping the tool workers failed: %s", err)

    # ------------------------------------------------------------------ data
    def _next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.cfg.algorithm.rollout_batch_size:
            try:
                out.append(next(self._order))
            except StopIteration:
                self._order = iter(self.sampler)
        return out

    def _requests(
        self, dataset: MathDataset, indices: Sequence[int], group_size: int, step: int
    ) -> list[RolloutRequest]:
        return [
            RolloutRequest(
                prompt_ids=item.prompt_ids,
                answers=item.answers,
                group_size=group_size,
                index=item.index,
                step=step,
            )
            for item in (dataset[i] for i in indices)
        ]

    def _put_requests(self, indices: Sequence[int], step: int) -> None:
        """Puts the training requests of ``indices`` (one group each) for ``step``."""
        group_size, timeout = self.cfg.algorithm.group_size, self.cfg.runner.channel_timeout_s
        for request in self._requests(self.train_set, indices, group_size, step):
            self.requests.put(request, timeout=timeout)

    # ------------------------------------------------------------------ sync
    def sync_weights(self, version: int) -> dict[str, Any]:
        """Deprecated name of :meth:`update_rollout_weights`."""
        warnings.warn(
            "ReasoningRunner.sync_weights is deprecated; use update_rollout_weights",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.update_rollout_weights(version)

    def update_rollout_weights(self, version: int) -> dict[str, Any]:
        """Pushes the actor's weights to every rollout rank as ``version`` (bucketed).

        Args:
            version: The weight version (the global step they start).

        Returns:
            The actor rank 0 report merged with the rollout rank 0 report.
        """
        t0 = time.perf_counter()
        first = self.synced_version is None
        if first:
            _log.info("first weight sync (actor -> rollout, version %d) ...", version)
        actor_out, rollout_out = wait_all(
            [
                self.actor.execute_on(*self.base_actor_ranks).sync_model_to_rollout(
                    self.rollout.name, self.rollout.world_size, version
                ),
                self.rollout.sync_model_from_actor(self.actor.name),
            ],
            self.cfg.runner.step_timeout_s,
            hint=_TIMEOUT_HINT,
        )
        report = {
            "actor": actor_out[0],
            "rollout": rollout_out,
            "seconds": time.perf_counter() - t0,
        }
        self.sync_history.append(report)
        self.synced_version = version
        if first:
            _log.info("first weight sync done in %.1f s", report["seconds"])
        return report

    # ------------------------------------------------------------------ step

    def train_step(self) -> dict[str, float]:
        """Runs one GRPO step (sync, rollout, reward, training) and returns its metrics.

        Returns:
            ``rollout/*``, ``actor/*``, ``time/*`` and ``train/*`` metrics.

        Raises:
            RuntimeError: If a group was generated with another weight version.
            rlinf.sched.WorkerError: A stage failed (the others are stopped).
        """
        if not self._initialized:
            raise RuntimeError("call init_workers() before train_step()")
        if self._async is not None:
            return self._async_train_step(self._async)
        cfg, step = self.cfg, self.global_step
        start = time.perf_counter()
        indices = self._next_indices()
        t_sync = 0.0
        if self.synced_version != step:
            t_sync = self.update_rollout_weights(step)["seconds"]
        self._put_requests(indices, step)
        t_stages = time.perf_counter()
        scaling: dict[str, float] = {}
        if cfg.runner.online_scaling:
            rollout_out, reward_out, actor_out, scaling = self._scaled_stages(step)
        else:
            rollout_out, reward_out, actor_out = wait_all(
                [
                    self.rollout.generate(self.requests, self.generated, step),
                    self.reward.compute_rewards(self.generated, self.rewarded),
                    self.actor.run_training(self.rewarded, step),
                ],
                cfg.runner.step_timeout_s,
                on_error=self._res.close_channels,
                hint=_TIMEOUT_HINT,
            )
        t_end = time.perf_counter()
        self.data_history.append(indices)

        versions = sorted({v for r in actor_out for v in r["versions"]})
        if versions != [step]:
            raise RuntimeError(
                f"step {step} trained on groups of weight versions {versions}; every group of a "
                "step must come from the weights synced at its start"
            )
        trained = sorted(i for r in actor_out for i in r["indices"])
        if trained != sorted(indices):
            raise RuntimeError(
                f"step {step}: the actor trained on prompts {trained}, not {sorted(indices)}"
            )

        metrics = _actor_step_metrics(actor_out)
        metrics.update(_agent_time_metrics(rollout_out))
        t_rollout = max(r["busy_s"] for r in rollout_out)
        t_reward = max(r["busy_s"] for r in reward_out)
        t_train, t_recompute = metrics["time/actor/training"], metrics["time/actor/inference"]
        t_step = t_end - start
        tokens = sum(r["tokens"] for r in rollout_out)
        stage_sum = t_sync + t_rollout + t_reward + t_train + t_recompute
        metrics.update(
            {
                "time/step": t_step,
                "time/sync_weights": t_sync,
                "time/stages": t_end - t_stages,
                "time/rollout": t_rollout,
                "time/reward": t_reward,
                "time/stage_sum": stage_sum,
                "train/overlap_ratio": stage_sum / t_step if t_step > 0 else float("nan"),
                **_throughput_metrics(cfg, tokens, t_step, step),
                **scaling,
            }
        )
        self.global_step = step + 1
        return metrics

    def _scaled_stages(self, step: int) -> tuple[list[Any], list[Any], list[Any], dict[str, float]]:
        """Online scaling: generate + reward, grow the actor, train on every rank, shrink.

        Returns:
            The rollout, reward and actor results, and the scaling metrics.

        Raises:
            rlinf.sched.ScalingError: A rank failed or died while re-sharding.
        """
        timeout = self.cfg.runner.step_timeout_s
        close = self._res.close_channels
        rollout_out, reward_out = wait_all(
            [
                self.rollout.generate(self.requests, self.generated, step),
                self.reward.compute_rewards(self.generated, self.rewarded),
            ],
            timeout,
            on_error=close,
            hint=_TIMEOUT_HINT,
        )
        t_up = scale_actor(self.actor, "scale_up", timeout)
        (actor_out,) = wait_all(
            [self.actor.run_training(self.rewarded, step)],
            timeout,
            on_error=close,
            hint=_TIMEOUT_HINT,
        )
        t_down = scale_actor(self.actor, "scale_down", timeout)
        metrics = {
            "time/scale_up": t_up,
            "time/scale_down": t_down,
            "actor/world_size_generate": float(len(self.base_actor_ranks)),
            "actor/world_size_train": float(self.actor.world_size),
        }
        return rollout_out, reward_out, actor_out, metrics

    def _async_train_step(self, pipe: AsyncPipeline) -> dict[str, float]:
        """One step of asynchronous GRPO (see :mod:`rlinf.reasoning.async_grpo`)."""
        cfg, step = self.cfg, self.global_step
        k = cfg.algorithm.max_staleness
        start = time.perf_counter()
        pipe.start(step)  # the first step: a full sync, then the streams start
        t_sync = time.perf_counter() - start
        if self.synced_version != step:
            t_sync += pipe.sync(step)
        actor_out = pipe.train(step)  # requests the next prompts once the weights are loaded
        t_step = time.perf_counter() - start
        versions = sorted({v for r in actor_out for v in r["versions"]})
        if versions and (versions[0] < step - k or versions[-1] > step):
            raise RuntimeError(
                f"step {step} trained on weight versions {versions}; asynchronous GRPO with "
                f"algorithm.max_staleness={k} allows {max(0, step - k)}..{step} only"
            )
        self.data_history.append(sorted(i for r in actor_out for i in r["indices"]))
        metrics = _actor_step_metrics(actor_out)
        metrics.update(
            staleness_metrics(
                [s for r in actor_out for s in r["staleness"]],
                sum(r["dropped"] for r in actor_out),
                k,
            )
        )
        tokens = sum(r["rollout"].get("response_length_sum", 0.0) for r in actor_out)
        metrics.update(
            {
                "time/step": t_step,
                "time/sync_weights": t_sync,
                "time/actor/wait": max(r["time"]["wait"] for r in actor_out),
                "time/actor/wait_proximal": max(
                    r["time"].get("wait_proximal", 0.0) for r in actor_out
                ),
                **_throughput_metrics(cfg, tokens, t_step, step),
            }
        )
        self.global_step = step + 1
        return metrics

    def _ensure_synced(self, version: int) -> None:
        """Makes the rollout hold weights ``version`` (waits for the load in async mode)."""
        if self._async is not None and self._async.running:
            if self.synced_version != version:
                self._async.sync(version)
            self._async.wait_synced()
        elif self.synced_version != version:
            self.update_rollout_weights(version)

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> dict[str, float]:
        """Generates for the held-out prompts with the current weights and scores them.

        Syncs the weights first when the rollout does not hold the current ones.

        Returns:
            ``eval/accuracy`` (fraction correct), ``eval/reward``,
            ``eval/response_length``, ``eval/fraction_of_samples_properly_ended``,
            ``eval/num_samples`` and ``time/eval``.

        Raises:
            RuntimeError: If the run has no held-out data.
        """
        if self.val_set is None:
            raise RuntimeError("no held-out data: set data.val_files to evaluate")
        cfg = self.cfg
        t0 = time.perf_counter()
        first = not self._evaluated
        if first:
            _log.info("first eval (step %d) ...", self.global_step)
        self._ensure_synced(self.global_step)
        count = len(self.val_set)
        if cfg.runner.val_max_prompts is not None:
            count = min(count, cfg.runner.val_max_prompts)
        requests = self._requests(self.val_set, range(count), 1, self.global_step)
        sampling = cfg.algorithm.eval_sampling
        timeout = cfg.runner.step_timeout_s
        world = self.rollout.world_size
        shares = [requests[r::world] for r in range(world)]
        futs = [self.rollout.execute_on(r).generate_eval(shares[r], sampling) for r in range(world)]
        generated: list[RolloutResult] = [
            g for out in wait_all(futs, timeout, hint=_TIMEOUT_HINT) for g in out[0]
        ]
        rworld = self.reward.world_size
        parts = [generated[r::rworld] for r in range(rworld)]
        scored = [self.reward.execute_on(r).evaluate(parts[r]) for r in range(rworld)]
        flags: list[bool] = []
        rewards: list[float] = []
        for out in wait_all(scored, timeout, hint=_TIMEOUT_HINT):
            for group_rewards, group_flags in out[0]:
                flags += group_flags
                rewards += group_rewards
        lengths = [n for g in generated for n in g.response_lengths]
        ended = [e for g in generated for e in g.is_end]
        self._evaluated = True
        if first:
            _log.info("first eval done in %.1f s", time.perf_counter() - t0)
        return {
            "eval/accuracy": float(np.mean(flags)) if flags else 0.0,
            "eval/reward": float(np.mean(rewards)) if rewards else 0.0,
            "eval/response_length": float(np.mean(lengths)) if lengths else 0.0,
            "eval/fraction_of_samples_properly_ended": float(np.mean(ended)) if ended else 0.0,
            "eval/num_samples": float(len(flags)),
            "time/eval": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, float]:
        """Trains until the last step, with eval, checkpoints, metrics and a progress bar.

        With ``runner.max_restarts`` > 0, a dead worker does not end the run:
        the three groups are relaunched on the same placement and training goes
        on from the newest intact checkpoint (``train/restarts`` counts them).

        Returns:
            The metrics of the last logged step (empty if nothing ran).
        """
        if not self._initialized:
            self.init_workers()
        attempt = self._run_attempt
        pipe = self._async

        def run_async() -> dict[str, float]:
            assert pipe is not None
            try:
                out = attempt()
            except BaseException:
                pipe.abort()  # the channels may be closed: do not wait for the streams
                raise
            pipe.stop()
            return out

        return run_with_restarts(
            attempt if pipe is None else run_async,
            groups=(self.actor, self.rollout, self.reward),
            max_restarts=self.cfg.runner.max_restarts,
            resume=resume_from_newest(self, self.cfg.runner.resume_dir),
        )

    def _run_attempt(self) -> dict[str, float]:
        cfg = self.cfg
        logger = self._res.logger
        last: dict[str, float] = {}
        interval = cfg.runner.val_check_interval
        if self.val_set is not None and cfg.runner.val_before_train and self.global_step == 0:
            last = self.evaluate()
            logger.log(last, step=0)
            self.metrics_history.append(dict(last, step=0.0))
            startup.mark("eval_before_train")
        started = startup.report()  # once per process: the first step begins
        if started is not None:
            _log.info(started[0])
        with training_console(
            logger,
            total=self.total_steps,
            desc="GRPO",
            watch=_CONSOLE_WATCH,
            summary_interval=cfg.runner.summary_interval,
            initial=self.global_step,
        ) as console:
            while self.global_step < self.total_steps:
                metrics = self.train_step()
                step = self.global_step
                final = step == self.total_steps
                if self.val_set is not None and interval > 0 and (step % interval == 0 or final):
                    metrics.update(self.evaluate())
                save = cfg.runner.save_interval
                if save > 0 and (step % save == 0 or final):
                    t0 = time.perf_counter()
                    self.save_checkpoint()
                    metrics["time/save"] = time.perf_counter() - t0
                if cfg.runner.max_restarts > 0:
                    metrics["train/restarts"] = float(self.restarts)
                console.step(metrics, step)
                self.metrics_history.append(dict(metrics, step=float(step)))
                last = metrics
        return last

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Writes ``checkpoints/global_step_N`` (actor state, sampler, RNG, step).

        Returns:
            The checkpoint directory.
        """
        step = self.global_step
        with new_checkpoint(self.checkpoint_root, step) as path:
            actor = self.actor.execute_on(*self.checkpoint_actor_ranks)
            actor.save_checkpoint(str(path), step).wait(self.cfg.runner.step_timeout_s)
            cursor = (
                self._async.cursor_for(step)
                if self._async is not None
                else self.sampler.state_dict()
            )
            progress = RunProgress(
                global_step=step,
                restarts=self.restarts,
                data_cursor=cursor,
                rng=rng_state(cuda=False),  # the driver leaves the GPUs to the workers
            )
            save_run_state(path, progress, self.cfg)
        return path

    def load_checkpoint(self, path: str | Path) -> int:
        """Restores the actor, the sampler cursor, RNG and the step from ``path``.

        Args:
            path: A ``global_step_N`` directory.

        Returns:
            The restored global step.
        """
        path = Path(path)
        allow = self.cfg.runner.allow_config_change
        progress = load_run_state(path, self.cfg, allow_config_change=allow)
        actor = self.actor.execute_on(*self.checkpoint_actor_ranks)
        steps = actor.load_checkpoint(str(path)).wait(self.cfg.runner.step_timeout_s)
        if any(s != progress.global_step for s in steps):
            raise RuntimeError(
                f"checkpoint {path}: actor step {steps} != runner step {progress.global_step}"
            )
        if progress.data_cursor is not None:
            self.sampler.load_state_dict(progress.data_cursor)
        self._order = iter(self.sampler)
        if progress.rng is not None:
            set_rng_state(progress.rng)
        self.global_step = progress.global_step
        self.restarts = max(self.restarts, progress.restarts)
        self.synced_version = None
        _log.info("resumed from %s at step %d", path, self.global_step)
        return self.global_step

    # ------------------------------------------------------------------ close
    def stop_streams(self) -> None:
        """Async mode: stops the background rollout and reward streams (idempotent).

        :meth:`run` does it when it ends; call it after driving :meth:`train_step`
        yourself.
        """
        if self._async is not None:
            self._async.stop()

    def close(self, groups: bool = False) -> None:
        """Closes the metric logger and removes the channels (idempotent).

        Args:
            groups: Also close the worker groups. They belong to the caller, so
                by default (and when a ``with`` block ends) they stay up.
        """
        if self._async is not None and self._async.running:
            try:
                self._async.stop()
            except Exception as err:  # closing anyway; the channels go below
                _log.warning("stopping the async streams failed: %s", err)
                self._async.abort()
        self._stop_tool_workers()
        self._res.close()
        if groups:
            for group in (self.actor, self.rollout, self.reward, self.tool):
                if group is not None:
                    group.close()

    def shutdown(self, groups: bool = True) -> None:
        """Deprecated: ``close(groups=True)``."""
        warnings.warn(
            "ReasoningRunner.shutdown is deprecated; use close(groups=True)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.close(groups=groups)


def _check_model_dir(path: Path, key: str) -> None:
    where = Path(path).expanduser()
    if not where.exists():
        raise FileNotFoundError(
            f"{key}={str(path)!r} does not exist; pass a local directory written by "
            "save_pretrained (models are never downloaded; for the toy task run "
            "examples/reasoning/make_toy_task.py first)"
        )
    if not (where / "config.json").is_file():
        raise FileNotFoundError(
            f"{key}={str(path)!r} has no config.json; it is not a save_pretrained model directory"
        )


def _throughput_metrics(
    cfg: ReasoningConfig, tokens: float, seconds: float, step: int
) -> dict[str, float]:
    """Tokens and responses (N * G) per second of a step that trained weight version ``step``."""
    samples = cfg.algorithm.rollout_batch_size * cfg.algorithm.group_size
    return {
        "train/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "train/samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "train/weight_version": float(step),
        "rollout/generated_tokens": float(tokens),
    }


def _agent_time_metrics(rollout_out: list[dict[str, Any]]) -> dict[str, float]:
    """Multi-turn runs: the share of agent time the engine waited for tools, over the ranks."""
    seconds = sum(r.get("agent_seconds", 0.0) for r in rollout_out)
    if seconds <= 0:
        return {}
    wait = sum(r.get("agent_tool_wait_s", 0.0) for r in rollout_out)
    return {"agent/tool_wait_share": wait / seconds}


def _actor_step_metrics(actor_out: list[dict[str, Any]]) -> dict[str, float]:
    """Rollout statistics, the ranks' mean train metrics and the slowest rank's actor times."""
    metrics = _rollout_metrics([r["rollout"] for r in actor_out])
    train = [r["train"] for r in actor_out]
    metrics.update({key: float(np.mean([t[key] for t in train])) for key in train[0]})
    times = [r["time"] for r in actor_out]
    metrics["time/actor/prepare"] = max(t.get("prepare", 0.0) for t in times)
    metrics["time/actor/total"] = max(t.get("total", 0.0) for t in times)
    metrics["time/actor/training"] = max(t["train"] for t in times)
    metrics["time/actor/inference"] = max(t["recompute"] for t in times)
    return metrics


def _rollout_metrics(stats: list[dict[str, float]]) -> dict[str, float]:
    stats = [s for s in stats if s]
    if not stats:
        return {}
    count = sum(s["count"] for s in stats)
    adv_count = sum(s["adv_count"] for s in stats)
    resp = sum(s["response_length_sum"] for s in stats) / count
    prompt = sum(s["prompt_length_sum"] for s in stats) / count
    agent: dict[str, float] = {}  # multi-turn: per-trajectory means (agent/turns, ...)
    for key in sorted({k for s in stats for k in s if k.startswith("traj/")}):
        agent[f"agent/{key[5:]}"] = sum(s.get(key, 0.0) for s in stats) / count
    if "agent/tool_calls" in agent:
        calls = agent["agent/tool_calls"]
        seconds = agent.pop("agent/tool_seconds", 0.0)
        agent["agent/tool_latency_s"] = seconds / calls if calls > 0 else 0.0
    return {
        **agent,
        "rollout/reward_scores": sum(s["reward_sum"] for s in stats) / count,
        "rollout/response_length": resp,
        "rollout/response_length_max": max(s["response_length_max"] for s in stats),
        "rollout/response_length_min": min(s["response_length_min"] for s in stats),
        "rollout/prompt_length": prompt,
        "rollout/total_length": prompt + resp,
        "rollout/fraction_of_samples_properly_ended": sum(s["ended_sum"] for s in stats) / count,
        "rollout/advantages_mean": sum(s["adv_sum"] for s in stats) / max(1.0, adv_count),
        "rollout/advantages_max": max(s["adv_max"] for s in stats),
        "rollout/advantages_min": min(s["adv_min"] for s in stats),
        "rollout/total_num_sequence": count,
        "rollout/num_groups": sum(s["groups"] for s in stats),
    }
