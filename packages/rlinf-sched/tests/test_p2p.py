"""Point-to-point send/recv/broadcast, channels by name and device locks on real Ray."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import numpy as np
import pytest
import ray
import torch

from rlinf.core.channel import Channel
from rlinf.sched import (
    Cluster,
    CommTimeoutError,
    PackedPlacementStrategy,
    PeerDiedError,
    Worker,
    WorkerError,
)


@dataclass
class Batch:
    obs: torch.Tensor
    names: list[str]
    extra: dict[str, np.ndarray]


class Peer(Worker):
    def pid(self) -> int:
        return os.getpid()

    def send_many(self, dst: str, dst_rank: int, items: list[object]) -> int:
        for item in items:
            self.send(item, dst, dst_rank)
        return len(items)

    def recv_many(self, src: str, src_rank: int, count: int) -> list[object]:
        return [self.recv(src, src_rank) for _ in range(count)]

    def async_stream(self, dst: str, dst_rank: int, count: int) -> int:
        works = [self.send({"i": i}, dst, dst_rank, async_op=True) for i in range(count)]
        works[-1].wait(timeout=120)
        assert all(w.done() for w in works)
        return count

    def async_drain(self, src: str, src_rank: int, count: int) -> list[int]:
        works = [self.recv(src, src_rank, async_op=True) for _ in range(count)]
        return [w.wait(timeout=120)["i"] for w in works]

    def recv_with_timeout(self, src: str, src_rank: int, timeout: float) -> object:
        return self.recv(src, src_rank, timeout=timeout)

    def bcast(self, obj: object, groups: list, src: tuple | None = None) -> object:
        return self.broadcast(obj, groups, src)

    def make_channel(self, name: str) -> None:
        self.create_channel(name).put({"from": self.group_name, "rank": self.rank})

    def read_channel(self, name: str) -> object:
        return self.connect_channel(name).get(timeout=30)

    def put_into(self, channel: Channel, item: object) -> None:
        channel.put(item)

    def locked_section(self, seconds: float) -> tuple[float, float]:
        self.acquire_device_lock(timeout=60)
        try:
            start = time.monotonic()
            time.sleep(seconds)
            return start, time.monotonic()
        finally:
            self.release_device_lock()

    def try_lock(self, timeout: float) -> None:
        self.acquire_device_lock(timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 4}, num_cpus=2) as c:
        yield c


@pytest.fixture(scope="module")
def pair(cluster):
    a = Peer.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="a")
    b = Peer.create_group().launch(cluster, PackedPlacementStrategy(2, 2), name="b")
    yield a, b
    a.close()
    b.close()


def test_objects_tensors_and_dataclasses_arrive_in_order(pair) -> None:
    a, b = pair
    items = [
        "hello",
        {"nested": [1, (2, 3)], "arr": np.arange(6).reshape(2, 3)},
        torch.arange(10, dtype=torch.float32),
        Batch(torch.ones(2, 3), ["x", "y"], {"m": np.eye(2)}),
        None,
    ]
    # recv posted before send: the receiver waits for the first item.
    received = b.execute_on(0).recv_many("a", 1, len(items))
    time.sleep(0.3)
    assert a.execute_on(1).send_many("b", 0, items).wait(timeout=60) == [len(items)]
    got = received.wait(timeout=60)[0]
    assert got[0] == "hello"
    assert got[1]["nested"] == [1, (2, 3)] and np.array_equal(got[1]["arr"], items[1]["arr"])
    assert torch.equal(got[2], items[2])
    assert isinstance(got[3], Batch) and torch.equal(got[3].obs, torch.ones(2, 3))
    assert got[3].names == ["x", "y"] and np.array_equal(got[3].extra["m"], np.eye(2))
    assert got[4] is None


def test_both_directions_and_pairs_are_independent(pair) -> None:
    a, b = pair
    # a[0] <-> b[0] both ways at once, a[1] -> b[0] interleaved: per-pair FIFO.
    r1 = b.execute_on(0).recv_many("a", 0, 3)
    r2 = b.execute_on(0)
    s1 = a.execute_on(0).send_many("b", 0, [0, 1, 2])
    s2 = a.execute_on(1).send_many("b", 0, ["x", "y"])
    back = a.execute_on(0).recv_many("b", 0, 2)
    r2 = b.execute_on(0).send_many("a", 0, ["p", "q"])
    assert r1.wait(timeout=60) == [[0, 1, 2]]
    assert b.execute_on(0).recv_many("a", 1, 2).wait(timeout=60) == [["x", "y"]]
    assert back.wait(timeout=60) == [["p", "q"]]
    for f in (s1, s2, r2):
        f.wait(timeout=60)


def test_a_thousand_async_messages(pair) -> None:
    a, b = pair
    drain = b.execute_on(0).async_drain("a", 0, 1000)
    assert a.execute_on(0).async_stream("b", 0, 1000).wait(timeout=120) == [1000]
    assert drain.wait(timeout=120) == [list(range(1000))]


def test_broadcast_across_groups(pair) -> None:
    a, b = pair
    groups = [("a", [0, 1]), ("b", 0)]
    payload = {"w": torch.arange(4.0)}
    fa = a.bcast(payload, groups, ("a", 1))
    fb = b.bcast(None, groups, ("a", 1))
    results = fa.wait(timeout=60) + fb.wait(timeout=60)
    assert all(torch.equal(r["w"], payload["w"]) for r in results)
    with pytest.raises(WorkerError, match=r"not among the participants"):
        b.bcast(None, [("a", [0, 1])]).wait(timeout=60)


@pytest.mark.parametrize("timeout", [0.1, 2.0])  # one native wait; several slices
def test_recv_timeout_names_the_peer(pair, timeout: float) -> None:
    _, b = pair
    start = time.monotonic()
    expected = rf"recv b:0 <- a\[1\] timed out after {timeout:g} s"
    # The recv's own timeout fires (a CommTimeoutError naming the peer), not the
    # 120 s bound of the wait here; it waited the whole timeout (a lower bound).
    with pytest.raises(WorkerError, match=expected) as info:
        b.execute_on(0).recv_with_timeout("a", 1, timeout).wait(timeout=120)
    assert "CommTimeoutError" in str(info.value)
    assert time.monotonic() - start >= timeout


def test_a_killed_sender_is_reported_to_a_pending_recv(cluster) -> None:
    src = Peer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="doomed")
    dst = Peer.create_group().launch(cluster, PackedPlacementStrategy(1, 1), name="waiter")
    try:
        pending = dst.recv_many("doomed", 0, 1)
        time.sleep(1.0)  # let the recv block (it is reported the same if it has not yet)
        os.kill(src.pid().wait()[0], signal.SIGKILL)
        # The death wakes the recv (default bound 1800 s): a PeerDiedError, not a
        # TimeoutError of this 120 s wait.
        with pytest.raises(WorkerError, match=r"peer doomed\[rank 0\] died") as info:
            pending.wait(timeout=120)
        assert "PeerDiedError" in str(info.value)
    finally:
        src.close()
        dst.close()


def test_channels_by_name_from_workers_and_driver(pair) -> None:
    a, b = pair
    a.execute_on(0).make_channel("made-in-a").wait(timeout=60)
    assert b.execute_on(0).read_channel("made-in-a").wait(timeout=60) == [{"from": "a", "rank": 0}]
    driver_made = Channel.create("made-in-driver")
    a.execute_on(1).put_into(driver_made, [1, 2, 3]).wait(timeout=60)
    assert driver_made.get(timeout=30) == [1, 2, 3]


def test_device_lock_serialises_collocated_phases(cluster) -> None:
    # Two groups on the same CPU slot (collocated): their locked sections never overlap.
    x = Peer.create_group().launch(cluster, PackedPlacementStrategy(3, 3), name="x")
    y = Peer.create_group().launch(cluster, PackedPlacementStrategy(3, 3), name="y")
    try:
        fx, fy = x.locked_section(1.0), y.locked_section(1.0)
        (sx, ex), (sy, ey) = fx.wait(timeout=60)[0], fy.wait(timeout=60)[0]
        assert ex <= sy or ey <= sx, "collocated phases overlapped"
        x.try_lock(5).wait(timeout=60)
        with pytest.raises(WorkerError, match=r"waited 0.5 s for the lock of device cpu_slot:3"):
            y.try_lock(0.5).wait(timeout=60)
        assert x.offload().wait() == [None] and x.onload().wait() == [None]
    finally:
        x.close()
        y.close()


def test_default_timeout_env_is_validated(monkeypatch) -> None:
    from rlinf.sched.comm.p2p import default_timeout

    monkeypatch.setenv("RLINF_COMM_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="RLINF_COMM_TIMEOUT_S must be a number of seconds"):
        default_timeout()
    monkeypatch.setenv("RLINF_COMM_TIMEOUT_S", "5")
    assert default_timeout() == 5.0
    assert issubclass(CommTimeoutError, TimeoutError) and issubclass(PeerDiedError, RuntimeError)


# ----- the seeds' programming flow: three groups, two channels, pipelined ----------------
class Producer(Worker):
    def produce(self, channel: Channel, count: int) -> list[float]:
        stamps = []
        for seq in range(count):
            channel.put(
                {"src": self.rank, "seq": seq, "data": torch.full((4,), seq)}, key=self.rank
            )
            stamps.append(time.monotonic())
            time.sleep(0.01)
        return stamps


class Transformer(Worker):
    def transform(self, inbox: Channel, outbox: Channel, count: int) -> int:
        for _ in range(count):
            item = inbox.get(key=self.rank, timeout=60)
            item["data"] = item["data"] * 2
            outbox.put(item, key=item["src"])
        return count


class Consumer(Worker):
    def consume(self, channel: Channel, keys: list[int], count: int) -> dict:
        seen: dict[int, list[int]] = {k: [] for k in keys}
        first = None
        for _ in range(count):
            for k in keys:
                item = channel.get(key=k, timeout=60)
                assert torch.equal(item["data"], torch.full((4,), item["seq"]) * 2)
                seen[k].append(item["seq"])
                first = first or time.monotonic()
        return {"seen": seen, "first": first}


def test_three_groups_two_channels_pipelined(cluster) -> None:
    # Bounded keys make "pipelined" an ordering fact, whatever the machine's speed:
    # a producer's last put can only return once the consumer has taken items.
    stage1 = Channel.create("flow-stage1", maxsize=4)
    stage2 = Channel.create("flow-stage2", maxsize=4)
    producers = Producer.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="prod")
    transformers = Transformer.create_group().launch(
        cluster, PackedPlacementStrategy(2, 3), name="xform"
    )
    consumer = Consumer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="cons")
    try:
        count = 50
        done_c = consumer.consume(stage2, [0, 1], count)
        done_t = transformers.transform(stage1, stage2, count)
        done_p = producers.produce(stage1, count)
        result = done_c.wait(timeout=120)[0]
        assert done_t.wait(timeout=60) == [count, count]
        stamps = done_p.wait(timeout=60)
        # Every item arrived exactly once and in order per key.
        assert result["seen"] == {0: list(range(count)), 1: list(range(count))}
        # Pipelined: the consumer had its first item before the producers finished
        # (with 4 items per key of room in each channel, seq 49 can only be put once
        # the consumer has taken seq >= 40 of that key).
        assert result["first"] < min(s[-1] for s in stamps)
        assert stage1.qsize(0) == stage2.qsize(1) == 0
    finally:
        for g in (producers, transformers, consumer):
            g.close()


def test_from_group_name_reattaches(pair) -> None:
    from rlinf.sched import WorkerGroup

    again = WorkerGroup.from_group_name("a")
    assert again.world_size == 2 and again.name == "a"
    assert again.pid().wait(timeout=60) == pair[0].pid().wait(timeout=60)
    with pytest.raises(ValueError, match=r"no worker group named 'nope'.*launched groups: .*'a'"):
        WorkerGroup.from_group_name("nope")


class CudaPeer(Worker):
    def send_cuda(self, dst: str) -> list[float]:
        t = torch.arange(8, dtype=torch.float32, device="cuda")
        self.send({"t": t}, dst, 0)
        return t.cpu().tolist()

    def recv_cuda(self, src: str) -> tuple[str, list[float]]:
        t = self.recv(src, 0)["t"]
        return str(t.device), t.cpu().tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_cuda_tensor_between_workers_on_one_gpu(cluster) -> None:
    # Two workers sharing GPU 0: the tensor arrives on the receiver's GPU, equal.
    s = CudaPeer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="gs")
    r = CudaPeer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="gr")
    try:
        got = r.recv_cuda("gs")
        sent = s.send_cuda("gr").wait(timeout=120)[0]
        device, values = got.wait(timeout=120)[0]
        assert device.startswith("cuda") and values == sent
    finally:
        s.close()
        r.close()
