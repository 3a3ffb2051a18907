"""Where tool calls run: in the rollout worker, or in a tool worker group over the channel.

Both executors take calls without blocking (:meth:`ToolExecutor.submit`) and
hand back whichever answers are ready (:meth:`ToolExecutor.collect`), so the
agent loop keeps generating the trajectories that are not waiting for a tool.

Calls and answers cross the channel as plain dicts (:func:`call_message`,
:func:`result_of`), which every channel decode mode accepts.
"""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from rlinf.core.channel import Channel
from rlinf.reasoning.tools.parsing import MalformedCall, ToolCall
from rlinf.reasoning.tools.registry import ToolRegistry, ToolResult

__all__ = [
    "ChannelToolExecutor",
    "LocalToolExecutor",
    "ToolExecutor",
    "call_message",
    "call_of",
    "overdue_result",
    "result_message",
    "result_of",
]


class ToolExecutor(Protocol):
    """Runs tool calls concurrently for one rollout rank."""

    def submit(self, ticket: int, call: ToolCall | MalformedCall) -> None:
        """Starts ``call``; its answer comes back from :meth:`collect` under ``ticket``."""
        ...

    def collect(self, timeout: float) -> list[tuple[int, ToolResult]]:
        """The answers ready now; waits up to ``timeout`` seconds for the first one."""
        ...

    def close(self) -> None:
        """Releases what the executor holds (threads); pending answers are dropped."""
        ...


def call_message(reply_to: int, ticket: int, call: ToolCall | MalformedCall) -> dict[str, Any]:
    """``call`` as a channel item for the tool workers."""
    if isinstance(call, MalformedCall):
        return {"reply_to": reply_to, "ticket": ticket, "malformed": call.reason, "text": call.text}
    return {"reply_to": reply_to, "ticket": ticket, "name": call.name, "arguments": call.arguments}


def call_of(message: dict[str, Any]) -> ToolCall | MalformedCall:
    """The call a :func:`call_message` item carries."""
    if "malformed" in message:
        return MalformedCall(str(message["malformed"]), str(message.get("text", "")))
    return ToolCall(str(message["name"]), dict(message["arguments"]))


def result_message(ticket: int, result: ToolResult) -> dict[str, Any]:
    """A tool's answer as a channel item."""
    return {
        "ticket": ticket,
        "name": result.name,
        "content": result.content,
        "error": result.error,
        "seconds": result.seconds,
    }


def result_of(message: dict[str, Any]) -> tuple[int, ToolResult]:
    """The ticket and answer of a :func:`result_message` item."""
    result = ToolResult(
        str(message["name"]), str(message["content"]), message["error"], float(message["seconds"])
    )
    return int(message["ticket"]), result


class LocalToolExecutor:
    """Calls run on a thread pool of the rollout worker (each in its own process).

    Args:
        registry: The tools.
        concurrency: Calls running at once.
    """

    def __init__(self, registry: ToolRegistry, concurrency: int) -> None:
        self.registry = registry
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="rlinf-tool")
        self._done: queue.SimpleQueue[tuple[int, ToolResult]] = queue.SimpleQueue()

    def submit(self, ticket: int, call: ToolCall | MalformedCall) -> None:
        """Starts ``call`` on the pool."""
        future = self._pool.submit(self.registry.call, call)

        def deliver(done: Future[ToolResult]) -> None:
            self._done.put((ticket, done.result()))

        future.add_done_callback(deliver)

    def collect(self, timeout: float) -> list[tuple[int, ToolResult]]:
        """Finished calls; waits up to ``timeout`` s for the first."""
        out: list[tuple[int, ToolResult]] = []
        try:
            out.append(self._done.get(timeout=timeout) if timeout > 0 else self._done.get_nowait())
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Stops the pool (running calls end at their tool's timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class ChannelToolExecutor:
    """Calls go to the tool worker group on ``requests``; answers come back keyed by rank.

    Args:
        requests: The tool workers' request channel (shared by every rollout rank).
        replies: Answers, keyed by ``str(rank)``.
        rank: This rollout rank (where answers are addressed).
        put_timeout_s: Seconds a put may wait for room in ``requests``.
    """

    def __init__(
        self, requests: Channel, replies: Channel, rank: int, put_timeout_s: float
    ) -> None:
        self.requests, self.replies = requests, replies
        self.rank = rank
        self.put_timeout_s = put_timeout_s

    def submit(self, ticket: int, call: ToolCall | MalformedCall) -> None:
        """Sends ``call`` to the tool workers."""
        self.requests.put(call_message(self.rank, ticket, call), timeout=self.put_timeout_s)

    def collect(self, timeout: float) -> list[tuple[int, ToolResult]]:
        """Answers addressed to this rank; waits up to ``timeout`` s for the first."""
        key = str(self.rank)
        out: list[tuple[int, ToolResult]] = []
        try:
            if timeout > 0:
                out.append(result_of(self.replies.get(key=key, timeout=timeout)))
            else:
                out.append(result_of(self.replies.get_nowait(key=key)))
        except (TimeoutError, asyncio.QueueEmpty):
            return out
        while True:
            try:
                out.append(result_of(self.replies.get_nowait(key=key)))
            except asyncio.QueueEmpty:
                return out

    def close(self) -> None:
        """Nothing to release (the channels belong to the runner)."""


def overdue_result(name: str, waited_s: float) -> ToolResult:
    """The answer given to a call whose answer never came (a dead tool worker)."""
    return ToolResult(
        name, f"Error: no answer from the tool after {waited_s:.0f} s.", "timeout", waited_s
    )
