"""Truncated importance-sampling weights and the ratio early stop, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlinf.core.algorithms import early_stop_ratio_exceeded, truncated_is_weights


def test_truncated_is_weights_hand_computed() -> None:
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]])
    rollout = torch.tensor([[-1.0, -1.0, -2.0], [-1.0, -1.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = truncated_is_weights(train, rollout, clip=2.0, mask=mask)
    expected = torch.tensor(
        [
            [1.0, math.exp(-1.0), 2.0],  # exp(1.5) = 4.48 is clipped to 2
            [math.exp(-2.0), math.exp(0.5), 0.0],  # the masked token gets 0
        ]
    )
    assert torch.allclose(w, expected)
    assert w.dtype == torch.float32


def test_truncated_is_weights_do_not_carry_gradient_and_survive_huge_gaps() -> None:
    train = torch.tensor([[0.0, 100.0]], requires_grad=True)
    w = truncated_is_weights(train, torch.tensor([[0.0, -100.0]]), clip=1.0)
    assert not w.requires_grad
    assert torch.equal(w, torch.tensor([[1.0, 1.0]]))  # exp(200) is not inf-then-clipped NaN


def test_truncated_is_weights_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="importance_sampling_clip=0"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), clip=0)
    with pytest.raises(ValueError, match=r"rollout_logprobs\.shape"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 3), clip=1.0)


def test_early_stop_on_mean_ratio() -> None:
    old = torch.zeros(2, 2)
    lp = torch.tensor([[math.log(2.0), math.log(4.0)], [math.log(9.0), 0.0]])
    mask = torch.tensor([[1, 1], [0, 1]])  # ratios 2, 4, 1 on valid tokens: mean 7/3
    stop, mean = early_stop_ratio_exceeded(lp, old, mask, threshold=2.0)
    assert stop and mean == pytest.approx(7 / 3)
    stop, _ = early_stop_ratio_exceeded(lp, old, mask, threshold=2.5)
    assert not stop


def test_early_stop_uses_the_data_parallel_mean() -> None:
    """With an all-reduce every rank takes the decision on the global mean."""
    lp, old, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)  # local mean 1
    stop, mean = early_stop_ratio_exceeded(lp, old, mask, 2.0, all_reduce_mean=lambda t: t * 3)
    assert stop and mean == pytest.approx(3.0)
