"""DeviceLock without Ray: exclusion, sorted multi-device locks, timeouts, a dead holder."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

from rlinf.sched.worker.device_lock import DeviceLock, DeviceLockTimeout


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


_HOLDER = """
import sys, time
from rlinf.sched.worker.device_lock import DeviceLock
lock = DeviceLock(["accelerator:0"], sys.argv[1])  # kept: dropping it would release
lock.acquire(timeout=10)
print("held", flush=True)
time.sleep(600)
"""


def test_exclusive_timeout_names_the_device_and_held(namespace: str) -> None:
    a = DeviceLock(["accelerator:1", "accelerator:0", "accelerator:1"], namespace)
    b = DeviceLock(["accelerator:1"], namespace)
    assert a.devices == ["accelerator:0", "accelerator:1"], "deduplicated and sorted"
    assert not a.held and DeviceLock([], namespace).held, "no devices: nothing to lock"
    a.acquire(timeout=1)
    assert a.held
    with pytest.raises(RuntimeError, match="already held by this worker"):
        a.acquire(timeout=1)
    start = time.monotonic()
    with pytest.raises(
        DeviceLockTimeout, match=r"b\[0\] waited 0.2 s for the lock of device accelerator:1;"
    ):
        b.acquire(timeout=0.2, holder="b[0]")
    assert 0.15 < time.monotonic() - start < 5 and not b.held
    a.release()
    a.release()  # idempotent
    with b.hold(timeout=1):
        assert b.held
    assert not b.held


def test_released_from_another_thread(namespace: str) -> None:
    # A Ray actor runs calls in several threads: acquire and release may differ.
    lock, other = DeviceLock(["cpu_slot:0"], namespace), DeviceLock(["cpu_slot:0"], namespace)
    lock.acquire(timeout=1)
    thread = threading.Thread(target=lock.release)
    thread.start()
    thread.join()
    other.acquire(timeout=1)
    other.release()


def test_sorted_multi_device_acquisition_does_not_deadlock(namespace: str) -> None:
    # Two lockers ask for the same devices in opposite orders, many times over.
    devices = ["accelerator:0", "accelerator:1", "accelerator:2"]
    errors: list[BaseException] = []

    def loop(order: list[str]) -> None:
        lock = DeviceLock(order, namespace)
        try:
            for _ in range(50):
                with lock.hold(timeout=20):
                    pass
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(o,)) for o in (devices, devices[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)


def test_a_dead_holder_releases_the_lock(namespace: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, namespace], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        lock = DeviceLock(["accelerator:0"], namespace)
        with pytest.raises(DeviceLockTimeout):
            lock.acquire(timeout=0.1)
        holder.kill()  # SIGKILL: no clean-up runs in the holder
        holder.wait(timeout=30)
        lock.acquire(timeout=10)  # the kernel dropped the dead process's flock
        assert lock.held
        lock.release()
    finally:
        holder.kill()
        holder.wait()
