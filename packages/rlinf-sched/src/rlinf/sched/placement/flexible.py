"""``FlexiblePlacementStrategy``: an explicit resource list per process."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import NodeGroupSpec, normalize_node_groups
from rlinf.sched.placement.strategy import ResourceListStrategy, placements_from_resources


class FlexiblePlacementStrategy(ResourceListStrategy):
    """Give each process an explicit list of resource ranks.

    The ranks inside a process are sorted and the processes are then **reordered
    by their first resource rank** (stable), so process rank ``k`` is the k-th
    in resource order, not the k-th as written. Several processes may share a
    resource; within one process a rank may appear only once, and all of a
    process's resources must be on one node of one node group.

    Args:
        hardware_ranks_list: Resource ranks per process.
        node_group: Node group(s) whose resources the ranks count; None means
            ``cluster``.

    Raises:
        ValueError: On an empty list, an empty process, a non-int or negative
            rank, or a rank repeated within a process.
    """

    def __init__(
        self, hardware_ranks_list: Sequence[Sequence[int]], node_group: NodeGroupSpec = None
    ) -> None:
        if isinstance(hardware_ranks_list, str | bytes) or not hardware_ranks_list:
            raise ValueError(
                f"hardware_ranks_list={hardware_ranks_list!r} must be a non-empty list of "
                "non-empty lists of resource ranks"
            )
        cleaned: list[list[int]] = []
        for proc, ranks in enumerate(hardware_ranks_list):
            if isinstance(ranks, str | bytes) or not isinstance(ranks, Sequence) or not ranks:
                raise ValueError(
                    f"hardware_ranks_list[{proc}]={ranks!r} must be a non-empty list of "
                    "resource ranks"
                )
            for r in ranks:
                if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                    raise ValueError(
                        f"hardware_ranks_list[{proc}] contains {r!r}: resource ranks must be "
                        "ints >= 0"
                    )
            if len(set(ranks)) != len(ranks):
                raise ValueError(
                    f"hardware_ranks_list[{proc}]={list(ranks)} repeats a resource rank; "
                    "each rank may appear once per process"
                )
            cleaned.append(sorted(ranks))
        self.hardware_ranks_list: list[list[int]] = sorted(cleaned, key=lambda rs: rs[0])
        self.node_group = normalize_node_groups(node_group)

    def get_placement(self, cluster: ClusterInfo) -> list[Placement]:
        """Place the processes on ``cluster`` (see :class:`PlacementStrategy`)."""
        space = self._hardware_space(cluster)
        return placements_from_resources(
            cluster, space, self.hardware_ranks_list, "hardware_ranks_list"
        )

    def __repr__(self) -> str:
        return (
            f"FlexiblePlacementStrategy({self.hardware_ranks_list}, "
            f"node_group={list(self.node_group)})"
        )
