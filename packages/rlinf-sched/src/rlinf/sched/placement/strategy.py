"""Base class of placement strategies and the shared record builder."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import ResourceKind, ResourceSpace


class PlacementStrategy(ABC):
    """Maps process ranks onto a cluster. Pure logic: no Ray."""

    @abstractmethod
    def get_placement(self, cluster: ClusterInfo) -> list[Placement]:
        """Place every process rank.

        Args:
            cluster: The cluster snapshot to place on.

        Returns:
            One :class:`Placement` per process, ordered by rank.

        Raises:
            ValueError: When the strategy does not fit the cluster.
        """


class ResourceListStrategy(PlacementStrategy):
    """A strategy given as a list of hardware-rank lists, one per process."""

    hardware_ranks_list: list[list[int]]
    node_group: tuple[str, ...]

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return len(self.hardware_ranks_list)

    def _hardware_space(self, cluster: ClusterInfo) -> ResourceSpace:
        """The resources of the strategy's node groups; they must count hardware."""
        space = ResourceSpace(cluster, self.node_group)
        if not space.has_hardware:
            raise ValueError(
                f"{type(self).__name__}: node_group={list(self.node_group)} counts whole "
                "nodes, not hardware; use NodePlacementStrategy for node-level placement"
            )
        return space


@dataclass(frozen=True)
class _Draft:
    node_rank: int
    node_group: str
    resource_ranks: tuple[int, ...]
    accelerator_ids: tuple[int, ...]
    kind: str


def finish_placements(drafts: Sequence[_Draft]) -> list[Placement]:
    """Number drafts by rank and fill ``local_rank`` / ``local_world_size`` per node."""
    per_node = Counter(d.node_rank for d in drafts)
    seen: Counter[int] = Counter()
    out: list[Placement] = []
    for rank, d in enumerate(drafts):
        out.append(
            Placement(
                rank=rank,
                node_rank=d.node_rank,
                node_group=d.node_group,
                local_rank=seen[d.node_rank],
                local_world_size=per_node[d.node_rank],
                resource_ranks=d.resource_ranks,
                local_accelerator_ids=d.accelerator_ids,
                resource_kind=d.kind,
            )
        )
        seen[d.node_rank] += 1
    return out


def node_accelerators(cluster: ClusterInfo, node_rank: int) -> tuple[int, ...]:
    """All accelerator ids of a node (empty for CPU nodes)."""
    for node in cluster.nodes:
        if node.node_rank == node_rank:
            return tuple(range(node.num_accelerators))
    return ()


def placements_from_resources(
    cluster: ClusterInfo,
    space: ResourceSpace,
    per_process: Sequence[Sequence[int]],
    argument: str,
) -> list[Placement]:
    """Build placements for processes given their resource ranks in ``space``.

    Args:
        cluster: The cluster snapshot.
        space: The resources the ranks index.
        per_process: Resource ranks per process, in process order.
        argument: Name of the argument the ranks came from (for messages).

    Returns:
        One placement per process.

    Raises:
        ValueError: When a rank is out of range or a process's resources span
            nodes, node groups or kinds.
    """
    drafts: list[_Draft] = []
    for proc, ranks in enumerate(per_process):
        for r in ranks:
            if not 0 <= r < space.size:
                valid = f"0-{space.size - 1}" if space.size else "none"
                raise ValueError(
                    f"{argument}: resource rank {r} of process {proc} is out of range; "
                    f"there are {space.describe()} (valid: {valid})"
                )
        res = [space.resources[r] for r in ranks]
        where = {(x.group_label, x.node_rank, x.kind) for x in res}
        if len(where) != 1:
            spots = ", ".join(f"{x.rank}->node {x.node_rank}/{x.group_label!r}" for x in res)
            raise ValueError(
                f"{argument}: process {proc} gets resources {list(ranks)} on more than one "
                f"node ({spots}); a process's resources must be on one node of one node group"
            )
        first = res[0]
        if first.kind == ResourceKind.ACCELERATOR:
            accel = tuple(x.local_index for x in res)
        else:
            accel = node_accelerators(cluster, first.node_rank)
        drafts.append(
            _Draft(
                node_rank=first.node_rank,
                node_group=first.group_label,
                resource_ranks=tuple(x.group_rank for x in res),
                accelerator_ids=accel,
                kind=first.kind,
            )
        )
    return finish_placements(drafts)


def node_placements(cluster: ClusterInfo, entries: Sequence[tuple[str, int]]) -> list[Placement]:
    """Placements for whole-node processes given ``(group label, node rank)`` entries."""
    drafts = [
        _Draft(
            node_rank=node_rank,
            node_group=label,
            resource_ranks=(),
            accelerator_ids=node_accelerators(cluster, node_rank),
            kind=ResourceKind.NODE.value,
        )
        for label, node_rank in entries
    ]
    return finish_placements(drafts)


def check_int(argument: str, value: object, minimum: int) -> int:
    """Validate an integer argument (``bool`` rejected) with a lower bound.

    Raises:
        ValueError: Naming the argument, the value and the valid range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{argument}={value!r} must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{argument}={value} is out of range: must be >= {minimum}")
    return value
