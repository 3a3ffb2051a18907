"""Name-to-function registries for advantage estimators and policy losses.

``algorithm.adv_type`` is resolved with :func:`get_advantage` and
``algorithm.loss_type`` with :func:`get_policy_loss`. Unknown names raise a
``ValueError`` that names the bad value and lists every registered name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from rlinf.core.algorithms.inputs import AdvantageInputs, AdvantageResult

__all__ = [
    "AdvantageFn",
    "PolicyLossFn",
    "Registry",
    "available_advantages",
    "available_policy_losses",
    "get_advantage",
    "get_policy_loss",
    "register_advantage",
    "register_policy_loss",
]

AdvantageFn = Callable[[AdvantageInputs], AdvantageResult]
"""An advantage estimator: takes embodied or reasoning inputs, returns (advantages, returns)."""

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]
"""A policy loss: called with keyword arguments, returns (scalar loss, metrics).

Metrics are detached 0-d tensors (preferred: no host sync) or floats."""

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """A name-to-function table with aliases and helpful lookup errors.

    Args:
        kind: What the entries are, for error messages ("advantage estimator").
        config_key: The config key whose value is looked up ("algorithm.adv_type").
    """

    def __init__(self, kind: str, config_key: str) -> None:
        self._kind = kind
        self._config_key = config_key
        self._entries: dict[str, F] = {}

    def register(self, name: str, *, aliases: Sequence[str] = ()) -> Callable[[F], F]:
        """Decorator that registers a function under ``name`` and each alias.

        Args:
            name: The canonical name.
            aliases: Further names that resolve to the same function.

        Returns:
            A decorator returning the function unchanged.

        Raises:
            ValueError: If a name is empty or already taken by another function.
        """

        def decorator(fn: F) -> F:
            for key in (name, *aliases):
                if not isinstance(key, str) or not key:
                    raise ValueError(
                        f"{self._kind} name {key!r} is invalid. Fix: use a non-empty string"
                    )
                current = self._entries.get(key)
                if current is not None and current is not fn:
                    raise ValueError(
                        f"{self._kind} {key!r} is already registered "
                        f"({current.__module__}.{current.__qualname__}). "
                        "Fix: choose another name"
                    )
            for key in (name, *aliases):
                self._entries[key] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """Return the function registered under ``name``.

        Raises:
            ValueError: If no function is registered under ``name``.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"{self._config_key}={name!r} is not a registered {self._kind}. "
                f"Fix: use one of {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """All registered names (canonical names and aliases), sorted."""
        return tuple(sorted(self._entries))


_ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.adv_type")
_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "algorithm.loss_type")


def register_advantage(
    name: str, *, aliases: Sequence[str] = ()
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator under ``name`` (and optional aliases).

    The function takes an :class:`EmbodiedAdvantageInputs` or
    :class:`ReasoningAdvantageInputs` and returns an :class:`AdvantageResult`. It
    should raise ``ValueError`` for an input family it does not support.

    Args:
        name: The value of ``algorithm.adv_type`` that selects it.
        aliases: Further accepted names.

    Returns:
        A decorator that returns the function unchanged.
    """
    return _ADVANTAGES.register(name, aliases=aliases)


def get_advantage(name: str) -> AdvantageFn:
    """Look up the advantage estimator registered as ``name``.

    Args:
        name: Typically ``cfg.algorithm.adv_type``.

    Returns:
        The estimator.

    Raises:
        ValueError: If ``name`` is unknown; the message lists the registered names.
    """
    return _ADVANTAGES.get(name)


def available_advantages() -> tuple[str, ...]:
    """Every name :func:`get_advantage` accepts, sorted."""
    return _ADVANTAGES.names()


def register_policy_loss(
    name: str, *, aliases: Sequence[str] = ()
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss under ``name`` (and optional aliases).

    The function is called with keyword arguments (``logprobs``, ``old_logprobs``,
    ``advantages``, ``loss_mask``, ``clip_ratio_low``, ``clip_ratio_high``,
    ``dual_clip_c``, ``loss_agg_mode`` ...) and returns ``(loss, metrics)``.

    Args:
        name: The value of ``algorithm.loss_type`` that selects it.
        aliases: Further accepted names.

    Returns:
        A decorator that returns the function unchanged.
    """
    return _POLICY_LOSSES.register(name, aliases=aliases)


def get_policy_loss(name: str) -> PolicyLossFn:
    """Look up the policy loss registered as ``name``.

    Args:
        name: Typically ``cfg.algorithm.loss_type``.

    Returns:
        The loss function.

    Raises:
        ValueError: If ``name`` is unknown; the message lists the registered names.
    """
    return _POLICY_LOSSES.get(name)


def available_policy_losses() -> tuple[str, ...]:
    """Every name :func:`get_policy_loss` accepts, sorted."""
    return _POLICY_LOSSES.names()
