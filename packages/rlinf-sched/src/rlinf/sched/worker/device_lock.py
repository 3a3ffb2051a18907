"""``DeviceLock``: serialises phases of collocated workers that share a device.

In collocated mode several groups (env, rollout, actor) own the same GPUs (or
CPU slots). A phase takes the lock of every device it uses, so two phases
never hold one device's memory at once; runners offload a group before the
next group takes the lock. The lock is an ``flock`` on a file per device,
so it is released by the kernel if its holder dies.

Why filelock: it is the well-kept ``flock`` wrapper (stale handles, leases, odd
filesystems); like the loop it replaces it polls (every 10 ms here), so the
gain is fewer hand-written lines, not fewer wake-ups.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from filelock import FileLock, Timeout

__all__ = ["DEVICES_ENV", "DeviceLock", "DeviceLockTimeout"]

DEVICES_ENV = "RLINF_DEVICES"
"""Set by the scheduler: ``<kind>:<rank>,<rank>...`` resources a worker owns on its node."""

_POLL_S = 0.01
"""How often a waiting phase retries: a collocated hand-over costs at most this much."""


class DeviceLockTimeout(TimeoutError):
    """The device lock was not acquired within the timeout."""


class DeviceLock:
    """Exclusive use of a set of devices on this node by one process at a time.

    Args:
        devices: Device identifiers (e.g. ``["accelerator:0"]``); empty means
            no lock is needed.
        namespace: Run namespace, so two runs on one machine do not contend.
    """

    def __init__(self, devices: list[str], namespace: str) -> None:
        self.devices = sorted(set(devices))  # sorted: a fixed order avoids deadlock
        directory = os.path.join(tempfile.gettempdir(), "rlinf-locks", namespace)
        os.makedirs(directory, exist_ok=True)
        # thread_local=False: a worker may take the lock in one of its actor's
        # threads and release it in another. fallback_to_soft=False: a soft lock
        # outlives a dead holder, so a filesystem without flock is an error.
        self._locks = [
            FileLock(
                os.path.join(directory, d.replace(":", "-")),
                mode=0o600,
                thread_local=False,
                fallback_to_soft=False,
            )
            for d in self.devices
        ]
        self._held: list[FileLock] = []

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return bool(self._held) or not self.devices

    def acquire(self, timeout: float = 600.0, holder: str = "") -> None:
        """Takes every device's lock (in sorted order), waiting up to ``timeout`` s in all.

        Raises:
            DeviceLockTimeout: Naming the devices still busy.
            RuntimeError: If this object already holds the lock.
        """
        if self._held:
            raise RuntimeError(f"device lock on {self.devices} is already held by this worker")
        deadline = time.monotonic() + timeout
        try:
            for i, lock in enumerate(self._locks):
                left = max(0.0, deadline - time.monotonic())
                try:
                    lock.acquire(timeout=left, poll_interval=_POLL_S)
                except Timeout:
                    raise DeviceLockTimeout(
                        f"{holder or 'worker'} waited {timeout} s for the lock of "
                        f"device {self.devices[i]}; another collocated phase holds it (did the "
                        "runner forget to release it, or is that phase stuck?)"
                    ) from None
                self._held.append(lock)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Releases every device (idempotent)."""
        held, self._held = self._held, []
        for lock in held:
            lock.release(force=True)  # closing the file drops the flock

    @contextmanager
    def hold(self, timeout: float = 600.0, holder: str = "") -> Iterator[None]:
        """``with lock.hold():`` acquires and releases around a block."""
        self.acquire(timeout, holder)
        try:
            yield
        finally:
            self.release()
