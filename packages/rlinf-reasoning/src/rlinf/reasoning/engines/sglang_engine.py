"""``SGLangEngine``: the :class:`RolloutEngine` contract on SGLang's offline ``Engine``.

Written against SGLang 0.5.23's public ``sglang.Engine`` methods only
(``generate``, ``begin_weight_update`` / ``update_weights_from_tensor`` /
``end_weight_update``, ``flush_cache``, ``release_memory_occupation`` /
``resume_memory_occupation``). SGLang needs a CUDA GPU; none was available
where this was written, so the end-to-end path (start, generation, weight
sync, memory release) is **unchecked**. What the CPU tests check: that every
call below exists in the installed SGLang with the keywords passed (parsed
from its source, ``tests/engines/sglang``), and this module's own logic with
a recording stand-in for ``sglang.Engine``.

* **Generation**: token-id prompts (``skip_tokenizer_init=True``), one request
  per sample: each prompt is repeated ``n`` times, so outputs come back
  prompt-major in request order and each sample gets its own
  ``sampling_seed``. ``top_k`` -1 or 0 becomes SGLang's -1 ("whole
  vocabulary"; SGLang rejects 0). ``output_ids`` include the stop token
  (SGLang returns ``output_ids_through_stop``); ``finish_reason`` ``"stop"``
  or ``"length"`` comes from SGLang's ``meta_info["finish_reason"]["type"]``,
  and an aborted request raises.
* **Logprobs**: SGLang's sampler (``sglang/srt/layers/sampler.py``) divides the
  logits by the temperature, takes the softmax, samples from it with
  top-k/top-p, and returns ``log`` of that softmax at the sampled token:
  ``log_softmax(logits / T)[token]`` before top-k/top-p, fp32, our convention,
  for any temperature (provided the sampling kernel leaves the probabilities
  untouched: the PyTorch sampler filters a sorted copy; FlashInfer's kernel,
  SGLang's default on CUDA, was not read). Two exceptions, both refused: greedy
  requests (``top_k == 1``, or a temperature below SGLang's 1e-6 greedy
  threshold) get ``log_softmax(logits)``, the temperature-1 value, so greedy
  with a temperature other than 1 raises an error naming the sampling keys;
  and the environment variable ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (raw,
  temperature-1 logprobs for every request) makes the engine refuse to start.
  The engine never sets ``rl_on_policy_target`` (bf16 logprobs). Logprobs are
  rounded to float32.
* **Seeds**: SGLang uses ``sampling_seed`` only with deterministic inference
  (``rollout.sglang.enable_deterministic_inference``, which also switches to
  its PyTorch sampler); without it a seeded call is not reproducible.
* **Weight sync**: SGLang 0.5.23 loads weights only inside a session:
  the first :meth:`load_weights` of a sync calls ``begin_weight_update``, each
  bucket goes through ``update_weights_from_tensor(flush_cache=False)`` and
  :meth:`finish_weight_sync` calls ``end_weight_update`` and ``flush_cache``
  (``generate`` and ``offload`` end an open session themselves). Qwen2's
  ``load_weights`` copies each q/k/v or gate/up tensor into its own slice of the
  fused parameter (``QKVParallelLinear.weight_loader`` with a shard id), so a
  bucket may hold any subset of a fused group: no holding back as in the vLLM
  engine. ``update_weights_from_distributed`` is not used: the rollout worker
  receives buckets itself and hands tensors to :meth:`load_weights`.
  ``Engine.get_weights_by_name`` exists but returns a truncated list, and
  Qwen2 has no implementation of it, so :attr:`weights_readable` is False and
  the rollout worker checks a sync's names against :meth:`expected_weight_names`.
* **Memory release**: :meth:`offload` calls ``release_memory_occupation()``
  (weights, KV cache and CUDA graphs; needs ``enable_memory_saver``, on by
  default), :meth:`onload` resumes what is still released. Without
  ``enable_weights_cpu_backup`` released weights are discarded: a weight sync
  while offloaded first resumes the weights alone (the collocated worker syncs
  while offloaded), and generating refuses to run until a sync has sent every
  tensor of the model directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlinf.core.logging import get_logger
from rlinf.reasoning.engines.base import FinishReason, GenerationOutput, LibEngine, SamplingParams
from rlinf.reasoning.models.loading import resolve_dtype

__all__ = [
    "MEMORY_TAGS",
    "SGLangEngine",
    "convert_outputs",
    "engine_kwargs",
    "request_sampling_params",
    "sample_seed",
]

_log = get_logger("rlinf.reasoning.engines.sglang")

MEMORY_TAGS: tuple[str, ...] = ("kv_cache", "weights", "cuda_graph")
"""What ``release_memory_occupation()`` without tags releases (``sglang.srt.constants``)."""

_WEIGHTS = "weights"
_GREEDY_TEMPERATURE = 1e-6
"""SGLang treats a temperature below this as greedy (``SamplingParams.__post_init__``)."""
_ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
_SEED_MIX = 0x9E3779B97F4A7C15


def engine_kwargs(
    model_path: str | Path,
    dtype: torch.dtype,
    *,
    gpu_id: int = 0,
    seed: int = 0,
    max_batch_size: int | None = None,
    max_model_len: int | None = None,
    mem_fraction_static: float = 0.5,
    enable_memory_saver: bool = True,
    enable_weights_cpu_backup: bool = False,
    enable_deterministic_inference: bool = False,
    disable_cuda_graph: bool = True,
    log_level: str = "error",
) -> dict[str, Any]:
    """The keyword arguments of ``sglang.Engine`` (each one a ``ServerArgs`` field).

    Args:
        model_path: Hugging Face model directory.
        dtype: Weights' dtype.
        gpu_id: CUDA device index (SGLang's ``base_gpu_id``).
        seed: SGLang's ``random_seed``.
        max_batch_size: Most requests decoded at once (``max_running_requests``).
        max_model_len: Longest prompt + response (``context_length``); None: the model's.
        mem_fraction_static: Share of GPU memory for weights and KV cache.
        enable_memory_saver: Allow ``release_memory_occupation``.
        enable_weights_cpu_backup: Keep a CPU copy of released weights.
        enable_deterministic_inference: Batch-invariant kernels; honours ``sampling_seed``.
        disable_cuda_graph: Skip CUDA graphs (faster start-up, slower decoding).
        log_level: SGLang's log level.

    Returns:
        The keyword arguments.
    """
    kwargs: dict[str, Any] = {
        "model_path": str(model_path),
        "dtype": str(dtype).removeprefix("torch."),
        "skip_tokenizer_init": True,
        "tp_size": 1,
        "base_gpu_id": gpu_id,
        "random_seed": seed,
        "mem_fraction_static": mem_fraction_static,
        "enable_memory_saver": enable_memory_saver,
        "enable_weights_cpu_backup": enable_weights_cpu_backup,
        "enable_deterministic_inference": enable_deterministic_inference,
        "disable_cuda_graph": disable_cuda_graph,
        "log_level": log_level,
    }
    if max_batch_size is not None:
        kwargs["max_running_requests"] = max_batch_size
    if max_model_len is not None:
        kwargs["context_length"] = max_model_len
    return kwargs


def sample_seed(seed: int, request: int) -> int:
    """The ``sampling_seed`` of request ``request`` of a call seeded with ``seed``.

    Distinct per request (SGLang hashes the seed with the position, so equal
    seeds would give equal samples) and in SGLang's range ``[0, 2**63)``.

    Args:
        seed: The call's seed.
        request: Flat request index (``prompt * n + sample``).

    Returns:
        The request's seed.
    """
    return (seed + (request + 1) * _SEED_MIX) % 2**63


def _check_logprob_temperature(params: SamplingParams) -> None:
    greedy = params.top_k == 1 or params.temperature < _GREEDY_TEMPERATURE
    if greedy and params.temperature != 1.0:
        raise ValueError(
            f"temperature={params.temperature} with top_k={params.top_k}: SGLang samples this "
            "greedily and reports greedy logprobs at temperature 1, not at "
            f"{params.temperature}; set algorithm.val_sampling_params (greedy evaluation) or "
            "algorithm.sampling_params temperature to 1.0 for greedy decoding, or use "
            "rollout.engine: hf"
        )


def request_sampling_params(
    params: SamplingParams, num_prompts: int, n: int
) -> list[dict[str, Any]]:
    """SGLang's per-request sampling parameters (``n`` requests per prompt, prompt-major).

    Args:
        params: Our sampling parameters.
        num_prompts: Number of prompts.
        n: Samples per prompt.

    Returns:
        One dict of ``sglang.srt.sampling.sampling_params.SamplingParams`` fields per request.

    Raises:
        ValueError: Greedy decoding with a temperature other than 1 (see the module docstring).
    """
    _check_logprob_temperature(params)
    base: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k_enabled else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
    }
    out: list[dict[str, Any]] = []
    for request in range(num_prompts * n):
        one = dict(base)
        if params.seed is not None:
            one["sampling_seed"] = sample_seed(params.seed, request)
        out.append(one)
    return out


def convert_outputs(
    results: Sequence[Mapping[str, Any]], num_prompts: int, n: int
) -> list[GenerationOutput]:
    """Turns ``Engine.generate``'s per-request dicts into prompt-major outputs.

    Args:
        results: SGLang's outputs, one per request, in request order (``n`` per prompt).
        num_prompts: Number of prompts.
        n: Samples per prompt.

    Returns:
        ``num_prompts * n`` outputs.

    Raises:
        RuntimeError: A request was aborted, did not finish, or its logprobs do
            not line up with its tokens.
    """
    if len(results) != num_prompts * n:
        raise RuntimeError(
            f"SGLang returned {len(results)} outputs for {num_prompts} prompts x {n} samples"
        )
    outputs: list[GenerationOutput] = []
    for request, result in enumerate(results):
        ids = [int(t) for t in result["output_ids"]]
        meta = result["meta_info"]
        reason = meta["finish_reason"]
        kind = reason["type"] if isinstance(reason, Mapping) else None
        if kind == "stop":
            finish: FinishReason = "stop"
        elif kind == "length":
            finish = "length"
        elif kind == "abort":
            raise RuntimeError(
                f"SGLang aborted request {request}: {reason.get('message')} (check "
                "rollout.sglang.max_model_len against the prompt and max_new_tokens lengths)"
            )
        else:
            raise RuntimeError(f"SGLang request {request} did not finish ({reason!r})")
        entries = meta["output_token_logprobs"]
        if len(entries) != len(ids) or any(
            int(entry[1]) != t for entry, t in zip(entries, ids, strict=True)
        ):
            raise RuntimeError(
                f"SGLang request {request}: {len(entries)} logprobs do not match its "
                f"{len(ids)} output tokens"
            )
        logprobs = torch.tensor([float(entry[0]) for entry in entries], dtype=torch.float32)
        outputs.append(GenerationOutput(request // n, request % n, ids, finish, logprobs.tolist()))
    return outputs


def _require_gpu(device: str | torch.device | None) -> torch.device:
    """The CUDA device SGLang will use; refuses a machine or device without CUDA."""
    wanted = torch.device(device) if device is not None else None
    if not torch.cuda.is_available() or (wanted is not None and wanted.type != "cuda"):
        where = "no CUDA GPU is visible" if not torch.cuda.is_available() else f"device={wanted}"
        raise RuntimeError(
            f"rollout.engine: sglang needs a CUDA GPU ({where}); SGLang has no CPU backend "
            "here. Set rollout.engine: hf (any device) or vllm (its CPU build runs on CPU)"
        )
    index = wanted.index if wanted is not None and wanted.index is not None else None
    return torch.device("cuda", torch.cuda.current_device() if index is None else index)


def _check_environment() -> None:
    if os.environ.get(_ORIGINAL_LOGPROB_ENV, "").lower() in ("1", "true", "yes", "on"):
        raise RuntimeError(
            f"{_ORIGINAL_LOGPROB_ENV} is set: SGLang would report temperature-1 logprobs for "
            "every request, not log_softmax(logits / temperature); unset it for the "
            "rollout workers"
        )


class SGLangEngine(LibEngine):
    """Rollout engine backed by SGLang's offline ``Engine`` (see the module docstring).

    Args:
        model_path: Hugging Face model directory (config, safetensors).
        dtype: Weights' dtype (``bfloat16``, ``float32``...).
        device: The CUDA device (None: the current one); anything but CUDA is refused.
        max_model_len: Longest prompt + response; None: the model's.
        max_batch_size: Most requests decoded at once (``max_running_requests``).
        seed: SGLang's base seed.
        mem_fraction_static: Share of GPU memory for weights and KV cache.
        enable_memory_saver: Let :meth:`offload` release GPU memory; without it
            ``offload``/``onload`` are tracked no-ops.
        enable_weights_cpu_backup: Keep a CPU copy of the weights while offloaded
            (else they are discarded and the next sync must send all of them).
        enable_deterministic_inference: SGLang's deterministic mode (seeds honoured).
        disable_cuda_graph: Skip CUDA graphs (faster start-up, slower decoding).
        log_level: SGLang's log level.

    Raises:
        FileNotFoundError: ``model_path`` is not a model directory.
        RuntimeError: No CUDA GPU (checked before SGLang is imported), the
            environment asks SGLang for raw logprobs, or SGLang failed to start.
        ImportError: SGLang is not installed (the message names the extra).
    """

    library = "SGLang"
    _unreadable = (
        "for Qwen2 (Engine.get_weights_by_name is truncated and not implemented for it); "
        "compare generations with a fresh engine"
    )

    def __init__(
        self,
        model_path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        *,
        max_model_len: int | None = None,
        max_batch_size: int | None = None,
        seed: int = 0,
        mem_fraction_static: float = 0.5,
        enable_memory_saver: bool = True,
        enable_weights_cpu_backup: bool = False,
        enable_deterministic_inference: bool = False,
        disable_cuda_graph: bool = True,
        log_level: str = "error",
    ) -> None:
        path = self._model_dir(model_path)
        cuda = _require_gpu(device)
        _check_environment()
        sglang = self._import_library(
            'pip install "rlinf-reasoning[sglang]" on a machine with a CUDA GPU, or set '
            "rollout.engine: hf"
        )
        torch_dtype = resolve_dtype(dtype)
        kwargs = engine_kwargs(
            path,
            torch_dtype,
            gpu_id=cuda.index or 0,
            seed=seed,
            max_batch_size=max_batch_size,
            max_model_len=max_model_len,
            mem_fraction_static=mem_fraction_static,
            enable_memory_saver=enable_memory_saver,
            enable_weights_cpu_backup=enable_weights_cpu_backup,
            enable_deterministic_inference=enable_deterministic_inference,
            disable_cuda_graph=disable_cuda_graph,
            log_level=log_level,
        )
        try:
            engine = sglang.Engine(**kwargs)
        except Exception as exc:
            raise self._start_error(path, exc) from exc
        self._setup(
            engine,
            path,
            torch_dtype,
            cuda,
            memory_saver=enable_memory_saver,
            cpu_backup=enable_weights_cpu_backup,
        )

    @classmethod
    def from_engine(
        cls,
        engine: Any,
        model_path: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        *,
        enable_memory_saver: bool = True,
        enable_weights_cpu_backup: bool = False,
    ) -> SGLangEngine:
        """Wraps an engine that is already running (or an object with its methods).

        No GPU check and no import: the caller built ``engine``. Tensors passed
        to :meth:`load_weights` move to ``device`` when it is given.

        Args:
            engine: An ``sglang.Engine`` (or a stand-in with the same methods).
            model_path: Its model directory.
            dtype: Its weights' dtype.
            device: Where weight tensors are sent from (None: where they are).
            enable_memory_saver: Whether ``engine`` was started with it.
            enable_weights_cpu_backup: Whether ``engine`` was started with it.

        Returns:
            The adapter.
        """
        self = cls.__new__(cls)
        self._setup(
            engine,
            cls._model_dir(model_path),
            resolve_dtype(dtype),
            torch.device(device) if device is not None else None,
            memory_saver=enable_memory_saver,
            cpu_backup=enable_weights_cpu_backup,
        )
        return self

    def _setup(
        self,
        engine: Any,
        path: Path,
        dtype: torch.dtype,
        device: torch.device | None,
        *,
        memory_saver: bool,
        cpu_backup: bool,
    ) -> None:
        self._engine = engine
        self.model_path = path
        self.dtype = dtype
        self.device = device
        self.version = 0
        self._memory_saver = memory_saver
        self._cpu_backup = cpu_backup
        self._offloaded = False
        self._released: set[str] = set()
        self._in_sync = False
        self._sync_names: set[str] = set()
        self._weights_discarded = False

    # ------------------------------------------------------------------ weights

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int | None = None
    ) -> int:
        """Loads one bucket of Hugging Face-named tensors (any subset of fused groups).

        Opens SGLang's weight-update session on the first bucket of a sync and,
        while offloaded with released weights, resumes the weights' memory first.

        Args:
            named_tensors: ``(name, tensor)`` pairs, any device and floating dtype.
            version: If given, the new :attr:`version` after loading.

        Returns:
            How many tensors were passed to SGLang by this call.

        Raises:
            RuntimeError: SGLang refused the session or the update (its message).
        """
        bucket = [
            (name, tensor.detach().to(device=self.device or tensor.device, dtype=self.dtype))
            for name, tensor in named_tensors
        ]
        if bucket:
            if _WEIGHTS in self._released:
                self._engine.resume_memory_occupation(tags=[_WEIGHTS])
                self._released.discard(_WEIGHTS)
            if not self._in_sync:
                _check(self._engine.begin_weight_update(), "begin_weight_update")
                self._in_sync = True
            _check(
                self._engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False),
                "update_weights_from_tensor",
            )
            self._sync_names.update(name for name, _ in bucket)
        if version is not None:
            self.version = int(version)
        return len(bucket)

    def finish_weight_sync(self) -> None:
        """Ends a sync: closes SGLang's session and flushes the prefix cache.

        Raises:
            ValueError: The weights were discarded by :meth:`offload` and this
                sync did not send all of them (names what is missing).
            RuntimeError: SGLang refused to close the session or flush the cache.
        """
        if not self._in_sync:
            return
        names, self._sync_names = self._sync_names, set()
        self._in_sync = False
        _check(self._engine.end_weight_update(), "end_weight_update")
        flushed = self._engine.flush_cache()
        if not getattr(flushed, "success", True):
            raise RuntimeError(
                f"SGLang could not flush its cache after the weight sync: "
                f"{getattr(flushed, 'message', flushed)}"
            )
        if self._weights_discarded:
            missing = sorted(self.expected_weight_names() - names)
            if missing:
                raise ValueError(
                    f"the weights were released by offload without a CPU backup and this sync "
                    f"did not send {missing[:6]}: send the whole state dict, or set "
                    "rollout.sglang.enable_weights_cpu_backup: true"
                )
            self._weights_discarded = False

    def offload(self) -> None:
        """Releases GPU memory (weights, KV cache, CUDA graphs) with SGLang's memory saver."""
        if self._offloaded:
            return
        self.finish_weight_sync()
        if self._memory_saver:
            self._engine.release_memory_occupation()
            self._released = set(MEMORY_TAGS)
            if not self._cpu_backup:
                self._weights_discarded = True
        self._offloaded = True

    def onload(self) -> None:
        """Resumes what :meth:`offload` released and a sync has not resumed yet."""
        if not self._offloaded:
            return
        if self._released:
            self._engine.resume_memory_occupation(
                tags=[t for t in MEMORY_TAGS if t in self._released]
            )
            self._released.clear()
        self._offloaded = False

    # ------------------------------------------------------------------ generation

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[GenerationOutput]:
        """See :meth:`RolloutEngine.generate`; greedy needs temperature 1 (module docstring).

        Raises:
            ValueError: Bad prompts or ``n``, or greedy decoding at a temperature other than 1.
            RuntimeError: Offloaded, weights discarded and not re-sent, or a request
                aborted.
        """
        prompts = self._prompts(prompt_ids, n)
        sampling = request_sampling_params(params, len(prompts), n)
        if self._offloaded:
            raise RuntimeError("SGLangEngine.generate called while offloaded; call onload() first")
        self.finish_weight_sync()
        if self._weights_discarded:
            raise RuntimeError(
                "SGLangEngine.generate: the weights were released by offload without a CPU "
                "backup and no weight sync has sent them since; sync the weights first, or "
                "set rollout.sglang.enable_weights_cpu_backup: true"
            )
        requests = [p for p in prompts for _ in range(n)]
        results = self._engine.generate(
            input_ids=requests, sampling_params=sampling, return_logprob=True
        )
        return convert_outputs(results, len(prompts), n)


def _check(result: Any, call: str) -> None:
    """Raises if an SGLang ``(success, message)`` answer reports a failure."""
    if isinstance(result, tuple) and len(result) >= 2 and not result[0]:
        raise RuntimeError(f"SGLang {call} failed: {result[1]}")
