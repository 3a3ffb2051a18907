"""Channel ratios: our channel against baselines measured in the same run (~25 s).

Part of the benchmark tier (``uv run pytest benchmarks``), not of the default
``uv run pytest``. Every ratio compares two numbers taken seconds apart on the
same machine, never an absolute time: pytest-benchmark times each round
(``interleave`` in ``conftest.py``) and the candidates run in interleaved
blocks so that a burst of load from elsewhere hits all of them alike. Each
ratio becomes a row of the table printed at the end of the run (target and
floor: see README.md). That a ``get`` returns memory inside the channel is
behaviour and is tested in the default tier
(``packages/rlinf-core/tests/test_channel_zero_copy.py``).
"""

import contextlib
import uuid

import numpy as np
import pytest
from chbench.harness import MemcpyPeer, peer, prepare
from chbench.payloads import MiB

from rlinf.core import _native as native
from rlinf.core.channel import Channel

US = 1e6


# What the 64 B round trip measures depends on how our waits went, which the
# channel decides itself (crates/channel/src/spin.rs): with a spare core the
# waiter polls (a hand-off costs well under a microsecond); on a machine with
# more runnable tasks than cores it refuses to poll, so as not to steal a core,
# and sleeps on its futex at once. Then both paths are bound by the kernel's
# wake-ups (ours: 2 per round trip; mp.Queue: 4, with its feeder thread), and
# the ratio measures the sleeping path. Each regime has its own target and floor.
POLLING = {"target": 6.0, "floor": 3.0}
SLEEPING = {"target": 2.5, "floor": 1.25}


def sleeping_share(before: dict[str, int], after: dict[str, int]) -> float:
    """Share of this process's channel waits that skipped polling because the machine was loaded."""
    delta = {k: after[k] - before.get(k, 0) for k in after}
    polled = delta["spin_hit"] + delta["spin_miss"]
    loaded = delta["skip_loaded"]
    return loaded / (polled + loaded) if polled + loaded else 0.0


def test_64B_roundtrip_vs_mp_queue_and_zmq(namespace, interleave, record_ratio):
    """A 64-byte item out and a 1-byte ack back, between two processes."""
    impls = ["ours", "mp_queue", "zmq_ipc"]
    with contextlib.ExitStack() as stack:
        peers = {i: stack.enter_context(peer(i, namespace, max_item_bytes=MiB)) for i in impls}
        fns = {i: prepare(p, "roundtrip", "bytes", 64).fn for i, p in peers.items()}
        waits = native.wait_stats()
        stats = interleave(fns, blocks=8, rounds=300, warmup_rounds=500)
        share = sleeping_share(waits, native.wait_stats())
        regime = SLEEPING if share > 0.5 else POLLING
        if stats["mp_queue"].median / stats["ours"].median < regime["target"]:
            # One re-measurement: a burst of load from another process (spinning
            # waiters lose their core) can skew a single pass.
            waits = native.wait_stats()
            stats = interleave(fns, blocks=8, rounds=300, warmup_rounds=100, label="#2")
            share = sleeping_share(waits, native.wait_stats())
            regime = SLEEPING if share > 0.5 else POLLING

    med = {i: s.median * US for i, s in stats.items()}
    # Two fixed row names, one per regime; the share goes to the log.
    mode = "sleeping (machine loaded)" if regime is SLEEPING else "polling"
    print(f"\n64 B round trip: {share:.0%} of our waits skipped polling (machine loaded)")
    record_ratio(
        f"channel 64 B round trip vs mp.Queue, {mode}",
        med["ours"],
        med["mp_queue"],
        unit="us",
        baseline_name="mp.Queue",
        target=regime["target"],
        floor=regime["floor"],
        higher_is_better=False,
    )
    record_ratio(
        "channel 64 B round trip vs pyzmq ipc",
        med["ours"],
        med["zmq_ipc"],
        unit="us",
        baseline_name="zmq ipc",
        target=1.0,
        floor=0.5,
        higher_is_better=False,
    )


@pytest.fixture(scope="module")
def ours_peer(namespace):
    with peer("ours", namespace) as p:
        yield p


@pytest.mark.parametrize("size", [16 * MiB, 64 * MiB], ids=["16MiB", "64MiB"])
def test_large_stream_vs_memcpy(ours_peer, size, interleave, record_ratio):
    """K numpy arrays back to back; the consumer reads every page, then acks."""
    memcpy = MemcpyPeer()
    cells = {
        "ours": prepare(ours_peer, "stream", "numpy", size),
        "memcpy": prepare(memcpy, "stream", "numpy", size),  # two alternating destinations
        "memcpy_single": prepare(memcpy, "roundtrip", "numpy", size),  # one reused destination
    }
    stats = interleave({i: c.fn for i, c in cells.items()}, blocks=8, rounds=4, warmup_rounds=3)
    gbps = {i: cells[i].bytes_per_round / stats[i].median / 1e9 for i in cells}
    mib = size // MiB
    record_ratio(
        f"channel {mib} MiB numpy stream vs np.copyto",
        gbps["ours"],
        gbps["memcpy"],
        unit="GB/s",
        baseline_name="np.copyto (2 buffers)",
        target=0.7,
        floor=0.35,
    )
    record_ratio(
        f"channel {mib} MiB numpy stream vs np.copyto, one buffer",
        gbps["ours"],
        gbps["memcpy_single"],
        unit="GB/s",
        baseline_name="np.copyto (1 buffer)",
        target=None,  # partly in L3 at 16 MiB: no pipeline reaches it (README.md)
        floor=None,
    )


class QueuedGets:
    """Per key: ``queued`` arrays are put, untimed, whenever the key is empty; a round takes one.

    The arrays taken before a refill are dropped then. (A get right behind the
    put of 64 MiB costs ~0.1 ms more while the writes of that put settle: not
    what this measures.)
    """

    def __init__(self, ch: Channel, items: dict[str, np.ndarray], queued: int) -> None:
        self.ch: Channel | None = ch
        self.items = items
        self.queued = queued
        self.held: dict[str, list[np.ndarray]] = {key: [] for key in items}

    def setup(self, key: str):
        def refill() -> None:
            if len(self.held[key]) % self.queued == 0:
                self.held[key].clear()
                for _ in range(self.queued):
                    self.ch.put(self.items[key], key=key, timeout=30)

        return refill

    def take(self, key: str):
        held = self.held[key]
        return lambda: held.append(self.ch.get(key, timeout=30))

    def close(self) -> None:
        for held in self.held.values():
            held.clear()
        if self.ch is not None:
            self.ch.close()
            self.ch = None  # the segment goes when the last reference does


def test_get_of_queued_array_costs_the_same_at_1MiB_and_64MiB(namespace, interleave, record_ratio):
    """Taking a queued array: no copy on get, so 64 MiB costs about what 1 MiB does."""
    queued = 6
    name = f"smoke-get-{uuid.uuid4().hex[:6]}"
    items = {
        "1MiB": np.full(MiB // 4, 1.5, dtype=np.float32),
        "64MiB": np.full(64 * MiB // 4, 1.5, dtype=np.float32),
    }
    gets = QueuedGets(
        Channel.create(name, namespace=namespace, capacity_bytes=1 << 30), items, queued
    )
    try:
        stats = interleave(
            {key: gets.take(key) for key in items},
            setup={key: gets.setup(key) for key in items},
            blocks=4,
            rounds=queued,
            warmup_rounds=queued,
        )
    finally:
        gets.close()
    record_ratio(
        "channel get of a queued array, 64 MiB vs 1 MiB",
        stats["64MiB"].median * US,
        stats["1MiB"].median * US,
        unit="us",
        baseline_name="1 MiB get",
        target=1 / 3,  # 64 MiB within 3x of 1 MiB
        floor=1 / 6,
        higher_is_better=False,
    )


def test_tcp_stream_64MiB_vs_zmq_tcp(namespace, interleave, record_ratio):
    """64 MiB numpy arrays streamed over loopback TCP: our agent path vs pyzmq tcp://."""
    impls = ["ours_tcp", "zmq_tcp"]
    size = 64 * MiB
    with contextlib.ExitStack() as stack:
        peers = {i: stack.enter_context(peer(i, namespace)) for i in impls}
        cells = {i: prepare(p, "stream", "numpy", size) for i, p in peers.items()}
        stats = interleave({i: c.fn for i, c in cells.items()}, blocks=3, rounds=2, warmup_rounds=2)
    gbps = {i: cells[i].bytes_per_round / stats[i].median / 1e9 for i in impls}
    record_ratio(
        "channel 64 MiB numpy stream over TCP vs pyzmq tcp",
        gbps["ours_tcp"],
        gbps["zmq_tcp"],
        unit="GB/s",
        baseline_name="zmq tcp",
        target=1.0,
        floor=0.5,
    )


def test_tcp_stream_64MiB_tls_vs_plain(namespace, interleave, record_ratio):
    """64 MiB numpy arrays streamed over loopback TCP through an agent, TLS vs plain (info).

    Both peers are our agent path (``ours_tcp``); the TLS one connects with
    ``RLINF_CHANNEL_TLS=1``, so every payload byte is encrypted by the
    producer and decrypted by the agent (AES-GCM or ChaCha20-Poly1305,
    whichever TLS 1.3 negotiates) and copied once more through rustls's
    buffers. The price of the option, measured, not a goal.
    """
    if not native.TLS_COMPILED:
        pytest.skip("the extension was built without the `tls` cargo feature")
    impls = ["ours_tcp_tls", "ours_tcp"]
    size = 64 * MiB
    with contextlib.ExitStack() as stack:
        peers = {i: stack.enter_context(peer(i, namespace)) for i in impls}
        cells = {i: prepare(p, "stream", "numpy", size) for i, p in peers.items()}
        stats = interleave({i: c.fn for i, c in cells.items()}, blocks=3, rounds=2, warmup_rounds=2)
    gbps = {i: cells[i].bytes_per_round / stats[i].median / 1e9 for i in impls}
    print(f"GB/s: TLS {gbps['ours_tcp_tls']:.2f}, plain {gbps['ours_tcp']:.2f}")
    record_ratio(
        "channel 64 MiB numpy stream over TCP: TLS vs plain",
        gbps["ours_tcp_tls"],
        gbps["ours_tcp"],
        unit="GB/s",
        baseline_name="plain TCP",
        target=None,
        floor=None,
    )


def test_agent_connection_setup_with_authentication(namespace, interleave, record_ratio):
    """What authentication adds to reaching a channel through an agent (info rows).

    Three candidates against one in-process agent on loopback: a bare TCP connect
    and close (no agent protocol at all); ``Channel.connect(address=...)``, which
    connects, runs the HMAC handshake (two round trips) and opens the channel;
    and the handshake alone is their difference. Connections are set up once
    per process and channel, so this is a start-up cost, not a per-item one.
    """
    import socket

    agent = native.ChannelAgent("127.0.0.1:0")
    name = f"auth{uuid.uuid4().hex[:8]}"
    home = Channel.create(name, namespace=namespace)
    host, port = agent.address.rsplit(":", 1)

    def tcp_connect() -> None:
        socket.create_connection((host, int(port))).close()

    def channel_connect() -> None:
        Channel.connect(name, namespace=namespace, address=agent.address).close()

    try:
        stats = interleave(
            {"tcp_connect": tcp_connect, "channel_connect": channel_connect},
            blocks=4,
            rounds=50,
            warmup_rounds=20,
        )
    finally:
        home.close()
        agent.stop()
    record_ratio(
        "agent connection set-up: Channel.connect over TCP (connect, authenticate, open) "
        "vs a bare TCP connect",
        stats["channel_connect"].median * US,
        stats["tcp_connect"].median * US,
        unit="us",
        baseline_name="bare TCP connect",
        target=None,
        floor=None,
        higher_is_better=False,
    )
