"""Measurement harness shared by the pytest tiers and ``report.py``.

A *peer* drives one transport with its child already running:

* ``roundtrip``: send one item, wait for the child's tiny ack;
* ``stream``: send K items back to back, wait for the ack the child sends
  after touching the K-th (throughput = K * bytes / time until that ack).

``memcpy`` is the roofline peer: ``np.copyto`` of the same number of bytes
in this process, into destinations that are pre-faulted and reused.

Rounds are calibrated from a warm-up (which also faults in and recycles every
buffer the steady state uses), so each cell costs about ``budget_s``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from chbench.payloads import MiB, make_payload, payload_nbytes
from chbench.transports import (
    CTL,
    MpQueueTransport,
    OursTcpTlsTransport,
    OursTcpTransport,
    OursTransport,
    ShmSlotTransport,
    ZmqTransport,
    settle_malloc,
)

SPAWN_IMPLS = ["ours", "mp_queue", "shm_slot", "zmq_ipc", "zmq_tcp"]
RAY_IMPLS = ["ray_put_get", "ray_actor_queue"]
IMPLS = [*SPAWN_IMPLS, "memcpy", *RAY_IMPLS]
BASELINES = [i for i in IMPLS if i != "ours"]
PATTERNS = ["roundtrip", "stream"]
NAMESPACE_ENV = "RLINF_CHANNEL_NAMESPACE"


def stream_batch(size: int | None, impl: str = "ours") -> int:
    """Items per streaming round: ~64 MiB, between 4 and 512 items (Ray: 32).

    Ray moves a few hundred small items per second here, so its batches are
    capped to keep a round near a tenth of a second.
    """
    most = 32 if impl in RAY_IMPLS else 512
    if size is None:
        return most
    return max(4, min(most, (64 * MiB) // size))


# ----- peers ------------------------------------------------------------------------------
class Peer:
    """Drives a started transport (its child is running)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.name: str = transport.name
        self.ack_every = 1

    def item(self, kind: str, size: int | None) -> Any:
        return make_payload(kind, size)

    def set_ack_every(self, n: int) -> None:
        if n != self.ack_every:
            self.transport.send((CTL, "ack_every", n))
            self.transport.recv()
            self.ack_every = n

    def roundtrip(self, item: Any) -> None:
        self.transport.send(item)
        self.transport.recv()

    def stream(self, item: Any, k: int) -> None:
        send = self.transport.send
        for _ in range(k):
            send(item)
        self.transport.recv()

    def close(self) -> None:
        self.transport.stop()


class MemcpyPeer:
    """The roofline: ``np.copyto`` of the item's byte count, in process.

    Destinations are pre-faulted and reused. A round trip copies into one
    buffer; a stream alternates between two, because any producer/consumer
    pipeline that overlaps copying with consuming holds at least two buffers
    (at 16 MiB a single reused destination stays partly in a 32 MiB L3 and
    copies ~1.4x faster than DRAM allows a pipeline to).
    """

    name = "memcpy"

    def __init__(self) -> None:
        self.src = np.empty(0, np.uint8)
        self.dst: list[np.ndarray] = []

    def item(self, kind: str, size: int | None) -> Any:
        if size is None:
            raise ValueError("memcpy needs a byte size")
        if self.src.nbytes != size:
            self.src = np.full(size, 7, dtype=np.uint8)
            self.dst = [np.empty_like(self.src) for _ in range(2)]
            for d in self.dst:
                np.copyto(d, self.src)  # pre-fault
        return None

    def set_ack_every(self, n: int) -> None:
        pass

    def roundtrip(self, item: Any) -> None:
        np.copyto(self.dst[0], self.src)

    def stream(self, item: Any, k: int) -> None:
        src, dst = self.src, self.dst
        for i in range(k):
            np.copyto(dst[i & 1], src)

    def close(self) -> None:
        self.src, self.dst = np.empty(0, np.uint8), []


def open_peer(impl: str, namespace: str, max_item_bytes: int = 64 * MiB) -> Any:
    """Starts ``impl``'s child and returns its peer (Ray impls need a ray_session)."""
    settle_malloc()
    if impl == "memcpy":
        return MemcpyPeer()
    if impl == "ours":
        transport: Any = OursTransport(max_item_bytes, namespace)
    elif impl == "ours_tcp":
        transport = OursTcpTransport(max_item_bytes, namespace)
    elif impl == "ours_tcp_tls":
        transport = OursTcpTlsTransport(max_item_bytes, namespace)
    elif impl == "mp_queue":
        transport = MpQueueTransport(max_item_bytes, namespace)
    elif impl == "shm_slot":
        transport = ShmSlotTransport(max_item_bytes, namespace)
    elif impl in ("zmq_ipc", "zmq_tcp"):
        transport = ZmqTransport(max_item_bytes, namespace, scheme=impl.removeprefix("zmq_"))
    elif impl in RAY_IMPLS:
        from chbench.ray_transports import RayTransport

        transport = RayTransport(max_item_bytes, namespace, by_ref=impl == "ray_put_get")
    else:
        raise ValueError(f"unknown impl {impl!r}; expected one of {IMPLS}")
    transport.start()
    return Peer(transport)


@contextlib.contextmanager
def peer(impl: str, namespace: str, max_item_bytes: int = 64 * MiB) -> Iterator[Any]:
    p = open_peer(impl, namespace, max_item_bytes)
    try:
        yield p
    finally:
        p.close()


# ----- one cell -------------------------------------------------------------------------------
@dataclass
class Cell:
    """What one (impl, pattern, kind, size) measurement runs."""

    impl: str
    pattern: str
    kind: str
    size: int | None
    fn: Callable[[], None]
    items_per_round: int
    bytes_per_round: int


def prepare(p: Any, pattern: str, kind: str, size: int | None) -> Cell:
    """Builds the item and the round function; sets the child's ack mode."""
    k = 1 if pattern == "roundtrip" else stream_batch(size, p.name)
    item = p.item(kind, size)
    p.set_ack_every(k)
    if pattern == "roundtrip":

        def fn() -> None:
            p.roundtrip(item)
    else:

        def fn() -> None:
            p.stream(item, k)

    return Cell(p.name, pattern, kind, size, fn, k, k * payload_nbytes(kind, size))


def warm_up(fn: Callable[[], None], budget_s: float, max_rounds: int) -> float:
    """Runs ``fn`` at least 3 times and for ~20% of the budget; returns a round's time."""
    times: list[float] = []
    until = time.perf_counter() + 0.2 * budget_s
    while len(times) < 3 or (time.perf_counter() < until and len(times) < max_rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 2 :])


def plan_rounds(per_round_s: float, budget_s: float, min_rounds: int, max_rounds: int) -> int:
    return int(max(min_rounds, min(max_rounds, budget_s / max(per_round_s, 1e-9))))


def time_rounds(fn: Callable[[], None], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


@dataclass
class Result:
    impl: str
    pattern: str
    kind: str
    size: int | None
    rounds: int
    items_per_round: int
    bytes_per_round: int
    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    value: float = 0.0
    unit: str = ""
    samples_s: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.value, self.unit = headline(self.pattern, self.median_s, self)

    def as_dict(self, with_samples: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_samples:
            d.pop("samples_s")
        return d


def headline(pattern: str, median_s: float, r: Any) -> tuple[float, str]:
    """The number a table shows: us per round trip, GB/s (or kmsg/s) streaming."""
    if pattern == "roundtrip":
        return median_s * 1e6, "us"
    if r.bytes_per_round == 0:
        return r.items_per_round / median_s / 1e3, "kmsg/s"
    return r.bytes_per_round / median_s / 1e9, "GB/s"


def summarize(cell: Cell, samples: list[float]) -> Result:
    qs = np.quantile(samples, [0.1, 0.5, 0.9])
    return Result(
        impl=cell.impl,
        pattern=cell.pattern,
        kind=cell.kind,
        size=cell.size,
        rounds=len(samples),
        items_per_round=cell.items_per_round,
        bytes_per_round=cell.bytes_per_round,
        median_s=float(qs[1]),
        p10_s=float(qs[0]),
        p90_s=float(qs[2]),
        min_s=min(samples),
        samples_s=samples,
    )


def run_cell(
    p: Any,
    pattern: str,
    kind: str,
    size: int | None,
    budget_s: float = 0.5,
    min_rounds: int = 5,
    max_rounds: int = 2000,
) -> Result:
    """Warm up, calibrate, measure one cell; returns its result."""
    cell = prepare(p, pattern, kind, size)
    per_round = warm_up(cell.fn, budget_s, max_rounds)
    rounds = plan_rounds(per_round, budget_s, min_rounds, max_rounds)
    return summarize(cell, time_rounds(cell.fn, rounds))


# ----- session hygiene -----------------------------------------------------------------------
def skip_reason(impl: str, pattern: str, kind: str, size: int | None) -> str | None:
    """Why a combination is not measured (None: it is)."""
    if impl == "memcpy" and kind == "meta":
        return "memcpy is a byte-copy roofline; the meta dict has no byte size"
    if impl in RAY_IMPLS and kind in ("torch", "tensor_dict") and (size or 0) >= 64 * MiB:
        return (
            "Ray pickles torch tensors in band (torch.save bytes, several copies): "
            "seconds per 64 MiB item; the 16 MiB cell shows the trend"
        )
    return None


def shm_leftovers(namespace: str) -> list[str]:
    prefix = f"rlinf.{namespace}."
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix))


@contextlib.contextmanager
def bench_namespace() -> Iterator[str]:
    """A fresh channel namespace; on exit, checks no segment of it is left behind."""
    ns = f"chbench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    old = os.environ.get(NAMESPACE_ENV)
    os.environ[NAMESPACE_ENV] = ns
    try:
        yield ns
    finally:
        if old is None:
            os.environ.pop(NAMESPACE_ENV, None)
        else:
            os.environ[NAMESPACE_ENV] = old
        gc.collect()
        channel = sys.modules.get("rlinf.core.channel")
        release = getattr(channel, "release_created_channels", None)
        if release is not None:  # what this process's exit does (channels it created)
            release(ns)
        left = shm_leftovers(ns)
        if left:
            from rlinf.core.channel import cleanup_stale_segments

            cleanup_stale_segments(ns)
            raise RuntimeError(f"channel segments left behind in /dev/shm: {left}")


def env_info() -> dict[str, Any]:
    """Facts that explain a number: load, cores, kernel, CPU, versions."""
    info: dict[str, Any] = {
        "loadavg": os.getloadavg(),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    for mod in ("torch", "zmq", "ray"):
        if mod in sys.modules:
            info[mod] = getattr(sys.modules[mod], "__version__", "?")
    return info
