"""Rollout engines: the backend-neutral contract and its implementations.

* :class:`SamplingParams`, :class:`GenerationOutput`, :class:`RolloutEngine`:
  the contract (:mod:`rlinf.reasoning.engines.base`).
* :func:`create_engine` / :func:`register_engine`: the backend registry.
* :class:`HFEngine`: the transformers backend (CPU and GPU).
"""

from rlinf.reasoning.engines.base import (
    FinishReason,
    GenerationOutput,
    LibEngine,
    RolloutEngine,
    SamplingParams,
)
from rlinf.reasoning.engines.hf import HFEngine
from rlinf.reasoning.engines.registry import (
    available_engines,
    create_engine,
    get_engine_class,
    register_engine,
)
from rlinf.reasoning.engines.sampling import filter_logits, sample_tokens

__all__ = [
    "FinishReason",
    "GenerationOutput",
    "HFEngine",
    "LibEngine",
    "RolloutEngine",
    "SamplingParams",
    "available_engines",
    "create_engine",
    "filter_logits",
    "get_engine_class",
    "register_engine",
    "sample_tokens",
]
