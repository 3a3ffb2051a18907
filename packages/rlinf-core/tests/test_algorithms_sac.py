"""SAC losses, temperature loss and Polyak update against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from rlinf.core.algorithms import (
    default_target_entropy,
    get_policy_loss,
    polyak_update,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_loss,
    sac_q_target,
)


def test_q_target_bootstraps_unless_terminated() -> None:
    rewards = torch.tensor([1.0, 2.0])
    next_q1 = torch.tensor([10.0, 4.0])
    next_q2 = torch.tensor([8.0, 6.0])
    next_logp = torch.tensor([-1.0, 2.0])
    term = torch.tensor([False, True])
    y = sac_q_target(rewards, next_q1, next_q2, next_logp, term, gamma=0.5, alpha=0.1)
    # row 0: 1 + 0.5 * (min(10, 8) - 0.1 * -1) = 1 + 0.5 * 8.1 = 5.05; row 1: terminated -> 2
    assert torch.allclose(y, torch.tensor([5.05, 2.0]))
    assert not y.requires_grad


def test_critic_loss_is_the_sum_of_two_mses() -> None:
    q1 = torch.tensor([1.0, 3.0], requires_grad=True)
    q2 = torch.tensor([2.0, 2.0], requires_grad=True)
    y = torch.tensor([2.0, 2.0])
    loss, metrics = sac_critic_loss(q1, q2, y)
    # MSE(q1) = (1 + 1) / 2 = 1; MSE(q2) = 0
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert q1.grad is not None and torch.allclose(q1.grad, torch.tensor([-1.0, 1.0]))
    assert float(metrics["q1_mean"]) == pytest.approx(2.0)
    assert float(metrics["target_mean"]) == pytest.approx(2.0)


def test_actor_loss_uses_min_q_and_alpha() -> None:
    logp = torch.tensor([-1.0, 0.5], requires_grad=True)
    q1 = torch.tensor([3.0, 1.0])
    q2 = torch.tensor([2.0, 4.0])
    loss, metrics = sac_actor_loss(logprobs=logp, q1=q1, q2=q2, alpha=0.2)
    # mean(0.2 * -1 - 2, 0.2 * 0.5 - 1) = mean(-2.2, -0.9) = -1.55
    assert loss.item() == pytest.approx(-1.55)
    assert float(metrics["entropy"]) == pytest.approx(0.25)
    loss.backward()
    assert logp.grad is not None and torch.allclose(logp.grad, torch.tensor([0.1, 0.1]))


def test_actor_loss_is_registered_as_policy_loss_sac() -> None:
    assert get_policy_loss("sac") is sac_actor_loss
    assert get_policy_loss("embodied_sac") is sac_actor_loss


def test_alpha_loss_gradient_raises_alpha_when_entropy_is_low() -> None:
    log_alpha = torch.tensor(0.0, requires_grad=True)
    # entropy -mean(logp) = 0.5 is below the target 1.0: loss = -log_alpha * (-0.5 + 1.0),
    # d loss / d log_alpha = -0.5, so a descent step raises alpha.
    logp = torch.tensor([-0.5, -0.5])
    loss = sac_alpha_loss(log_alpha, logp, target_entropy=1.0)
    assert loss.item() == pytest.approx(0.0)
    loss.backward()
    assert log_alpha.grad is not None
    assert log_alpha.grad.item() == pytest.approx(-0.5)  # gradient descent raises log_alpha


def test_default_target_entropy() -> None:
    assert default_target_entropy(6) == -6.0
    with pytest.raises(ValueError, match="action_dim"):
        default_target_entropy(0)


def test_polyak_exact() -> None:
    target = [torch.tensor([0.0, 4.0]), torch.tensor([[1.0]])]
    source = [torch.tensor([2.0, 0.0]), torch.tensor([[3.0]])]
    polyak_update(target, source, tau=0.25)
    assert torch.equal(target[0], torch.tensor([0.5, 3.0]))
    assert torch.equal(target[1], torch.tensor([[1.5]]))
    polyak_update(target, source, tau=1.0)
    assert torch.equal(target[0], source[0]) and torch.equal(target[1], source[1])
    before = [t.clone() for t in target]
    polyak_update(target, [s + 1 for s in source], tau=0.0)
    assert all(torch.equal(a, b) for a, b in zip(before, target, strict=True))


def test_polyak_on_modules_and_errors() -> None:
    torch.manual_seed(0)
    src, tgt = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    pairs = zip(src.parameters(), tgt.parameters(), strict=True)
    expected = [0.005 * s.detach() + 0.995 * t.detach() for s, t in pairs]
    polyak_update(tgt.parameters(), src.parameters(), tau=0.005)
    for e, t in zip(expected, tgt.parameters(), strict=True):
        assert torch.allclose(e, t)
        assert t.grad is None
    with pytest.raises(ValueError, match="tau"):
        polyak_update(tgt.parameters(), src.parameters(), tau=1.5)
    with pytest.raises(ValueError, match="target"):
        polyak_update([torch.zeros(1)], [], tau=0.5)


def test_shape_mismatch_names_the_argument() -> None:
    with pytest.raises(ValueError, match="next_q1"):
        sac_q_target(
            torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2), torch.zeros(2), 0.9, 0.1
        )
