"""``Worker``: the base class of every RLinf worker process (a Ray actor).

Subclass it, add methods, and launch a group with
``MyWorker.create_group(cfg).launch(cluster, placement_strategy=...)``. The
scheduler sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``GROUP_NAME`` (plus
``CUDA_VISIBLE_DEVICES`` on accelerators) before the worker's process starts,
so ``torch.distributed.init_process_group()`` works with no arguments.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rlinf.core.logging import get_worker_logger

if TYPE_CHECKING:
    from rlinf.sched.worker.group import WorkerGroup

__all__ = ["Worker"]

_REQUIRED_ENV = ("GROUP_NAME", "RANK", "WORLD_SIZE")


class Worker:
    """Base class of worker processes; one instance per rank of a group.

    Inside a worker, ``self.rank``, ``self.world_size``, ``self.local_rank``,
    ``self.node_rank`` and ``self.group_name`` describe its place, ``self.log_info``
    and friends log with a ``[group rank]`` prefix, and ``with
    self.worker_timer("tag"):`` times a section (the driver collects the times
    with ``group.pop_timings()``).

    Raises:
        RuntimeError: If instantiated outside a launched group (the
            scheduler's environment variables are missing).
    """

    def __init__(self) -> None:
        """Reads the placement the scheduler put in the environment."""
        missing = [k for k in _REQUIRED_ENV if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} is a Worker: create it with "
                f"{type(self).__name__}.create_group(...).launch(cluster), not directly "
                f"(missing environment: {', '.join(missing)})"
            )
        self.group_name = os.environ["GROUP_NAME"]
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.node_rank = int(os.environ.get("NODE_RANK", "0"))
        self._logger = get_worker_logger(self.group_name, self.rank)
        self._timings: dict[str, list[float]] = defaultdict(list)

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup:
        """An unlaunched group whose ranks will be built with ``cls(*args, **kwargs)``."""
        from rlinf.sched.worker.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

    # ----- logging ------------------------------------------------------------------
    def log_debug(self, msg: str, *args: Any) -> None:
        """Logs at DEBUG with the ``[group rank]`` prefix."""
        self._logger.debug(msg, *args)

    def log_info(self, msg: str, *args: Any) -> None:
        """Logs at INFO with the ``[group rank]`` prefix."""
        self._logger.info(msg, *args)

    def log_warning(self, msg: str, *args: Any) -> None:
        """Logs at WARNING with the ``[group rank]`` prefix."""
        self._logger.warning(msg, *args)

    def log_error(self, msg: str, *args: Any) -> None:
        """Logs at ERROR with the ``[group rank]`` prefix."""
        self._logger.error(msg, *args)

    # ----- timing -------------------------------------------------------------------
    @contextmanager
    def worker_timer(self, tag: str) -> Iterator[None]:
        """Times the ``with`` block under ``tag`` (seconds)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timings[tag].append(time.perf_counter() - start)

    def pop_timings(self) -> dict[str, float]:
        """Total seconds per tag since the last call; clears them."""
        out = {tag: sum(v) for tag, v in self._timings.items()}
        self._timings.clear()
        return out

    def ping(self) -> int:
        """Returns this worker's rank (a liveness check)."""
        return self.rank
