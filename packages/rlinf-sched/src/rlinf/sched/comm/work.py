"""``CommWork``: the handle of an asynchronous send, recv or broadcast."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from rlinf.sched.comm.errors import CommTimeoutError

__all__ = ["CommWork"]


class CommWork:
    """A pending communication; ``wait()`` returns its result (the object, for a recv).

    Operations between one pair of workers complete in the order they were
    issued, so waiting on the last one of a pair implies the earlier ones
    finished.
    """

    def __init__(self, future: Future[Any], description: str) -> None:
        self._future = future
        self._description = description

    def done(self) -> bool:
        """Whether the operation finished (successfully or not)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Any:
        """The result; raises the operation's error.

        Args:
            timeout: Extra bound on this wait in seconds (the operation has
                its own timeout too); None waits for the operation.

        Raises:
            CommTimeoutError: If ``timeout`` passed first.
            PeerDiedError: If the peer died.
        """
        # Not future.result(timeout): its TimeoutError is the builtin one,
        # indistinguishable from the operation's own CommTimeoutError.
        done, _ = wait_futures([self._future], timeout=timeout)
        if not done:
            raise CommTimeoutError(f"{self._description} did not finish within {timeout} s")
        return self._future.result()

    async def async_wait(self) -> Any:
        """Awaits the result without blocking the event loop."""
        return await asyncio.wrap_future(self._future)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.async_wait().__await__()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"CommWork({self._description}, {state})"
