"""The rollout-engine contract: sampling parameters, outputs and the engine protocol.

Every backend (the Hugging Face, vLLM and SGLang engines) implements
:class:`RolloutEngine`. The rollout worker and runner are written against this
protocol only, so adding a backend means registering it in
:mod:`rlinf.reasoning.engines.registry` and nothing else.

Conventions shared by all backends:

* Prompts are lists of token ids without padding; engines pad internally.
* ``generate(prompt_ids, n, params)`` returns ``len(prompt_ids) * n`` outputs,
  prompt-major: all ``n`` samples of prompt 0, then prompt 1, and so on.
* ``output_ids`` includes the stop token when ``finish_reason == "stop"``.
* ``finish_reason`` is ``"stop"`` (EOS or a stop id was sampled) or
  ``"length"`` (``max_new_tokens`` reached). ``is_end`` means ``"stop"`` for
  every backend (the original system disagreed between backends).
* ``logprobs[i]`` is ``log_softmax(logits / temperature)[output_ids[i]]`` in
  float32, computed *before* top-k/top-p filtering; see
  :mod:`rlinf.reasoning.models.logprobs` for why this matches the actor.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import torch

from rlinf.reasoning.models.loading import checkpoint_weight_names

__all__ = ["FinishReason", "GenerationOutput", "RolloutEngine", "SamplingParams"]

FinishReason = Literal["stop", "length"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, fixed for every request of one generation call.

    Attributes:
        temperature: Softmax temperature, > 0. Greedy decoding is ``top_k=1``
            (the reported logprobs still use this temperature).
        top_p: Nucleus mass in ``(0, 1]``; 1 disables it.
        top_k: Keep the ``k`` most likely tokens; ``-1`` or ``0`` disables it.
        max_new_tokens: Generation budget per sample, >= 1.
        stop_token_ids: Extra ids that end a sample (the model's EOS always does);
            stored as a tuple.
        seed: Seed for the sampler; ``None`` uses the global torch RNG. With a
            seed, the same call on the same engine and device is reproducible.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 32
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    seed: int | None = None

    def __post_init__(self) -> None:
        """Validates every field; errors name the field and the value."""
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise ValueError(
                f"temperature must be a finite number > 0, got {t!r} "
                "(for greedy decoding use top_k=1)"
            )
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(
                f"top_k must be an int >= -1 (-1 or 0 disables it), got {self.top_k!r}"
            )
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        stop = self.stop_token_ids
        if isinstance(stop, str | bytes) or not isinstance(stop, Iterable):
            raise ValueError(f"stop_token_ids must be a sequence of ints, got {stop!r}")
        stop_tuple = tuple(stop)
        if not all(_is_int(s) and s >= 0 for s in stop_tuple):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {stop!r}")
        object.__setattr__(self, "stop_token_ids", stop_tuple)
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))

    @property
    def top_k_enabled(self) -> bool:
        """Whether top-k filtering is active."""
        return self.top_k > 0

    @property
    def is_greedy(self) -> bool:
        """Whether sampling reduces to argmax (``top_k == 1``)."""
        return self.top_k == 1


@dataclass
class GenerationOutput:
    """One generated sample.

    Attributes:
        prompt_index: Index of the prompt in the ``prompt_ids`` passed to ``generate``.
        sample_index: Index of this sample within its prompt's group, ``0..n-1``.
        output_ids: Generated token ids, including the stop token if any.
        finish_reason: ``"stop"`` or ``"length"``.
        logprobs: One float32 logprob per output id (see module docstring).
    """

    prompt_index: int
    sample_index: int
    output_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[float]

    @property
    def is_end(self) -> bool:
        """True when the sample ended on a stop token (not truncated by length)."""
        return self.finish_reason == "stop"

    @property
    def num_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.output_ids)


@runtime_checkable
class RolloutEngine(Protocol):
    """What a rollout backend provides to the rollout worker.

    Attributes:
        version: Version of the weights currently loaded (set by ``load_weights``).
    """

    version: int

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[GenerationOutput]:
        """Samples ``n`` continuations of every prompt (prompt-major order)."""
        ...

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int | None = None
    ) -> int:
        """Copies one bucket of Hugging Face-named tensors in; returns how many were loaded."""
        ...

    def weights_max_abs_diff(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Largest absolute difference between the engine's weights and ``named_tensors``."""
        ...

    def offload(self) -> None:
        """Releases device memory (weights and caches) until ``onload``."""
        ...

    def onload(self) -> None:
        """Restores what ``offload`` released."""
        ...

    @property
    def is_offloaded(self) -> bool:
        """Whether the engine is currently offloaded."""
        ...


class LibEngine:
    """Base of the engines that serve a model directory through a library (vLLM, SGLang)."""

    library: ClassVar[str]  # its name in messages; its module and rollout.<config> in lowercase
    _unreadable: ClassVar[str]  # why its weights cannot be read back, and what to do instead
    weights_readable = False
    """Engine weights cannot be read back: a sync is checked by :meth:`expected_weight_names`."""
    model_path: Path
    dtype: torch.dtype
    version: int
    _offloaded: bool
    _expected: frozenset[str] | None = None  # read once, by expected_weight_names
    _repr_fields: ClassVar[tuple[str, ...]] = ()  # attributes __repr__ shows after the dtype

    @property
    def is_offloaded(self) -> bool:
        """Whether :meth:`offload` was called without a matching :meth:`onload`."""
        return self._offloaded

    def weights_max_abs_diff(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Not available (see :attr:`weights_readable`).

        Raises:
            NotImplementedError: Always; compare generations instead.
        """
        raise NotImplementedError(
            f"{self.library}'s weights cannot be read back {self._unreadable}, or set "
            "rollout.validate_weight_first_sync: false"
        )

    def expected_weight_names(self) -> set[str]:
        """Hugging Face names of every tensor in the model directory's safetensors."""
        if self._expected is None:
            self._expected = checkpoint_weight_names(self.model_path)
        return set(self._expected)

    @staticmethod
    def _model_dir(model_path: str | Path) -> Path:
        """``model_path`` as a path; raises ``FileNotFoundError`` if it has no ``config.json``."""
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"rollout model directory {path} has no config.json; set rollout.model_path "
                "(or actor.model_path) to a Hugging Face model directory"
            )
        return path

    @staticmethod
    def _prompts(prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        """The prompts of a ``generate`` call as lists of ints; raises ``ValueError`` if bad."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompts = [list(map(int, p)) for p in prompt_ids]
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists")
        return prompts

    @classmethod
    def _import_library(cls, install: str) -> Any:
        """Imports the library; raises an ``ImportError`` that says how to ``install`` it."""
        name = cls.library.lower()
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"rollout.engine: {name} needs {cls.library} ({exc}): {install}"
            ) from exc

    @classmethod
    def _start_error(cls, path: Path, exc: Exception) -> RuntimeError:
        """The error raised when the library fails to start on ``path``."""
        return RuntimeError(
            f"{cls.library} could not start on {path} ({type(exc).__name__}: {exc}); check "
            f"rollout.dtype, rollout.max_batch_size and rollout.{cls.library.lower()}, or set "
            "rollout.engine: hf"
        )

    def __repr__(self) -> str:
        # getattr with a default: a traceback of a failed start shows an engine half built
        def field(name: str) -> str:
            return repr(getattr(self, name, "<unset>"))

        extra = "".join(f"{name}={field(name)}, " for name in self._repr_fields)
        return (
            f"{type(self).__name__}(model_path={str(getattr(self, 'model_path', '<unset>'))!r}, "
            f"dtype={getattr(self, 'dtype', '<unset>')}, {extra}version={field('version')}, "
            f"offloaded={field('_offloaded')})"
        )
