"""Where does a small round trip through the channel spend its time?

    uv run python benchmarks/profile_roundtrip.py [--kind bytes|numpy|torch] [--size 64] [--n 3000]

Two views:

1. Per-call costs in one process (no waiting): the public ``Channel.put`` /
   ``Channel.get`` against their parts (the pickle-5 serializer and the
   native ``ChannelCore`` calls underneath).
2. A timeline of cross-process round trips, stamped with ``perf_counter``
   (CLOCK_MONOTONIC, one clock for all processes) on both sides, once with
   the public API and once with the native calls plus the plain C pickler
   (``pickle.dumps(..., protocol=5, buffer_callback=...)``, out-of-band
   buffers included). The difference between the two is the Python layer.

This is a diagnostic tool: it reaches into ``Channel._core`` / ``_lane``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chbench.payloads import make_payload, touch

from rlinf.core.channel import Channel
from rlinf.core.channel.serialization import dumps, loads

clock = time.perf_counter


def lean_dumps(obj: object) -> tuple[bytes, list[memoryview]]:
    """The C pickler alone: no Pickler subclass, no BytesIO."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return header, [b.raw() for b in buffers]


def lean_loads(header: object, views: list[object]) -> object:
    return pickle.loads(header, buffers=views)  # type: ignore[arg-type]


def per_call(f, n: int = 20000) -> float:
    for _ in range(n // 10):
        f()
    t0 = clock()
    for _ in range(n):
        f()
    return (clock() - t0) / n * 1e6


def in_process(ch: Channel, payload: object) -> None:
    core, lane = ch._core, ch._lane("probe")
    header, buffers = dumps(payload)
    raw, raw_buffers = lean_dumps(payload)
    rows = [
        (
            "Channel.put + Channel.get (public API)",
            lambda: (ch.put(payload, "probe"), ch.get("probe")),
        ),
        ("  serialization.dumps", lambda: dumps(payload)),
        ("  serialization.loads", lambda: loads(header, buffers)),
        (
            "  ChannelCore.put + ChannelCore.get",
            lambda: (core.put(lane, header, buffers, 0, 0.25, False), core.get(lane, 0.25, False)),
        ),
        ("  plain C pickler dumps (protocol 5)", lambda: lean_dumps(payload)),
        ("  plain C pickler loads", lambda: lean_loads(raw, raw_buffers)),
        ("touch (what the benchmark consumer does)", lambda: touch(payload)),
    ]
    print(f"\n1. per call, one process, {type(payload).__name__} item (us)")
    for name, f in rows:
        print(f"   {name:44s} {per_call(f):7.2f}")


def endpoint(ch: Channel, rx: str, tx: str, native: bool):
    """(send, recv) over two keys: public API, or native calls + the plain C pickler."""
    if not native:
        return (lambda obj: ch.put(obj, tx, timeout=5.0)), (lambda: ch.get(rx, timeout=5.0))
    core, rx_lane, tx_lane = ch._core, ch._lane(rx), ch._lane(tx)

    def send(obj: object) -> None:
        core.put(tx_lane, *lean_dumps(obj), 0, 5.0, False)

    def recv() -> object:
        return lean_loads(*core.get(rx_lane, 5.0, False))

    return send, recv


def child(ch: Channel, n: int, native: bool) -> None:
    send, recv = endpoint(ch, rx="data", tx="ack", native=native)
    stamps = np.zeros((n, 3))
    for i in range(n):
        item = recv()
        got = clock()
        touch(item)
        del item
        touched = clock()
        send(b"k")
        stamps[i] = (got, touched, clock())
    ch.put(stamps, "stamps", timeout=5.0)


def timeline(ch: Channel, payload: object, n: int, native: bool) -> None:
    send, recv = endpoint(ch, rx="ack", tx="data", native=native)
    proc = mp.get_context("spawn").Process(target=child, args=(ch, n, native), daemon=True)
    proc.start()
    try:
        stamps = np.zeros((n, 3))
        for i in range(n):
            t0 = clock()
            send(payload)
            t1 = clock()
            recv()
            stamps[i] = (t0, t1, clock())
        theirs = ch.get("stamps", timeout=30.0)
    finally:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
    p, c = stamps[n // 10 :], theirs[n // 10 :]  # drop the warm-up tenth

    def med(x: np.ndarray) -> float:
        return float(np.median(x) * 1e6)

    what = "native ChannelCore calls + plain C pickler" if native else "public Channel API"
    print(f"\n2. cross-process timeline, {what} (median us)")
    print(f"   round trip                                    {med(p[:, 2] - p[:, 0]):7.1f}")
    print(f"   parent put returns                            {med(p[:, 1] - p[:, 0]):7.1f}")
    print(f"   -> child holds the item (wake + get + loads)  {med(c[:, 0] - p[:, 1]):7.1f}")
    print(f"   child touches it                              {med(c[:, 1] - c[:, 0]):7.1f}")
    print(f"   child put(ack) returns                        {med(c[:, 2] - c[:, 1]):7.1f}")
    print(f"   parent holds the ack, after that put returned {med(p[:, 2] - c[:, 2]):7.1f}")
    print(f"   parent holds the ack, after that put started  {med(p[:, 2] - c[:, 1]):7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--kind", choices=["bytes", "numpy", "torch"], default="bytes", help="item type"
    )
    parser.add_argument("--size", type=int, default=64, help="item size in bytes (default 64)")
    parser.add_argument("--n", type=int, default=3000, help="round trips per timeline")
    args = parser.parse_args()
    payload = make_payload(args.kind, args.size)
    namespace = f"chprof-{os.getpid()}"
    ch = Channel.create(f"profile-{uuid.uuid4().hex[:6]}", namespace=namespace)
    try:
        print(f"{args.kind} {args.size} B; cpus {os.cpu_count()}, loadavg {os.getloadavg()[0]:.2f}")
        in_process(ch, payload)
        timeline(ch, payload, args.n, native=False)
        timeline(ch, payload, args.n, native=True)
    finally:
        ch.close()
        del ch


if __name__ == "__main__":
    main()
