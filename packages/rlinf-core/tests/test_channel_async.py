"""``aput``/``aget``: never block the event loop, cancel safely, and mix with sync callers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import numpy as np
import pytest

from rlinf.core.channel import Channel, ChannelClosed

# Bounds for waits that must succeed (or be woken) long before them: no pass
# depends on how fast the machine is; pytest-timeout catches a real hang.
WAIT_S = 60.0


@pytest.fixture
def ch(channel_name: str) -> Iterator[Channel]:
    channel = Channel.create(channel_name, capacity_bytes=64 << 20)
    yield channel
    channel.close()


def run(coro: Coroutine[Any, Any, Any], timeout: float = 4 * WAIT_S) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Ticker:
    """Counts 10 ms ticks of the event loop: it stalls when the loop is blocked."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def until(self, ticks: int) -> None:
        """Returns once the loop has ticked ``ticks`` times (never while it is blocked)."""
        while self.ticks < ticks:
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


def test_aget_does_not_block_the_event_loop(ch: Channel) -> None:
    # The item comes only after the loop has ticked 10 times while aget waits:
    # an aget that blocked the loop would never see it (it would time out).
    async def main() -> None:
        ticker = Ticker()
        task = asyncio.create_task(ch.aget(timeout=WAIT_S))
        await ticker.until(10)
        assert not task.done(), "aget returned before anything was put"
        ch.put_nowait({"x": np.arange(4)})
        got = await task
        await ticker.stop()
        assert np.array_equal(got["x"], np.arange(4))

    run(main())


def test_aget_returns_a_ready_item_at_once(ch: Channel) -> None:
    ch.put("ready")

    async def main() -> None:
        # "At once": the coroutine finishes on its first step, without ever
        # suspending (no wait in a thread, no yield to the loop).
        coro = ch.aget(timeout=WAIT_S)
        with pytest.raises(StopIteration) as done:
            coro.send(None)
        assert done.value.value == "ready"

    run(main())


def test_cancelled_aget_loses_nothing(ch: Channel) -> None:
    async def main() -> None:
        task = asyncio.create_task(ch.aget(timeout=WAIT_S))
        await asyncio.sleep(0.2)  # let it wait
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    ch.put("after cancel")
    assert ch.qsize() == 1
    assert ch.get(timeout=WAIT_S) == "after cancel"


def test_cancellation_racing_puts_never_loses_or_duplicates(ch: Channel) -> None:
    """Agets cancelled at random moments while a thread puts: each item is taken once."""
    n = 200
    rng = random.Random(1)
    delays = [rng.uniform(0, 0.004) for _ in range(n)]

    def produce() -> None:
        for i, delay in enumerate(delays):
            time.sleep(delay)
            ch.put(i)

    async def main() -> list[int]:
        got: list[int] = []
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        while producer.is_alive() or ch.qsize() > 0:
            task = asyncio.create_task(ch.aget(timeout=WAIT_S))
            await asyncio.sleep(rng.uniform(0, 0.005))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                got.append(await task)
        producer.join(WAIT_S)
        return got

    got = run(main())
    rest = []
    while not ch.empty():
        rest.append(ch.get_nowait())
    assert sorted(got + rest) == list(range(n))
    assert got == sorted(got)  # FIFO is kept across cancellations
    assert len(got) > 0


def test_aget_timeout(ch: Channel) -> None:
    async def main() -> None:
        start = time.monotonic()
        task = asyncio.create_task(ch.aget(timeout=0.3))
        await asyncio.sleep(0)  # one loop iteration: the aget's first step has run
        assert not task.done(), "aget blocked the event loop while it waited"
        with pytest.raises(TimeoutError):
            await task
        assert time.monotonic() - start >= 0.29  # a lower bound: load cannot shorten it

    run(main())
    assert ch.qsize() == 0


def test_aget_is_woken_by_close_and_drains_first(ch: Channel) -> None:
    ch.put("queued")

    async def main() -> None:
        assert await ch.aget(timeout=WAIT_S) == "queued"
        task = asyncio.create_task(ch.aget(timeout=WAIT_S))
        await asyncio.sleep(0.2)  # let it wait (it raises the same if it has not yet)
        ch.close()
        # Woken by the close: ChannelClosed, not a TimeoutError after WAIT_S.
        with pytest.raises(ChannelClosed):
            await task
        with pytest.raises(ChannelClosed):
            await ch.aput("late")

    run(main())


@pytest.mark.parametrize("size", [16, 2 << 20], ids=["small-inline", "large-in-thread"])
def test_aput_waits_on_a_full_key_without_blocking_the_loop(channel_name: str, size: int) -> None:
    ch = Channel.create(channel_name, maxsize=1, capacity_bytes=64 << 20)
    ch.put(np.zeros(size, np.uint8))

    async def main() -> None:
        ticker = Ticker()
        task = asyncio.create_task(ch.aput(np.full(size, 7, np.uint8), timeout=WAIT_S))
        # The loop ticks 10 times while aput waits for room: an aput that blocked
        # the loop would be done (timed out) by the time the ticker got there.
        await ticker.until(10)
        assert not task.done(), "aput finished although the key was full"
        first = await ch.aget(timeout=WAIT_S)  # makes room
        assert (first == 0).all()
        await task
        await ticker.stop()

    run(main())
    assert (ch.get(timeout=WAIT_S) == 7).all()
    ch.close()


def test_aput_timeout_on_a_full_key(channel_name: str) -> None:
    ch = Channel.create(channel_name, maxsize=1, capacity_bytes=1 << 20)
    ch.put(0)

    async def main() -> None:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await ch.aput(1, timeout=0.2)
        assert time.monotonic() - start >= 0.19  # a lower bound: load cannot shorten it

    run(main())
    assert ch.qsize() == 1


def test_aget_batch(ch: Channel) -> None:
    async def main() -> list[Any]:
        task = asyncio.create_task(ch.aget_batch(3, timeout=WAIT_S))
        await ch.aput("a", weight=1)
        await asyncio.sleep(0.1)
        assert not task.done()
        await ch.aput("b", weight=2)
        await ch.aput("c", weight=1)
        return await task

    assert run(main()) == ["a", "b"]
    assert ch.get_nowait() == "c"


def test_sync_and_async_getters_on_shared_keys_get_each_item_once(ch: Channel) -> None:
    """A sync getter thread and async getters on two keys, with producers of both kinds.

    Every item is received exactly once, every getter only sees its own key,
    and each getter sees its key's items in FIFO order.
    """
    n = 400
    stop = "STOP"
    getters = {"a": 3, "b": 2}  # per key: one sync thread plus the rest async
    arrays = {"a": 1, "b": 2}

    def item(key: str, i: int) -> tuple[str, int, np.ndarray]:
        return (key, i, np.full(16, arrays[key] * 1000 + i, np.int64))

    def check(key: str, got: tuple[str, int, np.ndarray]) -> int:
        k, i, arr = got
        assert k == key, f"getter of {key!r} received an item of {k!r}"
        assert (arr == arrays[key] * 1000 + i).all()
        return i

    results: dict[str, list[list[int]]] = {"a": [], "b": []}

    errors: list[BaseException] = []

    def sync_getter(key: str) -> None:
        seen: list[int] = []
        try:
            while (got := ch.get(key, timeout=WAIT_S)) != stop:
                seen.append(check(key, got))
        except BaseException as err:
            errors.append(err)
        results[key].append(seen)

    async def async_getter(key: str) -> None:
        seen: list[int] = []
        while (got := await ch.aget(key, timeout=WAIT_S)) != stop:
            seen.append(check(key, got))
            if random.random() < 0.3:
                await asyncio.sleep(0)
        results[key].append(seen)

    def sync_producer() -> None:
        for i in range(n):
            ch.put(item("a", i), key="a")
        for _ in range(getters["a"]):
            ch.put(stop, key="a")

    async def main() -> None:
        threads = [threading.Thread(target=sync_getter, args=(k,), daemon=True) for k in getters]
        threads.append(threading.Thread(target=sync_producer, daemon=True))
        for t in threads:
            t.start()
        tasks = [
            asyncio.create_task(async_getter(k))
            for k, count in getters.items()
            for _ in range(count - 1)
        ]
        for i in range(n):
            await ch.aput(item("b", i), key="b")
        for _ in range(getters["b"]):
            await ch.aput(stop, key="b")
        await asyncio.gather(*tasks)
        for t in threads:
            await asyncio.to_thread(t.join, WAIT_S)
            assert not t.is_alive()

    run(main())
    assert not errors, errors
    for key, count in getters.items():
        assert len(results[key]) == count
        every = [i for seen in results[key] for i in seen]
        assert sorted(every) == list(range(n)), f"key {key!r}: items lost or duplicated"
        for seen in results[key]:
            assert seen == sorted(seen)
    assert ch.qsize("a") == ch.qsize("b") == 0
    gc.collect()
    assert ch.stats()["leased_blocks"] == 0
