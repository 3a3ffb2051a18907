"""MathRewardScorer: process pool, hard timeout with pool recovery, clean shutdown."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlinf.reasoning.reward import MathRewardScorer, RewardConfig, default_num_workers, verify

# Without the in-process guard, sympy really tries to evaluate 10^(10^10): a hung
# C-level computation that only killing the worker stops.
UNGUARDED = functools.partial(verify, guard=False)
HANG = r"\boxed{10^{10^{10}}}"


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def full_pool(scorer: MathRewardScorer, timeout_s: float = 60.0) -> list[int]:
    """The scorer's worker pids once the pool is back to full size (pebble replaces
    a killed worker in the background, a moment after the sample's verdict)."""
    deadline = time.monotonic() + timeout_s
    while len(scorer.worker_pids) < scorer.num_workers and time.monotonic() < deadline:
        time.sleep(0.05)
    return scorer.worker_pids


@pytest.fixture(scope="module")
def scorer() -> Iterator[MathRewardScorer]:
    s = MathRewardScorer(num_workers=2, timeout_s=2.0, verify_fn=UNGUARDED)
    s.start()
    yield s
    s.close()


def test_scores_in_order_with_reward_scale() -> None:
    with MathRewardScorer(num_workers=2, reward_scale=5.0, correct=1.0, incorrect=-1.0) as s:
        rewards = s.score(
            [r"\boxed{\frac{1}{2}}", "no idea", r"x \boxed{3}", r"\boxed{x+1}", r"\boxed{4}"],
            [["0.5"], ["1"], ["2", "3"], ["1+x"], ["5"]],
        )
        assert rewards == [5.0, -5.0, 5.0, 5.0, -5.0]
        assert s.judge([r"\boxed{2}"], [["2"]]) == [True]
        assert s.score([], []) == []
        assert len(s.worker_pids) == 2


def test_hung_sample_times_out_and_the_pool_recovers(scorer: MathRewardScorer) -> None:
    pids_before = scorer.worker_pids
    timeouts, restarts = scorer.num_timeouts, scorer.num_restarts
    responses = [r"\boxed{1}", HANG, r"\boxed{2}", HANG, r"\boxed{3}", r"\boxed{0.5}"]
    refs = [["1"], ["1"], ["2"], ["1"], ["4"], [r"\frac{1}{2}"]]
    assert scorer.score(responses, refs) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert scorer.last_timed_out == [1, 3]
    # Each hung sample timed out once (never retried) and cost exactly its worker.
    assert scorer.num_timeouts == timeouts + 2
    assert scorer.num_restarts == restarts + 2
    # The hung workers were killed (one or both of the first pool's, depending on
    # which worker picked which sample); a worker of the first pool that is still
    # alive is one of the pool's current workers.
    replaced = [pid for pid in pids_before if pid not in scorer.worker_pids]
    assert replaced and not any(alive(pid) for pid in replaced)
    # the replacement workers work
    assert scorer.score([r"\boxed{7}"] * 4, [["7"]] * 4) == [1.0] * 4
    assert scorer.last_timed_out == []
    pids = full_pool(scorer)
    assert len(pids) == 2 and not set(replaced) & set(pids)
    assert all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids_before if pid not in pids)


def test_timeout_is_per_sample_not_per_batch(scorer: MathRewardScorer) -> None:
    # Many quick samples behind one slow one: only the slow one fails.
    responses = [HANG] + [rf"\boxed{{{i}}}" for i in range(30)]
    refs = [["0"]] + [[str(i)] for i in range(30)]
    assert scorer.score(responses, refs) == [0.0] + [1.0] * 30


def test_close_leaves_no_worker_processes(scorer: MathRewardScorer) -> None:
    full_pool(scorer)  # the module's other scorer: idle, full size, left alone here
    children_before = {p.pid for p in multiprocessing.active_children()}
    s = MathRewardScorer(num_workers=2, timeout_s=2.0, verify_fn=UNGUARDED)
    assert s.worker_pids == []  # lazy: nothing started yet
    seen = set()
    s.start()
    seen |= set(s.worker_pids)
    assert s.score([HANG, r"\boxed{1}"], [["1"], ["1"]]) == [0.0, 1.0]
    assert s.score([r"\boxed{1}"], [["1"]]) == [1.0]
    seen |= set(full_pool(s))  # the hung worker was replaced
    assert len(seen) >= 3 and all(alive(pid) for pid in s.worker_pids)
    s.close()
    assert s.worker_pids == []
    assert not any(alive(pid) for pid in seen)
    assert {p.pid for p in multiprocessing.active_children()} <= children_before
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        s.score([r"\boxed{1}"], [["1"]])


# A verifier that dies like an OOM-killed worker, or raises; workers import it by name.
CRASHY = """
import os
import signal

from rlinf.reasoning.reward import verify


def crashy(response, references):
    if "CRASH" in response:
        os.kill(os.getpid(), signal.SIGKILL)
    if "RAISE" in response:
        raise ValueError("a verifier bug")
    return verify(response, references)
"""


def test_crash_and_error_cost_one_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rlinf_test_crashy_verify.py").write_text(CRASHY)
    monkeypatch.syspath_prepend(str(tmp_path))
    crashy = importlib.import_module("rlinf_test_crashy_verify").crashy
    with MathRewardScorer(num_workers=2, timeout_s=30.0, verify_fn=crashy) as s:
        s.start()
        pids_before = s.worker_pids
        responses = [r"\boxed{1}", "CRASH", r"\boxed{2}", "RAISE", r"\boxed{3}", "CRASH"]
        refs = [["1"], ["1"], ["2"], ["1"], ["3"], ["1"]]
        assert s.score(responses, refs) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
        # each crash cost its own sample and its worker, nothing else
        assert (s.num_timeouts, s.num_restarts, s.last_timed_out) == (0, 2, [])
        assert s.score([r"\boxed{7}"] * 4, [["7"]] * 4) == [1.0] * 4
        pids = full_pool(s)
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        assert not any(alive(pid) for pid in pids_before if pid not in pids)


def test_context_manager_closes() -> None:
    with MathRewardScorer(num_workers=1) as s:
        assert s.score([r"\boxed{1}"], [["1"]]) == [1.0]
        pids = s.worker_pids
    assert pids and not any(alive(pid) for pid in pids)


def test_spawn_context_leaves_no_children_at_all() -> None:
    def children() -> set[int]:
        me = str(os.getpid())
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[1] == me:
                    out.add(int(entry.name))
        return out

    before = children()
    with MathRewardScorer(num_workers=1, timeout_s=5.0, mp_context="spawn") as s:
        assert s.score([r"\boxed{1}"], [["1"]]) == [1.0]
    # a resource tracker may start with the first pool and lives as long as python
    leftover = children() - before
    assert all("resource_tracker" in Path(f"/proc/{p}/cmdline").read_text() for p in leftover)


def test_argument_validation() -> None:
    s = MathRewardScorer(num_workers=1)
    with pytest.raises(ValueError, match="2 responses but 1 reference"):
        s.score(["a", "b"], [["1"]])
    with pytest.raises(TypeError, match=r"references\[0\] is a string"):
        s.score(["a"], ["1"])  # type: ignore[list-item]
    s.close()
    assert s.worker_pids == []
    with pytest.raises(ValueError, match="num_workers"):
        MathRewardScorer(num_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        MathRewardScorer(timeout_s=0)
    with pytest.raises(ValueError, match="never 'fork'"):
        MathRewardScorer(mp_context="fork")  # type: ignore[arg-type]


def test_default_pool_size() -> None:
    n = default_num_workers()
    assert 1 <= n <= 8
    assert n == min(len(os.sched_getaffinity(0)), 8)
    assert MathRewardScorer().num_workers == n


def test_reward_config() -> None:
    cfg = RewardConfig()
    assert (cfg.reward_type, cfg.reward_scale, cfg.timeout_s, cfg.num_workers) == (
        "math",
        1.0,
        5.0,
        None,
    )
    s = MathRewardScorer.from_config(RewardConfig(reward_scale=5.0, timeout_s=3, num_workers=2))
    assert (s.reward_scale, s.timeout_s, s.num_workers) == (5.0, 3.0, 2)
    s.close()
    with pytest.raises(ValidationError):
        RewardConfig.model_validate({"reward_type": "code"})
    with pytest.raises(ValidationError, match="extra"):
        RewardConfig.model_validate({"reward_scale": 1.0, "timeout": 5})
    with pytest.raises(ValidationError):
        RewardConfig(timeout_s=0)
