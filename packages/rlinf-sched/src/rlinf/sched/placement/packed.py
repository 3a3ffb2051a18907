"""``PackedPlacementStrategy``: processes packed over a contiguous resource range."""

from __future__ import annotations

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import NodeGroupSpec, normalize_node_groups
from rlinf.sched.placement.strategy import (
    ResourceListStrategy,
    check_int,
    placements_from_resources,
)


class PackedPlacementStrategy(ResourceListStrategy):
    """Pack processes over the inclusive resource range ``[start, end]``.

    Each process takes ``num_hardware_per_process`` resources spaced ``stride``
    apart, starting at the lowest resource not yet taken. With 8 GPUs, 2 per
    process and stride 2 the processes get ``[0,2], [1,3], [4,6], [5,7]``.
    Process ranks follow resource order; a process may not cross a node.

    Args:
        start_hardware_rank: First resource rank (inclusive).
        end_hardware_rank: Last resource rank (inclusive).
        num_hardware_per_process: Resources per process (>= 1).
        stride: Distance between a process's resources (>= 1).
        node_group: Node group(s) whose resources the ranks count; None means
            ``cluster``. Groups counting whole nodes (e.g. ``node``) are refused.

    Raises:
        ValueError: On a bad argument, or when the range size is not a multiple
            of ``num_hardware_per_process * stride``.
    """

    def __init__(
        self,
        start_hardware_rank: int,
        end_hardware_rank: int,
        num_hardware_per_process: int = 1,
        stride: int = 1,
        node_group: NodeGroupSpec = None,
    ) -> None:
        self.start_hardware_rank = check_int("start_hardware_rank", start_hardware_rank, 0)
        self.end_hardware_rank = check_int(
            "end_hardware_rank", end_hardware_rank, self.start_hardware_rank
        )
        self.num_hardware_per_process = check_int(
            "num_hardware_per_process", num_hardware_per_process, 1
        )
        self.stride = check_int("stride", stride, 1)
        self.node_group = normalize_node_groups(node_group)
        size = self.end_hardware_rank - self.start_hardware_rank + 1
        block = self.num_hardware_per_process * self.stride
        if size % block:
            raise ValueError(
                f"the range start_hardware_rank={self.start_hardware_rank}.."
                f"end_hardware_rank={self.end_hardware_rank} holds {size} resources, which is "
                f"not a multiple of num_hardware_per_process * stride = "
                f"{self.num_hardware_per_process} * {self.stride} = {block}"
            )
        self.hardware_ranks_list: list[list[int]] = []
        for base in range(self.start_hardware_rank, self.end_hardware_rank + 1, block):
            for offset in range(self.stride):
                self.hardware_ranks_list.append(
                    [base + offset + k * self.stride for k in range(self.num_hardware_per_process)]
                )

    def get_placement(self, cluster: ClusterInfo) -> list[Placement]:
        """Place the processes on ``cluster`` (see :class:`PlacementStrategy`)."""
        space = self._hardware_space(cluster)
        if self.end_hardware_rank >= space.size:
            valid = f"0-{space.size - 1}" if space.size else "none"
            raise ValueError(
                f"end_hardware_rank={self.end_hardware_rank} is out of range: there are "
                f"{space.describe()} (valid: {valid})"
            )
        return placements_from_resources(
            cluster, space, self.hardware_ranks_list, "PackedPlacementStrategy"
        )

    def __repr__(self) -> str:
        return (
            f"PackedPlacementStrategy({self.start_hardware_rank}, {self.end_hardware_rank}, "
            f"num_hardware_per_process={self.num_hardware_per_process}, stride={self.stride}, "
            f"node_group={list(self.node_group)})"
        )
