"""Ray baselines (full matrix only: a Ray cluster takes ~10 s to start).

Both use a ``QueueActor`` that holds one ``asyncio.Queue`` per key, like the
original RLinf channel (a ``ChannelWorker`` actor owning per-key queues), and
a ``ConsumerActor`` that runs the same :func:`chbench.transports.serve` loop
as every spawned child:

* ``ray_actor_queue``: the item itself is the argument of ``queue.put`` and
  the return value of ``queue.get`` (Ray copies it into the object store on
  each hop; items over 100 KiB travel through plasma).
* ``ray_put_get``: the producer ``ray.put`` s the item and only the object
  ref travels through the queue; the consumer ``ray.get`` s it (zero-copy
  numpy from plasma).

Ray is imported lazily, so importing this module costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from chbench.transports import ACK, CTL, WAIT_S, serve

_BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def ray_session() -> Iterator[None]:
    """A private local Ray cluster (2 CPUs, no dashboard), always shut down."""
    # Under `uv run`, Ray would start every worker through `uv run` with the
    # current folder as working_dir (packaged and re-synced: ~30 s per actor).
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    import ray
    from ray._private import ray_constants

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False  # in case ray was imported earlier
    # Ray workers must import chbench: they inherit the raylet's environment.
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _BENCH_DIR + (os.pathsep + path if path else "")
    try:
        ray.init(
            include_dashboard=False,
            num_cpus=2,
            object_store_memory=2 << 30,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        yield
    finally:
        try:
            ray.shutdown()
        finally:
            if path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = path


class QueueActor:
    """One asyncio queue per key (async actor: a waiting get never blocks a put)."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[Any]] = {}

    def _queue(self, key: str) -> asyncio.Queue[Any]:
        if key not in self.queues:
            self.queues[key] = asyncio.Queue()
        return self.queues[key]

    async def put(self, key: str, item: Any) -> None:
        self._queue(key).put_nowait(item)

    async def get(self, key: str) -> Any:
        return await self._queue(key).get()


class _RayEndpoint:
    """Receives from one key of the queue actor, sends to another.

    A ``get`` that timed out stays pending in the actor, so it is kept and
    awaited again rather than issued twice (which would lose a message).
    """

    def __init__(self, queue: Any, rx: str, tx: str, by_ref: bool) -> None:
        self.queue, self.rx, self.tx, self.by_ref = queue, rx, tx, by_ref
        self.pending: Any = None

    def send(self, obj: Any) -> None:
        import ray

        if self.by_ref:
            obj = [ray.put(obj)]  # a list, so Ray passes the ref itself, unresolved
        self.queue.put.remote(self.tx, obj)

    def recv(self, timeout: float = WAIT_S) -> Any:
        import ray

        if self.pending is None:
            self.pending = self.queue.get.remote(self.rx)
        try:
            item = ray.get(self.pending, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"no message within {timeout} s") from None
        self.pending = None
        if self.by_ref:
            item = ray.get(item[0], timeout=WAIT_S)
        return item

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.queue = self.pending = None


class ConsumerActor:
    def serve(self, queue: Any, by_ref: bool) -> None:
        endpoint = _RayEndpoint(queue, rx="data", tx="ack", by_ref=by_ref)
        try:
            endpoint.send(ACK)  # hello
            serve(endpoint)
        finally:
            endpoint.close()


class RayTransport:
    """Parent side of both Ray baselines (needs :func:`ray_session` running)."""

    def __init__(self, max_item_bytes: int, namespace: str, by_ref: bool) -> None:
        self.by_ref = by_ref
        self.name = "ray_put_get" if by_ref else "ray_actor_queue"
        self.queue: Any = None
        self.consumer: Any = None
        self.serve_ref: Any = None
        self.ep: _RayEndpoint | None = None

    def start(self) -> None:
        import ray

        try:
            self.queue = ray.remote(QueueActor).options(num_cpus=0).remote()
            self.consumer = ray.remote(ConsumerActor).options(num_cpus=0).remote()
            self.serve_ref = self.consumer.serve.remote(self.queue, self.by_ref)
            self.ep = _RayEndpoint(self.queue, rx="ack", tx="data", by_ref=self.by_ref)
            self.recv(WAIT_S)  # hello
        except BaseException:
            self.stop()
            raise

    def send(self, obj: Any) -> None:
        assert self.ep is not None
        self.ep.send(obj)

    def recv(self, timeout: float = WAIT_S) -> Any:
        import ray

        assert self.ep is not None
        try:
            return self.ep.recv(timeout)
        except TimeoutError:
            done, _ = ray.wait([self.serve_ref], timeout=0)
            if done:
                ray.get(done[0])  # re-raises the consumer's error
            raise

    def stop(self) -> None:
        import ray

        try:
            if self.ep is not None:
                with contextlib.suppress(Exception):
                    self.send((CTL, "stop"))
                    self.recv(10.0)
                    ray.get(self.serve_ref, timeout=10.0)
        finally:
            for actor in (self.consumer, self.queue):
                if actor is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
            self.consumer = self.queue = self.serve_ref = self.ep = None
