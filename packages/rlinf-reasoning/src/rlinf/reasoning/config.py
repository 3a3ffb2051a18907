"""``ReasoningConfig``: the validated config tree of a reasoning (GRPO) run.

Sections (``examples/reasoning/config/*.yaml`` show all of them)::

    cluster:    num_nodes, cpu_slots_per_node, component_placement (actor, rollout, reward),
                node_groups, torch_threads
    runner:     max_epochs / max_steps, val_check_interval, val_before_train, save_interval,
                resume_dir, seed, logger, timeouts
    data:       train_files, val_files, prompt/answer keys, max_prompt_length, ... (DataConfig)
    algorithm:  adv_type, group_size (G), rollout_batch_size (N prompts per step),
                max_staleness (0 sync; k > 0 async GRPO, see docs/reasoning.md),
                n_minibatches, update_epoch, loss options, kl_beta / kl_penalty,
                entropy_bonus, sampling_params, val_sampling_params
    rollout:    engine, model_path, dtype, groups_per_chunk, enable_offload
    actor:      training_backend (fsdp | megatron), model (tensor/pipeline parallel sizes),
                model_path, tokenizer_path, dtype, micro_batch_size, recompute_logprobs,
                optim (lr, schedule, clip_grad), sync_bucket_mb, enable_offload, dist_backend
    reward:     reward_type, reward_scale, timeout_s, num_workers (RewardConfig)
    agent:      (optional) multi-turn tool use: tools, max_turns, max_response_tokens,
                penalties, ... (AgentConfig); places the optional ``tool`` component
    profile_data: (optional) measured seconds per step for ``rlinf auto-place``:
                rollout_cost, inference_cost, actor_cost, reward_cost, sync_cost, slots

Every cross-field rule raises an error that starts with the dotted key it is
about, shows the values and says how to fix it. Model paths are *not* checked
here (a config must validate on a machine without the weights, e.g. in CI);
loading fails with an error naming the path. Rules that need the world sizes
of the placed groups are checked by :meth:`ReasoningConfig.check_world_sizes`
once the placement is known (the runner calls it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rlinf.core.config import RLinfModel, RunnerConfig
from rlinf.core.config.schema import rename_deprecated_key
from rlinf.reasoning.agent.config import AgentConfig
from rlinf.reasoning.data.config import DataConfig
from rlinf.reasoning.reward.config import RewardConfig
from rlinf.sched.config import ClusterConfig

__all__ = [
    "COMPONENTS",
    "ActorConfig",
    "ActorModelConfig",
    "AlgorithmConfig",
    "OptimConfig",
    "ProfileDataConfig",
    "ReasoningClusterConfig",
    "ReasoningConfig",
    "ReasoningRunnerConfig",
    "RolloutConfig",
    "SamplingConfig",
]

COMPONENTS = ("actor", "rollout", "reward", "tool")
"""Components a reasoning run places (``tool`` only with an ``agent`` section, optionally)."""

KLKind = Literal["k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"]


class ReasoningClusterConfig(ClusterConfig):
    """Where the groups run (``cluster``).

    ``component_placement`` maps ``actor``, ``rollout`` and ``reward`` (alone or
    comma-joined) to resource ranks: GPUs, or CPU slots when
    ``cpu_slots_per_node`` > 0 on a CPU machine. Actor and rollout on the same
    ranks is *collocated* (they take turns, with offload/onload and device
    locks); on disjoint ranks it is *disaggregated* (the stages overlap).
    """

    components: ClassVar[tuple[str, ...]] = COMPONENTS
    optional_components: ClassVar[tuple[str, ...]] = ("tool",)
    placement_examples: ClassVar[str] = (
        "'actor,rollout,reward: all' (collocated) or actor: 0, rollout: 1, reward: 1 "
        "(disaggregated)"
    )

    torch_threads: int = Field(
        1, ge=0, description="torch CPU threads per worker process (0: torch's default)."
    )


class ReasoningRunnerConfig(RunnerConfig):
    """The training loop (``runner``).

    A run takes ``max_epochs * (len(train) // algorithm.rollout_batch_size)``
    steps, capped by ``max_steps`` when that is set.
    """

    val_before_train: bool = Field(
        True,
        description="Evaluate the starting weights once before the first update "
        "(needs data.val_files).",
    )
    val_max_prompts: int | None = Field(
        None, ge=1, description="Evaluate on at most this many held-out prompts (null: all)."
    )
    step_timeout_s: float = Field(
        1800.0, gt=0, description="Longest wait for one phase of a step (rollout, training...)."
    )
    channel_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for one item on a channel between stages."
    )
    online_scaling: bool = Field(
        False,
        description="Disaggregated placement, FSDP actor or Megatron actor (PP 1, no "
        "distributed optimizer): after each step's generation the actor grows onto the "
        "rollout's devices for training and shrinks back before the next generation "
        "(see docs/online_scaling.md).",
    )


class SamplingConfig(RLinfModel):
    """Sampling parameters of the rollout (``algorithm.sampling_params``)."""

    temperature: float = Field(1.0, gt=0, description="Softmax temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus mass; 1 disables it.")
    top_k: int = Field(-1, ge=-1, description="Keep the k most likely tokens; -1 or 0: off.")
    max_new_tokens: int = Field(256, ge=1, description="Generated tokens per response, at most.")

    def to_params(self, seed: int | None = None, stop_token_ids: tuple[int, ...] = ()) -> Any:
        """The engine's :class:`~rlinf.reasoning.engines.SamplingParams`.

        Args:
            seed: Sampler seed (None: the global torch RNG).
            stop_token_ids: Extra ids that end a response (besides the model's EOS).

        Returns:
            The sampling parameters.
        """
        from rlinf.reasoning.engines.base import SamplingParams

        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=stop_token_ids,
            seed=seed,
        )


class AlgorithmConfig(RLinfModel):
    """The GRPO step and its loss (``algorithm``)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        return rename_deprecated_key(data, "algorithm", "update_epochs", "update_epoch")

    adv_type: Literal["grpo", "reinforce_plus_plus", "reinpp"] = Field(
        "grpo", description="Advantage estimator: grpo or reinforce_plus_plus (alias reinpp)."
    )
    group_size: int = Field(8, ge=1, description="G: responses sampled per prompt.")
    rollout_batch_size: int = Field(8, ge=1, description="N: prompts per step.")
    n_minibatches: int = Field(
        1, ge=1, description="Optimizer steps per pass over a step's N*G responses."
    )
    update_epoch: int = Field(1, ge=1, description="Passes over each step's responses.")
    shuffle_rollout: bool = Field(
        False,
        description="Split a step's responses into minibatches in a seeded random order "
        "(each minibatch then mixes all prompts; training waits for the whole batch) "
        "instead of arrival order (minibatches of whole groups, trained as they arrive).",
    )
    norm_by_std: bool = Field(True, description="grpo: divide by the group's reward std.")
    normalize_advantages: bool = Field(
        False,
        description="Whiten advantages over all valid tokens of the step (waits for the "
        "whole batch, so training no longer overlaps rollout).",
    )
    use_reinpp_baseline: bool = Field(
        False, description="reinforce_plus_plus: subtract the group mean reward first."
    )
    reinpp_kl_beta: float = Field(
        0.0, ge=0, description="reinforce_plus_plus: KL penalty folded into the token rewards."
    )
    loss_type: str = Field("ppo", description="Policy loss from the registry (ppo/actor).")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        "token-mean", description="How per-token losses reduce to a scalar."
    )
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="PPO clip below 1 (epsilon_low).")
    clip_ratio_high: float | None = Field(
        None, gt=0, description="PPO clip above 1 (epsilon_high); null: clip_ratio_low."
    )
    clip_ratio_c: float | None = Field(
        None, gt=1, description="Dual-clip constant c > 1; null disables dual clip."
    )
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of the KL loss to the initial (reference) weights."
    )
    kl_penalty: KLKind = Field(
        "k3", description="KL estimator: k1 (kl), k2 (mse), k3 (low_var_kl) or abs."
    )
    entropy_bonus: float = Field(0.0, ge=0, description="Entropy coefficient (subtracted).")
    importance_sampling_fix: bool | None = Field(
        None,
        description="Truncated IS: multiply advantages by min(exp(recomputed - rollout "
        "logprobs), importance_sampling_clip); needs actor.recompute_logprobs. "
        "null: on when max_staleness > 0 (async), off otherwise.",
    )
    importance_sampling_clip: float = Field(
        2.0, gt=0, description="Upper bound of a truncated-IS weight."
    )
    proximal_on_rollout: bool | None = Field(
        None,
        description="Async GRPO: the rollout scores the previous version's groups under "
        "each new weight version right after loading it (its device idles then) and the "
        "actor takes those proximal logprobs instead of recomputing them. null: on in "
        "async mode with the hf engine, recomputed logprobs and no reference model.",
    )
    use_valid_token_scale: bool = Field(
        False,
        description="DAPO token-level loss: scale each micro-batch's token-mean loss so a "
        "minibatch's gradient is the mean over all its valid tokens (all actor ranks), "
        "independent of micro-batching; needs loss_agg_mode token-mean.",
    )
    early_stop_imp_ratio: float | None = Field(
        None,
        gt=1,
        description="Drop a micro-batch's loss when its mean ratio (over data-parallel "
        "ranks) exceeds this; null disables.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="0: synchronous GRPO (every step trains on samples of the weights "
        "synced at its start). k > 0: asynchronous GRPO: the rollout keeps generating "
        "with weights up to k versions older than the actor's, and the actor drops "
        "(and regenerates) any group older than that; needs disaggregated placement.",
    )
    sampling_params: SamplingConfig = Field(default_factory=SamplingConfig)  # type: ignore[arg-type]
    val_sampling_params: SamplingConfig | None = Field(
        None,
        description="Eval sampling; null: greedy (top_k=1) with sampling_params' "
        "max_new_tokens and temperature.",
    )

    @field_validator("loss_type")
    @classmethod
    def _check_loss(cls, value: str) -> str:
        from rlinf.core.algorithms import available_policy_losses

        known = available_policy_losses()
        if value not in known:
            raise ValueError(f"unknown policy loss {value!r}; registered: {sorted(known)}")
        return value

    @property
    def eval_sampling(self) -> SamplingConfig:
        """The sampling of evaluation (greedy unless ``val_sampling_params`` is set)."""
        if self.val_sampling_params is not None:
            return self.val_sampling_params
        return self.sampling_params.model_copy(update={"top_k": 1, "top_p": 1.0})

    @property
    def sampling_by_key(self) -> dict[str, SamplingConfig]:
        """Every sampling of the run by its config key (training, then evaluation)."""
        return {
            "algorithm.sampling_params": self.sampling_params,
            "algorithm.val_sampling_params": self.eval_sampling,
        }

    @property
    def is_async(self) -> bool:
        """Whether the run is asynchronous GRPO (``max_staleness`` > 0)."""
        return self.max_staleness > 0

    @property
    def use_importance_sampling_fix(self) -> bool:
        """Whether truncated IS is on (``importance_sampling_fix``; null: in async mode)."""
        if self.importance_sampling_fix is None:
            return self.is_async
        return self.importance_sampling_fix

    @property
    def is_reinpp(self) -> bool:
        """Whether the estimator is REINFORCE++."""
        return self.adv_type in ("reinforce_plus_plus", "reinpp")


class VLLMOptions(RLinfModel):
    """vLLM engine options (``rollout.vllm``; used with ``rollout.engine: vllm``)."""

    max_model_len: int | None = Field(
        None, ge=8, description="Longest prompt + response; null: the model's."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="Share of GPU memory vLLM may take (GPU only)."
    )
    enforce_eager: bool = Field(
        True, description="Skip CUDA graphs: faster start-up, slower decoding (GPU only)."
    )


class SGLangOptions(RLinfModel):
    """SGLang engine options (``rollout.sglang``; used with ``rollout.engine: sglang``)."""

    max_model_len: int | None = Field(
        None,
        ge=8,
        description="Longest prompt + response (SGLang's context_length); null: the model's.",
    )
    mem_fraction_static: float = Field(
        0.5, gt=0, lt=1, description="Share of GPU memory for SGLang's weights and KV cache."
    )
    enable_memory_saver: bool = Field(
        True,
        description="Let offload release GPU memory (release_memory_occupation); false: "
        "offload and onload keep everything on the GPU.",
    )
    enable_weights_cpu_backup: bool = Field(
        False,
        description="Keep a CPU copy of the weights while offloaded; false: they are "
        "discarded and the next weight sync must send all of them.",
    )
    enable_deterministic_inference: bool = Field(
        False,
        description="SGLang's deterministic mode (batch-invariant kernels, PyTorch sampler); "
        "sampling seeds are honoured only with it.",
    )
    disable_cuda_graph: bool = Field(
        True, description="Skip CUDA graphs: faster start-up, slower decoding."
    )
    log_level: str = Field("error", description="SGLang's log level.")


_ENGINE_PACKAGES = {
    "vllm": (
        "vllm",
        'install the extra on a GPU machine: `pip install "rlinf-reasoning[vllm]"` '
        "(vLLM's CUDA build)",
    ),
    "sglang": (
        "sglang",
        'install the extra on a GPU machine: `pip install "rlinf-reasoning[sglang]"`',
    ),
}
"""Engine -> (module it imports, what to install)."""


class RolloutConfig(RLinfModel):
    """The generation workers (``rollout``)."""

    engine: str = Field(
        "hf",
        description="Rollout engine backend: hf, vllm or sglang.",
    )
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)  # type: ignore[arg-type]
    """Options of the vLLM engine."""
    sglang: SGLangOptions = Field(default_factory=SGLangOptions)  # type: ignore[arg-type]
    """Options of the SGLang engine."""
    model_path: Path | None = Field(
        None, description="Model directory of the engine; null: actor.model_path."
    )
    dtype: str = Field("float32", description="Engine weights' dtype (float32, bfloat16...).")
    max_batch_size: int | None = Field(
        None, ge=1, description="Sequences decoded at once (null: no limit)."
    )
    groups_per_chunk: int = Field(
        4,
        ge=1,
        description="Prompts generated together; their groups stream out when the chunk is "
        "done (smaller: earlier streaming, larger: bigger decode batches).",
    )
    enable_offload: bool | None = Field(
        None, description="Offload the engine after generating; null: when collocated."
    )
    validate_weight_first_sync: bool = Field(
        True, description="After the first weight sync, check engine weights == actor weights."
    )

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        # The registry module is light; the engines themselves load lazily.
        from rlinf.reasoning.engines.registry import available_engines

        if value not in available_engines():
            raise ValueError(f"unknown rollout engine {value!r}; available: {available_engines()}")
        if value in _ENGINE_PACKAGES:
            module, extra = _ENGINE_PACKAGES[value]
            if importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"rollout.engine={value!r} needs the {module} package, which is not "
                    f"installed: {extra}, or set rollout.engine: hf"
                )
        return value


class OptimConfig(RLinfModel):
    """AdamW and its schedule (``actor.optim``)."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    clip_grad: float | None = Field(
        1.0, gt=0, description="Gradient norm clip; null disables clipping."
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Schedule after warm-up, over the run's optimizer steps."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up in optimizer steps.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final lr / peak lr for the linear and cosine schedules."
    )

    @field_validator("adam_betas")
    @classmethod
    def _check_betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"both betas must be in [0, 1), got {value}")
        return value


class ActorModelConfig(RLinfModel):
    """Model parallelism of the Megatron backend (``actor.model``).

    The actor ranks split into ``tensor_model_parallel_size *
    pipeline_model_parallel_size`` model-parallel ranks per replica; the rest
    is data parallel (``actor ranks / (tp * pp)`` replicas, each taking an
    equal share of the step's prompt groups). The FSDP backend ignores them.
    """

    tensor_model_parallel_size: int = Field(
        1, ge=1, description="Megatron tensor-parallel size (splits heads and the vocabulary)."
    )
    pipeline_model_parallel_size: int = Field(
        1,
        ge=1,
        description="Megatron pipeline-parallel size (splits the layers; each micro-batch "
        "runs through the stages alone, without overlap).",
    )
    use_distributed_optimizer: bool | None = Field(
        None,
        description="Train with Megatron's DDP wrapper and distributed optimizer (fp32 master "
        "weights and AdamW moments sharded over the replicas; CUDA only). null: on with CUDA "
        "unless the actor offloads between phases (collocated), where torch AdamW per rank runs.",
    )


class ActorConfig(RLinfModel):
    """The training workers (``actor``): FSDP2 or Megatron-core."""

    training_backend: Literal["fsdp", "megatron"] = Field(
        "fsdp",
        description="fsdp: FSDP2 over all actor ranks; megatron: Megatron-core tensor "
        "parallelism (actor.model), data parallel over the rest (needs the megatron extra).",
    )
    model: ActorModelConfig = Field(default_factory=ActorModelConfig)  # type: ignore[arg-type]
    model_path: Path = Field(..., description="Local Hugging Face model directory (weights).")
    tokenizer_path: Path | None = Field(
        None, description="Tokenizer directory; null: actor.model_path."
    )
    dtype: str = Field("float32", description="Parameter dtype (float32 keeps exact logprobs).")
    micro_batch_size: int = Field(
        8, ge=1, description="Responses per forward/backward per actor rank."
    )
    logprob_micro_batch_size: int | None = Field(
        None, ge=1, description="Responses per no-grad logprob forward; null: micro_batch_size."
    )
    recompute_logprobs: bool = Field(
        True,
        description="Recompute the old logprobs with the step's starting weights (else use "
        "the rollout engine's, which match to float rounding).",
    )
    optim: OptimConfig = Field(default_factory=OptimConfig)  # type: ignore[arg-type]
    sync_bucket_mb: float = Field(
        128.0, gt=0, description="Weight sync bucket size in MiB (one broadcast per bucket)."
    )
    enable_offload: bool | None = Field(
        None, description="Offload weights and optimizer between phases; null: when collocated."
    )
    reshard_after_forward: bool = Field(
        True, description="FSDP2: free gathered parameters after each layer's forward."
    )
    fsdp_units: Literal["layers", "model"] = Field(
        "layers",
        description="FSDP2 units: 'layers' shards each decoder layer apart from the root "
        "(gathers one layer at a time: big models); 'model' one unit for the whole model "
        "(fewest collectives: tiny models on CPU).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (saves memory)."
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: auto picks nccl with CUDA, else gloo."
    )

    @field_validator("training_backend")
    @classmethod
    def _check_backend(cls, value: str) -> str:
        if value == "megatron" and importlib.util.find_spec("megatron.core") is None:
            raise ValueError(
                "actor.training_backend='megatron' needs megatron-core, which is not "
                'installed: pip install "rlinf-reasoning[megatron]", or set '
                "actor.training_backend: fsdp"
            )
        return value

    @property
    def tokenizer_dir(self) -> Path:
        """Where the tokenizer is read from."""
        return self.tokenizer_path or self.model_path

    @property
    def model_parallel_size(self) -> int:
        """Actor ranks per data-parallel replica (1 for FSDP)."""
        if self.training_backend != "megatron":
            return 1
        return self.model.tensor_model_parallel_size * self.model.pipeline_model_parallel_size


class ProfileDataConfig(RLinfModel):
    """Measured costs for ``rlinf auto-place`` (``profile_data``), instead of profiling.

    Seconds per GRPO step of each component with actor, rollout and reward on
    the same ``slots`` resource ranks (a collocated run), e.g. read from its
    ``time/*`` metrics: ``rollout_cost`` from ``time/rollout``,
    ``inference_cost`` from ``time/actor/inference``, ``actor_cost`` from
    ``time/actor/training``, ``reward_cost`` from ``time/reward``,
    ``sync_cost`` from ``time/sync_weights``.
    """

    rollout_cost: float = Field(..., ge=0, description="Generation per step (s).")
    inference_cost: float = Field(..., ge=0, description="Logprob recomputation per step (s).")
    actor_cost: float = Field(..., ge=0, description="Training per step (s).")
    reward_cost: float = Field(0.0, ge=0, description="Scoring per step (s).")
    sync_cost: float = Field(0.0, ge=0, description="Weight sync actor -> rollout (s).")
    slots: int | None = Field(
        None, ge=1, description="Resource ranks the costs were measured on; null: all of them."
    )


class ReasoningConfig(RLinfModel):
    """Top-level schema of a reasoning run (the ``reasoning`` config schema)."""

    cluster: ReasoningClusterConfig
    runner: ReasoningRunnerConfig = Field(default_factory=ReasoningRunnerConfig)  # type: ignore[arg-type]
    data: DataConfig
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)  # type: ignore[arg-type]
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)  # type: ignore[arg-type]
    actor: ActorConfig
    reward: RewardConfig = Field(default_factory=RewardConfig)  # type: ignore[arg-type]
    profile_data: ProfileDataConfig | None = Field(
        None, description="Measured costs for rlinf auto-place (instead of profiling)."
    )
    agent: AgentConfig | None = Field(
        None, description="Multi-turn rollouts with tool calls (agentic RL); null: one turn."
    )

    @property
    def places_tool_workers(self) -> bool:
        """Whether ``cluster.component_placement`` places a ``tool`` group."""
        from rlinf.sched.placement.grammar import parse_component_placement

        specs = parse_component_placement(self.cluster.component_placement)
        return any("tool" in spec.names for spec in specs)

    @model_validator(mode="after")
    def _check_tool_placement(self) -> ReasoningConfig:
        if self.agent is None and self.places_tool_workers:
            raise ValueError(
                "cluster.component_placement places tool workers but there is no agent "
                "section; add agent: {tools: [python]} or remove tool from the placement"
            )
        return self

    @model_validator(mode="after")
    def _check(self) -> ReasoningConfig:
        alg, data, runner, actor = self.algorithm, self.data, self.runner, self.actor
        g, n = alg.group_size, alg.rollout_batch_size
        if alg.adv_type == "grpo" and g < 2:
            raise ValueError(
                f"algorithm.group_size={g} is too small for GRPO: the group baseline needs "
                ">= 2 responses per prompt; set algorithm.group_size: 8"
            )
        if alg.is_reinpp and alg.use_reinpp_baseline and g < 2:
            raise ValueError(
                f"algorithm.group_size={g} is too small for use_reinpp_baseline (a group mean "
                "needs >= 2 responses); raise it or set use_reinpp_baseline: false"
            )
        if n % alg.n_minibatches:
            raise ValueError(
                f"algorithm.rollout_batch_size={n} is not divisible by "
                f"algorithm.n_minibatches={alg.n_minibatches}: every minibatch holds whole "
                "prompt groups; pick n_minibatches among the divisors of rollout_batch_size"
            )
        per_minibatch = n * g // alg.n_minibatches
        if per_minibatch % actor.micro_batch_size:
            raise ValueError(
                f"actor.micro_batch_size={actor.micro_batch_size} does not divide the "
                f"{per_minibatch} responses of a minibatch (rollout_batch_size {n} * "
                f"group_size {g} / n_minibatches {alg.n_minibatches}); pick a divisor"
            )
        if not data.train_files:
            raise ValueError("data.train_files is empty; list the training .jsonl/.json files")
        if (runner.val_check_interval > 0 or runner.val_before_train) and not data.val_files:
            raise ValueError(
                "data.val_files is empty but evaluation is on (runner.val_check_interval="
                f"{runner.val_check_interval}, runner.val_before_train="
                f"{runner.val_before_train}); list the held-out files, or set "
                "runner.val_check_interval: -1 and runner.val_before_train: false"
            )
        if alg.use_valid_token_scale and alg.loss_agg_mode != "token-mean":
            raise ValueError(
                "algorithm.use_valid_token_scale=true turns token means into a minibatch-wide "
                f"token mean, but algorithm.loss_agg_mode is {alg.loss_agg_mode!r}; set "
                "loss_agg_mode: token-mean or use_valid_token_scale: false"
            )
        if alg.proximal_on_rollout and not self._proximal_possible():
            raise ValueError(
                "algorithm.proximal_on_rollout=true needs asynchronous GRPO (max_staleness > "
                "0), actor.recompute_logprobs: true, rollout.engine: hf and no KL term, got "
                f"max_staleness={alg.max_staleness}, recompute_logprobs="
                f"{actor.recompute_logprobs}, engine={self.rollout.engine!r}, kl_beta="
                f"{alg.kl_beta}; set it to null (automatic) or false"
            )
        if alg.use_importance_sampling_fix and not actor.recompute_logprobs:
            why = (
                "algorithm.importance_sampling_fix=true"
                if alg.importance_sampling_fix
                else f"algorithm.max_staleness={alg.max_staleness} turns "
                "algorithm.importance_sampling_fix on by default; it"
            )
            raise ValueError(
                f"{why} compares the actor's recomputed logprobs with the engine's, but "
                "actor.recompute_logprobs is false; set actor.recompute_logprobs: true or "
                "algorithm.importance_sampling_fix: false"
            )
        if self.rollout.engine == "vllm":
            from rlinf.reasoning.engines.vllm_engine import vllm_logprobs_mode

            vllm_logprobs_mode(alg.sampling_by_key)  # one vLLM logprobs_mode must fit them all
        if actor.training_backend == "megatron" and actor.gradient_checkpointing:
            raise ValueError(
                "actor.gradient_checkpointing=true is not implemented for "
                "actor.training_backend='megatron'; set actor.gradient_checkpointing: false"
            )
        if runner.online_scaling:
            _check_online_scaling(self)
        if alg.kl_beta > 0 and alg.is_reinpp:
            raise ValueError(
                "algorithm.kl_beta > 0 adds a KL loss term; reinforce_plus_plus folds its KL "
                "into the rewards instead: use algorithm.reinpp_kl_beta and set kl_beta: 0"
            )
        return self

    # ----------------------------------------------------------------- derived values

    @property
    def rollout_model_path(self) -> Path:
        """The engine's model directory (``rollout.model_path`` or ``actor.model_path``)."""
        return self.rollout.model_path or self.actor.model_path

    @property
    def scores_proximal_on_rollout(self) -> bool:
        """Whether the rollout scores the proximal logprobs (``proximal_on_rollout``)."""
        flag = self.algorithm.proximal_on_rollout
        return self._proximal_possible() if flag is None else flag

    def _proximal_possible(self) -> bool:
        return (
            self.algorithm.is_async
            and self.actor.recompute_logprobs
            and self.rollout.engine == "hf"
            and not self.needs_ref_model
        )

    @property
    def needs_ref_model(self) -> bool:
        """Whether the actor keeps a frozen copy of the initial weights (KL terms)."""
        return self.algorithm.kl_beta > 0 or (
            self.algorithm.is_reinpp and self.algorithm.reinpp_kl_beta > 0
        )

    def check_world_sizes(self, *, actor: int, rollout: int, reward: int) -> None:
        """Checks the rules that need the placed groups' world sizes.

        Every rank of a stage takes an equal share of the step's prompt groups,
        and every actor rank an equal share of every minibatch.

        Args:
            actor: Actor ranks.
            rollout: Rollout ranks.
            reward: Reward ranks.

        Raises:
            ValueError: Naming the key to change, with the numbers and the fix.
        """
        alg = self.algorithm
        n = alg.rollout_batch_size
        mp = self.actor.model_parallel_size
        if actor % mp:
            model = self.actor.model
            raise ValueError(
                f"actor.model.tensor_model_parallel_size ({model.tensor_model_parallel_size}) * "
                f"pipeline_model_parallel_size ({model.pipeline_model_parallel_size}) = {mp} "
                f"does not divide the {actor} actor ranks (cluster.component_placement.actor); "
                f"place a multiple of {mp} actor ranks or lower the parallel sizes"
            )
        actor //= mp  # data-parallel replicas: the ranks that split the batch
        megatron = self.actor.training_backend == "megatron"
        ranks = "actor data-parallel ranks" if megatron else "actor ranks"
        for name, world in (("rollout", rollout), ("reward", reward)):
            if n % world:
                raise ValueError(
                    f"algorithm.rollout_batch_size={n} is not divisible by the {world} {name} "
                    f"ranks (cluster.component_placement): each {name} rank takes an equal "
                    f"share of the prompt groups; use a multiple of {world}"
                )
        if n % (alg.n_minibatches * actor):
            raise ValueError(
                f"algorithm.rollout_batch_size={n} is not divisible by algorithm.n_minibatches "
                f"({alg.n_minibatches}) * {ranks} ({actor}) = {alg.n_minibatches * actor}: "
                f"every {ranks[:-1]} takes whole prompt groups of every minibatch; use a multiple"
            )
        per_rank = n * alg.group_size // (alg.n_minibatches * actor)
        if per_rank % self.actor.micro_batch_size:
            raise ValueError(
                f"actor.micro_batch_size={self.actor.micro_batch_size} does not divide the "
                f"{per_rank} responses each of the {actor} {ranks} gets per minibatch; "
                "pick a divisor"
            )


def _check_online_scaling(cfg: ReasoningConfig) -> None:
    """Refuses ``runner.online_scaling`` where it is not implemented (the message names the key)."""
    fix = "set runner.online_scaling: false"
    megatron = cfg.actor.training_backend == "megatron"
    if megatron:
        parallel = cfg.actor.model
        if parallel.pipeline_model_parallel_size != 1:
            raise ValueError(
                "runner.online_scaling=true with the Megatron actor adds data-parallel "
                "replicas and needs actor.model.pipeline_model_parallel_size=1, got "
                f"{parallel.pipeline_model_parallel_size}; {fix} or set it to 1"
            )
        if parallel.use_distributed_optimizer:
            raise ValueError(
                "runner.online_scaling=true replicates per-rank AdamW state and cannot "
                "re-shard Megatron's distributed optimizer (actor.model."
                f"use_distributed_optimizer=true); {fix} or set it to null or false"
            )
    if cfg.algorithm.is_async:
        raise ValueError(
            f"runner.online_scaling=true needs synchronous GRPO, but algorithm.max_staleness="
            f"{cfg.algorithm.max_staleness} (the rollout never stops generating); {fix} or "
            "set algorithm.max_staleness: 0"
        )
    if cfg.needs_ref_model and not megatron:  # Megatron: every rank keeps its own copy
        raise ValueError(
            "runner.online_scaling=true does not re-shard the frozen reference model that KL "
            f"terms need (algorithm.kl_beta={cfg.algorithm.kl_beta}, reinpp_kl_beta="
            f"{cfg.algorithm.reinpp_kl_beta}); {fix} or set the KL coefficients to 0"
        )
    if cfg.actor.enable_offload:
        raise ValueError(
            f"runner.online_scaling=true with actor.enable_offload=true is not implemented; "
            f"{fix} or set actor.enable_offload: false"
        )
