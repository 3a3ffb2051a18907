"""``rlinf.core.heap``: what freezing the heap keeps from the cyclic collector, and for how long."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from rlinf.core.heap import freeze_heap, frozen_objects


class Node:
    """An object that can sit in a reference cycle (and be weakly referenced)."""

    def __init__(self) -> None:
        self.other: Node | None = None


def make_cycle() -> weakref.ref[Node]:
    """Two nodes that reference each other and nothing else; returns a weak ref to one."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen in this process."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_counts_every_live_object() -> None:
    assert frozen_objects() == 0
    count = freeze_heap()
    assert count == frozen_objects() == gc.get_freeze_count()
    assert count > 1_000  # at least the modules pytest imported


def test_a_cycle_frozen_alive_waits_for_the_next_freeze() -> None:
    holder = [make_cycle()]
    strong = holder[0]()  # keep it alive through the freeze
    freeze_heap()
    del strong  # now only the cycle holds it: garbage, but frozen
    gc.collect()
    assert holder[0]() is not None, "a frozen cycle was collected"
    freeze_heap()  # unfreezes, collects, freezes again
    assert holder[0]() is None, "freeze_heap did not reclaim a cycle frozen earlier"


def test_cycles_made_after_a_freeze_are_collected() -> None:
    freeze_heap()
    ref = make_cycle()
    gc.collect()
    assert ref() is None


def test_garbage_alive_at_the_freeze_is_collected_first() -> None:
    gc.disable()  # no automatic pass may collect the cycle before freeze_heap does
    try:
        ref = make_cycle()  # already unreachable
        assert ref() is not None
        freeze_heap()
        assert ref() is None, "freeze_heap froze garbage instead of collecting it"
    finally:
        gc.enable()


def test_the_heap_is_thawed_before_python_exits() -> None:
    """Python's last collection skips frozen objects, so freeze_heap thaws them at exit
    (else nanobind types, e.g. triton's, report their live instances as leaked)."""
    script = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count()))\n"
        "from rlinf.core.heap import freeze_heap\n"
        "print('frozen:', freeze_heap())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert int(out[0].split()[-1]) > 1_000, out
    assert out[1] == "frozen at exit: 0", out  # atexit runs last-registered first
