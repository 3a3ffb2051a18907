"""A created channel lives until its creating process ends, not until its handle is dropped.

``Channel.create`` without keeping the handle: other processes still connect
by name; ``unlink()``, ``release_created_channels()`` or the creator's end
(normal exit, or SIGKILL plus the last-holder rule / the janitor) remove it.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlinf.core.channel import (
    Channel,
    ChannelAgent,
    ChannelNotFound,
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


WAIT_S = 30.0
SPAWN = mp.get_context("spawn")


def segment(name: str, namespace: str | None = None) -> Path:
    return Path(f"/dev/shm/rlinf.{namespace or default_namespace()}.{name}")


def start(target: Callable[..., Any], *args: Any, method: str = "spawn") -> mp.process.BaseProcess:
    proc = mp.get_context(method).Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def kill(proc: mp.process.BaseProcess) -> None:
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(WAIT_S)
    assert proc.exitcode == -signal.SIGKILL


def mapped_here(path: Path) -> bool:
    """Whether this process maps the segment or has it open (memory it pins)."""
    with open("/proc/self/maps") as maps:
        if any(path.name in line for line in maps):
            return True
    fds = Path("/proc/self/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd).startswith(str(path)):
                return True
        except OSError:
            pass
    return False


def wait_gone(path: Path, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not path.exists(), f"{path} is still there after {timeout} s"


@pytest.fixture
def tidy(channel_name: str) -> Iterator[str]:
    """The test's channel name; whatever a failed test leaves under it is removed."""
    yield channel_name
    for p in segment(channel_name).parent.glob(f"{segment(channel_name).name}*"):
        p.unlink(missing_ok=True)


# ----- children ------------------------------------------------------------------------


@child
def echo_by_name(name: str, unlink: bool) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    item = ch.get(key="to_child", timeout=WAIT_S)
    ch.put({"seq": item["seq"], "data": item["data"] * 2}, key="to_parent")
    if unlink:
        assert ch.unlink()


@child
def create_drop_and_wait(name: str, go: Any) -> None:
    Channel.create(name, capacity_bytes=1 << 20).put("created", key="status")
    gc.collect()  # the only handle is gone
    assert go.wait(WAIT_S)


@child
def create_drop_and_hang(name: str) -> None:
    Channel.create(name, capacity_bytes=1 << 20).put("created", key="status")
    gc.collect()
    time.sleep(WAIT_S * 4)


# ----- the creating process keeps it -----------------------------------------------------


def test_dropped_handle_keeps_the_channel_for_another_process(tidy: str) -> None:
    Channel.create(tidy, capacity_bytes=1 << 20)  # the handle is not kept
    gc.collect()
    path = segment(tidy)
    assert path.exists()
    assert not mapped_here(path), "the creator pins nothing once its handle is gone"
    proc = start(echo_by_name, tidy, False)
    ch = Channel.connect(tidy)
    ch.put({"seq": 1, "data": np.arange(1000)}, key="to_child")
    reply = ch.get(key="to_parent", timeout=WAIT_S)
    assert reply["seq"] == 1 and np.array_equal(reply["data"], np.arange(1000) * 2)
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    del ch, reply
    gc.collect()
    assert path.exists(), "a connected handle going does not remove it"
    assert Channel.connect(tidy).qsize("to_parent") == 0


def test_unlink_by_another_process_removes_it_and_frees_it(tidy: str) -> None:
    Channel.create(tidy, capacity_bytes=1 << 20)
    gc.collect()
    proc = start(echo_by_name, tidy, True)
    ch = Channel.connect(tidy)
    ch.put({"seq": 7, "data": np.ones(3)}, key="to_child")
    assert ch.get(key="to_parent", timeout=WAIT_S)["seq"] == 7
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    path = segment(tidy)
    assert not path.exists()
    with pytest.raises(ChannelNotFound):
        Channel.connect(tidy)
    assert mapped_here(path)  # our handle still works ...
    ch.put("still usable")
    assert ch.get_nowait() == "still usable"
    del ch
    gc.collect()
    assert not mapped_here(path)  # ... and nothing keeps the memory after it
    assert release_created_channels() == 0  # nothing left to release


def test_unlink_by_the_creator_removes_it(tidy: str) -> None:
    ch = Channel.create(tidy, capacity_bytes=1 << 20)
    assert ch.unlink()
    assert not segment(tidy).exists()
    assert not ch.unlink()
    del ch
    gc.collect()
    assert not mapped_here(segment(tidy))
    fresh = Channel.create(tidy, maxsize=3, capacity_bytes=1 << 20)  # the name is free again
    assert fresh.maxsize == 3


def test_create_again_while_the_creator_keeps_it_raises(tidy: str) -> None:
    from rlinf.core.channel import ChannelExists

    Channel.create(tidy, maxsize=2, capacity_bytes=1 << 20)
    gc.collect()
    with pytest.raises(ChannelExists):
        Channel.create(tidy, capacity_bytes=1 << 20)
    assert Channel.create(tidy, exist_ok=True, capacity_bytes=1 << 20).maxsize == 2


def test_release_created_channels_removes_them(tidy: str) -> None:
    other_ns = default_namespace() + "rel"
    Channel.create(tidy, capacity_bytes=1 << 20)
    Channel.create(tidy + "-held", capacity_bytes=1 << 20)
    Channel.create(tidy, namespace=other_ns, capacity_bytes=1 << 20)
    held = Channel.connect(tidy + "-held")
    gc.collect()
    assert release_created_channels(default_namespace()) == 1  # the held one waits
    assert not segment(tidy).exists()
    assert segment(tidy + "-held").exists(), "a held channel goes with its last holder"
    assert segment(tidy, other_ns).exists(), "only the namespace asked for"
    del held
    gc.collect()
    assert not segment(tidy + "-held").exists()
    assert release_created_channels() == 1
    assert not segment(tidy, other_ns).exists()
    assert release_created_channels() == 0  # idempotent


# ----- the creating process ends -----------------------------------------------------------


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_child_creator_exiting_normally_leaves_no_segment(tidy: str, method: str) -> None:
    go = mp.get_context(method).Event()
    proc = start(create_drop_and_wait, tidy, go, method=method)
    ch = Channel.connect(tidy, timeout=WAIT_S)  # the child dropped its handle; still there
    assert ch.get("status", timeout=WAIT_S) == "created"
    del ch
    gc.collect()
    assert segment(tidy).exists()
    go.set()
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    assert not segment(tidy).exists()


def test_child_creator_exiting_while_others_hold_it_hands_it_to_the_last_holder(
    tidy: str,
) -> None:
    go = SPAWN.Event()
    proc = start(create_drop_and_wait, tidy, go)
    ch = Channel.connect(tidy, timeout=WAIT_S)
    assert ch.get("status", timeout=WAIT_S) == "created"
    go.set()
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    assert segment(tidy).exists()  # we hold it
    del ch
    gc.collect()
    assert not segment(tidy).exists()


def test_sigkilled_creator_segment_goes_with_the_last_holder(tidy: str) -> None:
    proc = start(create_drop_and_hang, tidy)
    ch = Channel.connect(tidy, timeout=WAIT_S)
    assert ch.get("status", timeout=WAIT_S) == "created"
    kill(proc)
    assert segment(tidy).exists()
    del ch
    gc.collect()
    assert not segment(tidy).exists()


def test_sigkilled_creator_segment_nobody_holds_is_removed_by_the_janitor(tidy: str) -> None:
    proc = start(create_drop_and_hang, tidy)
    ch = Channel.connect(tidy, timeout=WAIT_S)
    assert ch.get("status", timeout=WAIT_S) == "created"
    del ch
    gc.collect()
    path = segment(tidy)
    assert path.exists(), "the creator, alive, keeps it"
    old = time.time() - 3600
    os.utime(path, (old, old))
    assert path.name not in cleanup_stale_segments(default_namespace()), "creator alive"
    kill(proc)
    assert path.exists()  # nobody was left to unlink it
    assert path.name in cleanup_stale_segments(default_namespace())
    assert not path.exists()


def drop_inherited(holder: list[Channel]) -> None:
    holder.pop()  # the forked copy of the parent's handle goes here
    gc.collect()


def test_a_forked_child_dropping_an_inherited_handle_leaves_the_name(tidy: str) -> None:
    # The child's copy shares the parent's lock: it must not act as the last holder.
    Channel.create(tidy, capacity_bytes=1 << 20)
    holder = [Channel.connect(tidy)]
    assert release_created_channels() == 0  # only our handle keeps it now
    proc = start(drop_inherited, holder, method="fork")
    proc.join(WAIT_S)
    assert proc.exitcode == 0
    assert segment(tidy).exists(), "the child unlinked a name its parent holds"
    holder[0].put("still named")
    assert Channel.connect(tidy).get_nowait() == "still named"
    holder.clear()
    gc.collect()
    assert not segment(tidy).exists()


# ----- channels created on another node (address=) ---------------------------------------


def test_channel_created_through_an_agent_lives_until_released(tidy: str) -> None:
    agent = ChannelAgent("127.0.0.1:0")
    try:
        Channel.create(tidy, capacity_bytes=1 << 20, address=agent.address)
        kept = Channel.create(tidy + "-b", capacity_bytes=1 << 20, address=agent.address)
        gc.collect()
        # Our connection to the agent keeps it: processes on its node attach by name.
        local = Channel.connect(tidy)
        local.put("via shm")
        assert Channel.connect(tidy, address=agent.address).get(timeout=WAIT_S) == "via shm"
        del local
        gc.collect()
        assert segment(tidy).exists()
        # unlink() on a remote handle removes nothing there but ends our keep-alive.
        assert not kept.unlink()
        del kept
        gc.collect()
        wait_gone(segment(tidy + "-b"))
        assert segment(tidy).exists()
        release_created_channels()
        wait_gone(segment(tidy))
    finally:
        agent.stop()
