"""ResumableSampler: per-epoch permutations from a seed, and exact resumption."""

from __future__ import annotations

import itertools
import json

import pytest

from rlinf.reasoning.data import ResumableSampler


def take(sampler: ResumableSampler, n: int) -> list[int]:
    """Draw ``n`` indices, crossing epochs as a training loop would."""
    out: list[int] = []
    while len(out) < n:
        out += list(itertools.islice(iter(sampler), n - len(out)))
    return out


def test_each_epoch_is_a_permutation_and_epochs_differ() -> None:
    s = ResumableSampler(20, seed=7)
    e0, e1 = list(s), list(s)
    assert sorted(e0) == sorted(e1) == list(range(20))
    assert e0 != e1 and e0 != list(range(20))
    assert s.epoch == 2 and s.cursor == 0
    assert list(ResumableSampler(20, seed=7)) == e0  # a pure function of (seed, epoch)
    assert list(ResumableSampler(20, seed=8)) != e0
    assert len(s) == 20


def test_no_shuffle_is_identity() -> None:
    s = ResumableSampler(5, shuffle=False)
    assert list(s) == list(s) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("stop", [0, 1, 6, 10, 11, 25, 30])
def test_resume_yields_exactly_the_continuation(stop: int) -> None:
    reference = take(ResumableSampler(10, seed=1), 45)
    first = ResumableSampler(10, seed=1)
    head = take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    second = ResumableSampler(10, seed=1)
    second.load_state_dict(state)
    assert head + take(second, 45 - stop) == reference


def test_resume_mid_iteration_state() -> None:
    s = ResumableSampler(6, seed=0)
    it = iter(s)
    got = [next(it) for _ in range(4)]
    assert s.state_dict() == {"epoch": 0, "cursor": 4, "seed": 0, "shuffle": True, "data_size": 6}
    t = ResumableSampler(6, seed=0)
    t.load_state_dict(s.state_dict())
    assert got + list(t) == list(ResumableSampler(6, seed=0))


def test_set_epoch() -> None:
    s = ResumableSampler(8, seed=2)
    s.set_epoch(3)
    assert list(s) == s.epoch_order(3)
    with pytest.raises(ValueError):
        s.set_epoch(-1)


def test_load_state_dict_rejects_other_settings() -> None:
    state = ResumableSampler(10, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"data_size=10.*data_size=9"):
        ResumableSampler(9, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(10, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        ResumableSampler(10, seed=1, shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="out of range"):
        ResumableSampler(10, seed=1).load_state_dict({**state, "cursor": 11})
    with pytest.raises(KeyError, match="cursor"):
        ResumableSampler(10, seed=1).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="empty"):
        ResumableSampler(0)
