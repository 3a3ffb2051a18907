"""Smoke tier: our channel against baselines measured in the same run (~20 s).

Runs in the default ``uv run pytest``. Every assertion compares two numbers
taken seconds apart on the same machine, never an absolute time, and the
candidates are measured in interleaved blocks so that a burst of load from
elsewhere hits all of them alike. The ratios are printed at the end of the
run (see ``conftest.py``).
"""

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
from chbench.harness import MemcpyPeer, peer, prepare, time_rounds, warm_up
from chbench.payloads import MiB

from rlinf.core.channel import Channel


def interleaved(fns: dict[str, Callable[[], None]], blocks: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternating blocks."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            samples[name].extend(time_rounds(fn, rounds))
    return {name: statistics.median(s) for name, s in samples.items()}


def test_64B_roundtrip_beats_mp_queue_and_zmq(namespace, report):
    """A 64-byte item out and a 1-byte ack back, between two processes."""
    impls = ["ours", "mp_queue", "zmq_ipc"]
    with contextlib.ExitStack() as stack:
        peers = {i: stack.enter_context(peer(i, namespace, max_item_bytes=MiB)) for i in impls}
        cells = {i: prepare(p, "roundtrip", "bytes", 64) for i, p in peers.items()}
        for cell in cells.values():
            warm_up(cell.fn, budget_s=0.5, max_rounds=2000)
        med = interleaved({i: c.fn for i, c in cells.items()}, blocks=8, rounds=300)
        if med["mp_queue"] / med["ours"] < 6.0:
            # One re-measurement: a burst of load from another process (spinning
            # waiters lose their core) can skew a single pass.
            med = interleaved({i: c.fn for i, c in cells.items()}, blocks=8, rounds=300)

    vs_queue = med["mp_queue"] / med["ours"]
    vs_zmq = med["zmq_ipc"] / med["ours"]
    report(
        f"64 B round trip (median): ours {med['ours'] * 1e6:.1f} us, "
        f"mp_queue {med['mp_queue'] * 1e6:.1f} us (ours {vs_queue:.2f}x faster), "
        f"zmq_ipc {med['zmq_ipc'] * 1e6:.1f} us (ours {vs_zmq:.2f}x faster)"
    )
    assert vs_queue >= 6.0, (
        f"ours is only {vs_queue:.2f}x faster than mp.Queue (want >= 6x); "
        "benchmarks/profile_roundtrip.py shows where the time goes"
    )
    assert vs_zmq > 1.0, f"ours is slower than pyzmq ipc ({vs_zmq:.2f}x)"


@pytest.fixture(scope="module")
def ours_peer(namespace):
    with peer("ours", namespace) as p:
        yield p


@pytest.mark.parametrize("size", [16 * MiB, 64 * MiB], ids=["16MiB", "64MiB"])
def test_large_stream_near_memcpy(ours_peer, size, report):
    """K numpy arrays back to back; the consumer reads every page, then acks."""
    memcpy = MemcpyPeer()
    ours = prepare(ours_peer, "stream", "numpy", size)
    roof = prepare(memcpy, "stream", "numpy", size)
    single = prepare(memcpy, "roundtrip", "numpy", size)  # one reused destination
    for cell in (ours, roof, single):
        warm_up(cell.fn, budget_s=0.2, max_rounds=20)
    med = interleaved({"ours": ours.fn, "memcpy": roof.fn, "single": single.fn}, 5, 3)

    gbps = {
        "ours": ours.bytes_per_round / med["ours"] / 1e9,
        "memcpy": roof.bytes_per_round / med["memcpy"] / 1e9,
        "single": size / med["single"] / 1e9,
    }
    ratio = gbps["ours"] / gbps["memcpy"]
    report(
        f"{size // MiB} MiB numpy stream: ours {gbps['ours']:.2f} GB/s = {ratio:.0%} of "
        f"np.copyto {gbps['memcpy']:.2f} GB/s (two alternating destinations; "
        f"one reused destination: {gbps['single']:.2f} GB/s)"
    )
    assert ratio >= 0.7, f"ours streams at {ratio:.0%} of np.copyto (want >= 70%)"


def _mapping_of(segment: str) -> tuple[int, int]:
    """Address range of the first mapping of /dev/shm/<segment> in this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(f"/dev/shm/{segment}"):
                lo, hi = line.split()[0].split("-")
                return int(lo, 16), int(hi, 16)
    raise AssertionError(f"/dev/shm/{segment} is not mapped in this process")


def test_get_of_queued_array_is_zero_copy(namespace, report):
    """Taking a queued array costs the same at 1 MiB and 64 MiB: no copy on get."""
    queued, batches = 6, 4
    name = f"smoke-get-{uuid.uuid4().hex[:6]}"
    ch = Channel.create(name, namespace=namespace, capacity_bytes=2 << 30)
    try:
        lo, hi = _mapping_of(f"rlinf.{namespace}.{name}")
        med = {}
        for size in (MiB, 64 * MiB):
            item = np.full(size // 4, 1.5, dtype=np.float32)
            samples = []
            for batch in range(batches):
                for _ in range(queued):
                    ch.put(item, timeout=30)
                got = []
                for _ in range(queued):
                    t0 = time.perf_counter()
                    arr = ch.get(timeout=30)
                    samples.append(time.perf_counter() - t0)
                    got.append(arr)
                if batch == 0:
                    arr = got[0]
                    assert arr.nbytes == size and arr.flags.writeable
                    assert lo <= arr.ctypes.data < hi, "get returned memory outside the channel"
                del got, arr
            med[size] = statistics.median(samples[queued:])  # first batch: warm-up
    finally:
        ch.close()
        del ch

    ratio = med[64 * MiB] / med[MiB]
    report(
        f"get of a queued array (median): 1 MiB {med[MiB] * 1e6:.1f} us, "
        f"64 MiB {med[64 * MiB] * 1e6:.1f} us (ratio {ratio:.2f}, want <= 3)"
    )
    assert ratio <= 3.0, f"get of 64 MiB takes {ratio:.1f}x the 1 MiB time: is it copying?"


def test_tcp_stream_64MiB_at_least_as_fast_as_zmq_tcp(namespace, report):
    """64 MiB numpy arrays streamed over loopback TCP: our agent path vs pyzmq tcp://."""
    impls = ["ours_tcp", "zmq_tcp"]
    size = 64 * MiB
    with contextlib.ExitStack() as stack:
        peers = {i: stack.enter_context(peer(i, namespace)) for i in impls}
        cells = {i: prepare(p, "stream", "numpy", size) for i, p in peers.items()}
        for cell in cells.values():
            warm_up(cell.fn, budget_s=0.3, max_rounds=3)
        med = interleaved({i: c.fn for i, c in cells.items()}, blocks=3, rounds=2)
    gbps = {i: cells[i].bytes_per_round / med[i] / 1e9 for i in impls}
    ratio = gbps["ours_tcp"] / gbps["zmq_tcp"]
    report(
        f"64 MiB numpy stream over TCP: ours {gbps['ours_tcp']:.2f} GB/s, "
        f"zmq_tcp {gbps['zmq_tcp']:.2f} GB/s (ours {ratio:.2f}x)"
    )
    assert ratio >= 1.0, f"our TCP path is slower than pyzmq over TCP ({ratio:.2f}x)"
