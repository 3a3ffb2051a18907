"""Placeholders for the SGLang and vLLM backends, which this release does not implement.

Only the Hugging Face engine (``rollout.engine: hf``) exists. The names
``"sglang"`` and ``"vllm"`` are registered so that a config selecting them
fails with a clear :class:`ImportError` instead of an unknown-engine error.
There is no ``rlinf-reasoning[sglang]`` / ``[vllm]`` extra: installing the
``sglang`` or ``vllm`` package does not enable them. An adapter would
implement :class:`rlinf.reasoning.engines.base.RolloutEngine` and replace
these loaders in :mod:`rlinf.reasoning.engines.registry` (planned, unchecked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from rlinf.reasoning.engines.base import RolloutEngine

__all__ = ["load_sglang_engine", "load_vllm_engine"]


def _unavailable(name: str) -> NoReturn:
    raise ImportError(
        f"rollout engine {name!r} is not implemented in this release (only 'hf' is); set "
        f"rollout.engine: hf in the config (installing {name} does not enable it)"
    )


def load_sglang_engine() -> Callable[..., RolloutEngine]:
    """Loader for the ``"sglang"`` backend, not implemented in this release.

    Returns:
        Never returns in this release.

    Raises:
        ImportError: Always; says the engine is not implemented and to set
            ``rollout.engine: hf``.
    """
    _unavailable("sglang")


def load_vllm_engine() -> Callable[..., RolloutEngine]:
    """Loader for the ``"vllm"`` backend, not implemented in this release.

    Returns:
        Never returns in this release.

    Raises:
        ImportError: Always; says the engine is not implemented and to set
            ``rollout.engine: hf``.
    """
    _unavailable("vllm")
