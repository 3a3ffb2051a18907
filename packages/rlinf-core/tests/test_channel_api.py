"""``Channel`` API in one process: payloads, zero copy, keys, backpressure, batches, close, errors.

Everything runs against real shared memory; threads stand in for peers where
a call has to block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf.core.channel import (
    DEFAULT_KEY,
    Channel,
    ChannelClosed,
    ChannelError,
    ChannelExists,
    ChannelNotFound,
    default_namespace,
    release_created_channels,
)

# Bound of waits that must succeed, or be woken (by a put, a close), long before
# it: no pass depends on the machine's speed, and pytest-timeout catches a hang.
# Timeouts that must fire are checked from below only (load cannot shorten them).
WAIT_S = 60.0


@pytest.fixture
def ch(channel_name: str) -> Iterator[Channel]:
    channel = Channel.create(channel_name, capacity_bytes=64 << 20)
    yield channel
    channel.close()


def leased(channel: Channel) -> int:
    gc.collect()
    return channel.stats()["leased_blocks"]


def roundtrip(channel: Channel, item: Any) -> Any:
    channel.put(item)
    return channel.get(timeout=WAIT_S)


class Worker:
    """Runs ``fn`` in a daemon thread and records its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as err:
            self.error = err
        finally:
            self.done.set()

    def join(self, timeout: float = 2 * WAIT_S) -> Any:
        assert self.done.wait(timeout), "worker thread did not finish"
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result


def let_block() -> None:
    """Gives a thread time to reach its blocking call (not used as synchronisation)."""
    time.sleep(0.2)


# ----- payloads -------------------------------------------------------------------------


@dataclasses.dataclass
class Rollout:
    obs: np.ndarray
    actions: torch.Tensor
    info: dict[str, Any]


def assert_same(got: Any, want: Any) -> None:
    """Deep equality that also checks container types, dtypes and shapes."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind in "fc":
            np.testing.assert_array_equal(got, want)
        else:
            assert np.array_equal(got, want)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.requires_grad == want.requires_grad
        assert torch.equal(got.detach(), want.detach())
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            assert_same(getattr(got, field.name), getattr(want, field.name))
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


PLAIN_ITEMS = {
    "bytes": b"\x00\x01payload\xff",
    "empty_bytes": b"",
    "bytearray": bytearray(b"abc"),
    "str": "héllo wörld ✓",
    "none": None,
    "int": 2**80,
    "float": -1.5e300,
    "bool": True,
    "nested": {"a": [1, (2, 3.0), {"b": None}], "c": ("x", [b"y"]), 7: {frozenset({1})}},
    "tuple": (1, "two", (3,)),
    "large_bytes": os.urandom(1 << 20),
}


@pytest.mark.parametrize("item", PLAIN_ITEMS.values(), ids=PLAIN_ITEMS.keys())
def test_plain_items_round_trip(ch: Channel, item: Any) -> None:
    assert_same(roundtrip(ch, item), item)


def test_items_without_arrays_are_copied_out_and_freed(ch: Channel) -> None:
    # Small and large (over the copy-out threshold) messages: nothing stays leased.
    got = [roundtrip(ch, {"x": 1}), roundtrip(ch, b"z" * (1 << 20))]
    assert got[1] == b"z" * (1 << 20)
    assert leased(ch) == 0
    assert ch.stats()["queued_blocks"] == 0


NUMPY_ARRAYS = {
    "c_order": np.arange(24, dtype=np.float64).reshape(2, 3, 4),
    "f_order": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    "zero_d": np.array(3.25),
    "empty": np.zeros((0, 5), dtype=np.float32),
    "bool": np.array([True, False, True]),
    "int8": np.array([-128, 0, 127], dtype=np.int8),
    "uint16": np.arange(1000, dtype=np.uint16),
    "int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "float16": np.linspace(-2, 2, 17, dtype=np.float16),
    "float32_nan_inf": np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32),
    "complex128": np.array([1 + 2j, -3j]),
    "datetime64": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
    "structured": np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    "unicode": np.array(["ab", "çd"]),
    "object": np.array([1, "a", None], dtype=object),
    "non_contiguous": np.arange(20).reshape(4, 5)[:, ::2],
    "big_endian": np.arange(5, dtype=">u4"),
}


@pytest.mark.parametrize("array", NUMPY_ARRAYS.values(), ids=NUMPY_ARRAYS.keys())
def test_numpy_arrays_round_trip(ch: Channel, array: np.ndarray) -> None:
    got = roundtrip(ch, array)
    assert_same(got, array)
    if array.flags.f_contiguous and not array.flags.c_contiguous:
        assert got.flags.f_contiguous


TENSORS = {
    "float32": torch.randn(3, 4),
    "bfloat16": torch.randn(5, 3).to(torch.bfloat16),
    "float16": torch.randn(8).half(),
    "float64": torch.randn(2, 2, dtype=torch.float64),
    "int64": torch.arange(-5, 5),
    "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "uint8": torch.arange(256, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "zero_d": torch.tensor(7.5),
    "empty": torch.zeros(0, 3),
    "complex64": torch.randn(3, dtype=torch.complex64),
}


@pytest.mark.parametrize("tensor", TENSORS.values(), ids=TENSORS.keys())
def test_torch_tensors_round_trip(ch: Channel, tensor: torch.Tensor) -> None:
    got = roundtrip(ch, tensor)
    assert_same(got, tensor)
    assert got.device.type == "cpu"


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).reshape(3, 4).t(),
        lambda: torch.arange(40).reshape(5, 8)[1:4, ::3],
        lambda: torch.arange(24).reshape(2, 3, 4).permute(2, 0, 1),
        lambda: torch.arange(10.0).expand(3, 10),
    ],
    ids=["transposed", "sliced", "permuted", "expanded"],
)
def test_non_contiguous_tensor_arrives_contiguous(
    ch: Channel, make: Callable[[], torch.Tensor]
) -> None:
    tensor = make()
    assert not tensor.is_contiguous()
    got = roundtrip(ch, tensor)
    assert got.is_contiguous()
    assert got.shape == tensor.shape and got.dtype == tensor.dtype
    assert torch.equal(got, tensor)


def test_requires_grad_is_preserved(ch: Channel) -> None:
    leaf = torch.randn(4, requires_grad=True)
    non_leaf = leaf * 2  # part of a graph: arrives detached, still requiring grad
    plain = torch.randn(4)
    got_leaf, got_non_leaf, got_plain = roundtrip(ch, (leaf, non_leaf, plain))
    assert got_leaf.requires_grad and got_leaf.is_leaf
    assert got_non_leaf.requires_grad and got_non_leaf.is_leaf
    assert not got_plain.requires_grad
    assert torch.equal(got_non_leaf.detach(), non_leaf.detach())
    got_leaf.sum().backward()  # usable as a leaf
    assert torch.equal(got_leaf.grad, torch.ones(4))


def test_inference_tensors_arrive_as_ordinary_tensors(ch: Channel) -> None:
    """The env worker's loops run under ``torch.inference_mode()``: what they put
    (trajectories, observations) must arrive as tensors autograd can use."""
    weight = torch.randn(2, 3, requires_grad=True)
    with torch.inference_mode():
        states = torch.randn(4, 3) * 2
        sent = {"states": states, "rows": states[1:3]}
    assert sent["states"].is_inference()
    got = roundtrip(ch, sent)
    assert not any(t.is_inference() for t in got.values())
    assert torch.equal(got["states"], states) and torch.equal(got["rows"], states[1:3])
    got["states"][0] = 0.0  # writable outside inference mode
    (got["states"] @ weight.t()).sum().backward()  # and usable where autograd saves it
    assert weight.grad is not None


def test_dataclass_with_tensors_and_arrays(ch: Channel) -> None:
    item = Rollout(
        obs=np.random.default_rng(0).integers(0, 255, (4, 84, 84), dtype=np.uint8),
        actions=torch.randn(4, 6),
        info={"ids": np.arange(4), "mask": torch.ones(4, dtype=torch.bool), "step": 3},
    )
    got = roundtrip(ch, item)
    assert isinstance(got, Rollout)
    assert_same(got, item)
    assert leased(ch) == 1  # all four arrays share one block
    del got
    assert leased(ch) == 0


def test_same_array_twice_arrives_twice_with_equal_values(ch: Channel) -> None:
    a = np.arange(6)
    x, y = roundtrip(ch, [a, a])
    assert np.array_equal(x, a) and np.array_equal(y, a)


# ----- zero copy ----------------------------------------------------------------------


def test_received_array_is_a_writable_view_of_the_block(ch: Channel) -> None:
    sent = np.arange(1000, dtype=np.int64)
    got = roundtrip(ch, sent)
    assert got.flags.writeable and not got.flags.owndata
    assert leased(ch) == 1
    got[:] = -1
    assert (got == -1).all()
    assert np.array_equal(sent, np.arange(1000))  # the sender's copy is untouched
    view = got[10:20]  # a derived view keeps the block alive too
    del got
    assert leased(ch) == 1
    assert (view == -1).all()
    del view
    assert leased(ch) == 0
    assert ch.stats()["free_blocks"] == ch.stats()["blocks"]


def test_received_tensor_is_writable_and_holds_the_block(ch: Channel) -> None:
    sent = torch.zeros(256, dtype=torch.float32)
    got = roundtrip(ch, sent)
    assert leased(ch) == 1
    got += 5
    assert torch.equal(got, torch.full((256,), 5.0))
    assert torch.equal(sent, torch.zeros(256))
    del got
    assert leased(ch) == 0


def test_one_surviving_array_of_a_message_keeps_its_block(ch: Channel) -> None:
    got = roundtrip(ch, {"a": np.ones(10), "b": np.zeros(10), "c": "text"})
    keep = got["b"]
    del got
    assert leased(ch) == 1
    del keep
    assert leased(ch) == 0


def test_each_received_message_leases_its_own_block(ch: Channel) -> None:
    for i in range(3):
        ch.put(np.full(100, i))
    got = [ch.get(timeout=WAIT_S) for _ in range(3)]
    assert [int(a[0]) for a in got] == [0, 1, 2]
    assert leased(ch) == 3
    got.pop(1)
    assert leased(ch) == 2
    got.clear()
    assert leased(ch) == 0


# ----- keys ---------------------------------------------------------------------------


def test_fifo_per_key_and_keys_are_independent(ch: Channel) -> None:
    for i in range(20):
        ch.put(("a", i), key="a")
        if i % 2 == 0:
            ch.put(("b", i), key="b")
    assert ch.qsize("a") == 20 and ch.qsize("b") == 10 and ch.qsize() == 0
    assert [ch.get("b", timeout=WAIT_S) for _ in range(10)] == [("b", i) for i in range(0, 20, 2)]
    assert [ch.get("a", timeout=WAIT_S) for _ in range(20)] == [("a", i) for i in range(20)]
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait(DEFAULT_KEY)


@pytest.mark.parametrize(
    "keys",
    [
        ["x", "y", ""],
        [0, 1, -(2**40)],
        [("stage", 0), ("stage", 1), ("stage", 0, "b")],
        [b"raw", b"raw2", "raw"],
        ["1", 1, (1,)],
    ],
    ids=["str", "int", "tuple", "bytes", "same-text-different-type"],
)
def test_keys_of_any_type_are_distinct_lanes(ch: Channel, keys: list[Any]) -> None:
    for k in keys:
        ch.put(repr(k), key=k)
    other = Channel.connect(ch.name)  # a fresh handle maps keys to the same lanes
    for k in keys:
        assert other.qsize(k) == 1
        assert other.get_nowait(k) == repr(k)
        assert ch.empty(k)


def test_too_long_key_and_too_many_keys_are_rejected(channel_name: str) -> None:
    small = Channel.create(channel_name, max_keys=2, capacity_bytes=1 << 16)
    small.put(1, key="k1")
    small.put(2, key="k2")
    with pytest.raises(ValueError, match="max_keys"):
        small.put(3, key="k3")
    with pytest.raises(ValueError, match="shorter key"):
        small.put(4, key="x" * 500)
    assert small.get_nowait("k1") == 1 and small.get_nowait("k2") == 2


def test_equal_keys_of_different_types_map_to_the_same_lane_on_every_handle(
    ch: Channel,
) -> None:
    ch.put("item", key=1)
    seen_by_this_handle = ch.qsize(True)  # 1: served from the lane cache of key 1
    seen_by_a_fresh_handle = Channel.connect(ch.name).qsize(True)  # 0: its own lane
    assert seen_by_this_handle == seen_by_a_fresh_handle


# ----- backpressure, get timeouts -----------------------------------------------------


def test_put_blocks_while_the_key_is_full_until_a_get(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=2, capacity_bytes=1 << 20)
    ch.put(1)
    ch.put(2)
    assert ch.full()
    ch.put("other key is not full", key="other")
    putter = Worker(lambda: ch.put(3, timeout=WAIT_S))
    assert not putter.done.wait(0.3), "put returned although the key was full"
    assert ch.qsize() == 2
    assert ch.get(timeout=WAIT_S) == 1
    putter.join()
    assert [ch.get(timeout=WAIT_S), ch.get(timeout=WAIT_S)] == [2, 3]
    assert ch.get("other", timeout=WAIT_S) == "other key is not full"


def test_put_nowait_on_full_key_raises_queue_full_and_puts_nothing(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=1, capacity_bytes=1 << 20)
    ch.put_nowait("first")
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait("second")
    assert ch.qsize() == 1
    assert ch.get_nowait() == "first"
    ch.put_nowait("third")
    assert ch.get_nowait() == "third"


def test_put_timeout_on_full_key(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=1, capacity_bytes=1 << 20)
    ch.put(0)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ch.put(1, timeout=0.1)
    assert time.monotonic() - start >= 0.09
    assert ch.qsize() == 1


def test_arena_space_is_backpressure_too(channel_name: str) -> None:
    ch = Channel.create(channel_name, capacity_bytes=1 << 16)
    ch.put(np.zeros(40_000, np.uint8))
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(np.zeros(40_000, np.uint8))
    with pytest.raises(TimeoutError):
        ch.put(np.ones(40_000, np.uint8), timeout=0.05)
    held = ch.get(timeout=WAIT_S)  # taken but still leased: space is not back yet
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(np.zeros(40_000, np.uint8))
    putter = Worker(lambda: ch.put(np.full(40_000, 9, np.uint8), timeout=WAIT_S))
    assert not putter.done.wait(0.3)
    del held
    gc.collect()  # the last view goes: the block returns and wakes the putter
    putter.join()
    assert (ch.get(timeout=WAIT_S) == 9).all()


def test_get_nowait_on_empty_raises_queue_empty(ch: Channel) -> None:
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()
    ch.put("x", key="elsewhere")
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()


@pytest.mark.parametrize("timeout", [0.0, 0.05, 0.3])
def test_get_timeout_bounds(ch: Channel, timeout: float) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ch.get(timeout=timeout)
    assert time.monotonic() - start >= timeout * 0.95  # waited the whole timeout


def test_get_with_zero_timeout_returns_a_ready_item(ch: Channel) -> None:
    ch.put("ready")
    assert ch.get(timeout=0) == "ready"


def test_get_waits_for_a_put_from_another_thread(ch: Channel) -> None:
    getter = Worker(lambda: ch.get(timeout=WAIT_S))
    assert not getter.done.wait(0.2)
    ch.put({"late": np.arange(3)})
    got = getter.join()
    assert np.array_equal(got["late"], np.arange(3))


# ----- get_batch ----------------------------------------------------------------------


def put_weighted(ch: Channel, weights: list[int], key: Any = DEFAULT_KEY) -> None:
    for i, w in enumerate(weights):
        ch.put((i, w), key=key, weight=w)


@pytest.mark.parametrize(
    ("weights", "target", "taken"),
    [
        ([1, 2, 3], 3, 2),  # 1+2 reaches 3
        ([3, 1], 3, 1),  # exactly the first
        ([0, 0, 2, 1], 2, 3),  # zero weights ride along until the target
        ([2, 0, 1], 2, 1),  # stops as soon as the target is reached
        ([1, 1, 1, 1, 1], 4, 4),
        ([5], 5, 1),
    ],
)
def test_get_batch_takes_fifo_up_to_the_target(
    ch: Channel, weights: list[int], target: int, taken: int
) -> None:
    put_weighted(ch, weights)
    batch = ch.get_batch(target, timeout=WAIT_S)
    assert batch == [(i, w) for i, w in enumerate(weights)][:taken]
    assert ch.qsize() == len(weights) - taken


@pytest.mark.parametrize(("weights", "target"), [([1, 3], 3), ([4], 3), ([2, 2], 3)])
def test_get_batch_overshoot_raises_value_error_and_takes_nothing(
    ch: Channel, weights: list[int], target: int
) -> None:
    put_weighted(ch, weights)
    with pytest.raises(ValueError, match="past the target"):
        ch.get_batch(target, timeout=WAIT_S)
    assert ch.qsize() == len(weights)
    assert ch.get_nowait() == (0, weights[0])


def test_get_batch_times_out_without_taking_anything(ch: Channel) -> None:
    put_weighted(ch, [1, 1])
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ch.get_batch(3, timeout=0.2)
    assert time.monotonic() - start >= 0.19
    assert ch.qsize() == 2


def test_get_batch_waits_for_weight_from_another_thread(ch: Channel) -> None:
    ch.put("first", weight=1)
    getter = Worker(lambda: ch.get_batch(4, timeout=WAIT_S))
    assert not getter.done.wait(0.2)
    ch.put("second", weight=2)
    assert not getter.done.wait(0.2), "batch returned before reaching its target"
    ch.put("third", weight=1)
    ch.put("fourth", weight=1)
    assert getter.join() == ["first", "second", "third"]
    assert ch.get_nowait() == "fourth"


def test_get_batch_by_the_main_thread_while_a_thread_produces(ch: Channel) -> None:
    def produce() -> None:
        let_block()
        for i in range(10):
            ch.put(np.full(8, i), weight=1)

    producer = Worker(produce)
    batch = ch.get_batch(10, timeout=WAIT_S)
    producer.join()
    assert [int(a[0]) for a in batch] == list(range(10))
    assert leased(ch) == 10
    del batch
    assert leased(ch) == 0


def test_get_batch_rejects_non_positive_targets(ch: Channel) -> None:
    for target in (0, -1):
        with pytest.raises(ValueError, match="target_weight"):
            ch.get_batch(target)


# ----- qsize / empty / full -----------------------------------------------------------


def test_qsize_empty_full(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=2, capacity_bytes=1 << 20)
    assert (ch.qsize(), ch.empty(), ch.full()) == (0, True, False)
    ch.put("a")
    assert (ch.qsize(), ch.empty(), ch.full()) == (1, False, False)
    ch.put("b")
    assert (ch.qsize(), ch.empty(), ch.full()) == (2, False, True)
    assert ch.empty("k") and not ch.full("k")
    ch.get_nowait()
    assert (ch.qsize(), ch.empty(), ch.full()) == (1, False, False)


def test_unbounded_channel_is_never_full(ch: Channel) -> None:
    for i in range(100):
        ch.put_nowait(i)
    assert ch.maxsize == 0 and not ch.full() and ch.qsize() == 100


# ----- close --------------------------------------------------------------------------


def test_close_wakes_a_blocked_getter(ch: Channel) -> None:
    getter = Worker(lambda: ch.get(timeout=WAIT_S))
    assert not getter.done.wait(0.2)
    ch.close()
    # Woken by the close: ChannelClosed, not a TimeoutError after WAIT_S.
    with pytest.raises(ChannelClosed):
        getter.join()


def test_close_wakes_a_blocked_putter_and_batch_getter(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=1, capacity_bytes=1 << 20)
    ch.put("fills the key")
    putter = Worker(lambda: ch.put("blocked", timeout=WAIT_S))
    batcher = Worker(lambda: ch.get_batch(5, key="b", timeout=WAIT_S))
    assert not putter.done.wait(0.2) and not batcher.done.is_set()
    ch.close()
    for worker in (putter, batcher):  # woken: ChannelClosed, not a TimeoutError
        with pytest.raises(ChannelClosed):
            worker.join()


def test_after_close_puts_fail_and_gets_drain(ch: Channel) -> None:
    ch.put("queued-1")
    ch.put(np.arange(3), key="arr")
    ch.put("queued-2")
    other = Channel.connect(ch.name)
    ch.close()
    ch.close()  # idempotent
    assert ch.closed and other.closed
    with pytest.raises(ChannelClosed):
        ch.put("late")
    with pytest.raises(ChannelClosed):
        other.put_nowait("late")
    assert other.get(timeout=WAIT_S) == "queued-1"
    assert ch.get_nowait() == "queued-2"
    assert np.array_equal(ch.get("arr", timeout=WAIT_S), np.arange(3))
    for get in (lambda: ch.get(timeout=WAIT_S), other.get_nowait, lambda: ch.get(timeout=0)):
        with pytest.raises(ChannelClosed):
            get()
    with pytest.raises(ChannelClosed):
        ch.get("never-used-key", timeout=1.0)


def test_get_batch_after_close_drains_whole_batches_only(ch: Channel) -> None:
    put_weighted(ch, [1, 1, 1])
    ch.close()
    assert ch.get_batch(2, timeout=WAIT_S) == [(0, 1), (1, 1)]
    with pytest.raises(ChannelClosed):
        ch.get_batch(2, timeout=WAIT_S)  # cannot be reached any more
    assert ch.get_nowait() == (2, 1)


def test_channel_errors_share_a_base_class() -> None:
    for err in (ChannelClosed, ChannelExists, ChannelNotFound):
        assert issubclass(err, ChannelError)


# ----- create / connect / names / sizes -------------------------------------------------


def test_create_twice_raises_and_exist_ok_connects(channel_name: str) -> None:
    first = Channel.create(channel_name, maxsize=3, capacity_bytes=1 << 20)
    with pytest.raises(ChannelExists, match=channel_name):
        Channel.create(channel_name, capacity_bytes=1 << 20)
    again = Channel.create(channel_name, maxsize=99, capacity_bytes=1 << 20, exist_ok=True)
    assert again.maxsize == 3  # connected to the existing one, not recreated
    first.put("shared")
    assert again.get_nowait() == "shared"


def test_properties_and_segment_file(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=4, capacity_bytes=1 << 20)
    namespace = default_namespace()
    assert namespace == os.environ["RLINF_CHANNEL_NAMESPACE"]
    assert (ch.name, ch.namespace, ch.maxsize, ch.closed) == (channel_name, namespace, 4, False)
    assert channel_name in repr(ch)
    segment = Path(f"/dev/shm/rlinf.{namespace}.{channel_name}")
    assert segment.exists()
    stats = ch.stats()
    assert set(stats) == {
        "blocks",
        "free_blocks",
        "leased_blocks",
        "queued_blocks",
        "writing_blocks",
        "lanes",
        "arena_used",
        "arena_size",
    }
    assert stats["arena_size"] == 1 << 20
    del ch
    gc.collect()
    assert segment.exists()  # the creating process keeps it, not the object
    Channel.connect(channel_name).unlink()
    assert not segment.exists()


def test_explicit_namespace(channel_name: str) -> None:
    namespace = default_namespace() + "x"
    ch = Channel.create(channel_name, namespace=namespace, capacity_bytes=1 << 20)
    assert Path(f"/dev/shm/rlinf.{namespace}.{channel_name}").exists()
    with pytest.raises(ChannelNotFound):
        Channel.connect(channel_name)  # not in the default namespace
    ch.put(1)
    assert Channel.connect(channel_name, namespace=namespace).get_nowait() == 1
    del ch
    gc.collect()
    assert Path(f"/dev/shm/rlinf.{namespace}.{channel_name}").exists()
    assert release_created_channels(default_namespace()) == 0  # another namespace
    assert Path(f"/dev/shm/rlinf.{namespace}.{channel_name}").exists()
    assert release_created_channels(namespace) == 1
    assert not Path(f"/dev/shm/rlinf.{namespace}.{channel_name}").exists()


def test_connect_to_a_missing_channel_names_the_segment(channel_name: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChannelNotFound) as info:
        Channel.connect(channel_name, timeout=0.1)
    assert time.monotonic() - start >= 0.1
    assert f"rlinf.{default_namespace()}.{channel_name}" in str(info.value)


def test_connect_waits_for_the_channel_to_appear(channel_name: str) -> None:
    creator = Worker(lambda: (let_block(), Channel.create(channel_name, capacity_bytes=1 << 20)))
    ch = Channel.connect(channel_name, timeout=WAIT_S)
    created = creator.join()[1]
    ch.put("hello")
    assert created.get_nowait() == "hello"


def test_channel_pickles_as_its_name(ch: Channel) -> None:
    data = pickle.dumps(ch)
    assert len(data) < 200
    twin = pickle.loads(data)
    assert (twin.name, twin.namespace) == (ch.name, ch.namespace)
    ch.put("via the original")
    assert twin.get_nowait() == "via the original"


@pytest.mark.parametrize(
    ("name", "namespace", "fragment"),
    [
        ("a/b", None, "'/'"),
        ("with space", None, "' '"),
        ("semi;colon", None, "';'"),
        ("ünicode", None, "'ü'"),
        ("", None, "empty"),
        ("ok", "bad.ns", "namespace name has invalid character '.'"),
        ("x" * 300, None, "over the limit"),
    ],
)
def test_bad_names_are_rejected(name: str, namespace: str | None, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Channel.create(name, namespace=namespace, capacity_bytes=1 << 20)
    with pytest.raises(ValueError, match=fragment):
        Channel.connect(name, namespace=namespace)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"maxsize": -1}, "maxsize"),
        ({"capacity_bytes": 1000}, "capacity_bytes"),
        ({"max_keys": 0}, "max_keys"),
        ({"max_keys": 1 << 20}, "max_keys"),
        ({"max_items": 0}, "max_items"),
        ({"max_items": -1}, "max_items"),
        ({"max_keys": -1}, "max_keys"),
        ({"capacity_bytes": -1}, "capacity_bytes"),
        ({"maxsize": 1 << 33}, "maxsize"),
    ],
)
def test_bad_sizes_are_rejected(channel_name: str, kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Channel.create(channel_name, **{"capacity_bytes": 1 << 20, **kwargs})
    assert not Path(f"/dev/shm/rlinf.{default_namespace()}.{channel_name}").exists()


def test_item_larger_than_the_channel_names_capacity_bytes(channel_name: str) -> None:
    ch = Channel.create(channel_name, capacity_bytes=1 << 16)
    for put in (ch.put, ch.put_nowait):
        with pytest.raises(ValueError, match="capacity_bytes"):
            put(np.zeros(1 << 17, np.uint8))
    assert ch.qsize() == 0
    ch.put(np.zeros(1 << 10, np.uint8))  # the channel still works
    assert ch.get(timeout=WAIT_S).size == 1 << 10


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan")])
def test_bad_timeouts_are_rejected(ch: Channel, bad: float) -> None:
    ch.put("stays")
    calls = [
        lambda: ch.get(timeout=bad),
        lambda: ch.put("x", timeout=bad),
        lambda: ch.get_batch(1, timeout=bad),
        lambda: Channel.connect(ch.name, timeout=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="timeout"):
            call()
    assert ch.qsize() == 1 and ch.get_nowait() == "stays"


def test_unpicklable_item_raises_type_error_and_queues_nothing(ch: Channel) -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match="lock"):
        ch.put({"lock": lock})
    assert ch.qsize() == 0
    assert ch.stats()["writing_blocks"] == 0


@pytest.mark.parametrize("timeout", [0.05, 0.3])
def test_timeouts_name_the_bound(ch: Channel, timeout: float) -> None:
    # 0.05 s is one native wait, 0.3 s runs in slices: both say the same.
    with pytest.raises(TimeoutError, match=f"timed out after {timeout} s"):
        ch.get(timeout=timeout)


@pytest.mark.parametrize("bad", ["1", True, [0.5]])
def test_non_numeric_timeouts_are_rejected(ch: Channel, bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="timeout"):
        ch.get(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError), match="timeout"):
        ch.put("x", timeout=bad)  # type: ignore[arg-type]
