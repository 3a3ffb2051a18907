"""SACPolicy: bounded actions in every mode, tanh-corrected log-probs, twin critics, spec checks."""

from __future__ import annotations

import pytest
import torch

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models import PolicyConfig, SACPolicy, build_policy

SPEC = EnvSpec(
    state_dim=3, image_shape=None, action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
)


def _policy() -> SACPolicy:
    torch.manual_seed(0)
    policy = build_policy(PolicyConfig(model_type="sac_mlp", hidden_dims=[16, 16]), SPEC)
    assert isinstance(policy, SACPolicy)
    return policy


@pytest.mark.parametrize("mode", ["train", "eval", "random"])
def test_actions_stay_inside_the_env_bounds(mode: str) -> None:
    policy = _policy()
    states = torch.randn(256, 3) * 10
    gen = torch.Generator().manual_seed(1)
    out = policy.predict_action_batch({"states": states}, mode, generator=gen)
    actions = out.actions
    assert actions.shape == (256, 1, 2)
    assert bool((actions[..., 0] >= -2).all() and (actions[..., 0] <= 2).all())
    assert bool((actions[..., 1] >= 0).all() and (actions[..., 1] <= 1).all())
    assert out.prev_values is not None and out.prev_values.shape == (256, 1)
    assert torch.equal(out.forward_inputs["states"], states)
    if mode == "random":  # uniform: spread over the whole range
        assert float(actions[..., 0].min()) < -1.5 and float(actions[..., 0].max()) > 1.5
    if mode == "eval":  # deterministic
        again = policy.predict_action_batch({"states": states}, mode)
        assert torch.equal(again.actions, actions)


def test_log_prob_matches_the_change_of_variables() -> None:
    policy = _policy()
    states = torch.randn(5, 3)
    gen = torch.Generator().manual_seed(2)
    actions, logp = policy.sample(states, gen)
    mean, log_std = policy._gaussian(states)
    gen = torch.Generator().manual_seed(2)
    u = mean + log_std.exp() * torch.randn(mean.shape, generator=gen)
    scale = torch.tensor([2.0, 0.5])
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log(
        scale * (1 - torch.tanh(u) ** 2) + 1e-6
    )
    assert torch.allclose(logp, expected.sum(-1), atol=1e-5)
    assert torch.allclose(actions, torch.tanh(u) * scale + torch.tensor([0.0, 0.5]), atol=1e-6)
    logp.sum().backward()  # reparameterised: gradients reach the actor
    assert policy.mean_head.weight.grad is not None


def test_twin_critics_differ_and_parameter_groups_partition() -> None:
    policy = _policy()
    q1, q2 = policy.q_values(torch.randn(4, 3), torch.zeros(4, 2))
    assert q1.shape == (4,) and not torch.allclose(q1, q2)
    ids = {id(p) for p in policy.actor_parameters()} | {id(p) for p in policy.critic_parameters()}
    assert ids == {id(p) for p in policy.parameters()}
    assert torch.equal(policy.get_value({"states": torch.zeros(3, 3)}), torch.zeros(3, 1))


def test_spec_errors_name_the_fix() -> None:
    cfg = PolicyConfig(model_type="sac_mlp")
    with pytest.raises(ValueError, match="continuous"):
        build_policy(cfg, EnvSpec(state_dim=4, image_shape=None, action_dim=1, num_actions=2))
    with pytest.raises(ValueError, match="action_low"):
        build_policy(cfg, EnvSpec(state_dim=4, image_shape=None, action_dim=1))
    with pytest.raises(ValueError, match="num_action_chunks"):
        build_policy(PolicyConfig(model_type="sac_mlp", num_action_chunks=2), SPEC)
    with pytest.raises(ValueError, match="mode"):
        _policy().predict_action_batch({"states": torch.zeros(1, 3)}, "greedy")
