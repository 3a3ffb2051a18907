"""Worker.device_phase on real Ray: lock, onload, work, offload, release, also on errors.

Two groups are placed on the same CPU slot, as collocated groups are, so they
share that slot's device lock.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from rlinf.core.channel import Channel
from rlinf.sched import Cluster, PackedPlacementStrategy, Worker, WorkerError, WorkerGroup


class PhaseWorker(Worker):
    """Records what happens around its phases; ``held`` is the lock state seen at each event."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, bool]] = []

    def onload(self) -> None:
        self.events.append(("onload", self.device_lock.held))

    def offload(self) -> None:
        self.events.append(("offload", self.device_lock.held))

    def phase(self, lock: bool, offload: bool, fail: bool = False) -> list[tuple[str, bool]]:
        self.events = []
        try:
            with self.device_phase(lock=lock, offload=offload, timeout=60):
                self.events.append(("work", self.device_lock.held))
                if fail:
                    raise ValueError("the phase failed")
        finally:
            self.events.append(("after", self.device_lock.held))
        return self.events

    def failed_events(self) -> list[tuple[str, bool]]:
        return self.events

    def phase_until(self, gate: Channel) -> str:
        """Holds a locked phase until the gate opens."""
        with self.device_phase(lock=True, offload=True, timeout=60):
            gate.put("inside", key="entered")
            return str(gate.get(key="leave", timeout=120))

    def try_phase(self, timeout: float) -> str:
        with self.device_phase(lock=True, offload=True, timeout=timeout):
            return "entered"


@pytest.fixture(scope="module")
def collocated() -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 2}, num_cpus=2) as cluster:
        slot = PackedPlacementStrategy(0, 0)
        first = PhaseWorker.create_group().launch(cluster, slot, name="first")
        second = PhaseWorker.create_group().launch(cluster, slot, name="second")
        yield first, second
        first.close()
        second.close()


def test_order_lock_onload_work_offload_release(collocated) -> None:
    first, _ = collocated
    (events,) = first.phase(True, True).wait(timeout=120)
    assert events == [
        ("onload", True),
        ("work", True),
        ("offload", True),
        ("after", False),
    ]


def test_without_lock_or_offload(collocated) -> None:
    first, _ = collocated
    (events,) = first.phase(False, True).wait(timeout=120)
    assert events == [("onload", False), ("work", False), ("offload", False), ("after", False)]
    (events,) = first.phase(True, False).wait(timeout=120)
    assert events == [("onload", True), ("work", True), ("after", False)], "no offload"


def test_a_failing_phase_offloads_and_releases(collocated) -> None:
    first, second = collocated
    with pytest.raises(WorkerError, match="the phase failed"):
        first.phase(True, True, True).wait(timeout=120)
    (events,) = first.failed_events().wait(timeout=120)
    assert events == [("onload", True), ("work", True), ("offload", True), ("after", False)]
    assert second.try_phase(5.0).wait(timeout=120) == ["entered"], "the lock was released"


def test_collocated_phases_take_turns(collocated) -> None:
    first, second = collocated
    gate = Channel.create("device-phase-gate")
    holding = first.phase_until(gate)
    assert gate.get(key="entered", timeout=120) == "inside"
    with pytest.raises(WorkerError, match=r"waited 0.5 s for the lock of device cpu_slot:0"):
        second.try_phase(0.5).wait(timeout=120)
    gate.put("done", key="leave")
    assert holding.wait(timeout=120) == ["done"]
    assert second.try_phase(5.0).wait(timeout=120) == ["entered"]
