"""``NodePlacementStrategy``: one process per listed node, no hardware ranks."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import (
    DEFAULT_NODE_GROUP,
    NodeGroupSpec,
    ResourceSpace,
    normalize_node_groups,
)
from rlinf.sched.placement.strategy import PlacementStrategy, node_placements


class NodePlacementStrategy(PlacementStrategy):
    """Place one process per entry of ``node_ranks`` on that node.

    Repeat a node to put several processes on it; the list is sorted, so ranks
    follow node order. Each process sees every accelerator of its node and owns
    no resource ranks. Used for CPU-only workers, channels, agents and the like.

    Args:
        node_ranks: Node indices, one per process.
        node_group: None: ``node_ranks`` are global cluster node ranks. Otherwise
            they index the concatenated nodes of the listed groups, which must
            not share nodes.

    Raises:
        ValueError: On an empty list or a non-int / negative entry.
    """

    def __init__(self, node_ranks: Sequence[int], node_group: NodeGroupSpec = None) -> None:
        if isinstance(node_ranks, str | bytes) or not node_ranks:
            raise ValueError(f"node_ranks={node_ranks!r} must be a non-empty list of node ranks")
        for r in node_ranks:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise ValueError(f"node_ranks contains {r!r}: node ranks must be ints >= 0")
        self.node_ranks: list[int] = sorted(node_ranks)
        self.node_group: tuple[str, ...] | None = (
            None if node_group is None else normalize_node_groups(node_group)
        )

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return len(self.node_ranks)

    def get_placement(self, cluster: ClusterInfo) -> list[Placement]:
        """Place the processes on ``cluster`` (see :class:`PlacementStrategy`)."""
        if self.node_group is None:
            nodes = [(DEFAULT_NODE_GROUP, n.node_rank) for n in cluster.nodes]
            what = f"the cluster's {len(nodes)} node(s)"
        else:
            space = ResourceSpace(cluster, self.node_group)
            nodes = list(space.nodes)
            owners: dict[int, str] = {}
            for label, node_rank in nodes:
                if node_rank in owners:
                    raise ValueError(
                        f"node_group={list(self.node_group)}: node {node_rank} is in both "
                        f"{owners[node_rank]!r} and {label!r}; the listed groups must not overlap"
                    )
                owners[node_rank] = label
            what = f"the {len(nodes)} node(s) of node group(s) {list(self.node_group)}"
        for r in self.node_ranks:
            if r >= len(nodes):
                valid = f"0-{len(nodes) - 1}" if nodes else "none"
                raise ValueError(
                    f"node_ranks contains {r}, out of range for {what} (valid: {valid})"
                )
        return node_placements(cluster, [nodes[r] for r in self.node_ranks])

    def __repr__(self) -> str:
        groups = None if self.node_group is None else list(self.node_group)
        return f"NodePlacementStrategy({self.node_ranks}, node_group={groups})"
