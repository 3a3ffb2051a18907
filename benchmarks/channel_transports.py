"""Node transports of the channel, side by side: 64 MiB one-way and 64 B round trip.

    uv run python benchmarks/channel_transports.py [--mib 64] [--items 6] [--n 400]

A child process plays "another node": it reaches a channel homed in this
process through this process's ``ChannelAgent`` (``RLINF_CHANNEL_AGENT``),
with ``RLINF_CHANNEL_TRANSPORT`` (and ``UCX_TLS``) set per row:

- ``tcp``: the built-in TCP transport (the agent ``recv``s into the block);
- ``ucx-tcp``, ``ucx-sm``: UCX one-sided put/get restricted by ``UCX_TLS``
  (rows appear only where UCX is usable: ``ucx_unavailable_reason()``).

Measured here, in the parent: **one-way** = the child puts ``--items``
numpy arrays of ``--mib`` MiB, the parent takes them; GB/s over the items
after the first (the first pays connection set-up). **Round trip** = the
parent puts 64 bytes, the child takes them and puts 1 byte back; median
microseconds over ``--n`` trips after 50 warm-up trips. Both sides of the
remote hop run in the child, so a round trip crosses the agent twice.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
import uuid

import numpy as np

from rlinf.core.channel import (
    AGENT_ENV,
    TRANSPORT_ENV,
    Channel,
    ChannelAgent,
    ucx_unavailable_reason,
)

CTX = mp.get_context("spawn")
WAIT_S = 120.0


def _remote(name: str, mib: int, items: int, n: int) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    payload = np.ones(mib << 17, dtype=np.float64)  # mib MiB
    for _ in range(items):
        ch.put(payload, key="bulk", timeout=WAIT_S)
    for _ in range(n + 50):
        ch.get(key="ping", timeout=WAIT_S)
        ch.put(b"!", key="pong", timeout=WAIT_S)


def measure(transport: str, mib: int, items: int, n: int) -> tuple[float, float]:
    """Runs one row.

    Args:
        transport: ``tcp`` or ``ucx-<UCX_TLS>``.
        mib: Size of each one-way item in MiB.
        items: Number of one-way items.
        n: Number of timed round trips.

    Returns:
        One-way GB/s and the median round trip in microseconds.
    """
    agent = ChannelAgent("127.0.0.1:0")
    name = f"bench_tr_{uuid.uuid4().hex[:8]}"
    home = Channel.create(name, maxsize=4)
    env = {AGENT_ENV: agent.address, TRANSPORT_ENV: transport.split("-")[0]}
    if transport.startswith("ucx-"):
        env["UCX_TLS"] = transport.removeprefix("ucx-")
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        child = CTX.Process(target=_remote, args=(name, mib, items, n), daemon=True)
        child.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        home.get(key="bulk", timeout=WAIT_S)
        t0 = time.perf_counter()
        for _ in range(items - 1):
            home.get(key="bulk", timeout=WAIT_S)
        gbps = (items - 1) * (mib << 20) / (time.perf_counter() - t0) / 1e9
        msg = b"x" * 64
        trips = []
        for i in range(n + 50):
            t = time.perf_counter()
            home.put(msg, key="ping", timeout=WAIT_S)
            home.get(key="pong", timeout=WAIT_S)
            if i >= 50:
                trips.append(time.perf_counter() - t)
        child.join(WAIT_S)
        return gbps, statistics.median(trips) * 1e6
    finally:
        if child.is_alive():
            child.kill()
        agent.stop()


def main() -> None:
    """Prints one row per transport."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--items", type=int, default=6)
    p.add_argument("--n", type=int, default=400)
    a = p.parse_args()
    rows = ["tcp"] + (["ucx-tcp", "ucx-sm"] if ucx_unavailable_reason() is None else [])
    print(f"{'transport':<10} {f'{a.mib} MiB one-way GB/s':>22} {'64 B round trip us':>20}")
    for t in rows:
        gbps, rtt = measure(t, a.mib, a.items, a.n)
        print(f"{t:<10} {gbps:>22.2f} {rtt:>20.1f}")


if __name__ == "__main__":
    main()
