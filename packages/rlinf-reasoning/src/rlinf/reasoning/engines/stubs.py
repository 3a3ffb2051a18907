"""Placeholders for the SGLang and vLLM backends.

Both engines need a CUDA GPU and their own large wheels, installed through the
package extras ``rlinf-reasoning[sglang]`` / ``rlinf-reasoning[vllm]``. Their
adapters (``generate`` over the engine's offline API with ``return_logprob``,
``load_weights`` through the engine's update-weights-from-tensor API,
``offload``/``onload`` through memory release/sleep) implement
:class:`rlinf.reasoning.engines.base.RolloutEngine` and replace these loaders
in :mod:`rlinf.reasoning.engines.registry`. Until then selecting them fails
with an :class:`ImportError` that says what is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import NoReturn

from rlinf.reasoning.engines.base import RolloutEngine

__all__ = ["load_sglang_engine", "load_vllm_engine"]


def _unavailable(name: str, module: str) -> NoReturn:
    installed = importlib.util.find_spec(module) is not None
    if not installed:
        raise ImportError(
            f"rollout engine {name!r} needs the {module!r} package: install "
            f"`rlinf-reasoning[{name}]` on a machine with a CUDA GPU ({name} cannot run on "
            "CPU); for CPU runs use rollout.backend: hf"
        )
    raise ImportError(
        f"rollout engine {name!r}: {module!r} is installed but this release has no {name} "
        "adapter yet (it needs a CUDA GPU); use rollout.backend: hf"
    )


def load_sglang_engine() -> Callable[..., RolloutEngine]:
    """Loader for the ``"sglang"`` backend.

    Returns:
        Never returns in this release.

    Raises:
        ImportError: Always; names the ``rlinf-reasoning[sglang]`` extra and the GPU requirement.
    """
    _unavailable("sglang", "sglang")


def load_vllm_engine() -> Callable[..., RolloutEngine]:
    """Loader for the ``"vllm"`` backend.

    Returns:
        Never returns in this release.

    Raises:
        ImportError: Always; names the ``rlinf-reasoning[vllm]`` extra and the GPU requirement.
    """
    _unavailable("vllm", "vllm")
