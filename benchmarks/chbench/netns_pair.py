"""Two "nodes" in two network namespaces joined by a veth pair, for the node-transport rows.

    python -m chbench.netns_pair home  --kind tcp|ucx|zmq --bind IP --mib M --items N --n K
    python -m chbench.netns_pair remote --kind tcp|ucx|zmq --address HOST:PORT --mib M ...

``benchmarks/test_channel_netns.py`` creates the namespaces and runs one
``home`` (in namespace A) and one ``remote`` (in namespace B) per row, each
under ``ip netns exec``. The home prints its address on its first line, then
one JSON line with its measurements:

- **one-way**: the remote sends ``items`` numpy arrays of ``mib`` MiB; the home
  takes them; GB/s over the items after the first (the first pays set-up);
- **round trip**: the home sends 64 bytes, the remote receives them and sends
  1 byte back; median microseconds over ``n`` trips after 50 warm-up trips.

Kinds: ``tcp`` and ``ucx`` are the channel (the remote reaches a channel homed
in the home process through its ``ChannelAgent``, ``RLINF_CHANNEL_TRANSPORT``
= kind; UCX restricted by ``UCX_TLS``/``UCX_NET_DEVICES``, set by the caller);
``zmq`` is pyzmq over tcp (one PAIR socket; the home receives each array as a
zero-copy frame and views it as numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

WAIT_S = 120.0
PORT_ZMQ = 47213


def _measure(
    recv_bulk: Callable[[], object], ping: Callable[[], None], items: int, mib: int, n: int
) -> dict[str, float]:
    recv_bulk()
    t0 = time.perf_counter()
    for _ in range(items - 1):
        recv_bulk()
    gbps = (items - 1) * (mib << 20) / (time.perf_counter() - t0) / 1e9
    trips = []
    for i in range(n + 50):
        t = time.perf_counter()
        ping()
        if i >= 50:
            trips.append(time.perf_counter() - t)
    return {"gbps": gbps, "rtt_us": statistics.median(trips) * 1e6}


def home(kind: str, bind: str, mib: int, items: int, n: int) -> None:
    """Serves one row and prints its address, then its measurements (JSON)."""
    if kind == "zmq":
        import zmq

        sock = zmq.Context.instance().socket(zmq.PAIR)
        sock.bind(f"tcp://{bind}:{PORT_ZMQ}")
        print(f"{bind}:{PORT_ZMQ}", flush=True)
        msg = b"x" * 64

        def recv_bulk_zmq() -> object:
            return np.frombuffer(sock.recv(copy=False).buffer, dtype=np.float64)

        def ping_zmq() -> None:
            sock.send(msg)
            sock.recv()

        out = _measure(recv_bulk_zmq, ping_zmq, items, mib, n)
    else:
        from rlinf.core.channel import Channel, ChannelAgent

        agent = ChannelAgent(f"{bind}:0")
        ch = Channel.create("netns_bench", maxsize=4)
        print(agent.address, flush=True)
        msg = b"x" * 64

        def recv_bulk_ch() -> object:
            return ch.get(key="bulk", timeout=WAIT_S)

        def ping_ch() -> None:
            ch.put(msg, key="ping", timeout=WAIT_S)
            ch.get(key="pong", timeout=WAIT_S)

        out = _measure(recv_bulk_ch, ping_ch, items, mib, n)
        agent.stop()
    print(json.dumps(out), flush=True)


def remote(kind: str, address: str, mib: int, items: int, n: int) -> None:
    """The other side of one row."""
    payload = np.ones(mib << 17, dtype=np.float64)  # mib MiB
    if kind == "zmq":
        import zmq

        sock = zmq.Context.instance().socket(zmq.PAIR)
        sock.connect(f"tcp://{address}")
        for _ in range(items):
            sock.send(payload, copy=False)
        for _ in range(n + 50):
            sock.recv()
            sock.send(b"!")
        sock.close(linger=int(WAIT_S * 1000))
        return
    from rlinf.core.channel import Channel

    os.environ["RLINF_CHANNEL_TRANSPORT"] = kind
    ch = Channel.connect("netns_bench", address=address, timeout=WAIT_S)
    assert ch.transport == kind, f"wanted {kind}, got {ch.transport}"
    for _ in range(items):
        ch.put(payload, key="bulk", timeout=WAIT_S)
    for _ in range(n + 50):
        ch.get(key="ping", timeout=WAIT_S)
        ch.put(b"!", key="pong", timeout=WAIT_S)


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["home", "remote"])
    p.add_argument("--kind", choices=["tcp", "ucx", "zmq"], required=True)
    p.add_argument("--bind", default="")
    p.add_argument("--address", default="")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--items", type=int, default=6)
    p.add_argument("--n", type=int, default=400)
    a = p.parse_args(argv)
    if a.role == "home":
        home(a.kind, a.bind, a.mib, a.items, a.n)
    else:
        remote(a.kind, a.address, a.mib, a.items, a.n)


if __name__ == "__main__":
    sys.exit(main())
