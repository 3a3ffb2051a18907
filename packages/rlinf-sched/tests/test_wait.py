"""wait_all and launch_groups on real Ray: order, fail-fast, on_error, timeouts, clean-up;
launch-time checks of a group's Python environment."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import ray

from rlinf.core.channel import Channel
from rlinf.sched import (
    Cluster,
    PackedPlacementStrategy,
    PythonEnvConfig,
    PythonEnvError,
    Worker,
    WorkerDiedError,
    WorkerError,
    launch_groups,
    wait_all,
    wait_for_progress,
)
from rlinf.sched.worker import group as group_module
from rlinf.sched.worker.group import RAY_NAMESPACE


class Sleeper(Worker):
    def __init__(self, startup_s: float = 0.0) -> None:
        super().__init__()
        time.sleep(startup_s)

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"boom from rank {self.rank}")
        return self.rank

    def wait_for(self, gate: Channel) -> int:
        gate.get(key=self.rank, timeout=120)
        return self.rank


class BrokenOnRank(Worker):
    def __init__(self, broken_rank: int) -> None:
        super().__init__()
        if self.rank == broken_rank:
            raise RuntimeError(f"rank {self.rank} cannot start")

    def who(self) -> str:
        return f"{self.group_name}[{self.rank}]"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 4}, num_cpus=2) as c:
        yield c


@pytest.fixture(scope="module")
def pair(cluster: Cluster) -> Iterator[tuple[object, object]]:
    a = Sleeper.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="a")
    b = Sleeper.create_group().launch(cluster, PackedPlacementStrategy(2, 3), name="b")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def rlinf_caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog for the ``rlinf`` logger, which does not propagate to the root logger."""
    root = logging.getLogger("rlinf")
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="rlinf")
    yield caplog
    root.removeHandler(caplog.handler)


def _open(gate: Channel, ranks: int) -> None:
    for rank in range(ranks):
        gate.put("go", key=rank)


def test_results_in_the_order_given_and_in_rank_order(pair) -> None:
    a, b = pair
    # b finishes first, a's rank 0 last: the order of completion does not matter.
    slow, fast = a.nap(0.5), b.nap(0.0)
    assert wait_all([slow, fast], timeout=120) == [[0, 1], [0, 1]]
    assert wait_all([], timeout=1) == []
    fut = a.nap(0.0)
    with pytest.raises(ValueError, match=r"a.nap\(\) is passed to wait_all twice"):
        wait_all([fut, fut])
    fut.wait(timeout=60)


def test_wait_for_progress_returns_when_one_more_rank_ends(pair, tmp_path) -> None:
    """It blocks while every rank runs, and returns once one of them ends."""
    a, b = pair
    gate = Channel.create(f"progress-{tmp_path.name}")
    try:
        held, free = a.wait_for(gate), b.nap(0.0)
        for _ in range(3):  # b's two ranks end: one return each at most
            if free.done():
                break
            wait_for_progress([held, free], timeout=60)
        assert free.done() and not held.done()
        wait_for_progress([held], timeout=0.5)  # nothing ends: it returns at its timeout
        assert not held.done()
        _open(gate, 2)
        for _ in range(3):
            if held.done():
                break
            wait_for_progress([held], timeout=60)
        assert wait_all([held, free], timeout=60) == [[0, 1], [0, 1]]
        wait_for_progress([held, free], timeout=60)  # nothing running: returns at once
    finally:
        gate.close()


def test_first_failure_wins_while_another_future_still_runs(pair) -> None:
    a, b = pair
    gate = Channel.create("wait-first-failure")
    calls: list[float] = []

    def on_error() -> None:  # what a runner does: wake the blocked ranks
        calls.append(time.monotonic())
        _open(gate, 2)

    start = time.monotonic()
    blocked = a.wait_for(gate)  # would run until the gate opens (120 s at most)
    with pytest.raises(WorkerError, match=r"b\[rank 1\] raised") as info:
        wait_all([blocked, b.fail_on(1)], timeout=120, on_error=on_error)
    assert "boom from rank 1" in str(info.value)
    assert len(calls) == 1, "on_error runs exactly once"
    assert calls[0] - start < 60, "the failure surfaced before the blocked call ended"
    assert blocked.wait(timeout=60) == [0, 1], "on_error woke the blocked ranks"


def test_timeout_names_what_is_still_running(pair) -> None:
    a, b = pair
    gate = Channel.create("wait-timeout")
    calls: list[int] = []

    def on_error() -> None:
        calls.append(1)
        _open(gate, 2)

    blocked, done = a.wait_for(gate), b.nap(0.0)
    done.wait(timeout=60)
    with pytest.raises(
        TimeoutError,
        match=r"^a\.wait_for\(\) still running on ranks \[0, 1\] after 0\.3 s; is it stuck\?$",
    ):
        wait_all([blocked, done], timeout=0.3, on_error=on_error, hint="is it stuck?")
    assert calls == [1]
    assert blocked.wait(timeout=60) == [0, 1]


def test_progress_is_reported_while_waiting(pair) -> None:
    a, _ = pair
    seen: list[tuple[int, int, float]] = []
    out = wait_all(
        [a.nap(1.5)],
        timeout=120,
        progress=lambda done, total, waited: seen.append((done, total, waited)),
        progress_every=0.2,
    )
    assert out == [[0, 1]]
    assert seen and all(total == 2 and done < 2 for done, total, _ in seen)
    assert [w for *_, w in seen] == sorted(w for *_, w in seen)


def test_await_fails_fast_and_keeps_rank_order(pair) -> None:
    a, b = pair

    async def both() -> list[list[int]]:
        return [await a.nap(0.3), await b.nap(0.0)]

    assert asyncio.run(both()) == [[0, 1], [0, 1]]
    gate = Channel.create("await-fail-fast")
    blocked = a.wait_for(gate)
    try:

        async def fail() -> object:
            return await b.fail_on(0)

        with pytest.raises(WorkerError, match=r"b\[rank 0\] raised"):
            asyncio.run(asyncio.wait_for(fail(), timeout=60))
    finally:
        _open(gate, 2)
        blocked.wait(timeout=60)


def test_launch_says_what_it_waits_for(
    cluster: Cluster, rlinf_caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_module, "_LAUNCH_REPORT_S", 0.3)
    group = Sleeper.create_group(1.5).launch(cluster, PackedPlacementStrategy(0, 1), name="slow")
    group.close()
    lines = [r.getMessage() for r in rlinf_caplog.records if r.name == "rlinf.sched.group"]
    assert lines[0] == "launching slow x2 ..."
    assert any(line.startswith("still waiting for slow: ") for line in lines[1:-1]), lines
    assert "/2 ready after " in lines[1]
    assert lines[-1].startswith("slow: 2/2 ready in ") and lines[-1].endswith(" s")


def test_launch_groups_starts_all_and_keeps_the_order(cluster: Cluster) -> None:
    groups = launch_groups(
        cluster,
        {
            "second": (BrokenOnRank.create_group(-1), PackedPlacementStrategy(2, 3)),
            "first": (BrokenOnRank.create_group(-1), PackedPlacementStrategy(0, 1)),
        },
        timeout=300,
    )
    try:
        assert list(groups) == ["second", "first"]
        assert wait_all([g.who() for g in groups.values()], timeout=60) == [
            ["second[0]", "second[1]"],
            ["first[0]", "first[1]"],
        ]
    finally:
        for group in groups.values():
            group.close()


def _name_freed(name: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=RAY_NAMESPACE)
        except ValueError:
            return True
        time.sleep(0.2)
    return False


def test_launch_groups_leaves_nothing_running_when_one_fails(cluster: Cluster) -> None:
    healthy = BrokenOnRank.create_group(-1)
    broken = BrokenOnRank.create_group(1)
    with pytest.raises(WorkerError, match=r"broken\[rank 1\]") as info:
        launch_groups(
            cluster,
            {
                "healthy": (healthy, PackedPlacementStrategy(0, 1)),
                "broken": (broken, PackedPlacementStrategy(2, 3)),
            },
            timeout=300,
        )
    # A constructor that raised is reported with its own error, not as a death.
    assert "rank 1 cannot start" in str(info.value)
    assert not isinstance(info.value, WorkerDiedError)
    for group in (healthy, broken):  # both shut down: no actor left, calls refused
        with pytest.raises(RuntimeError, match="launch the group"):
            group.who()
    for name in ("healthy:0", "healthy:1", "broken:0", "broken:1"):
        assert _name_freed(name), f"actor {name} still alive after the failed launch"


def test_launch_groups_with_a_missing_python_env_fails_naming_the_key(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An env that was never set up fails before any actor starts, and takes the others down."""
    healthy = BrokenOnRank.create_group(-1)
    elsewhere = BrokenOnRank.create_group(-1).use_python_env(
        PythonEnvConfig(project=tmp_path / "libero"), key="env.python_env"
    )
    with pytest.raises(PythonEnvError) as info:
        launch_groups(
            cluster,
            {
                "healthy": (healthy, PackedPlacementStrategy(0, 1)),
                "elsewhere": (elsewhere, PackedPlacementStrategy(2, 3)),
            },
            timeout=300,
        )
    message = str(info.value)
    assert f"env.python_env.project = {tmp_path / 'libero'}" in message
    assert f"uv sync --locked --project {tmp_path / 'libero'}" in message
    for name in ("healthy:0", "healthy:1", "elsewhere:0", "elsewhere:1"):
        assert _name_freed(name), f"actor {name} still alive after the failed launch"


def test_a_python_env_that_cannot_import_the_worker_fails_naming_the_key(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An interpreter without rlinf (a bare venv) is refused with the import error."""
    bare = tmp_path / "bare"
    subprocess.run(["uv", "venv", "--quiet", "--python", sys.executable, str(bare)], check=True)
    group = BrokenOnRank.create_group(-1).use_python_env(
        PythonEnvConfig(interpreter=bare / "bin" / "python"), key="cluster.extra_env"
    )
    with pytest.raises(PythonEnvError, match=r"cluster\.extra_env\.interpreter = .*cannot import"):
        group.launch(cluster, PackedPlacementStrategy(0, 0), name="bare")
    assert _name_freed("bare:0")


def test_a_python_env_of_another_python_or_ray_is_refused_naming_the_pin() -> None:
    from rlinf.sched.python_env import _compare

    ours = [sys.version_info.major, sys.version_info.minor]
    same = {name: version(name) for name in ("ray", "pydantic", "cloudpickle")}
    _compare("k", "/p", {"python": ours, "versions": same})  # fits
    with pytest.raises(PythonEnvError, match=r"k: /p is Python 3\.99, the driver"):
        _compare("k", "/p", {"python": [3, 99], "versions": same})
    with pytest.raises(PythonEnvError, match=rf"ray 1\.0, the driver {same['ray']}.*ray=="):
        _compare("k", "/p", {"python": ours, "versions": {**same, "ray": "1.0"}})


def test_python_env_config_takes_exactly_one_of_project_and_interpreter() -> None:
    with pytest.raises(ValueError, match="exactly one of project"):
        PythonEnvConfig()
    with pytest.raises(ValueError, match="exactly one of project"):
        PythonEnvConfig(project=Path("a"), interpreter=Path("b"))
    assert (
        PythonEnvConfig(project=Path("a")).interpreter_path() == Path.cwd() / "a/.venv/bin/python"
    )
