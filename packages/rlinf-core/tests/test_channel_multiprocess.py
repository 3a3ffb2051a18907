"""Channels between real processes (``spawn``): connect, order, fan-in, large arrays."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlinf.core.channel import Channel

# pytest (--import-mode=importlib) imports this file under a dotted name that a
# spawned child cannot import. Children unpickle their target by module name,
# so publish this module under its file name, with its folder on sys.path
# (spawn passes the parent's sys.path to the child).
_MODULE = Path(__file__).stem
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))
sys.modules.setdefault(_MODULE, sys.modules[__name__])


def child(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a module-level function as a spawn target."""
    fn.__module__ = _MODULE
    return fn


# Bound of waits that must succeed long before it: spawned children import
# numpy and the channel first, which takes seconds on 2 busy cores.
WAIT_S = 120.0
CTX = mp.get_context("spawn")


@pytest.fixture
def ch(channel_name: str) -> Iterator[Channel]:
    channel = Channel.create(channel_name, capacity_bytes=256 << 20)
    yield channel
    channel.close()


def start(target: Callable[..., Any], *args: Any) -> mp.process.BaseProcess:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def finish(*procs: mp.process.BaseProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    assert [p.exitcode for p in procs] == [0] * len(procs)


# ----- children (module level: spawn pickles them by name) ------------------------------


@child
def echo_by_name(name: str) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    request = ch.get("request", timeout=WAIT_S)
    ch.put(("echo-by-name", request, ch.namespace), key="reply")


@child
def echo_by_pickle(ch: Channel) -> None:
    request = ch.get("request", timeout=WAIT_S)
    ch.put(("echo-by-pickle", request, ch.namespace), key="reply")


@child
def produce_sequence(ch: Channel, producer: int, n: int) -> None:
    for seq in range(n):
        ch.put((producer, seq, np.full(8, seq, np.int32)), timeout=WAIT_S)


@child
def consume_sequence(ch: Channel, n: int) -> None:
    """Checks order itself and reports the outcome on the 'result' key."""
    expected = 0
    for _ in range(n):
        producer, seq, arr = ch.get(timeout=WAIT_S)
        if (producer, seq) != (0, expected) or not (arr == seq).all():
            ch.put(("bad", producer, seq, expected), key="result")
            return
        expected += 1
    ch.put(("ok", expected), key="result")


@child
def put_large_array(ch: Channel, nbytes: int, seed: int) -> None:
    arr = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    ch.put({"arr": arr, "digest": int(arr.astype(np.uint64).sum())}, timeout=WAIT_S)


# ----- tests ----------------------------------------------------------------------------


def test_child_connects_by_name(ch: Channel) -> None:
    proc = start(echo_by_name, ch.name)
    ch.put({"q": np.arange(5)}, key="request")
    kind, request, namespace = ch.get("reply", timeout=WAIT_S)
    finish(proc)
    assert kind == "echo-by-name"
    assert np.array_equal(request["q"], np.arange(5))
    assert namespace == ch.namespace  # inherited from $RLINF_CHANNEL_NAMESPACE


def test_child_connects_through_a_pickled_channel(ch: Channel) -> None:
    proc = start(echo_by_pickle, ch)
    ch.put("ping", key="request")
    assert ch.get("reply", timeout=WAIT_S) == ("echo-by-pickle", "ping", ch.namespace)
    finish(proc)


def test_a_thousand_items_in_order_between_two_processes(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=16, capacity_bytes=16 << 20)
    n = 1000
    procs = [start(produce_sequence, ch, 0, n), start(consume_sequence, ch, n)]
    result = ch.get("result", timeout=WAIT_S * 2)
    finish(*procs)
    assert result == ("ok", n)
    assert ch.qsize() == 0


def test_three_producers_into_one_consumer(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=8, capacity_bytes=16 << 20)
    n, producers = 300, 3
    procs = [start(produce_sequence, ch, p, n) for p in range(producers)]
    seen: dict[int, list[int]] = {p: [] for p in range(producers)}
    for _ in range(n * producers):
        producer, seq, arr = ch.get(timeout=WAIT_S)
        assert (arr == seq).all()
        seen[producer].append(seq)
        del arr
    finish(*procs)
    for p in range(producers):
        assert seen[p] == list(range(n)), f"producer {p}: lost, duplicated or reordered items"
    with pytest.raises(TimeoutError):
        ch.get(timeout=0.1)
    assert ch.stats()["leased_blocks"] == 0


def test_child_puts_a_32_mib_array(ch: Channel) -> None:
    nbytes, seed = 32 << 20, 7
    proc = start(put_large_array, ch, nbytes, seed)
    got = ch.get(timeout=WAIT_S)
    finish(proc)
    want = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    assert got["arr"].shape == (nbytes,) and got["arr"].dtype == np.uint8
    assert np.array_equal(got["arr"], want)
    assert got["digest"] == int(want.astype(np.uint64).sum())
    assert got["arr"].flags.writeable and not got["arr"].flags.owndata
    assert ch.stats()["leased_blocks"] == 1
