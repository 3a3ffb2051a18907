"""ReplayBuffer: ring wrap-around, sampling only valid rows, state round-trip, errors."""

from __future__ import annotations

import pytest
import torch

from rlinf.embodied.replay import ReplayBuffer, Transitions


def _batch(start: int, n: int) -> Transitions:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return Transitions(
        obs={"states": ids[:, None].repeat(1, 3)},
        actions=ids[:, None],
        rewards=ids,
        next_obs={"states": ids[:, None].repeat(1, 3) + 0.5},
        terminations=(ids % 2 == 0),
        truncations=(ids % 3 == 0),
    )


def test_wrap_around_keeps_the_newest_rows() -> None:
    buf = ReplayBuffer(5)
    buf.add(_batch(0, 3))
    assert buf.size == 3 and buf.ready(3) and not buf.ready(4)
    buf.add(_batch(3, 4))  # 7 added, capacity 5: rows 2..6 remain
    assert buf.size == 5 and buf.total_added == 7
    state = buf.state_dict()
    assert sorted(state["data"]["rewards"].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert state["pos"] == 2
    buf.add(_batch(100, 12))  # larger than capacity: only the newest 5
    assert sorted(buf.state_dict()["data"]["rewards"].tolist()) == [107, 108, 109, 110, 111]


def test_samples_only_valid_rows_and_keeps_rows_together() -> None:
    buf = ReplayBuffer(100)
    buf.add(_batch(10, 7))
    gen = torch.Generator().manual_seed(0)
    sample = buf.sample(500, gen)
    assert len(sample) == 500
    assert set(sample.rewards.tolist()) == {float(i) for i in range(10, 17)}
    assert torch.equal(sample.obs["states"][:, 0], sample.rewards)
    assert torch.equal(sample.next_obs["states"][:, 1], sample.rewards + 0.5)
    assert torch.equal(sample.actions[:, 0], sample.rewards)
    assert torch.equal(sample.terminations, sample.rewards % 2 == 0)
    assert sample.terminations.dtype == torch.bool


def test_sampling_is_reproducible_with_a_seeded_generator() -> None:
    buf = ReplayBuffer(50)
    buf.add(_batch(0, 30))
    a = buf.sample(16, torch.Generator().manual_seed(3)).rewards
    b = buf.sample(16, torch.Generator().manual_seed(3)).rewards
    assert torch.equal(a, b)


def test_state_round_trip_restores_contents_cursor_and_sampling() -> None:
    buf = ReplayBuffer(8)
    buf.add(_batch(0, 11))
    state = buf.state_dict()
    other = ReplayBuffer(8)
    other.load_state_dict(state)
    assert other.size == buf.size and other.total_added == 11
    for name in ("rewards", "actions", "terminations"):
        assert torch.equal(other.state_dict()["data"][name], state["data"][name])
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(buf.sample(20, g1).rewards, other.sample(20, g2).rewards)
    # Both continue writing at the same cursor.
    buf.add(_batch(50, 2))
    other.add(_batch(50, 2))
    assert torch.equal(buf.state_dict()["data"]["rewards"], other.state_dict()["data"]["rewards"])
    with pytest.raises(ValueError, match="replay_capacity"):
        ReplayBuffer(9).load_state_dict(state)


def test_empty_round_trip_and_errors() -> None:
    empty = ReplayBuffer(4)
    fresh = ReplayBuffer(4)
    fresh.load_state_dict(empty.state_dict())
    assert fresh.size == 0
    with pytest.raises(ValueError, match="empty"):
        fresh.sample(1)
    with pytest.raises(ValueError, match="replay_capacity"):
        ReplayBuffer(0)
    buf = ReplayBuffer(4)
    buf.add(_batch(0, 2))
    bad = _batch(0, 2)
    bad.actions = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="actions"):
        buf.add(bad)
    bad = _batch(0, 2)
    bad.rewards = torch.zeros(3)
    with pytest.raises(ValueError, match="rows"):
        buf.add(bad)
