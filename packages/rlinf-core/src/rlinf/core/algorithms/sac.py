"""Soft actor-critic (SAC) losses and the Polyak target update, as pure tensor functions.

SAC (Haarnoja et al. 2018, with the automatic temperature of the 2019 version)
trains a stochastic policy ``pi`` and two Q networks on replayed transitions:

* critic: ``y = r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``
  with ``a' ~ pi(.|s')`` and target networks ``Q'``; the loss is
  ``MSE(Q1(s, a), y) + MSE(Q2(s, a), y)`` (:func:`sac_critic_loss`). Only a
  termination stops the bootstrap; a truncated episode (time limit) still
  bootstraps from its final observation.
* actor: ``alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)`` averaged, ``a~`` the
  reparameterised sample (:func:`sac_actor_loss`, registered as policy loss
  ``sac``).
* temperature: ``-log_alpha * (log pi + target_entropy)`` averaged, the log-probs
  detached (:func:`sac_alpha_loss`); :func:`default_target_entropy` is ``-action_dim``.
* targets: ``target <- tau * source + (1 - tau) * target`` (:func:`polyak_update`).

Cost: a few element-wise ops per batch; no host syncs except the metrics the
caller reads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlinf.core.algorithms._checks import check_in_unit_interval, check_same_shape, fail
from rlinf.core.algorithms.registry import register_policy_loss

__all__ = [
    "default_target_entropy",
    "polyak_update",
    "sac_actor_loss",
    "sac_alpha_loss",
    "sac_critic_loss",
    "sac_q_target",
]


def default_target_entropy(action_dim: int) -> float:
    """The usual SAC entropy target: ``-action_dim``.

    Args:
        action_dim: Dimensions of the continuous action.

    Returns:
        ``-float(action_dim)``.

    Raises:
        ValueError: ``action_dim`` < 1.
    """
    if action_dim < 1:
        fail("action_dim", action_dim, "must be >= 1", "pass the env's action dimension")
    return -float(action_dim)


def sac_q_target(
    rewards: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_logprobs: torch.Tensor,
    terminations: torch.Tensor,
    gamma: float,
    alpha: float | torch.Tensor,
) -> torch.Tensor:
    """The soft Bellman target ``r + gamma * (1 - term) * (min(Q1', Q2') - alpha * log pi')``.

    Args:
        rewards: ``[B]`` rewards of the transitions.
        next_q1: ``[B]`` first target critic on ``(s', a')``.
        next_q2: ``[B]`` second target critic on ``(s', a')``.
        next_logprobs: ``[B]`` ``log pi(a'|s')`` (summed over action dimensions).
        terminations: ``[B]`` bool or 0/1: the episode terminated at ``s'`` (no
            bootstrap). Truncations must be False here: they bootstrap.
        gamma: Discount in [0, 1].
        alpha: Entropy temperature (a float or a 0-d tensor; it is detached).

    Returns:
        ``[B]`` float32 targets, detached.

    Raises:
        ValueError: Shapes differ or ``gamma`` is outside [0, 1].
    """
    check_in_unit_interval("gamma", gamma)
    for name, value in (
        ("next_q1", next_q1),
        ("next_q2", next_q2),
        ("next_logprobs", next_logprobs),
        ("terminations", terminations),
    ):
        check_same_shape(name, value, "rewards", rewards)
    alpha_t = alpha.detach() if isinstance(alpha, torch.Tensor) else torch.tensor(alpha)
    min_q = torch.minimum(next_q1.float(), next_q2.float())
    soft_v = min_q - alpha_t.float() * next_logprobs.float()
    not_done = 1.0 - terminations.float()
    return (rewards.float() + gamma * not_done * soft_v).detach()


def sac_critic_loss(
    q1: torch.Tensor, q2: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Twin-Q loss ``MSE(q1, y) + MSE(q2, y)``.

    Args:
        q1: ``[B]`` first critic on the replayed ``(s, a)`` (requires grad).
        q2: ``[B]`` second critic.
        targets: ``[B]`` targets from :func:`sac_q_target` (not differentiated).

    Returns:
        ``(loss, metrics)``: metrics ``q_loss``, ``q1_mean``, ``q2_mean`` and
        ``target_mean`` as detached 0-d tensors.

    Raises:
        ValueError: Shapes differ.
    """
    check_same_shape("q1", q1, "targets", targets)
    check_same_shape("q2", q2, "targets", targets)
    y = targets.detach().float()
    loss1 = torch.nn.functional.mse_loss(q1.float(), y)
    loss2 = torch.nn.functional.mse_loss(q2.float(), y)
    loss = loss1 + loss2
    return loss, {
        "q_loss": loss.detach(),
        "q1_mean": q1.detach().float().mean(),
        "q2_mean": q2.detach().float().mean(),
        "target_mean": y.mean(),
    }


@register_policy_loss("sac", aliases=("embodied_sac",))
def sac_actor_loss(
    *,
    logprobs: torch.Tensor,
    q1: torch.Tensor,
    q2: torch.Tensor,
    alpha: float | torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAC policy loss ``mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~))``.

    Args:
        logprobs: ``[B]`` log-probs of reparameterised actions (requires grad).
        q1: ``[B]`` first critic on ``(s, a~)`` (gradient flows to the actions).
        q2: ``[B]`` second critic.
        alpha: Entropy temperature (detached).

    Returns:
        ``(loss, metrics)``: metrics ``actor_loss`` and ``entropy`` (``-mean log pi``).

    Raises:
        ValueError: Shapes differ.
    """
    check_same_shape("q1", q1, "logprobs", logprobs)
    check_same_shape("q2", q2, "logprobs", logprobs)
    alpha_t = alpha.detach() if isinstance(alpha, torch.Tensor) else torch.tensor(alpha)
    min_q = torch.minimum(q1.float(), q2.float())
    loss = (alpha_t.float() * logprobs.float() - min_q).mean()
    return loss, {"actor_loss": loss.detach(), "entropy": -logprobs.detach().float().mean()}


def sac_alpha_loss(
    log_alpha: torch.Tensor, logprobs: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """Temperature loss ``mean(-log_alpha * (log pi + target_entropy))``.

    Its gradient raises ``alpha`` while the policy's entropy is below
    ``target_entropy`` and lowers it above. Optimising ``log_alpha`` (rather
    than ``alpha``) keeps the temperature positive.

    Args:
        log_alpha: 0-d ``log alpha`` (requires grad).
        logprobs: ``[B]`` log-probs of fresh policy samples (detached here).
        target_entropy: The entropy target, usually ``-action_dim``.

    Returns:
        The scalar loss.

    Raises:
        ValueError: ``log_alpha`` is not a single value.
    """
    if log_alpha.numel() != 1:
        fail("log_alpha", tuple(log_alpha.shape), "must hold one value", "pass a 0-d tensor")
    return (-log_alpha.float() * (logprobs.detach().float() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(
    target: Iterable[torch.Tensor], source: Iterable[torch.Tensor], tau: float
) -> None:
    """In place: ``target <- tau * source + (1 - tau) * target`` for each pair.

    ``tau = 1`` copies exactly; ``tau = 0`` leaves ``target`` unchanged.

    Args:
        target: Target tensors (e.g. ``target_net.parameters()``), updated in place.
        source: Source tensors, same order and shapes.
        tau: Mixing weight in [0, 1].

    Raises:
        ValueError: ``tau`` outside [0, 1], or the two sequences differ in length or shapes.
    """
    check_in_unit_interval("tau", tau)
    targets, sources = list(target), list(source)
    if len(targets) != len(sources):
        fail(
            "target",
            f"{len(targets)} tensors",
            f"does not match source ({len(sources)} tensors)",
            "pass the parameters of two networks of the same architecture",
        )
    for i, (t, s) in enumerate(zip(targets, sources, strict=True)):
        check_same_shape(f"source[{i}]", s, f"target[{i}]", t)
    if not targets:
        return
    if tau == 1.0:
        torch._foreach_copy_(targets, sources)
        return
    torch._foreach_lerp_(targets, sources, tau)
