"""The :class:`Placement` record: where one process of a strategy runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where one process rank of a placement strategy runs.

    Attributes:
        rank: The process rank within the strategy (0..world_size-1).
        node_rank: Cluster node rank the process runs on.
        node_group: Label of the node group the process's resources belong to.
        local_rank: Index of this process among the strategy's processes on the
            same node, in rank order.
        local_world_size: Number of the strategy's processes on that node.
        resource_ranks: Resource ranks the process owns, numbered globally
            within ``node_group`` (accelerator ranks, CPU-slot ranks or hardware
            ranks; empty for :class:`NodePlacementStrategy`).
        local_accelerator_ids: Physical accelerator indices on the node that the
            process may see (empty on CPU nodes).
        resource_kind: What a resource rank counts: ``"accelerator"``,
            ``"cpu_slot"``, ``"node"`` or a registered hardware type name.
    """

    rank: int
    node_rank: int
    node_group: str
    local_rank: int
    local_world_size: int
    resource_ranks: tuple[int, ...]
    local_accelerator_ids: tuple[int, ...]
    resource_kind: str

    @property
    def visible_devices(self) -> str:
        """Value for ``CUDA_VISIBLE_DEVICES`` (empty string when no accelerators)."""
        return ",".join(str(i) for i in self.local_accelerator_ids)
