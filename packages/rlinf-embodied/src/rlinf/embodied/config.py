"""``EmbodiedConfig``: the validated config tree of an embodied training run.

Sections (``examples/embodiment/config/*.yaml`` show all of them)::

    cluster:    num_nodes, component_placement, cpu_slots_per_node, node_groups
    runner:     mode (sync | async), max_epochs / max_steps, val_check_interval, save_interval,
                resume_dir, seed, logger, val_before_train, plugin_modules, timeouts
    algorithm:  adv_type (gae | grpo), loss_type (actor_critic | actor | sac), gamma, gae_lambda,
                clip ratios, value_clip, huber_delta, entropy_bonus, update_epoch,
                normalize_advantages, group_size, reward_type, bootstrap_type, loss_agg_mode;
                async PPO/GRPO (runner.mode: async): max_staleness, importance_sampling_clip;
                SAC (runner.mode: async): tau, replay_capacity, replay_ratio, warmup_steps,
                updates_per_step, weight_sync_interval, init_alpha, auto_alpha,
                target_entropy, max_update_lag
    env:        train / eval (an EnvConfig each; num_envs counts one env rank's envs over
                all pipeline stages; max_steps_per_rollout_epoch is the rollout length)
    rollout:    pipeline_stage_num, enable_offload, in_env_process
    actor:      model (a PolicyConfig), optim, global_batch_size, micro_batch_size, seed,
                enable_offload, dist_backend
    profile_data: (optional) measured seconds per step for ``rlinf auto-place``:
                env_cost, rollout_cost, actor_cost, sync_cost, slots

Every cross-field rule raises an error that starts with the dotted key it is about,
shows the values and says how to fix it (``rlinf.core.config`` turns it into a
``ConfigError`` entry for that key). Rules that need the world sizes of the
placed groups are checked by :meth:`EmbodiedConfig.check_world_sizes` once the
groups exist (the runner calls it).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rlinf.core.config import ConfigError, ConfigIssue, RLinfModel, RunnerConfig
from rlinf.core.config.errors import NO_VALUE
from rlinf.embodied.envs.config import EnvConfig
from rlinf.embodied.models.config import PolicyConfig
from rlinf.sched.config import ClusterConfig
from rlinf.sched.python_env import PythonEnvConfig

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "EmbodiedClusterConfig",
    "EmbodiedConfig",
    "EmbodiedEnvConfig",
    "EmbodiedRunnerConfig",
    "EnvSplitConfig",
    "OptimConfig",
    "ProfileDataConfig",
    "RolloutConfig",
    "import_plugins",
]

COMPONENTS = ("actor", "env", "rollout")
"""Components an embodied run places."""


def import_plugins(modules: list[str]) -> None:
    """Imports modules (dotted names or ``.py`` paths) that register envs or policies.

    Args:
        modules: ``my_pkg.my_envs`` or ``path/to/my_envs.py`` entries.

    Raises:
        ImportError: A module cannot be imported (the message names it).
    """
    for entry in modules:
        try:
            if entry.endswith(".py"):
                path = Path(entry).expanduser().resolve()
                name = f"rlinf_plugin_{path.stem}_{abs(hash(str(path))) % 10**8}"
                if name in sys.modules:
                    continue
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot load {path}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(entry)
        except Exception as exc:
            raise ImportError(
                f"runner.plugin_modules entry {entry!r} could not be imported "
                f"({type(exc).__name__}: {exc}); fix the module or remove the entry"
            ) from exc


class EmbodiedClusterConfig(ClusterConfig):
    """Where the groups run (``cluster``).

    ``component_placement`` maps ``actor``, ``env`` and ``rollout`` (alone or
    comma-joined, e.g. ``"actor,env,rollout": 0-1``) to resource ranks: GPUs,
    or CPU slots when ``cpu_slots_per_node`` > 0 on a CPU machine. ``rollout``
    is placed exactly when there is a rollout group (``rollout.in_env_process: false``).
    """

    components: ClassVar[tuple[str, ...]] = COMPONENTS
    optional_components: ClassVar[tuple[str, ...]] = ("rollout",)
    placement_examples: ClassVar[str] = (
        "'actor,env,rollout: 0' (collocated) or actor: 0-1, env: 0, rollout: 1 (hybrid)"
    )


class EmbodiedRunnerConfig(RunnerConfig):
    """The training loop (``runner``).

    Training runs ``max_epochs`` steps, capped by ``max_steps`` when that is set.
    A sync step is one rollout + one update; an async PPO/GRPO step is one update on a
    batch generated while the previous update ran; an async (SAC) step is
    ``algorithm.updates_per_step`` gradient updates while env and rollout keep running.
    """

    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: EmbodiedRunner (PPO/GRPO, rollout then train); async: with "
        "loss_type sac the AsyncEmbodiedRunner (env and rollout run on while the actor "
        "trains from a replay buffer), with actor_critic / actor the AsyncPPORunner (env "
        "and rollout generate the next batch with the newest weights they have while the "
        "actor trains on the previous one; see algorithm.max_staleness).",
    )

    val_before_train: bool = Field(
        False, description="Evaluate once before the first training step (logged at step 0)."
    )
    online_scaling: bool = Field(
        False,
        description="Sync PPO/GRPO in disaggregated placement (actor and rollout on "
        "different resources): after each rollout the actor grows onto the rollout's "
        "resources for the training phase and shrinks back before the next one (FSDP2 "
        "state re-sharded in memory; see docs/online_scaling.md). Launch the groups with "
        "launch_embodied_groups. Refused with runner.mode: async and "
        "actor.enable_offload: true.",
    )

    @model_validator(mode="after")
    def _check_online_scaling(self) -> EmbodiedRunnerConfig:
        if self.online_scaling and self.mode != "sync":
            raise ValueError(
                f"runner.online_scaling=true works with sync PPO/GRPO only (the actor grows "
                f"while the rollout idles between rollouts), but runner.mode={self.mode!r} "
                "(async PPO/GRPO or SAC); set runner.mode: sync or runner.online_scaling: false"
            )
        return self

    plugin_modules: list[str] = Field(
        default_factory=list,
        description="Modules or .py files every process imports first (custom envs/policies).",
    )
    channel_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for one message between env, rollout and actor."
    )
    step_timeout_s: float = Field(
        3600.0, gt=0, description="Longest wait for one phase of a step (rollout, training...)."
    )

    @property
    def total_steps(self) -> int:
        """Training steps of the run: ``max_epochs`` capped by ``max_steps`` (if set)."""
        return self.max_epochs if self.max_steps < 0 else min(self.max_epochs, self.max_steps)


class AlgorithmConfig(RLinfModel):
    """Advantage estimator and losses (``algorithm``)."""

    adv_type: Literal["gae", "grpo"] = Field("gae", description="gae (PPO) or grpo.")
    loss_type: Literal["actor_critic", "actor", "sac"] = Field(
        "actor_critic",
        description="actor_critic: PPO policy + value loss; actor: policy loss only (GRPO); "
        "sac: soft actor-critic from a replay buffer (needs runner.mode: async).",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount per sub-step (or per chunk).")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="PPO clip below 1.")
    clip_ratio_high: float | None = Field(
        None, gt=0, description="PPO clip above 1; null: clip_ratio_low."
    )
    value_clip: float | None = Field(
        0.2, gt=0, description="Clip of value updates around the rollout values; null: none."
    )
    huber_delta: float | None = Field(
        None, gt=0, description="Huber delta of the value loss; null: 0.5 * MSE."
    )
    entropy_bonus: float = Field(0.0, ge=0, description="Entropy coefficient.")
    update_epoch: int = Field(4, ge=1, description="Passes over each rollout batch.")
    normalize_advantages: bool = Field(
        True, description="gae: whiten advantages over all actor ranks' valid entries."
    )
    group_size: int = Field(1, ge=1, description="GRPO group: envs that share a reset seed.")
    reward_type: Literal["action_level", "chunk_level"] = Field(
        "action_level", description="Credit per sub-step or per chunk."
    )
    logprob_type: Literal["token_level", "action_level", "chunk_level"] | None = Field(
        None,
        description="One PPO ratio per action dimension/token (token_level), per sub-step "
        "(action_level) or per chunk (chunk_level); null: as reward_type.",
    )
    bootstrap_type: Literal["standard", "always"] = Field(
        "standard",
        description="Add gamma * V(final obs) to the last reward on truncation (standard) "
        "or on any episode end (always).",
    )
    loss_agg_mode: Literal["token-mean", "episode-length-norm"] = Field(
        "token-mean", description="Loss reduction (episode-length-norm: no auto-reset runs)."
    )
    # Async PPO/GRPO (loss_type actor_critic / actor, runner.mode: async) -------------
    max_staleness: int | None = Field(
        None,
        description="Async PPO/GRPO (runner.mode: async): a batch is trained at most this "
        "many weight versions after the one that generated it; generation runs ahead of "
        "training by up to this many versions and the actor drops (and counts in "
        "rollout/dropped_batches) a batch older than that. null: 1 with runner.mode: async, "
        "0 (sync) otherwise; 0 in async mode makes generation wait for each update (sync "
        "PPO's schedule). Only valid with runner.mode: async and an on-policy loss_type.",
    )
    importance_sampling_clip: float = Field(
        2.0,
        gt=0,
        description="Async PPO/GRPO: upper bound of the truncated importance weight "
        "min(exp(proximal - behaviour logprob), clip) that multiplies each sample's "
        "advantage (the decoupled PPO correction).",
    )
    # SAC (loss_type: sac, runner.mode: async) ----------------------------------------
    tau: float = Field(0.005, gt=0, le=1, description="SAC: Polyak weight of the target critics.")
    replay_capacity: int = Field(
        1_000_000, ge=1, description="SAC: transitions the replay buffer keeps (a ring)."
    )
    replay_ratio: float = Field(
        1.0,
        gt=0,
        description="SAC: gradient updates per env step after warm-up (the actor waits for "
        "env steps when it is ahead).",
    )
    warmup_steps: int = Field(
        5000,
        ge=0,
        description="SAC: env steps (all env ranks) taken with uniform random actions before "
        "learning starts (rounded up to whole rollout epochs).",
    )
    updates_per_step: int = Field(
        50,
        ge=1,
        description="SAC: gradient updates per runner step (runner.max_epochs, "
        "val_check_interval and save_interval count these steps).",
    )
    weight_sync_interval: int = Field(
        50,
        ge=1,
        description="SAC: refresh the rollout's weights once this many updates were made since "
        "the last refresh (checked at step ends, between rollout epochs).",
    )
    init_alpha: float = Field(1.0, gt=0, description="SAC: initial entropy temperature.")
    auto_alpha: bool = Field(
        True, description="SAC: tune alpha towards target_entropy (else alpha stays init_alpha)."
    )
    target_entropy: float | None = Field(
        None, description="SAC: entropy target of auto_alpha; null: -action_dim."
    )
    max_update_lag: int | None = Field(
        None,
        ge=0,
        description="SAC: the env pauses before a rollout epoch while the actor is more than "
        "this many updates behind replay_ratio * env steps; null: the env never waits.",
    )

    def staleness_bound(self, mode: str) -> int:
        """The effective ``max_staleness`` k of a run in ``runner.mode`` ``mode``.

        Args:
            mode: ``sync`` or ``async``.

        Returns:
            ``max_staleness`` when set; else 1 for async PPO/GRPO, 0 otherwise.
        """
        if self.max_staleness is not None:
            return self.max_staleness
        return 1 if mode == "async" and self.loss_type != "sac" else 0


class EnvSplitConfig(EnvConfig):
    """One env split (``env.train`` / ``env.eval``): an :class:`EnvConfig` plus its rollout length.

    ``num_envs`` counts the envs of one env worker rank over all pipeline
    stages; each stage builds ``num_envs / rollout.pipeline_stage_num``.
    """

    num_envs: int = Field(
        1, ge=1, description="Envs per env worker rank over all stages (split into stages)."
    )
    max_steps_per_rollout_epoch: int | None = Field(
        None,
        ge=1,
        description="Env sub-steps per env per rollout (train: per training step); "
        "null: max_episode_steps.",
    )


class EmbodiedEnvConfig(RLinfModel):
    """Train and eval envs (``env``)."""

    train: EnvSplitConfig
    eval: EnvSplitConfig | None = Field(None, description="Eval envs; null disables eval.")
    python_env: PythonEnvConfig | None = Field(
        None,
        description="Python environment of the env workers ({project: DIR} of a uv project, "
        "or {interpreter: PATH}), for simulators whose pins clash with the trainer's; "
        "null: the driver's. See docs/simulators.md.",
    )


class RolloutConfig(RLinfModel):
    """The rollout workers (``rollout``)."""

    pipeline_stage_num: int = Field(
        1, ge=1, description="Env stages per env rank; 2 overlaps simulation and inference."
    )
    enable_offload: bool | None = Field(
        None, description="Offload the policy between rollouts; null: when collocated."
    )
    in_env_process: bool = Field(
        False,
        description="Run the policy inside each env worker: no rollout group, no "
        "observation/action hand-offs between processes (for cheap policies on few envs, "
        "where hand-offs cost more than the policy; see docs/embodied.md). Sync PPO/GRPO "
        "only; cluster.component_placement then places no rollout.",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "adaptive_stages" in data:
            raise ValueError(
                "rollout.adaptive_stages was removed: pipeline stages always run as "
                "configured (rollout.pipeline_stage_num); delete the key"
            )
        if isinstance(data, dict) and data.get("in_env_process") == "auto":
            raise ValueError(
                "rollout.in_env_process=auto was removed: set true (the env workers run the "
                "policy; place no rollout) or false (a rollout group; place rollout)"
            )
        return data


class OptimConfig(RLinfModel):
    """AdamW and its schedule (``actor.optim``)."""

    lr: float = Field(
        3e-4,
        ge=0,
        description="Learning rate of the policy parameters (0: the weights stay fixed, "
        "the check that PPO ratios are 1).",
    )
    value_lr: float | None = Field(
        None, ge=0, description="Learning rate of value_head parameters; null: lr."
    )
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    clip_grad: float | None = Field(
        0.5,
        gt=0,
        description="Gradient norm clip, applied to the policy and the value head separately; "
        "null disables clipping.",
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="LR schedule over the run's training steps."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up in training steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final LR / LR for linear, cosine.")


class ActorConfig(RLinfModel):
    """The training workers (``actor``)."""

    model: PolicyConfig = Field(default_factory=PolicyConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)  # type: ignore[arg-type]
    global_batch_size: int = Field(
        ..., ge=1, description="Samples per optimizer step over all actor ranks."
    )
    micro_batch_size: int = Field(..., ge=1, description="Samples per forward/backward per rank.")
    seed: int = Field(1234, ge=0, description="Model init and shuffling seed.")
    enable_offload: bool | None = Field(
        None, description="Offload optimizer state between phases; null: when collocated."
    )
    reshard_after_forward: bool = Field(
        True,
        description="FSDP2: free the gathered parameters after forward (gathered again for "
        "backward); false keeps them (one collective fewer per micro-batch, a full copy).",
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: auto picks nccl with CUDA, else gloo."
    )


class ProfileDataConfig(RLinfModel):
    """Measured costs for ``rlinf auto-place`` (``profile_data``), instead of profiling.

    Seconds per training step of each component with every component on the
    same ``slots`` resource ranks (a collocated run), e.g. read from the
    ``time/*`` metrics of such a run: ``env_cost`` from ``time/env_chunk_steps``,
    ``rollout_cost`` from ``time/policy_calls``, ``actor_cost`` from
    ``time/cal_adv_and_returns`` + ``time/actor_training``, ``sync_cost`` from
    ``time/sync_weights``.
    """

    env_cost: float = Field(..., ge=0, description="Env stepping per step (s).")
    rollout_cost: float = Field(..., ge=0, description="Policy calls per step (s).")
    actor_cost: float = Field(..., ge=0, description="Advantages and training per step (s).")
    sync_cost: float = Field(0.0, ge=0, description="Weight sync actor -> rollout (s).")
    slots: int | None = Field(
        None, ge=1, description="Resource ranks the costs were measured on; null: all of them."
    )


class EmbodiedConfig(RLinfModel):
    """Top-level schema of an embodied run (the ``embodied`` config schema)."""

    cluster: EmbodiedClusterConfig
    runner: EmbodiedRunnerConfig = Field(default_factory=EmbodiedRunnerConfig)  # type: ignore[arg-type]
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)  # type: ignore[arg-type]
    env: EmbodiedEnvConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)  # type: ignore[arg-type]
    actor: ActorConfig
    profile_data: ProfileDataConfig | None = Field(
        None, description="Measured costs for rlinf auto-place (instead of profiling)."
    )

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        # Custom envs/policies must be registered before actor.model.model_type is checked.
        if isinstance(data, dict):
            runner = data.get("runner")
            modules = runner.get("plugin_modules") if isinstance(runner, dict) else None
            if isinstance(modules, list) and all(isinstance(m, str) for m in modules):
                import_plugins(modules)
        return data

    @model_validator(mode="after")
    def _check(self) -> EmbodiedConfig:
        alg, env, actor = self.algorithm, self.env, self.actor
        stages = self.rollout.pipeline_stage_num
        chunks = actor.model.num_action_chunks
        if alg.logprob_type == "chunk_level" and alg.reward_type != "chunk_level":
            raise ValueError(
                "algorithm.logprob_type='chunk_level' needs one advantage per chunk, but "
                f"algorithm.reward_type={alg.reward_type!r} gives one per sub-step; set "
                "reward_type: chunk_level, or logprob_type: action_level / token_level"
            )
        sac = alg.loss_type == "sac"
        if self.runner.online_scaling:
            self._check_online_scaling()
        self._check_policy_placement()
        if self.rollout.in_env_process and (
            self.runner.mode != "sync" or self.runner.online_scaling
        ):
            raise ValueError(
                f"rollout.in_env_process=true runs the policy in the env workers with the sync "
                f"runner only, but runner.mode={self.runner.mode!r}, runner.online_scaling="
                f"{self.runner.online_scaling} (these need a rollout group); set "
                "rollout.in_env_process: false, or runner.mode: sync and "
                "runner.online_scaling: false"
            )
        if sac and self.runner.mode != "async":
            raise ValueError(
                f"runner.mode={self.runner.mode!r} does not fit algorithm.loss_type="
                f"{alg.loss_type!r}: SAC trains off-policy with the async runner; set "
                "runner.mode: async with loss_type: sac, or loss_type actor_critic / actor"
            )
        if alg.max_staleness is not None:
            if alg.max_staleness < 0:
                raise ValueError(
                    f"algorithm.max_staleness={alg.max_staleness} is negative; it counts weight "
                    "versions a batch may lag behind the actor: set algorithm.max_staleness: 1 "
                    "(or 0 for sync PPO's schedule)"
                )
            if sac or self.runner.mode != "async":
                raise ValueError(
                    f"algorithm.max_staleness={alg.max_staleness} only applies to async PPO/GRPO "
                    f"(runner.mode: async with loss_type actor_critic / actor) but runner.mode="
                    f"{self.runner.mode!r}, loss_type={alg.loss_type!r}; remove "
                    "algorithm.max_staleness (SAC uses weight_sync_interval), or set "
                    "runner.mode: async"
                )
        if sac:
            if actor.model.model_type != "sac_mlp":
                raise ValueError(
                    f"actor.model.model_type={actor.model.model_type!r} has no twin Q critics; "
                    "algorithm.loss_type: sac needs actor.model.model_type: sac_mlp"
                )
            if actor.optim.lr_scheduler != "constant" or actor.optim.warmup_steps:
                raise ValueError(
                    f"actor.optim.lr_scheduler={actor.optim.lr_scheduler!r} (warmup_steps="
                    f"{actor.optim.warmup_steps}): SAC trains at constant learning rates; set "
                    "actor.optim.lr_scheduler: constant and actor.optim.warmup_steps: 0"
                )
            if actor.micro_batch_size != actor.global_batch_size:
                raise ValueError(
                    f"actor.micro_batch_size={actor.micro_batch_size} differs from "
                    f"actor.global_batch_size={actor.global_batch_size}; SAC samples one "
                    "minibatch of global_batch_size per update (no accumulation); set "
                    f"actor.micro_batch_size: {actor.global_batch_size}"
                )
        elif alg.adv_type == "gae":
            if alg.loss_type != "actor_critic":
                raise ValueError(
                    f"algorithm.loss_type={alg.loss_type!r} does not fit adv_type 'gae': GAE "
                    "produces value targets; set algorithm.loss_type: actor_critic"
                )
            if not actor.model.add_value_head:
                raise ValueError(
                    "actor.model.add_value_head=False but algorithm.adv_type 'gae' needs a "
                    "critic; set actor.model.add_value_head: true"
                )
        else:
            if alg.loss_type != "actor":
                raise ValueError(
                    f"algorithm.loss_type={alg.loss_type!r} does not fit adv_type 'grpo' "
                    "(GRPO has no value targets); set algorithm.loss_type: actor"
                )
            if alg.group_size < 2:
                raise ValueError(
                    f"algorithm.group_size={alg.group_size} is too small for GRPO: a group "
                    "baseline needs >= 2 envs per group; set algorithm.group_size: 8"
                )
            if env.train.group_size != alg.group_size:
                raise ValueError(
                    f"env.train.group_size={env.train.group_size} must equal "
                    f"algorithm.group_size={alg.group_size} (envs of a GRPO group share a "
                    f"reset seed); set env.train.group_size: {alg.group_size}"
                )
            if env.train.auto_reset:
                raise ValueError(
                    "env.train.auto_reset=True does not fit GRPO: the score of an env is the "
                    "return of its first episode in the rollout; set env.train.auto_reset: false"
                )
        if alg.loss_agg_mode == "episode-length-norm" and env.train.auto_reset:
            raise ValueError(
                "algorithm.loss_agg_mode='episode-length-norm' needs env.train.auto_reset: false "
                "(one episode per env and rollout); use loss_agg_mode: token-mean"
            )
        splits: list[tuple[str, EnvSplitConfig]] = [("train", env.train)]
        if env.eval is not None:
            splits.append(("eval", env.eval))
        for name, split in splits:
            per = stages * split.group_size
            if split.num_envs % per != 0:
                lower = (split.num_envs // per) * per
                fixes = " or ".join(f"{m}" for m in (lower, lower + per) if m > 0)
                raise ValueError(
                    f"env.{name}.num_envs={split.num_envs} is not divisible by "
                    f"rollout.pipeline_stage_num ({stages}) * env.{name}.group_size "
                    f"({split.group_size}) = {per}: every stage needs whole groups; set "
                    f"env.{name}.num_envs to {fixes}, or change pipeline_stage_num"
                )
            steps = split.max_steps_per_rollout_epoch or split.max_episode_steps
            if steps is not None and steps % chunks != 0:
                key = (
                    "max_steps_per_rollout_epoch"
                    if split.max_steps_per_rollout_epoch
                    else "max_episode_steps"
                )
                raise ValueError(
                    f"env.{name}.{key}={steps} is not divisible by "
                    f"actor.model.num_action_chunks ({chunks}): a rollout is a whole number "
                    f"of chunks; set it to {max(chunks, steps // chunks * chunks)}"
                )
        if env.eval is not None and not env.eval.auto_reset:
            rollout_len = env.eval.max_steps_per_rollout_epoch
            limit = env.eval.max_episode_steps
            if rollout_len is not None and limit is not None and rollout_len < limit:
                raise ValueError(
                    f"env.eval.max_steps_per_rollout_epoch={rollout_len} is shorter than "
                    f"env.eval.max_episode_steps={limit}: eval episodes would be cut "
                    f"unfinished; set it to {limit} (or null)"
                )
        if actor.global_batch_size % actor.micro_batch_size != 0:
            raise ValueError(
                f"actor.global_batch_size={actor.global_batch_size} is not divisible by "
                f"actor.micro_batch_size={actor.micro_batch_size}; set micro_batch_size to a "
                "divisor of it"
            )
        return self

    # ----------------------------------------------------------------- derived values

    @property
    def allows_policy_in_env_process(self) -> bool:
        """Whether the policy in the env workers would do this run's work as well.

        Yes for the sync runner without online scaling and with one pipeline stage
        (with more, a rollout group overlaps the policy with the env; in the env
        process there is nothing to overlap). The runner's advice asks it.
        """
        return (
            self.runner.mode == "sync"
            and not self.runner.online_scaling
            and self.rollout.pipeline_stage_num == 1
        )

    def _check_policy_placement(self) -> None:
        """``cluster.component_placement`` places ``rollout`` exactly when a rollout group runs."""
        placed = [
            key
            for key in self.cluster.component_placement
            if "rollout" in (name.strip() for name in str(key).split(","))
        ]
        if self.rollout.in_env_process and placed:
            raise ValueError(
                f"rollout.in_env_process=true runs the policy in the env workers (no rollout "
                f"group), but cluster.component_placement places rollout under {placed[0]!r}; "
                "remove rollout from the placement, or set rollout.in_env_process: false"
            )
        if not self.rollout.in_env_process and not placed:
            raise ValueError(
                "rollout.in_env_process=false runs a rollout group, but "
                "cluster.component_placement places no rollout; add it (e.g. rollout: 1), or "
                "set rollout.in_env_process: true"
            )

    def stage_num_envs(self, split: Literal["train", "eval"] = "train") -> int:
        """Envs of one (env rank, pipeline stage): ``num_envs / pipeline_stage_num``."""
        cfg = self.env.train if split == "train" else self.env.eval
        if cfg is None:
            raise ValueError("env.eval is null: this run has no eval envs")
        return cfg.num_envs // self.rollout.pipeline_stage_num

    def _check_online_scaling(self) -> None:
        """What ``runner.online_scaling: true`` does not support beyond the runner's keys."""
        if self.actor.enable_offload:
            raise ValueError(
                "runner.online_scaling=true does not support actor.enable_offload=true (the "
                "actor gets devices of its own); set actor.enable_offload: null or false, or "
                "runner.online_scaling: false"
            )

    def check_world_sizes(
        self, *, actor: int, env: int, rollout: int, max_episode_steps: int | None = None
    ) -> None:
        """Checks the rules that need the placed groups' world sizes.

        Args:
            actor: Actor ranks ``Wa``.
            env: Env ranks ``We``.
            rollout: Rollout ranks ``Wr``.
            max_episode_steps: The train env's resolved episode limit (when
                ``max_steps_per_rollout_epoch`` is null).

        Raises:
            ConfigError: Naming the key to change, with the numbers and the fix.
        """
        issues: list[ConfigIssue] = []
        if self.algorithm.loss_type == "sac":
            if actor != 1:
                issues.append(
                    ConfigIssue(
                        "cluster.component_placement",
                        f"places {actor} actor ranks but SAC trains on one (its replay buffer "
                        "and updates are not sharded); place the actor on one resource rank, "
                        "e.g. actor: 0",
                        NO_VALUE,
                    )
                )
            if rollout > env:
                issues.append(
                    ConfigIssue(
                        "cluster.component_placement",
                        f"places {rollout} rollout ranks for {env} env ranks; place at most as "
                        "many rollout ranks as env ranks",
                        NO_VALUE,
                    )
                )
            if issues:
                raise ConfigError(issues)
            return
        stages = self.rollout.pipeline_stage_num
        n_stage = self.stage_num_envs("train")
        pieces = math.lcm(actor, env * stages)
        split_num = pieces // (env * stages)
        if n_stage % split_num != 0 or (n_stage // split_num) % self.env.train.group_size != 0:
            need = split_num * self.env.train.group_size * stages
            issues.append(
                ConfigIssue(
                    "env.train.num_envs",
                    f"each of the {env * stages} (env rank, stage) batches of {n_stage} envs is "
                    f"split over {actor} actor ranks into {split_num} pieces of whole groups "
                    f"(group_size {self.env.train.group_size}); set env.train.num_envs to a "
                    f"multiple of {need}, or change the actor/env world sizes",
                    self.env.train.num_envs,
                )
            )
        if rollout > env:
            issues.append(
                ConfigIssue(
                    "cluster.component_placement",
                    f"places {rollout} rollout ranks for {env} env ranks; rollout rank r serves "
                    f"env ranks r, r + {rollout}, ... so {rollout - env} would idle; place at "
                    "most as many rollout ranks as env ranks",
                    NO_VALUE,
                )
            )
        steps = self.env.train.max_steps_per_rollout_epoch or max_episode_steps
        if steps is not None:
            chunk_steps = steps // self.actor.model.num_action_chunks
            samples = chunk_steps * self.env.train.num_envs * env // actor
            gbs, mbs = self.actor.global_batch_size, self.actor.micro_batch_size
            if gbs % (mbs * actor) != 0:
                issues.append(
                    ConfigIssue(
                        "actor.global_batch_size",
                        f"is not divisible by actor.micro_batch_size ({mbs}) * actor world "
                        f"size ({actor}) = {mbs * actor}; set it to a multiple of {mbs * actor}",
                        gbs,
                    )
                )
            elif samples % (gbs // actor) != 0:
                issues.append(
                    ConfigIssue(
                        "actor.global_batch_size",
                        f"each actor rank trains on {samples} samples per step (chunk steps "
                        f"{chunk_steps} * envs {self.env.train.num_envs * env // actor}) but "
                        f"its share of a global batch is {gbs // actor}; set "
                        f"actor.global_batch_size so that {gbs // actor} divides {samples} "
                        f"(e.g. {samples * actor})",
                        gbs,
                    )
                )
        if issues:
            raise ConfigError(issues)
