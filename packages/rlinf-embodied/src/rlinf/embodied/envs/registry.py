"""Env registry keyed by ``env_type``, with lazy imports of the simulators.

The built-in backends are listed by module name, so importing this package
imports no simulator; a backend module is imported when its ``env_type`` is
first built, and the simulator itself when the env is constructed. A missing
simulator raises an :class:`ImportError` that names the extra to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rlinf.embodied.envs.base import VectorEnv
    from rlinf.embodied.envs.config import EnvConfig

__all__ = ["available_envs", "import_simulator", "make_env", "register_env"]

_BUILTIN: dict[str, str] = {
    "gym": "rlinf.embodied.envs.gym_env",
    "lang_reach": "rlinf.embodied.envs.lang_reach",
    "libero": "rlinf.embodied.envs.libero_env",
    "maniskill": "rlinf.embodied.envs.maniskill_env",
    "robosuite": "rlinf.embodied.envs.robosuite_env",
}
"""env_type -> module that registers it (imported on first use)."""

_REGISTRY: dict[str, type[VectorEnv]] = {}

E = TypeVar("E", bound="type[VectorEnv]")


def register_env(env_type: str) -> Callable[[E], E]:
    """Class decorator that makes a :class:`VectorEnv` subclass buildable by ``env_type``.

    Args:
        env_type: The ``env.<split>.env_type`` value that selects the class.

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        ValueError: If ``env_type`` is already registered to another class.
    """

    def decorator(cls: E) -> E:
        old = _REGISTRY.get(env_type)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"env_type {env_type!r} is already registered to "
                f"{old.__module__}.{old.__qualname__}; pick another name for "
                f"{cls.__module__}.{cls.__qualname__}"
            )
        cls.env_type = env_type
        _REGISTRY[env_type] = cls
        return cls

    return decorator


def available_envs() -> list[str]:
    """Every ``env_type`` that :func:`make_env` accepts (built-in and registered), sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def _env_class(env_type: str) -> type[VectorEnv]:
    if env_type not in _REGISTRY and env_type in _BUILTIN:
        importlib.import_module(_BUILTIN[env_type])
    try:
        return _REGISTRY[env_type]
    except KeyError:
        raise ValueError(
            f"unknown env_type {env_type!r}; available: {', '.join(available_envs())} "
            "(register a new one with @rlinf.embodied.envs.register_env)"
        ) from None


def make_env(
    cfg: EnvConfig,
    *,
    num_envs: int | None = None,
    seed_offset: int = 0,
    stage_id: int = 0,
) -> VectorEnv:
    """Builds the vectorized env that ``cfg.env_type`` names (arguments: see :class:`VectorEnv`).

    Returns:
        The env; call ``reset()`` before ``chunk_step()``.

    Raises:
        ValueError: Unknown ``env_type`` or a bad ``num_envs``.
        ImportError: The simulator is not installed (the message names the extra).
    """
    cls = _env_class(cfg.env_type)
    return cls(cfg, num_envs=num_envs, seed_offset=seed_offset, stage_id=stage_id)


def import_simulator(module: str, extra: str, env_type: str) -> ModuleType:
    """Imports a simulator module, or raises an ImportError naming the extra to install.

    Args:
        module: Module to import (``mani_skill.envs``).
        extra: The ``rlinf-embodied`` extra that installs it (``maniskill``).
        env_type: The env type that needs it, for the message.

    Returns:
        The imported module.

    Raises:
        ImportError: If the module (or one of its dependencies) cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"env_type {env_type!r} needs {module.split('.')[0]!r}, which cannot be imported "
            f"({exc}); install it with: uv pip install 'rlinf-embodied[{extra}]'"
        ) from exc
