"""A channel the driver creates, without keeping the handle, serves worker groups by name
on a real Ray cluster, and nothing of the run is left in ``/dev/shm`` once the groups
and the cluster are shut down."""

from __future__ import annotations

import gc
import os
import uuid
from pathlib import Path

import numpy as np
import ray

from rlinf.core.channel import NAMESPACE_ENV, Channel
from rlinf.sched import Cluster, PackedPlacementStrategy, Worker


class Producer(Worker):
    def produce(self, name: str, count: int) -> int:
        channel = Channel.connect(name, timeout=30)
        for i in range(count):
            channel.put({"i": i, "data": np.full(1000, i)}, key="items")
        return count


class Consumer(Worker):
    def consume(self, name: str, count: int) -> list[int]:
        channel = Channel.connect(name, timeout=30)
        got = []
        for _ in range(count):
            item = channel.get(key="items", timeout=60)
            assert (item["data"] == item["i"]).all()
            got.append(item["i"])
        return got


def test_driver_channel_serves_two_groups_by_name_until_cluster_shutdown(monkeypatch) -> None:
    assert not ray.is_initialized()
    # A namespace of its own, so "nothing of the run is left" means exactly that.
    namespace = f"lifetime{os.getpid()}-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(NAMESPACE_ENV, namespace)

    def left() -> list[str]:
        return sorted(p.name for p in Path("/dev/shm").glob(f"rlinf.{namespace}.*"))

    cluster = Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 4}, num_cpus=2)
    try:
        Channel.create("x")  # the handle is not kept: the driver process keeps the channel
        gc.collect()
        assert left() == [f"rlinf.{namespace}.x"]
        producers = Producer.create_group().launch(
            cluster, PackedPlacementStrategy(0, 0), name="lifetime-prod"
        )
        consumers = Consumer.create_group().launch(
            cluster, PackedPlacementStrategy(1, 1), name="lifetime-cons"
        )
        try:
            got = consumers.consume("x", 20)  # waits for items: posted first
            assert producers.produce("x", 20).wait(timeout=120) == [20]
            assert got.wait(timeout=120) == [list(range(20))]
        finally:
            producers.close()
            consumers.close()
        # The workers' inboxes went with them; the driver still keeps its channel.
        assert left() == [f"rlinf.{namespace}.x"]
        assert Channel.connect("x").qsize("items") == 0
        gc.collect()
    finally:
        cluster.close()
    assert left() == []
