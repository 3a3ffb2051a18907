"""Property tests of rlinf.core.algorithms against brute-force definitions (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.core.algorithms import (
    agg_loss,
    compute_embodied_gae,
    compute_embodied_grpo,
    compute_loss_mask,
    group_normalize,
    ppo_policy_loss,
)

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards [T,B,C], dones [T+1,B,C], values [T+1,B,V]) with V in {1, C}."""
    t = draw(st.integers(1, 5))
    b = draw(st.integers(1, 3))
    c = draw(st.integers(1, 3))
    v = draw(st.sampled_from([1, c]))
    small = st.integers(-3, 3)
    rewards = torch.tensor(draw(st.lists(small, min_size=t * b * c, max_size=t * b * c)))
    values = torch.tensor(draw(st.lists(small, min_size=(t + 1) * b * v, max_size=(t + 1) * b * v)))
    flags = draw(st.lists(st.booleans(), min_size=t * b * c, max_size=t * b * c))
    dones = torch.zeros(t + 1, b, c, dtype=torch.bool)
    dones[1:] = torch.tensor(flags).view(t, b, c)
    return (
        rewards.view(t, b, c).float(),
        dones,
        values.view(t + 1, b, v).float(),
    )


def substeps(
    rewards: torch.Tensor, dones: torch.Tensor, values: torch.Tensor, b: int
) -> tuple[list[float], list[bool], list[float]]:
    """Env b's per-sub-step rewards, done flags and values (len S+1), by plain loops."""
    t, _, c = rewards.shape
    r, d, v = [], [], []
    for i in range(t):
        for j in range(c):
            r.append(float(rewards[i, b, j]))
            d.append(bool(dones[i + 1, b, j]))
            v.append(float(values[i, b, j if values.shape[2] == c else 0]))
    v.append(float(values[t, b, 0]))
    return r, d, v


@SETTINGS
@given(trajectories())
def test_gae_lambda_gamma_one_is_reward_to_go_minus_value(
    traj: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    rewards, dones, values = traj
    adv, ret = compute_embodied_gae(rewards, dones, values, gamma=1.0, gae_lambda=1.0)
    _, n_env, c = rewards.shape
    for b in range(n_env):
        r, d, v = substeps(rewards, dones, values, b)
        for s in range(len(r)):
            to_go = 0.0
            for k in range(s, len(r)):
                to_go += r[k]
                if d[k]:
                    break
            else:
                to_go += v[-1]  # no done until the end: bootstrap the final state's value
            assert abs(float(adv[s // c, b, s % c]) - (to_go - v[s])) < 1e-4
            assert abs(float(ret[s // c, b, s % c]) - to_go) < 1e-4


@SETTINGS
@given(trajectories(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_the_sum_of_discounted_deltas(
    traj: tuple[torch.Tensor, torch.Tensor, torch.Tensor], gamma: float, lam: float
) -> None:
    rewards, dones, values = traj
    adv, _ = compute_embodied_gae(
        rewards.double(), dones, values.double(), gamma=gamma, gae_lambda=lam
    )
    c = rewards.shape[2]
    for b in range(rewards.shape[1]):
        r, d, v = substeps(rewards, dones, values, b)
        delta = [r[s] + gamma * v[s + 1] * (not d[s]) - v[s] for s in range(len(r))]
        for s in range(len(r)):
            total, weight = 0.0, 1.0
            for k in range(s, len(r)):
                total += weight * delta[k]
                if d[k]:
                    break
                weight *= gamma * lam
            assert abs(float(adv[s // c, b, s % c]) - total) < 1e-6


@SETTINGS
@given(trajectories())
def test_loss_mask_is_valid_until_and_including_the_first_done(
    traj: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    rewards, dones, values = traj
    mask, mask_sum = compute_loss_mask(dones)
    c = rewards.shape[2]
    for b in range(rewards.shape[1]):
        _, d, _ = substeps(rewards, dones, values, b)
        expected = [not any(d[:s]) for s in range(len(d))]
        got = [bool(mask[s // c, b, s % c]) for s in range(len(d))]
        assert got == expected
        assert int(mask_sum[0, b, 0]) == sum(expected)
    chunk_mask, _ = compute_loss_mask(dones, "chunk_level")
    assert torch.equal(chunk_mask[..., 0], mask.any(dim=-1))


@st.composite
def grouped_scores(draw: st.DrawFn) -> tuple[int, list[int]]:
    g = draw(st.integers(2, 4))
    n = g * draw(st.integers(1, 3))
    return g, draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n))


@SETTINGS
@given(grouped_scores(), st.floats(0.5, 10.0), st.floats(-5.0, 5.0))
def test_group_normalize_is_centred_and_affine_invariant(
    case: tuple[int, list[int]], scale: float, shift: float
) -> None:
    g, raw = case
    scores = torch.tensor(raw, dtype=torch.float64)
    adv = group_normalize(scores, g, eps=0.0)
    for k in range(len(raw) // g):
        group = adv[k * g : (k + 1) * g]
        assert abs(float(group.sum())) < 1e-9
        if len(set(raw[k * g : (k + 1) * g])) == 1:
            assert torch.count_nonzero(group) == 0
        else:
            assert abs(float(group.std()) - 1.0) < 1e-9
    torch.testing.assert_close(group_normalize(scores * scale + shift, g, eps=0.0), adv)


@SETTINGS
@given(trajectories(), st.integers(1, 2))
def test_embodied_grpo_zero_outside_mask_and_group_centred(
    traj: tuple[torch.Tensor, torch.Tensor, torch.Tensor], groups: int
) -> None:
    rewards, dones, _ = traj
    rewards = rewards.repeat(1, 2 * groups, 1)[:, : 2 * groups]
    dones = dones.repeat(1, 2 * groups, 1)[:, : 2 * groups]
    dones[1:, 1::2] = True  # odd envs always stop after their first sub-step
    adv = compute_embodied_grpo(rewards, dones, group_size=2)
    mask, _ = compute_loss_mask(dones)
    assert torch.all(adv[~mask] == 0)
    per_env = adv[0, :, 0]  # the first sub-step is always valid
    assert torch.allclose(per_env.view(-1, 2).sum(dim=1), torch.zeros(groups), atol=1e-5)


@SETTINGS
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.floats(-3.0, 3.0),
    st.lists(st.booleans(), min_size=16, max_size=16),
)
def test_agg_loss_of_a_constant_is_the_constant(
    n: int, length: int, value: float, flags: list[bool]
) -> None:
    losses = torch.full((n, length), value, dtype=torch.float64)
    mask = torch.tensor(flags[: n * length]).view(n, length)
    if not mask.any():
        mask[0, 0] = True
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert abs(float(agg_loss(losses, mask, mode)) - value) < 1e-12


@SETTINGS
@given(st.lists(st.floats(-2.0, 2.0), min_size=1, max_size=12), st.floats(0.05, 0.5))
def test_ppo_at_ratio_one_is_minus_mean_advantage(advs: list[float], eps: float) -> None:
    a = torch.tensor(advs, dtype=torch.float64)
    logp = torch.randn(len(advs), dtype=torch.float64)
    loss, metrics = ppo_policy_loss(
        logprobs=logp, old_logprobs=logp.clone(), advantages=a, clip_ratio_low=eps
    )
    assert abs(float(loss) + float(a.mean())) < 1e-12
    assert metrics["actor/clip_fraction"] == 0.0 and metrics["actor/ratio"] == 1.0
