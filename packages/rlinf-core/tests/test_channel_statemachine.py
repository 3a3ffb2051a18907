"""Random operation sequences against a model: a dict of deques with the same ``maxsize``."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import deque
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rlinf.core.channel import Channel, ChannelClosed

MAXSIZE = 3
KEYS = ["a", "b", 0, ("t", 1)]
SHORT_S = 0.002  # for calls the model says must time out
READY_S = 0.5  # for calls the model says succeed at once (failures then shrink fast)
_ids = itertools.count()

keys = st.sampled_from(KEYS)
handles = st.sampled_from(["own", "other"])


class ChannelMachine(RuleBasedStateMachine):
    """Items are ``(id, weight)`` or ``(id, weight, array)``; the model keeps ``(id, weight)``."""

    def __init__(self) -> None:
        super().__init__()
        name = f"sm{os.getpid()}-{next(_ids)}"
        self.ch = Channel.create(name, maxsize=MAXSIZE, max_keys=8, capacity_bytes=1 << 20)
        self.other = Channel.connect(name)  # a second handle on the same channel
        self.model: dict[Any, deque[tuple[int, int]]] = {k: deque() for k in KEYS}
        self.closed = False
        self.next_id = 0
        self.held: list[np.ndarray] = []  # received arrays kept alive (leased blocks)

    def handle(self, which: str) -> Channel:
        return self.ch if which == "own" else self.other

    def check_received(self, item: Any, key: Any, hold: bool = False) -> None:
        want_id, want_weight = self.model[key].popleft()
        assert item[:2] == (want_id, want_weight), f"key {key!r}: got {item[:2]}"
        if len(item) == 3:
            assert item[2].shape == (want_id % 5 + 1,) and (item[2] == want_id).all()
            if hold:
                self.held.append(item[2])

    # ----- puts -------------------------------------------------------------------
    @initialize(
        items=st.lists(st.tuples(keys, st.integers(0, 3), st.booleans(), handles), max_size=10)
    )
    def fill(self, items: list[tuple[Any, int, bool, str]]) -> None:
        """Starts most sequences from a non-empty channel."""
        for item in items:
            self.put_nowait(*item)

    @rule(key=keys, weight=st.integers(0, 3), with_array=st.booleans(), which=handles)
    def put_nowait(self, key: Any, weight: int, with_array: bool, which: str) -> None:
        item_id = self.next_id
        self.next_id += 1
        item: tuple[Any, ...] = (item_id, weight)
        if with_array:
            item += (np.full(item_id % 5 + 1, item_id, np.int64),)
        ch = self.handle(which)
        if self.closed:
            with pytest.raises(ChannelClosed):
                ch.put_nowait(item, key=key, weight=weight)
        elif len(self.model[key]) >= MAXSIZE:
            with pytest.raises(asyncio.QueueFull):
                ch.put_nowait(item, key=key, weight=weight)
        else:
            ch.put_nowait(item, key=key, weight=weight)
            self.model[key].append((item_id, weight))

    @rule(key=keys)
    @precondition(lambda self: self.closed or any(len(q) >= MAXSIZE for q in self.model.values()))
    def blocking_put_that_cannot_proceed(self, key: Any) -> None:
        if self.closed:
            with pytest.raises(ChannelClosed):
                self.ch.put((-1, 0), key=key, timeout=SHORT_S)
        elif len(self.model[key]) >= MAXSIZE:
            with pytest.raises(TimeoutError):
                self.ch.put((-1, 0), key=key, timeout=SHORT_S)

    # ----- gets -------------------------------------------------------------------
    @rule(key=keys, which=handles, hold=st.booleans())
    def get_nowait(self, key: Any, which: str, hold: bool) -> None:
        ch = self.handle(which)
        if self.model[key]:
            self.check_received(ch.get_nowait(key), key, hold)
        elif self.closed:
            with pytest.raises(ChannelClosed):
                ch.get_nowait(key)
        else:
            with pytest.raises(asyncio.QueueEmpty):
                ch.get_nowait(key)

    @rule(key=keys, which=handles)
    def get_with_timeout(self, key: Any, which: str) -> None:
        ch = self.handle(which)
        if self.model[key]:
            self.check_received(ch.get(key, timeout=READY_S), key)
        else:
            with pytest.raises(ChannelClosed if self.closed else TimeoutError):
                ch.get(key, timeout=SHORT_S)

    @rule(data=st.data(), which=handles)
    def get_batch(self, data: st.DataObject, which: str) -> None:
        ch = self.handle(which)
        filled = [k for k in KEYS if self.model[k]]
        key = data.draw(st.sampled_from(filled) if filled and data.draw(st.booleans()) else keys)
        # Half the time a target that some prefix of the queue sums to exactly.
        sums = [s for s in itertools.accumulate(w for _, w in self.model[key]) if s > 0]
        exact = st.sampled_from(sums) if sums else st.integers(1, 6)
        target = data.draw(st.one_of(exact, st.integers(1, 6)), label="target")
        acc, take, outcome = 0, 0, None
        for _, weight in self.model[key]:
            if acc + weight > target:
                outcome = ValueError  # overshoot before the target is reached
                break
            acc += weight
            take += 1
            if acc >= target:
                outcome = "ok"
                break
        if outcome is None:  # the queued weight cannot reach the target
            outcome = ChannelClosed if self.closed else TimeoutError
        if outcome == "ok":
            batch = ch.get_batch(target, key=key, timeout=READY_S)
            assert len(batch) == take
            for item in batch:
                self.check_received(item, key)
        else:
            before = ch.qsize(key)
            with pytest.raises(outcome):
                ch.get_batch(target, key=key, timeout=SHORT_S)
            assert ch.qsize(key) == before  # nothing was taken

    # ----- lifetime ---------------------------------------------------------------
    @rule(roll=st.integers(0, 15))
    def close(self, roll: int) -> None:
        if roll == 0:  # rarely, so most sequences run long on an open channel
            (self.ch if self.next_id % 2 else self.other).close()
            self.closed = True

    @rule()
    @precondition(lambda self: bool(self.held))
    def release_held_views(self) -> None:
        self.held.pop(0)

    # ----- invariants -------------------------------------------------------------
    @invariant()
    def sizes_match_the_model(self) -> None:
        for key, queue in self.model.items():
            ch = self.ch if isinstance(key, str) else self.other
            assert ch.qsize(key) == len(queue)
            assert ch.empty(key) == (not queue)
            assert ch.full(key) == (len(queue) >= MAXSIZE)
        assert self.ch.closed == self.other.closed == self.closed

    @invariant()
    def blocks_match_the_model(self) -> None:
        stats = self.ch.stats()
        assert stats["leased_blocks"] == len(self.held)
        assert stats["writing_blocks"] == 0
        # Items with arrays stay in their block until taken; small plain ones too.
        assert stats["queued_blocks"] == sum(len(q) for q in self.model.values())

    def teardown(self) -> None:
        self.ch.close()
        self.held.clear()  # refcounting frees the views (no gc.collect: it costs 30 ms)
        assert self.ch.stats()["leased_blocks"] == 0
        del self.ch, self.other


ChannelMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestChannelStateMachine = ChannelMachine.TestCase
