"""Placeholder for the SGLang backend, which this release does not implement yet.

The name ``"sglang"`` is registered so that a config selecting it fails with
a clear :class:`ImportError` instead of an unknown-engine error. There is no
``rlinf-reasoning[sglang]`` extra: installing ``sglang`` does not enable it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from rlinf.reasoning.engines.base import RolloutEngine

__all__ = ["load_sglang_engine"]


def _unavailable(name: str) -> NoReturn:
    raise ImportError(
        f"rollout engine {name!r} is not implemented in this release ('hf' and 'vllm' are); set "
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
