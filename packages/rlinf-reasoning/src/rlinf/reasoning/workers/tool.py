"""``ToolWorker``: serves the tool calls of every rollout rank over the channel.

Placed like any component (``cluster.component_placement.tool``). Each rank
runs :meth:`ToolWorker.serve` for the whole run: it takes calls from the
shared request channel (any tool rank may take any call), runs up to
``agent.tool_concurrency`` at once on a thread pool (each call in a process
of its own, see :class:`~rlinf.reasoning.tools.ToolRegistry`) and puts each
answer on the reply channel under the calling rollout rank's key. A ``None``
request ends one rank's ``serve`` (the runner sends one per tool rank).

Putting the tools on their own ranks keeps slow or heavy tools (a code
sandbox, a retriever's index) off the rollout's devices and lets one tool
group serve every rollout rank.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlinf.core.channel import Channel
from rlinf.reasoning.agent.executor import call_of, result_message
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.tools.factory import build_registry
from rlinf.reasoning.tools.registry import ToolRegistry
from rlinf.sched import Worker

__all__ = ["ToolWorker"]

_POLL_S = 0.5
"""How often a waiting :meth:`ToolWorker.serve` checks for :meth:`ToolWorker.stop`."""


class ToolWorker(Worker):
    """Runs tool calls for the rollout ranks.

    Args:
        cfg: The validated run config (with an ``agent`` section).
    """

    def __init__(self, cfg: ReasoningConfig) -> None:
        super().__init__()
        if cfg.agent is None:
            raise ValueError("ToolWorker needs an agent section in the config")
        self.cfg = cfg
        self.agent = cfg.agent
        self.registry: ToolRegistry | None = None
        self._stop = threading.Event()
        self.calls = 0

    def init_worker(self) -> dict[str, Any]:
        """Builds the tools (the sandbox is checked here, so a bad host fails at start).

        Returns:
            ``{"tools"}``: the tool names.
        """
        self.registry = build_registry(self.agent)
        return {"tools": self.registry.names}

    def serve(self, requests: Channel, replies: Channel) -> dict[str, Any]:
        """Answers calls until a ``None`` request or :meth:`stop`.

        Args:
            requests: Calls (:func:`~rlinf.reasoning.agent.executor.call_message` items).
            replies: Answers, put under ``str(reply_to)``.

        Returns:
            ``{"calls"}``: calls answered by this rank.
        """
        registry = self.registry
        if registry is None:
            raise RuntimeError("call init_worker() before serve()")
        timeout = self.cfg.runner.channel_timeout_s
        self._stop.clear()

        def answer(message: dict[str, Any]) -> None:
            result = registry.call(call_of(message))
            replies.put(
                result_message(int(message["ticket"]), result),
                key=str(message["reply_to"]),
                timeout=timeout,
            )

        with ThreadPoolExecutor(self.agent.tool_concurrency, "rlinf-tool") as pool:
            while not self._stop.is_set():
                try:
                    message = requests.get(timeout=_POLL_S)
                except TimeoutError:
                    continue
                if message is None:
                    break
                pool.submit(answer, message)
                self.calls += 1
        return {"calls": self.calls}

    def stop(self) -> None:
        """Ends a running :meth:`serve` after the calls it has taken."""
        self._stop.set()
