"""pi0's denoising math for RL: time grid, Euler/SDE transitions, Gaussian log-densities.

Conventions (openpi's): ``t = 1`` is noise, ``t = 0`` is data,
``x_t = t * eps + (1 - t) * a``, the network predicts the velocity ``v ~ eps - a``,
and sampling takes ``N`` Euler steps on the grid ``t_i = 1 - i / N`` (``i = 0..N``).

From a velocity at ``(x, t)`` the predicted endpoints are ``x0 = x - t v`` (data)
and ``x1 = x + (1 - t) v`` (noise). One step to ``t' = t - dt`` is a Gaussian
``N(mean, std^2)`` per element:

* ``ode``: ``mean = x0 (1 - t') + x1 t'`` (= ``x - dt v``, the Euler step), ``std = 0``;
* ``sde``: ``sigma = noise_level * sqrt(s / (1 - s))`` with ``s = t`` except at
  ``t = 1``, where ``s`` is the next grid point ``t'`` (so sigma is finite and > 0),
  ``mean = x0 (1 - t') + x1 (t' - sigma^2 dt / (2 t))``, ``std = sqrt(dt) * sigma``;
* ``noise``: the ``ode`` mean with a learned ``std`` (pi0's noise-std head).

Pure functions of tensors, so rollout sampling and actor re-scoring share them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "euler_mean",
    "gaussian_entropy",
    "gaussian_log_density",
    "sde_mean_std",
    "sde_sigma",
    "time_grid",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def time_grid(num_steps: int, device: torch.device | None = None) -> Tensor:
    """``[N + 1]`` float32 times ``1, 1 - 1/N, ..., 0``."""
    return 1.0 - torch.arange(num_steps + 1, device=device, dtype=torch.float32) / num_steps


def _endpoints(x: Tensor, velocity: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    t = t.reshape(-1, *([1] * (x.ndim - 1)))
    return x - t * velocity, x + (1.0 - t) * velocity


def euler_mean(x: Tensor, velocity: Tensor, t: Tensor, t_next: Tensor) -> Tensor:
    """Mean of the deterministic step from ``t`` to ``t_next`` (per-row ``[B]`` times).

    Args:
        x: ``[B, ...]`` current sample.
        velocity: ``[B, ...]`` predicted velocity at ``(x, t)``.
        t: ``[B]`` current times.
        t_next: ``[B]`` next times.

    Returns:
        ``x0 (1 - t_next) + x1 t_next``, which equals ``x - (t - t_next) v``.
    """
    x0, x1 = _endpoints(x, velocity, t)
    tn = t_next.reshape(-1, *([1] * (x.ndim - 1)))
    return x0 * (1.0 - tn) + x1 * tn


def sde_sigma(t: Tensor, t_next: Tensor, noise_level: float) -> Tensor:
    """``noise_level * sqrt(s / (1 - s))``, ``s = t`` except ``s = t_next`` where ``t >= 1``.

    Args:
        t: ``[B]`` current times in ``(0, 1]``.
        t_next: ``[B]`` next times (grid points below ``t``).
        noise_level: The ``sde`` noise scale.

    Returns:
        ``[B]`` float32 sigmas (> 0 for every ``t`` of a grid with ``N >= 2``).
    """
    s = torch.where(t >= 1.0, t_next, t)
    return noise_level * torch.sqrt(s / (1.0 - s))


def sde_mean_std(
    x: Tensor, velocity: Tensor, t: Tensor, t_next: Tensor, noise_level: float
) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of the stochastic step from ``t`` to ``t_next``.

    Args:
        x: ``[B, ...]`` current sample.
        velocity: ``[B, ...]`` predicted velocity.
        t: ``[B]`` current times.
        t_next: ``[B]`` next times.
        noise_level: The ``sde`` noise scale.

    Returns:
        ``mean`` shaped like ``x`` and ``std`` broadcastable to it (``[B, 1, ...]``).
    """
    x0, x1 = _endpoints(x, velocity, t)
    shape = (-1, *([1] * (x.ndim - 1)))
    dt = (t - t_next).reshape(shape)
    sigma = sde_sigma(t, t_next, noise_level).reshape(shape)
    tc, tn = t.reshape(shape), t_next.reshape(shape)
    mean = x0 * (1.0 - tn) + x1 * (tn - sigma**2 * dt / (2.0 * tc))
    return mean, torch.sqrt(dt) * sigma


def gaussian_log_density(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-element ``log N(x; mean, std^2)`` in float32 (``std`` must be > 0)."""
    std = std.float().expand_as(mean)
    z = (x.float() - mean.float()) / std
    return -0.5 * z**2 - torch.log(std) - _HALF_LOG_2PI


def gaussian_entropy(std: Tensor) -> Tensor:
    """Per-element entropy ``0.5 log(2 pi e std^2)`` in float32."""
    return 0.5 + _HALF_LOG_2PI + torch.log(std.float())
