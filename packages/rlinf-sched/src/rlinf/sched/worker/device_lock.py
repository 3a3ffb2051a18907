"""``DeviceLock``: serialises phases of collocated workers that share a device.

In collocated mode several groups (env, rollout, actor) own the same GPUs (or
CPU slots). A phase takes the lock of every device it uses, so two phases
never hold one device's memory at once; runners offload a group before the
next group takes the lock. The lock is an ``flock`` on a file per device,
so it is released by the kernel if its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DEVICES_ENV", "DeviceLock", "DeviceLockTimeout"]

DEVICES_ENV = "RLINF_DEVICES"
"""Set by the scheduler: ``<kind>:<rank>,<rank>...`` resources a worker owns on its node."""

_POLL_S = 0.01


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
        self._paths = [os.path.join(directory, d.replace(":", "-")) for d in self.devices]
        self._fds: list[int] = []

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return bool(self._fds) or not self.devices

    def acquire(self, timeout: float = 600.0, holder: str = "") -> None:
        """Takes every device's lock, waiting up to ``timeout`` seconds.

        Raises:
            DeviceLockTimeout: Naming the devices still busy.
            RuntimeError: If this object already holds the lock.
        """
        if self._fds:
            raise RuntimeError(f"device lock on {self.devices} is already held by this worker")
        deadline = time.monotonic() + timeout
        try:
            for path, device in zip(self._paths, self.devices, strict=True):
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                self._fds.append(fd)
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise DeviceLockTimeout(
                                f"{holder or 'worker'} waited {timeout} s for the lock of "
                                f"device {device}; another collocated phase holds it (did the "
                                "runner forget to release it, or is that phase stuck?)"
                            ) from None
                        time.sleep(_POLL_S)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Releases every device (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing drops the flock

    @contextmanager
    def hold(self, timeout: float = 600.0, holder: str = "") -> Iterator[None]:
        """``with lock.hold():`` acquires and releases around a block."""
        self.acquire(timeout, holder)
        try:
            yield
        finally:
            self.release()
