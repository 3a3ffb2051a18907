"""Crash safety: producers and consumers SIGKILLed mid-stream, leases reclaimed, no leaks."""

from __future__ import annotations

import asyncio
import gc
import mmap
import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlinf.core.channel import (
    Channel,
    cleanup_stale_segments,
    default_namespace,
    release_created_channels,
)

# pytest (--import-mode=importlib) imports this file under a dotted name that a
# child cannot import. Children unpickle their target by module name, so
# publish this module under its file name, with its folder on sys.path
# (children get the parent's sys.path).
_MODULE = Path(__file__).stem
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))
sys.modules.setdefault(_MODULE, sys.modules[__name__])


def child(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a module-level function as a child process target."""
    fn.__module__ = _MODULE
    return fn


# Bound of waits that must succeed long before it (generous: spawned and killed
# processes on 2 busy cores); no pass depends on the machine's speed.
WAIT_S = 60.0
# The forkserver imports the heavy modules once; each child is then a cheap
# fork of it, so 50 rounds of kill-and-restart stay fast on 2 cores. (This
# module itself cannot be preloaded: the forkserver does not get our sys.path
# before it preloads.)
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["numpy", "pytest", "rlinf.core.channel"])


def segment(name: str, namespace: str | None = None) -> Path:
    return Path(f"/dev/shm/rlinf.{namespace or default_namespace()}.{name}")


def kill(proc: mp.process.BaseProcess) -> None:
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(WAIT_S)
    assert proc.exitcode == -signal.SIGKILL


def start(target: Callable[..., Any], *args: Any) -> mp.process.BaseProcess:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


# ----- (a) producers killed mid-stream ---------------------------------------------------


def payload_size(round_: int, seq: int) -> int:
    """Uniform in 1 KiB .. 2 MiB, reproducible from (round, seq)."""
    return int(np.random.default_rng([round_, seq]).integers(1 << 10, (2 << 20) + 1))


def fill_value(round_: int, seq: int) -> int:
    return (seq * 37 + round_ * 11 + 1) % 256


@child
def stream_producer(ch: Channel, round_: int, last: Any) -> None:
    """Puts (round, seq, payload) forever; ``last`` is the last seq whose put returned."""
    ch.put(round_, key="ready")
    seq = 0
    while True:
        payload = np.full(payload_size(round_, seq), fill_value(round_, seq), np.uint8)
        ch.put((round_, seq, payload), key="data", timeout=WAIT_S)
        last.value = seq
        seq += 1


def check_item(item: Any, round_: int, expected_seq: int) -> None:
    assert item != "marker", f"item {expected_seq} of round {round_} never arrived"
    got_round, seq, payload = item
    assert (got_round, seq) == (round_, expected_seq), "item lost, duplicated or reordered"
    assert payload.dtype == np.uint8
    assert payload.shape == (payload_size(round_, seq),), "torn item: wrong length"
    assert (payload == fill_value(round_, seq)).all(), "torn item: wrong bytes"


def test_producer_sigkilled_mid_stream_never_tears_or_loses_items(channel_name: str) -> None:
    rounds = 120
    rng = random.Random(1234)
    ch = Channel.create(channel_name, maxsize=64, capacity_bytes=128 << 20)
    last = CTX.RawValue("q", -1)  # plain shared int: no lock a killed child could hold
    started = time.monotonic()
    totals, in_flight_published, mid_put = [], 0, 0
    for round_ in range(rounds):
        last.value = -1
        proc = start(stream_producer, ch, round_, last)
        assert ch.get("ready", timeout=WAIT_S) == round_
        kill_at = time.monotonic() + rng.uniform(0.0, 0.05)
        received = 0
        # Odd rounds consume while the producer runs (it often waits for room);
        # even rounds let it run flat out (the kill often lands mid-copy).
        if round_ % 2 == 0:
            time.sleep(max(0.0, kill_at - time.monotonic()))
        while (left := kill_at - time.monotonic()) > 0:
            try:
                item = ch.get("data", timeout=left)
            except TimeoutError:
                break
            check_item(item, round_, received)
            received += 1
            del item
        kill(proc)
        mid_put += ch.stats()["writing_blocks"] > 0  # the kill caught a put mid-copy
        returned = last.value + 1  # puts known to have completed
        assert received <= returned + 1
        # Every completed put must arrive; every wait is bounded.
        while received < returned:
            check_item(ch.get("data", timeout=WAIT_S), round_, received)
            received += 1
        # Then at most one more (the in-flight put, if it was published before the
        # kill), then the marker put now. An unpublished slot of the dead producer
        # must not block the marker behind it.
        ch.put("marker", key="data", timeout=WAIT_S)
        item = ch.get("data", timeout=WAIT_S)
        if item != "marker":
            check_item(item, round_, received)
            received += 1
            assert ch.get("data", timeout=WAIT_S) == "marker"
        del item
        assert returned <= received <= returned + 1
        in_flight_published += received == returned + 1
        totals.append(received)
    ch.reclaim()
    gc.collect()
    stats = ch.stats()
    assert stats["writing_blocks"] == 0 and stats["leased_blocks"] == 0, stats
    assert stats["queued_blocks"] == 0 and ch.qsize("data") == 0, stats
    # The channel still works after all that.
    ch.put(np.arange(10), key="data")
    assert np.array_equal(ch.get("data", timeout=WAIT_S), np.arange(10))
    assert sum(totals) > 0, "producers never got an item through"
    assert mid_put > 0, "no kill landed in the middle of a put"
    print(f"{rounds} kills: {sum(totals)} items, {mid_put} mid-put, {in_flight_published} ", end="")
    print(f"published in flight, {time.monotonic() - started:.1f} s")


@child
def put_one_array(name: str) -> None:
    Channel.connect(name, timeout=WAIT_S).put(np.full(1000, 5, np.uint8))


@pytest.mark.parametrize("state", ["slot_reserved_block_queued", "slot_ready_block_writing"])
def test_producer_killed_between_the_publish_stores_does_not_wedge_the_key(
    channel_name: str, state: str
) -> None:
    ch = Channel.create(channel_name, capacity_bytes=1 << 20)
    proc = start(put_one_array, channel_name)  # the first key used: lane 0, slot 0
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    # Fault injection: undo one of the two publish stores of the finished put,
    # as a SIGKILL between them would leave it (layout.rs, version 3). The
    # current order leaves slot READY + block WRITING; the older order left
    # slot RESERVED + block QUEUED. Both must heal.
    with open(segment(channel_name), "r+b") as f, mmap.mmap(f.fileno(), 0) as shm:
        assert shm[0:8] == b"RLCHAN01" and struct.unpack_from("<I", shm, 8)[0] == 3
        slots_off, blocks_off = struct.unpack_from("<QQ", shm, 48)
        assert struct.unpack_from("<I", shm, slots_off)[0] == 2  # READY
        block = struct.unpack_from("<I", shm, slots_off + 4)[0]
        if state == "slot_reserved_block_queued":
            struct.pack_into("<I", shm, slots_off, 1)  # slot RESERVED
        else:
            struct.pack_into("<I", shm, blocks_off + 64 * block + 16, 1)  # block WRITING
    ch.put("marker")
    got = ch.get(timeout=WAIT_S)  # the payload was complete: deliver it, or skip it
    if not isinstance(got, str):
        assert (got == 5).all()
        got = ch.get(timeout=WAIT_S)
    assert got == "marker"


# ----- (b) a consumer killed while it holds zero-copy views ------------------------------


@child
def hold_views(ch: Channel, batch: bool) -> None:
    items = ch.get_batch(2, timeout=WAIT_S) if batch else [ch.get(timeout=WAIT_S)]
    ch.put([int(it["arr"][0]) for it in items], key="holding")
    ch.get("never", timeout=WAIT_S)  # blocks, holding the views, until killed


@pytest.mark.parametrize("batch", [False, True], ids=["get", "get_batch"])
def test_killed_consumer_leases_are_reclaimed(channel_name: str, batch: bool) -> None:
    nbytes = 300 << 10  # one message takes more than a third of the arena
    ch = Channel.create(channel_name, capacity_bytes=1 << 20)
    n = 2 if batch else 1
    for i in range(n):
        ch.put({"arr": np.full(nbytes, i + 1, np.uint8)}, weight=1)
    proc = start(hold_views, ch, batch)
    assert ch.get("holding", timeout=WAIT_S) == list(range(1, n + 1))
    assert ch.stats()["leased_blocks"] == n
    assert ch.reclaim() == 0  # the holder is alive: nothing to take back
    # Fits only once the held blocks are back (single: 900 KiB; batch: 600 KiB).
    big = np.full((3 if n == 1 else 2) * nbytes, 9, np.uint8)
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(big)  # no room while the views live
    kill(proc)
    assert ch.reclaim() == n
    assert ch.stats()["leased_blocks"] == 0
    assert ch.reclaim() == 0
    ch.put_nowait(big)  # needs the reclaimed space
    got = ch.get(timeout=WAIT_S)
    assert got.shape == big.shape and (got == 9).all()


@child
def blocked_getter(ch: Channel) -> None:
    ch.put("waiting", key="status")
    ch.get("data", timeout=WAIT_S)


def test_killed_waiter_does_not_disturb_later_traffic(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=2, capacity_bytes=1 << 20)
    procs = [start(blocked_getter, ch) for _ in range(3)]
    for _ in procs:
        assert ch.get("status", timeout=WAIT_S) == "waiting"
    time.sleep(0.1)  # let them block in the futex wait
    for proc in procs:
        kill(proc)
    for i in range(20):
        ch.put(i, key="data", timeout=WAIT_S)
        assert ch.get("data", timeout=WAIT_S) == i
    assert ch.reclaim() == 0
    assert ch.stats()["leased_blocks"] == 0


# ----- (c) no /dev/shm leaks -----------------------------------------------------------


@child
def connect_and_hold(name: str, exit_normally: bool) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    ch.put("connected", key="status")
    if not exit_normally:
        ch.get("never", timeout=WAIT_S)


@child
def create_and_hold(name: str) -> None:
    ch = Channel.create(name, capacity_bytes=1 << 16)
    ch.put("stale", key="data")
    ch.put("created", key="status")
    ch.get("never", timeout=WAIT_S)


def test_create_replaces_the_segment_of_a_killed_creator(channel_name: str) -> None:
    proc = start(create_and_hold, channel_name)
    assert Channel.connect(channel_name, timeout=WAIT_S).get("status", timeout=WAIT_S) == "created"
    gc.collect()
    kill(proc)
    path = segment(channel_name)
    assert path.exists()  # nobody was left to unlink it
    fresh = Channel.create(channel_name, maxsize=2, capacity_bytes=1 << 16)
    assert fresh.maxsize == 2 and fresh.qsize("data") == 0  # a new channel, not the old one
    fresh.put("new", key="data")
    assert Channel.connect(channel_name).get_nowait("data") == "new"
    del fresh
    gc.collect()
    assert path.exists()  # this process created it and still runs
    assert release_created_channels() == 1
    assert not path.exists()


def test_segment_disappears_when_the_last_handle_and_view_go(channel_name: str) -> None:
    # Once its creator gives it up, a channel lives as long as any handle or view.
    ch = Channel.create(channel_name, capacity_bytes=1 << 20)
    path = segment(channel_name)
    twin = Channel.connect(channel_name)
    normal = start(connect_and_hold, channel_name, True)
    killed = start(connect_and_hold, channel_name, False)
    assert ch.get("status", timeout=WAIT_S) == "connected"
    assert ch.get("status", timeout=WAIT_S) == "connected"
    normal.join(WAIT_S)
    assert normal.exitcode == 0
    kill(killed)
    ch.put(np.arange(100))
    view = twin.get(timeout=WAIT_S)
    assert release_created_channels() == 0  # held: it goes with its last holder
    assert path.exists()
    del ch, twin
    gc.collect()
    assert path.exists(), "a live view must keep the segment"
    assert view.sum() == 4950
    del view
    gc.collect()
    assert not path.exists()


def test_segment_of_a_killed_creator_is_removed_by_the_janitor(channel_name: str) -> None:
    proc = start(create_and_hold, channel_name)
    ch = Channel.connect(channel_name, timeout=WAIT_S)
    assert ch.get("status", timeout=WAIT_S) == "created"
    del ch
    gc.collect()
    path = segment(channel_name)
    live = Channel.create(channel_name + "-live", capacity_bytes=1 << 16)
    # Held by nobody, but its creator (this process) runs: not stale either.
    Channel.create(channel_name + "-unheld", capacity_bytes=1 << 16)
    gc.collect()
    unheld = segment(channel_name + "-unheld")
    try:
        assert path.exists()  # still held by the child
        kill(proc)
        assert path.exists()  # nobody was left to unlink it
        assert path.name not in cleanup_stale_segments(default_namespace())  # too young
        old = time.time() - 3600
        for p in (path, segment(live.name), unheld):
            os.utime(p, (old, old))
        removed = cleanup_stale_segments(default_namespace())
        assert path.name in removed
        assert segment(live.name).name not in removed and unheld.name not in removed
        assert not path.exists() and segment(live.name).exists() and unheld.exists()
    finally:
        path.unlink(missing_ok=True)


_EXIT_HOLDING_A_VIEW = textwrap.dedent(
    """
    import sys
    import numpy as np
    {import_torch}
    from rlinf.core.channel import Channel
    ch = Channel.create(sys.argv[1], capacity_bytes=1 << 20)
    ch.put({payload})
    view = ch.get(timeout=5)
    """
)


@pytest.mark.parametrize(
    ("import_torch", "payload"),
    [("", "np.arange(10)"), ("import torch", "torch.arange(10)")],
    ids=["numpy", "torch"],
)
def test_process_exiting_with_a_live_view_leaves_no_segment(
    channel_name: str, import_torch: str, payload: str
) -> None:
    code = _EXIT_HOLDING_A_VIEW.format(import_torch=import_torch, payload=payload)
    path = segment(channel_name)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, channel_name], timeout=120, capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)
