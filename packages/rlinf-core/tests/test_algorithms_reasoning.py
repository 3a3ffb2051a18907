"""Reasoning advantages against hand-computed values: GRPO and REINFORCE++."""

from __future__ import annotations

import math

import pytest
import torch

from rlinf.core.algorithms import (
    ReasoningAdvantageInputs,
    compute_grpo_advantages,
    compute_reinforce_plus_plus,
    get_advantage,
)


def close(actual: torch.Tensor, expected: object, atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def lengths_mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def test_grpo_two_groups_one_with_zero_std() -> None:
    # G = 4. Group 0: r = [1, 0, 0, 0], mean 0.25,
    #   unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = 0.25 -> std 0.5
    #   A = [1.5, -0.5, -0.5, -0.5] (divided by 0.5 + 1e-6)
    # Group 1: all ones -> std 0 -> A = 0 (not 0/eps noise).
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    mask = lengths_mask([3, 1, 2, 0, 3, 3, 2, 1], 3)
    adv = compute_grpo_advantages(rewards, mask, group_size=4)
    s = 0.5 + 1e-6
    expected = torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0, 0, 0, 0])
    torch.testing.assert_close(adv, expected[:, None] * mask.float())
    assert adv[3].abs().sum() == 0 and adv[1, 1:].abs().sum() == 0  # padding stays 0


def test_grpo_without_std_normalisation() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = compute_grpo_advantages(
        rewards, torch.ones(4, 2, dtype=torch.bool), group_size=4, norm_by_std=False
    )
    close(adv[:, 0], [0.75, -0.25, -0.25, -0.25])


def test_grpo_registered_with_global_whitening() -> None:
    # Group advantages +-1/(sqrt(2)+eps) on tokens of lengths [1, 3]: valid tokens are
    # [a, -a, -a, -a] -> mean -a/2, biased std a*sqrt(3)/2 -> whitened [sqrt(3), -1/sqrt(3) x3].
    rewards = torch.tensor([1.0, 0.0])
    mask = lengths_mask([1, 3], 3)
    inputs = ReasoningAdvantageInputs(
        rewards, mask, group_size=2, normalize_advantages=True, eps=0.0
    )
    adv, ret = get_advantage("grpo")(inputs)
    assert ret is None
    r3 = math.sqrt(3.0)
    close(adv, [[r3, 0.0, 0.0], [-1 / r3, -1 / r3, -1 / r3]])


def test_grpo_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"rewards.shape=\(2, 1\) must be \[N\]"):
        compute_grpo_advantages(torch.zeros(2, 1), torch.ones(2, 3), group_size=2)
    with pytest.raises(ValueError, match=r"response_mask.shape=\(3, 3\)"):
        compute_grpo_advantages(torch.zeros(2), torch.ones(3, 3), group_size=2)
    with pytest.raises(ValueError, match="group_size=4 does not divide"):
        compute_grpo_advantages(torch.zeros(6), torch.ones(6, 3), group_size=4)


def test_reinforce_plus_plus_with_k1_penalty() -> None:
    # N = 2, L = 3, mask rows [1, 1, 0] and [1, 1, 1], rewards [1, 0], kl_beta = 0.1, k1.
    # k1 = logprobs - ref: row 0 [0.5, 0, (pad)], row 1 [0, -1, 0].
    # Token rewards (reward on the last valid token, minus 0.1 * kl):
    #   row 0 [-0.05, 1.0, 0],  row 1 [0, 0.1, 0]
    # gamma = 1 returns: row 0 [0.95, 1.0, 0], row 1 [0.1, 0.1, 0]
    # Whitening over the 5 valid tokens [0.95, 1.0, 0.1, 0.1, 0.0]:
    #   mean 0.43, biased var 1.9225/5 - 0.43^2 = 0.1996.
    mask = lengths_mask([2, 3], 3)
    logprobs = torch.tensor([[-1.0, -1.0, float("nan")], [-1.0, -2.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    adv, ret = compute_reinforce_plus_plus(
        torch.tensor([1.0, 0.0]),
        mask,
        logprobs=logprobs,
        ref_logprobs=ref,
        kl_beta=0.1,
        kl_kind="k1",
        eps=0.0,
    )
    close(ret, [[0.95, 1.0, 0.0], [0.1, 0.1, 0.0]])
    std = math.sqrt(0.1996)
    expected = [[(0.95 - 0.43) / std, (1.0 - 0.43) / std, 0.0], [(0.1 - 0.43) / std] * 2]
    expected[1].append(-0.43 / std)
    close(adv, expected)


def test_reinforce_plus_plus_discount_baseline_and_registry() -> None:
    # gamma = 0.5, no KL, use_baseline with G = 2: rewards [1, 0] -> [0.5, -0.5].
    # Row 0 (length 2): token rewards [0, 0.5] -> returns [0.25, 0.5]
    # Row 1 (length 3): token rewards [0, 0, -0.5] -> returns [-0.125, -0.25, -0.5]
    mask = lengths_mask([2, 3], 3)
    inputs = ReasoningAdvantageInputs(
        torch.tensor([1.0, 0.0]), mask, group_size=2, use_baseline=True, gamma=0.5
    )
    adv, ret = get_advantage("reinpp")(inputs)
    assert ret is not None
    close(ret, [[0.25, 0.5, 0.0], [-0.125, -0.25, -0.5]])
    valid = adv[mask]
    assert abs(float(valid.mean())) < 1e-6
    assert abs(float(valid.std(unbiased=False)) - 1.0) < 1e-4
    assert float(adv[0, 2]) == 0.0


def test_reinforce_plus_plus_empty_response_and_errors() -> None:
    mask = lengths_mask([0, 2], 2)
    adv, ret = compute_reinforce_plus_plus(torch.tensor([5.0, 1.0]), mask)
    close(ret, [[0.0, 0.0], [1.0, 1.0]])  # the empty response's reward goes nowhere
    close(adv, [[0.0, 0.0], [0.0, 0.0]])  # constant valid returns whiten to 0
    with pytest.raises(ValueError, match=r"kl_beta=0\.1 needs logprobs and ref_logprobs"):
        compute_reinforce_plus_plus(torch.zeros(2), mask, kl_beta=0.1)
    with pytest.raises(ValueError, match=r"kl_beta=-1\.0 must be >= 0"):
        compute_reinforce_plus_plus(torch.zeros(2), mask, kl_beta=-1.0)
    with pytest.raises(ValueError, match=r"logprobs.shape=\(2, 3\)"):
        compute_reinforce_plus_plus(
            torch.zeros(2),
            mask,
            kl_beta=0.1,
            logprobs=torch.zeros(2, 3),
            ref_logprobs=torch.zeros(2, 3),
        )
    with pytest.raises(ValueError, match="group_size=1 is too small"):
        compute_reinforce_plus_plus(torch.zeros(2), mask, use_baseline=True)
