"""Policy registry keyed by ``model_type``.

Example::

    @register_policy("my_policy")
    class MyPolicy(BasePolicy):
        def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None: ...

    policy = build_policy(PolicyConfig(model_type="my_policy"), env_spec)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

import torch

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models.base import BasePolicy
from rlinf.embodied.models.config import PolicyConfig

__all__ = ["available_policies", "build_policy", "get_policy_class", "register_policy"]

P = TypeVar("P", bound=type[BasePolicy])

_POLICIES: dict[str, type[BasePolicy]] = {}

_BUILTIN: dict[str, str] = {
    "pi0": "rlinf.embodied.models.vla.pi0.policy",
    "openvla": "rlinf.embodied.models.vla.openvla.policy",
}
"""Built-in policies whose module is imported on first use (VLAs import transformers)."""


def register_policy(model_type: str) -> Callable[[P], P]:
    """Class decorator that registers a :class:`BasePolicy` subclass under ``model_type``.

    Registering the same class twice is a no-op (module reloads); registering a
    different class under a taken name is an error.

    Args:
        model_type: The name ``PolicyConfig.model_type`` selects it by.

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        ValueError: ``model_type`` is empty or already taken by another class.
        TypeError: The decorated object is not a ``BasePolicy`` subclass.
    """
    if not model_type:
        raise ValueError("register_policy needs a non-empty model_type")

    def decorator(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, BasePolicy)):
            raise TypeError(
                f"@register_policy({model_type!r}) decorates {cls!r}, which is not a "
                "BasePolicy subclass"
            )
        taken = _POLICIES.get(model_type)
        same = taken is not None and (taken.__module__, taken.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if taken is not None and not same:
            raise ValueError(
                f"model_type {model_type!r} is already registered to "
                f"{taken.__module__}.{taken.__qualname__}; pick another name"
            )
        _POLICIES[model_type] = cls
        return cls

    return decorator


def available_policies() -> list[str]:
    """Names of the registered policies (and of the lazily imported built-ins), sorted."""
    return sorted(set(_POLICIES) | set(_BUILTIN))


def get_policy_class(model_type: str) -> type[BasePolicy]:
    """The class registered under ``model_type``.

    Args:
        model_type: A registered name.

    Returns:
        The policy class.

    Raises:
        ValueError: Nothing is registered under ``model_type``; lists what is.
    """
    if model_type not in _POLICIES and model_type in _BUILTIN:
        importlib.import_module(_BUILTIN[model_type])
    try:
        return _POLICIES[model_type]
    except KeyError:
        raise ValueError(
            f"unknown policy model_type {model_type!r}; registered: "
            f"{', '.join(available_policies()) or '(none)'}"
        ) from None


def build_policy(
    cfg: PolicyConfig, spec: EnvSpec, device: torch.device | str | None = None
) -> BasePolicy:
    """Builds the policy ``cfg.model_type`` for an env, in ``cfg.precision``.

    Args:
        cfg: The policy config.
        spec: The env's observation and action spec.
        device: Where to put the parameters (default: stay on the CPU).

    Returns:
        The policy, with parameters in ``cfg.torch_dtype``.

    Raises:
        ValueError: Unknown ``model_type``, or a spec the policy cannot serve (the
            message says which model_type or obs_mode to use instead).
    """
    cls = get_policy_class(cfg.model_type)
    if cfg.lora is not None and not cls.supports_lora:
        raise ValueError(
            f"actor.model.lora is set but model_type {cfg.model_type!r} does not support LoRA "
            "(only the VLAs, pi0 and openvla, do); remove actor.model.lora"
        )
    policy = cls(cfg, spec)
    return policy.to(device=device, dtype=cfg.torch_dtype)
