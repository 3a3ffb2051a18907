"""Worker groups on real Ray (CPU slots on one node): env, fan-out, futures, failures."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
import ray

from rlinf.core.channel import Channel
from rlinf.sched import (
    Cluster,
    PackedPlacementStrategy,
    Worker,
    WorkerDiedError,
    WorkerError,
)


class Echo(Worker):
    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def env(self) -> dict[str, str]:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_NAME")
        return {k: os.environ[k] for k in keys}

    def times(self, x: int) -> int:
        with self.worker_timer("times"):
            return x * self.scale * (self.rank + 1)

    def fail_on(self, rank: int) -> None:
        if self.rank == rank:
            raise ValueError(f"boom from rank {self.rank}")

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def wait_for(self, gate: Channel) -> int:
        gate.get(key=self.rank, timeout=120)
        return self.rank

    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # no arguments: the group's env is enough
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.item())

    def on_main_thread(self) -> bool:
        return threading.current_thread() is threading.main_thread()


class Serial(Echo):
    max_concurrent_calls = 1


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 4}, num_cpus=2) as c:
        yield c


def test_worker_outside_a_group_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"create it with Echo.create_group\(\.\.\.\)\.launch"):
        Echo(1)


def test_group_env_fan_out_futures_and_timers(cluster) -> None:
    group = Echo.create_group(10).launch(cluster, PackedPlacementStrategy(0, 2), name="echo")
    try:
        envs = group.env().wait()
        assert [e["RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in envs} == {"3"} and {e["GROUP_NAME"] for e in envs} == {
            "echo"
        }
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["NODE_RANK"] for e in envs} == {"0"}
        assert group.times(2).wait() == [20, 40, 60]
        assert group.execute_on(1).times(1).wait() == [20]
        assert group.times(1).wait() == [10, 20, 30], "execute_on applies to one call only"
        assert all(t["times"] > 0 for t in group.pop_timings().wait())
        assert asyncio.run(_await(group.times(3))) == [30, 60, 90]
        # The ranks wait on a gate that only this test opens: "still running" does
        # not depend on how fast the machine is.
        gate = Channel.create("echo-gate")
        fut = group.wait_for(gate)
        assert not fut.done()
        with pytest.raises(
            TimeoutError, match=r"echo.wait_for\(\) still running on ranks \[0, 1, 2\]"
        ):
            fut.wait(timeout=0.05)
        for rank in range(3):
            gate.put("go", key=rank)
        assert fut.wait(timeout=120) == [0, 1, 2] and fut.done()
    finally:
        group.close()


async def _await(fut):
    return await fut


def test_torch_distributed_initialises_without_arguments(cluster) -> None:
    group = Echo.create_group(1).launch(cluster, PackedPlacementStrategy(0, 1), name="ddp")
    try:
        assert group.all_reduce().wait(timeout=120) == [3.0, 3.0]
    finally:
        group.close()


def test_a_raising_rank_is_named_with_its_traceback(cluster) -> None:
    group = Echo.create_group(1).launch(cluster, PackedPlacementStrategy(0, 1), name="raiser")
    try:
        with pytest.raises(WorkerError, match=r"raiser\[rank 1\] raised") as info:
            group.fail_on(1).wait(timeout=60)
        assert "boom from rank 1" in str(info.value) and "ValueError" in str(info.value)
        assert group.times(1).wait() == [1, 2], "the group still works after a rank raised"
    finally:
        group.close()


def test_a_killed_rank_is_reported_quickly(cluster) -> None:
    group = Echo.create_group(1).launch(cluster, PackedPlacementStrategy(0, 1), name="victim")
    try:
        pids = group.pid().wait()
        fut = group.sleep(600)  # rank 0 stays busy far longer than the wait below
        time.sleep(0.5)  # let the call start (the death is reported the same if not)
        os.kill(pids[1], signal.SIGKILL)
        # Reported as soon as the rank dies: a WorkerDiedError, not a TimeoutError of
        # this 120 s wait (which rank 0 would only end after 600 s).
        with pytest.raises(WorkerDiedError, match=r"victim\[rank 1\] died"):
            fut.wait(timeout=120)
    finally:
        group.close()


def test_bad_names_and_calls(cluster) -> None:
    with pytest.raises(ValueError, match="must be non-empty and contain no ':'"):
        Echo.create_group(1).launch(cluster, name="a:b")
    with pytest.raises(TypeError, match=r"must be a subclass of rlinf\.sched\.Worker"):
        from rlinf.sched import WorkerGroup

        WorkerGroup(int, (), {})  # type: ignore[arg-type]
    group = Echo.create_group(1)
    with pytest.raises(RuntimeError, match="launch the group before calling times"):
        group.times(1)
    with pytest.raises(AttributeError, match="Echo has no method 'nope'"):
        group.nope  # noqa: B018


def test_max_concurrent_calls_pool_or_main_thread(cluster) -> None:
    """8 (the default): calls overlap on pool threads; 1: one at a time on the main thread."""
    strategy = PackedPlacementStrategy(0, 0)
    pooled = Echo.create_group(1).launch(cluster, strategy, name="pooled")
    serial = Serial.create_group(1).launch(cluster, strategy, name="serial")
    try:
        assert pooled.on_main_thread().wait(timeout=60) == [False]
        assert serial.on_main_thread().wait(timeout=60) == [True]
        pooled_gate, serial_gate = Channel.create("pooled-gate"), Channel.create("serial-gate")
        held = pooled.wait_for(pooled_gate)
        assert pooled.times(1).wait(timeout=120) == [1], "a second call runs meanwhile"
        assert not held.done()
        pooled_gate.put("go", key=0)
        assert held.wait(timeout=120) == [0]
        held = serial.wait_for(serial_gate)
        queued = serial.times(1)
        # Queued behind a call that only this test's gate ends: still waiting.
        with pytest.raises(TimeoutError, match=r"serial.times\(\) still running"):
            queued.wait(timeout=0.5)
        serial_gate.put("go", key=0)
        assert held.wait(timeout=120) == [0] and queued.wait(timeout=120) == [1]
    finally:
        pooled.close()
        serial.close()


def test_bad_max_concurrent_calls_is_refused() -> None:
    class Zero(Echo):
        max_concurrent_calls = 0

    with pytest.raises(ValueError, match=r"Zero.max_concurrent_calls = 0: must be an int >= 1"):
        Zero.create_group(1)


def test_master_port_is_free_and_outside_the_ephemeral_range() -> None:
    """A group's MASTER_PORT can't be taken by a bind-to-port-0 before rank 0 binds it."""
    import socket

    from rlinf.sched.worker.group import _free_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_start = int(f.read().split()[0])
    ports = {_free_port() for _ in range(20)}
    for port in ports:
        if ephemeral_start > 20001:
            assert 20000 <= port < ephemeral_start, port
        with socket.socket() as sock:
            sock.bind(("", port))  # still free
    assert len(ports) > 1  # random, not one fixed port
