"""Flow VLA numerics: ODE = Euler, SDE closed forms, Gaussian densities, rollout-vs-actor parity
for the sde and noise samplers, eval determinism and the flow-matching loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.distributions import Normal

from rlinf.embodied.models import PolicyConfig, build_policy
from rlinf.embodied.models.config import FlowSampler, FlowStart
from rlinf.embodied.models.vla.flow_sampling import (
    euler_mean,
    gaussian_entropy,
    gaussian_log_density,
    sde_mean_std,
    sde_sigma,
    time_grid,
)
from rlinf.embodied.models.vla.modeling_flow import sample_chain
from rlinf.embodied.models.vla.policy import FlowVLAPolicy
from rlinf.embodied.models.vla.tiny import make_tiny_vla, random_observations, tiny_env_spec

STATE_DIM, ACTION_DIM, CHUNKS, HORIZON, STEPS, N = 3, 2, 3, 5, 4, 6
LOW, HIGH = [-0.5, 0.0], [0.5, 2.0]


pytestmark = pytest.mark.usefixtures("vla_offline")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_vla(
        "flow",
        tmp_path_factory.mktemp("flow_vla"),
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        num_action_chunks=CHUNKS,
        action_horizon=HORIZON,
        num_steps=STEPS,
        action_low=LOW,
        action_high=HIGH,
        seed=2,
    )


def make_policy(
    model_dir: Path,
    sampler: FlowSampler = "sde",
    noise_level: float = 0.5,
    start: FlowStart = "zero",
) -> FlowVLAPolicy:
    cfg = PolicyConfig(
        model_type="flow_vla",
        model_path=model_dir,
        num_action_chunks=CHUNKS,
        flow_sampler=sampler,
        noise_level=noise_level,
        flow_start=start,
    )
    policy = build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))
    assert isinstance(policy, FlowVLAPolicy)
    return policy


def observations(n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    spec = tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM)
    return random_observations(spec, n, torch.Generator().manual_seed(seed))


def test_ode_equals_a_hand_written_euler_integration(model_dir: Path) -> None:
    policy = make_policy(model_dir, "ode", start="sampled")
    obs = observations()
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        prefix = policy._encode(policy._read_obs(obs, needs_states=True))
        x = torch.randn(N, HORIZON, ACTION_DIM, generator=torch.Generator().manual_seed(5))
        for i in range(STEPS):
            t = torch.full((N,), 1.0 - i / STEPS)
            velocity, _ = policy.model.expert_forward(prefix, x, t)
            x = x - velocity / STEPS
    chains = out.forward_inputs["chains"]
    assert chains.shape == (N, STEPS + 1, HORIZON, ACTION_DIM)
    assert torch.allclose(chains[:, -1], x, atol=1e-5)
    low, high = torch.tensor(LOW), torch.tensor(HIGH)
    expected = low + (x[:, :CHUNKS] + 1) / 2 * (high - low)
    assert torch.allclose(out.actions, expected, atol=1e-5)
    assert out.actions.shape == (N, CHUNKS, ACTION_DIM)
    assert torch.equal(out.forward_inputs["denoise_inds"], torch.zeros(N, STEPS, dtype=torch.long))
    assert out.prev_logprobs is not None
    assert torch.equal(out.prev_logprobs, torch.zeros(N, CHUNKS * ACTION_DIM))


@pytest.mark.parametrize(("t", "dt"), [(1.0, 0.25), (0.75, 0.25), (0.5, 0.1), (0.2, 0.2)])
def test_sde_transition_matches_the_closed_form(t: float, dt: float) -> None:
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 4, 2, generator=gen), torch.randn(3, 4, 2, generator=gen)
    level = 0.7
    tt, tn = torch.full((3,), t), torch.full((3,), t - dt)
    mean, std = sde_mean_std(x, v, tt, tn, level)
    s = t - dt if t >= 1.0 else t  # t = 1 uses the next grid point
    sigma = level * math.sqrt(s / (1 - s))
    x0, x1 = x - t * v, x + (1 - t) * v
    expected_mean = x0 * (1 - (t - dt)) + x1 * ((t - dt) - sigma**2 * dt / (2 * t))
    assert torch.allclose(mean, expected_mean, atol=1e-6)
    assert torch.allclose(std.expand_as(mean), torch.full_like(mean, math.sqrt(dt) * sigma))
    assert math.isfinite(sigma) and sigma > 0
    assert torch.allclose(sde_sigma(tt, tn, level), torch.full((3,), sigma))
    # sigma -> 0 recovers the Euler step x - dt v
    tiny_mean, tiny_std = sde_mean_std(x, v, tt, tn, 1e-6)
    assert torch.allclose(tiny_mean, x - dt * v, atol=1e-5)
    assert torch.allclose(euler_mean(x, v, tt, tn), x - dt * v, atol=1e-6)
    assert float(tiny_std.max()) < 1e-5


def test_time_grid_goes_from_noise_to_data() -> None:
    assert torch.allclose(time_grid(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_gaussian_log_density_and_entropy_match_torch_normal() -> None:
    gen = torch.Generator().manual_seed(1)
    mean = torch.randn(4, 3, 2, generator=gen)
    std = torch.rand(4, 3, 2, generator=gen) + 0.05
    x = mean + std * torch.randn(4, 3, 2, generator=gen) * 2
    reference = Normal(mean, std)
    assert torch.allclose(gaussian_log_density(x, mean, std), reference.log_prob(x), atol=1e-5)
    assert torch.allclose(gaussian_entropy(std), reference.entropy(), atol=1e-6)


@pytest.mark.parametrize("start", ["zero", "sampled"])
@pytest.mark.parametrize("sampler", ["sde", "noise"])
def test_actor_logprobs_equal_rollout_logprobs(
    model_dir: Path, sampler: FlowSampler, start: FlowStart
) -> None:
    policy = make_policy(model_dir, sampler, start=start)
    out = policy.predict_action_batch(
        observations(8), "train", generator=torch.Generator().manual_seed(11)
    )
    inds = out.forward_inputs["denoise_inds"]
    assert inds.shape == (8, STEPS)
    if sampler == "sde":
        assert bool((inds.sum(1) == 1).all()) and bool((inds == inds[:1]).all())
    else:
        assert bool((inds == 1).all())
    assert out.prev_logprobs is not None and out.prev_logprobs.shape == (8, CHUNKS * ACTION_DIM)
    assert float(out.prev_logprobs.abs().sum()) > 0
    stats = policy(out.forward_inputs, compute_entropy=True, compute_values=True)
    assert stats["logprobs"].requires_grad
    assert float((stats["logprobs"].detach() - out.prev_logprobs).abs().max()) <= 1e-5
    assert stats["entropy"].shape == (8, CHUNKS * ACTION_DIM)
    assert out.prev_values is not None
    assert torch.allclose(stats["values"].detach(), out.prev_values, atol=1e-6)
    # rows from different calls (different stochastic steps) re-batched together
    again = policy.predict_action_batch(
        observations(8, seed=1), "train", generator=torch.Generator().manual_seed(12)
    )
    assert again.prev_logprobs is not None
    mixed = {
        key: torch.cat([out.forward_inputs[key][:3], again.forward_inputs[key][4:]])
        for key in out.forward_inputs
    }
    expected = torch.cat([out.prev_logprobs[:3], again.prev_logprobs[4:]])
    got = policy.default_forward(mixed)["logprobs"].detach()
    assert float((got - expected).abs().max()) <= 1e-5
    # the check can fail: moving the scored sample changes the log-density
    moved = dict(out.forward_inputs)
    jitter = torch.randn(moved["chains"].shape, generator=torch.Generator().manual_seed(0))
    moved["chains"] = moved["chains"] + 0.05 * jitter
    shifted = policy.default_forward(moved)["logprobs"].detach()
    assert float((shifted - out.prev_logprobs).abs().max()) > 1e-3


def test_sde_step_is_a_gaussian_around_the_closed_form(model_dir: Path) -> None:
    policy = make_policy(model_dir, "sde", noise_level=0.5)
    obs = observations(4)
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(3))
    chains, inds = out.forward_inputs["chains"], out.forward_inputs["denoise_inds"]
    k = int(inds[0].argmax())
    grid = time_grid(STEPS)
    with torch.no_grad():
        prefix = policy._encode(policy._read_obs(obs, needs_states=True))
        t, tn = grid[k].expand(4), grid[k + 1].expand(4)
        v, _ = policy.model.expert_forward(prefix, chains[:, k], t)
    mean, std = sde_mean_std(chains[:, k], v, t, tn, 0.5)
    z = (chains[:, k + 1] - mean) / std
    density = Normal(mean, std.expand_as(mean)).log_prob(chains[:, k + 1])
    assert out.prev_logprobs is not None
    executed = density[:, :CHUNKS, :ACTION_DIM].reshape(4, -1)
    assert torch.allclose(out.prev_logprobs, executed, atol=1e-5)
    assert float(z.abs().max()) < 6 and float(z.std()) > 0.3
    for i in range(STEPS):  # every other step is an exact Euler step
        if i != k:
            with torch.no_grad():
                vi, _ = policy.model.expert_forward(prefix, chains[:, i], grid[i].expand(4))
            assert torch.allclose(chains[:, i + 1], chains[:, i] - vi / STEPS, atol=1e-5)


def test_noise_sampler_std_stays_in_the_documented_range(model_dir: Path) -> None:
    policy = make_policy(model_dir, "noise")
    out = policy.predict_action_batch(
        observations(), "train", generator=torch.Generator().manual_seed(2)
    )
    entropy = policy.default_forward(
        out.forward_inputs, compute_logprobs=False, compute_entropy=True
    )["entropy"]
    std = torch.exp(entropy - 0.5 - 0.5 * math.log(2 * math.pi))
    assert bool((std >= 0.08 - 1e-6).all()) and bool((std <= 0.16 + 1e-6).all())


def test_eval_is_deterministic(model_dir: Path) -> None:
    policy = make_policy(model_dir, "sde")
    obs = observations()
    first = policy.predict_action_batch(obs, "eval", generator=torch.Generator().manual_seed(0))
    second = policy.predict_action_batch(obs, "eval", generator=torch.Generator().manual_seed(1))
    third = policy.predict_action_batch(obs, "eval")
    assert torch.equal(first.actions, second.actions) and torch.equal(first.actions, third.actions)
    assert bool((first.forward_inputs["denoise_inds"] == 0).all())
    assert first.prev_logprobs is not None and not bool(first.prev_logprobs.any())
    train = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert not torch.equal(train.actions, first.actions)
    with torch.no_grad():
        prefix = policy._encode(policy._read_obs(obs, needs_states=True))
        start = sample_chain(
            policy.model, prefix, sampler="ode", noise_level=0.5, start_at_mean=True
        )
    assert torch.equal(start.chains[:, 0], torch.zeros(N, HORIZON, ACTION_DIM))


def test_flow_start_picks_the_chain_start_in_train_and_eval(model_dir: Path) -> None:
    obs, zeros = observations(), torch.zeros(N, HORIZON, ACTION_DIM)
    for mode in ("train", "eval"):
        zero = make_policy(model_dir, start="zero").predict_action_batch(
            obs, mode, generator=torch.Generator().manual_seed(0)
        )
        assert torch.equal(zero.forward_inputs["chains"][:, 0], zeros), mode
        sampled = make_policy(model_dir, start="sampled")
        draws = [
            sampled.predict_action_batch(obs, mode, generator=torch.Generator().manual_seed(seed))
            for seed in (0, 0, 1)
        ]
        starts = [draw.forward_inputs["chains"][:, 0] for draw in draws]
        assert float(starts[0].std()) > 0.5, mode  # x_1 ~ N(0, I)
        assert torch.equal(starts[0], starts[1]) and not torch.equal(starts[0], starts[2]), mode
        assert torch.equal(draws[0].actions, draws[1].actions), mode  # seeded: reproducible


def test_flow_matching_loss_decreases_on_a_fixed_batch(model_dir: Path) -> None:
    policy = make_policy(model_dir, "sde")
    obs = observations(16, seed=4)
    gen = torch.Generator().manual_seed(0)
    targets = torch.tensor(LOW) + torch.rand(16, HORIZON, ACTION_DIM, generator=gen) * (
        torch.tensor(HIGH) - torch.tensor(LOW)
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = policy.flow_matching_loss(obs, targets, generator=torch.Generator().manual_seed(1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert max(losses[-3:]) < 0.75 * losses[0], losses
    with pytest.raises(ValueError, match=r"\[n, H=5, A_env=2\]"):
        policy.flow_matching_loss(obs, targets[:, :CHUNKS])
