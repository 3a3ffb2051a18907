"""Embodied RL math against hand-computed values: loss mask, GAE and GRPO (T+1 convention).

Conventions: rewards [T, B, C]; dones [T + 1, B, C] with row 0 the bootstrap row;
dones[t + 1, b, c] marks that sub-step c of chunk t ended an episode; values [T + 1, B, V].
"""

from __future__ import annotations

import math

import pytest
import torch

from rlinf.core.algorithms import (
    EmbodiedAdvantageInputs,
    compute_embodied_gae,
    compute_embodied_grpo,
    compute_loss_mask,
    get_advantage,
)


def t3(rows: list[list[list[float]]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list[object], atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def dones_of(t: int, b: int, c: int, *hits: tuple[int, int, int]) -> torch.Tensor:
    """[T+1, B, C] all-false dones with the given (row, env, sub-step) set."""
    d = torch.zeros(t + 1, b, c, dtype=torch.bool)
    for hit in hits:
        d[hit] = True
    return d


# ----------------------------------------------------------------------------- loss mask


def test_loss_mask_done_mid_epoch() -> None:
    # T=3, B=2, C=2. Env 0: sub-step 0 of chunk 1 ends the episode (dones[2, 0, 0]).
    # Flattened sub-steps s = 2t + c: s0, s1, s2 (the done one, still valid), then invalid.
    # Env 1 never finishes: all 6 sub-steps valid.
    mask, mask_sum = compute_loss_mask(dones_of(3, 2, 2, (2, 0, 0)))
    assert mask.dtype == torch.bool and mask.shape == (3, 2, 2)
    close(mask[:, 0].float(), [[1, 1], [1, 0], [0, 0]])
    close(mask[:, 1].float(), [[1, 1], [1, 1], [1, 1]])
    assert mask_sum.dtype == torch.int64 and mask_sum.shape == (3, 2, 2)
    assert set(mask_sum[:, 0].flatten().tolist()) == {3}
    assert set(mask_sum[:, 1].flatten().tolist()) == {6}


def test_loss_mask_chunk_level_is_any_over_the_chunk() -> None:
    mask, mask_sum = compute_loss_mask(dones_of(3, 2, 2, (2, 0, 0)), "chunk_level")
    assert mask.shape == (3, 2, 1)
    close(mask[:, :, 0].float(), [[1, 1], [1, 1], [0, 1]])
    # mask_sum still counts valid sub-steps (3 and 6), broadcast to [T, B, 1]
    assert mask_sum[:, :, 0].tolist() == [[3, 6]] * 3


def test_loss_mask_edges_first_last_and_all_done() -> None:
    # T=2, C=2, B=3. Env 0: done at the very first sub-step -> only it is valid.
    # Env 1: done at the very last sub-step -> everything valid.
    # Env 2: every sub-step done -> only the first is valid.
    d = dones_of(2, 3, 2, (1, 0, 0), (2, 1, 1))
    d[1:, 2] = True
    d[0] = True  # row 0 is the bootstrap row and is never read
    mask, mask_sum = compute_loss_mask(d)
    close(mask[:, 0].float(), [[1, 0], [0, 0]])
    close(mask[:, 1].float(), [[1, 1], [1, 1]])
    close(mask[:, 2].float(), [[1, 0], [0, 0]])
    assert mask_sum[0, :, 0].tolist() == [1, 4, 1]


def test_loss_mask_rejects_bad_dones() -> None:
    with pytest.raises(ValueError, match=r"dones.shape=\(4, 2\)"):
        compute_loss_mask(torch.zeros(4, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="T >= 1"):
        compute_loss_mask(torch.zeros(1, 2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="reward_type='step_level'"):
        compute_loss_mask(torch.zeros(3, 2, 1, dtype=torch.bool), "step_level")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- GAE


def test_gae_three_steps_done_in_the_middle() -> None:
    # T=3, B=1, C=1, gamma=0.5, lambda=0.5. r = [1, 2, 3], V = [0.5, 1.0, 1.5, 2.0].
    # The transition at t=1 ends an episode: dones[2] = True.
    # t=2: delta = 3 + 0.5*2.0 - 1.5 = 2.5                         A2 = 2.5
    # t=1: done -> delta = 2 - 1.0 = 1.0, no recursion              A1 = 1.0
    #      (V[2] = 1.5 and A2 belong to the next episode: no leak)
    # t=0: delta = 1 + 0.5*1.0 - 0.5 = 1.0; A0 = 1.0 + 0.25*1.0   A0 = 1.25
    # returns = A + V = [1.75, 2.0, 4.0]
    adv, ret = compute_embodied_gae(
        t3([[[1.0]], [[2.0]], [[3.0]]]),
        dones_of(3, 1, 1, (2, 0, 0)),
        t3([[[0.5]], [[1.0]], [[1.5]], [[2.0]]]),
        gamma=0.5,
        gae_lambda=0.5,
    )
    close(adv[:, 0, 0], [1.25, 1.0, 2.5])
    close(ret[:, 0, 0], [1.75, 2.0, 4.0])


def test_gae_done_at_first_and_last_step_and_all_done() -> None:
    # B=3, T=3, C=1, gamma=0.9, lambda=0.8, r = 1 everywhere, V = [0, 0, 0, 100] for all.
    # Env 0: done at t=0 -> A0 = 1 - 0; t=1: delta = 1 + 0.9*0 - 0 = 1, then t=2 bootstraps
    #        the final value: A2 = 1 + 0.9*100 = 91; A1 = 1 + 0.72*91 = 66.52
    # Env 1: done at t=2 (last) -> the final value 100 must not leak: A2 = 1,
    #        A1 = 1 + 0.72*1 = 1.72, A0 = 1 + 0.72*1.72 = 2.2384
    # Env 2: every step done -> A = r - V = 1 everywhere.
    d = dones_of(3, 3, 1, (1, 0, 0), (3, 1, 0))
    d[1:, 2] = True
    rewards = torch.ones(3, 3, 1)
    values = torch.zeros(4, 3, 1)
    values[3] = 100.0
    adv, ret = compute_embodied_gae(rewards, d, values, gamma=0.9, gae_lambda=0.8)
    close(adv[:, 0, 0], [1.0, 66.52, 91.0], atol=1e-4)
    close(adv[:, 1, 0], [2.2384, 1.72, 1.0], atol=1e-4)
    close(adv[:, 2, 0], [1.0, 1.0, 1.0])
    close(ret, adv.tolist())  # V = 0 on the first T rows


def test_gae_truncation_and_termination_both_cut_through_dones() -> None:
    # The env adds gamma * V(final_obs) to the last reward of a truncated episode, so
    # truncation and termination are both just dones here. T=2, C=1, B=2, gamma=0.5,
    # lambda=1, V = [1, 1, 7] (7 = the next episode's / final value).
    # Env 0 terminates at t=1 with r = [0, 1]:
    #   A1 = 1 - 1 = 0;  A0 = (0 + 0.5*1 - 1) + 0.5*0 = -0.5
    # Env 1 truncates at t=1, V(final_obs) = 4, so r = [0, 1 + 0.5*4 = 3]:
    #   A1 = 3 - 1 = 2;  A0 = -0.5 + 0.5*2 = 0.5
    rewards = t3([[[0.0], [0.0]], [[1.0], [3.0]]])
    d = dones_of(2, 2, 1, (2, 0, 0), (2, 1, 0))
    values = torch.tensor([1.0, 1.0, 7.0]).view(3, 1, 1).expand(3, 2, 1)
    adv, _ = compute_embodied_gae(rewards, d, values, gamma=0.5, gae_lambda=1.0)
    close(adv[:, :, 0], [[-0.5, 0.5], [0.0, 2.0]])


def test_gae_action_level_value_head_v_equals_c() -> None:
    # T=2, B=1, C=2, gamma=0.5, lambda=1. Sub-steps s = 2t + c: r = [1, 0, 0, 2].
    # values[t, :, c] is used for sub-step (t, c): V = [0.1, 0.2, 0.3, 0.4] and the
    # bootstrap is values[T, :, 0] = 0.5 (0.6 is unused).
    # s3: 2 + 0.5*0.5 - 0.4 = 1.85
    # s2: delta = 0 + 0.5*0.4 - 0.3 = -0.1;  A = -0.1 + 0.5*1.85  = 0.825
    # s1: delta = 0 + 0.5*0.3 - 0.2 = -0.05; A = -0.05 + 0.5*0.825 = 0.3625
    # s0: delta = 1 + 0.5*0.2 - 0.1 = 1.0;   A = 1.0 + 0.5*0.3625 = 1.18125
    rewards = t3([[[1.0, 0.0]], [[0.0, 2.0]]])
    values = t3([[[0.1, 0.2]], [[0.3, 0.4]], [[0.5, 0.6]]])
    adv, ret = compute_embodied_gae(rewards, dones_of(2, 1, 2), values, gamma=0.5, gae_lambda=1.0)
    assert adv.shape == ret.shape == (2, 1, 2)
    close(adv[:, 0], [[1.18125, 0.3625], [0.825, 1.85]])
    close(ret[:, 0], [[1.28125, 0.5625], [1.125, 2.25]])


def test_gae_chunk_value_head_is_broadcast_over_substeps() -> None:
    # Same as above with V == 1: values [0.1, 0.3, 0.5] broadcast -> V = [0.1, 0.1, 0.3, 0.3], 0.5.
    # s3: 2 + 0.25 - 0.3 = 1.95
    # s2: delta = 0.15 - 0.3 = -0.15; A = -0.15 + 0.975 = 0.825
    # s1: delta = 0.15 - 0.1 = 0.05;  A = 0.05 + 0.4125 = 0.4625
    # s0: delta = 1 + 0.05 - 0.1 = 0.95; A = 0.95 + 0.23125 = 1.18125
    rewards = t3([[[1.0, 0.0]], [[0.0, 2.0]]])
    values = t3([[[0.1]], [[0.3]], [[0.5]]])
    adv, ret = compute_embodied_gae(rewards, dones_of(2, 1, 2), values, gamma=0.5, gae_lambda=1.0)
    close(adv[:, 0], [[1.18125, 0.4625], [0.825, 1.95]])
    close(ret[:, 0], [[1.28125, 0.5625], [1.125, 2.25]])


def test_gae_done_inside_a_chunk() -> None:
    # As the V == C case, but sub-step 1 of chunk 0 ends the episode (dones[1, 0, 1]).
    # s3, s2 unchanged (1.85, 0.825); s1: A = 0 - 0.2 = -0.2 (V of s2 = 0.3 must not leak);
    # s0: delta = 1 + 0.5*0.2 - 0.1 = 1.0; A = 1.0 + 0.5*(-0.2) = 0.9
    rewards = t3([[[1.0, 0.0]], [[0.0, 2.0]]])
    values = t3([[[0.1, 0.2]], [[0.3, 0.4]], [[0.5, 0.6]]])
    adv, _ = compute_embodied_gae(
        rewards, dones_of(2, 1, 2, (1, 0, 1)), values, gamma=0.5, gae_lambda=1.0
    )
    close(adv[:, 0], [[0.9, -0.2], [0.825, 1.85]])


def test_gae_chunk_level() -> None:
    # chunk_level: rewards summed per chunk -> [1, 2]; values column 0 -> [0.1, 0.3, 0.5];
    # gamma per chunk = 0.5, lambda = 1.
    # t1: 2 + 0.25 - 0.3 = 1.95; t0: delta = 1 + 0.15 - 0.1 = 1.05; A0 = 1.05 + 0.975 = 2.025
    # With the done at sub-step 1 of chunk 0, chunk 0 is done: A0 = 1 - 0.1 = 0.9.
    rewards = t3([[[1.0, 0.0]], [[0.0, 2.0]]])
    values = t3([[[0.1, 0.2]], [[0.3, 0.4]], [[0.5, 0.6]]])
    kw = {"gamma": 0.5, "gae_lambda": 1.0, "reward_type": "chunk_level"}
    adv, ret = compute_embodied_gae(rewards, dones_of(2, 1, 2), values, **kw)  # type: ignore[arg-type]
    assert adv.shape == ret.shape == (2, 1, 1)
    close(adv[:, 0, 0], [2.025, 1.95])
    close(ret[:, 0, 0], [2.125, 2.25])
    adv, _ = compute_embodied_gae(rewards, dones_of(2, 1, 2, (1, 0, 1)), values, **kw)  # type: ignore[arg-type]
    close(adv[:, 0, 0], [0.9, 1.95])


def test_gae_without_values_gives_discounted_returns() -> None:
    # r = [1, 1, 1], gamma = 0.5, no dones, V = 0: returns = [1.75, 1.5, 1].
    adv, ret = compute_embodied_gae(
        torch.ones(3, 1, 1), dones_of(3, 1, 1), None, gamma=0.5, gae_lambda=0.3
    )
    close(ret[:, 0, 0], [1.75, 1.5, 1.0])
    close(adv, ret.tolist())


def test_gae_registered_normalises_over_the_loss_mask() -> None:
    # Raw advantages (V = 0, gamma = 1, one step per episode) are the rewards [1, 3, 100];
    # 100 is masked out, so mean = 2, std = 1 over the valid entries -> [-1, 1, 98].
    rewards = t3([[[1.0]], [[3.0]], [[100.0]]])
    d = dones_of(3, 1, 1, (1, 0, 0), (2, 0, 0), (3, 0, 0))
    mask = torch.tensor([True, True, False]).view(3, 1, 1)
    inputs = EmbodiedAdvantageInputs(rewards, d, torch.zeros(4, 1, 1), loss_mask=mask, eps=0.0)
    adv, ret = get_advantage("gae")(inputs)
    close(adv[:, 0, 0], [-1.0, 1.0, 98.0])
    assert ret is not None
    close(ret[:, 0, 0], [1.0, 3.0, 100.0])
    raw = EmbodiedAdvantageInputs(rewards, d, normalize_advantages=False)
    close(get_advantage("gae")(raw).advantages[:, 0, 0], [1.0, 3.0, 100.0])


def test_gae_registered_all_reduce_hook_is_used() -> None:
    seen: list[torch.Tensor] = []

    def fake_all_reduce(stats: torch.Tensor) -> torch.Tensor:
        seen.append(stats.clone())
        return stats * 2  # as if a second rank held the same data: same mean and std

    rewards = t3([[[1.0]], [[3.0]]])
    d = dones_of(2, 1, 1, (1, 0, 0), (2, 0, 0))
    inputs = EmbodiedAdvantageInputs(rewards, d, eps=0.0, all_reduce=fake_all_reduce)
    adv, _ = get_advantage("gae")(inputs)
    close(adv[:, 0, 0], [-1.0, 1.0])
    assert seen and seen[0].tolist() == [2.0, 4.0, 10.0]  # count, sum, sum of squares


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": torch.zeros(2, 1)}, r"rewards.shape=\(2, 1\) must be \[T, B, C\]"),
        ({"dones": torch.zeros(2, 1, 1, dtype=torch.bool)}, r"dones.shape=\(2, 1, 1\)"),
        ({"values": torch.zeros(3, 1, 3)}, r"values.shape=\(3, 1, 3\)"),
        ({"values": torch.zeros(2, 1, 1)}, r"values.shape=\(2, 1, 1\)"),
        ({"gamma": 1.5}, "gamma=1.5 must be in"),
        ({"gae_lambda": -0.1}, "gae_lambda=-0.1 must be in"),
        ({"reward_type": "token_level"}, "reward_type='token_level' is not supported"),
    ],
)
def test_gae_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "rewards": torch.zeros(2, 1, 2),
        "dones": torch.zeros(3, 1, 2, dtype=torch.bool),
        "values": torch.zeros(3, 1, 2),
        "gamma": 0.9,
        "gae_lambda": 0.9,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_embodied_gae(**args)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- GRPO


def test_embodied_grpo_groups_with_loss_mask_and_zero_std() -> None:
    # T=2, B=4, C=1, G=2. Scores (sum of rewards over valid steps):
    #   env 0: r = [1, 1], no done             -> 2
    #   env 1: r = [0, 1], done at t=0         -> 0 (the reward at t=1 is past the done)
    #   env 2, env 3: r = [1, 0], no done      -> 1, 1 (zero std group -> advantage 0)
    # Group 0: mean 1, unbiased std sqrt(2) -> +-1 / (sqrt(2) + 1e-6).
    rewards = t3([[[1.0], [0.0], [1.0], [1.0]], [[1.0], [1.0], [0.0], [0.0]]])
    d = dones_of(2, 4, 1, (1, 1, 0))
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    adv = compute_embodied_grpo(rewards, d, group_size=2)
    assert adv.shape == (2, 4, 1)
    close(adv[:, :, 0], [[a, -a, 0.0, 0.0], [a, 0.0, 0.0, 0.0]])
    out = get_advantage("grpo")(EmbodiedAdvantageInputs(rewards, d, group_size=2))
    torch.testing.assert_close(out.advantages, adv)
    assert out.returns is None


def test_embodied_grpo_explicit_mask_and_chunk_level() -> None:
    # T=2, B=2, C=2, G=2. An explicit [T, B, 1] mask drops chunk 1 of env 0.
    # Scores: env 0 = 1 + 2 = 3 (chunk 0 only), env 1 = 1 + 0 + 0 + 0 = 1.
    # Group: mean 2, std sqrt(2) -> env 0: +a, env 1: -a.
    rewards = t3([[[1.0, 2.0], [1.0, 0.0]], [[5.0, 5.0], [0.0, 0.0]]])
    d = dones_of(2, 2, 2)
    mask = torch.tensor([[[True], [True]], [[False], [True]]])
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    adv = compute_embodied_grpo(rewards, d, group_size=2, loss_mask=mask)
    assert adv.shape == (2, 2, 2)
    close(adv, [[[a, a], [-a, -a]], [[0.0, 0.0], [-a, -a]]])
    adv = compute_embodied_grpo(rewards, d, group_size=2, loss_mask=mask, reward_type="chunk_level")
    assert adv.shape == (2, 2, 1)
    close(adv[:, :, 0], [[a, -a], [0.0, -a]])


def test_embodied_grpo_all_done_batch_uses_first_rewards_only() -> None:
    # Every sub-step done: each env's score is its first reward: [3, 1] -> +-a at t=0 only.
    rewards = t3([[[3.0], [1.0]], [[9.0], [9.0]]])
    d = dones_of(2, 2, 1)
    d[1:] = True
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    close(compute_embodied_grpo(rewards, d, group_size=2)[:, :, 0], [[a, -a], [0.0, 0.0]])


def test_embodied_grpo_bad_group_size() -> None:
    rewards = torch.zeros(2, 3, 1)
    d = dones_of(2, 3, 1)
    with pytest.raises(ValueError, match="group_size=2 does not divide the number of samples 3"):
        compute_embodied_grpo(rewards, d, group_size=2)
    with pytest.raises(ValueError, match="group_size=1 is too small"):
        compute_embodied_grpo(rewards, d, group_size=1)
    with pytest.raises(ValueError, match=r"loss_mask.shape=\(2, 3, 2\)"):
        compute_embodied_grpo(
            rewards, d, group_size=3, loss_mask=torch.ones(2, 3, 2, dtype=torch.bool)
        )
