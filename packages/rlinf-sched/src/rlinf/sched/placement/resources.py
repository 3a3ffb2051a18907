"""Resource-rank resolution: how node groups turn into numbered resources.

A *resource rank* is what placement ranges count. For one node group:

* ``ignore_hardware`` (e.g. the built-in ``node`` group): each node is one
  resource.
* ``hardware_type == "Accelerator"``, or no hardware type but the group's nodes
  have accelerators: accelerators, counted across the group's nodes in node
  order, then by local accelerator index.
* another hardware type (e.g. a robot): one resource per node (``NodeInfo``
  carries no per-type hardware counts).
* no hardware type and no accelerators: ``cluster.cpu_slots_per_node`` CPU slots
  per node when it is > 0, else each node is one resource.

Several groups are numbered one after another, in the order they are listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo

DEFAULT_NODE_GROUP = "cluster"
"""Group used when a strategy or a component names none."""

NodeGroupSpec = str | Sequence[str] | None
"""A node-group selection: one label, ``"a,b"``, a list of labels, or None (``cluster``)."""


class ResourceKind(StrEnum):
    """What one resource rank of a node group counts."""

    ACCELERATOR = "accelerator"
    CPU_SLOT = "cpu_slot"
    NODE = "node"
    HARDWARE = "hardware"


@dataclass(frozen=True)
class Resource:
    """One numbered resource.

    Attributes:
        rank: Rank across all selected groups (what placement ranges count).
        group_rank: Rank within its own node group.
        group_label: The node group it belongs to.
        node_rank: The cluster node it lives on.
        local_index: Accelerator id / CPU-slot index on the node (0 for nodes).
        kind: What it counts (``accelerator``, ``cpu_slot``, ``node`` or a
            hardware type name).
    """

    rank: int
    group_rank: int
    group_label: str
    node_rank: int
    local_index: int
    kind: str


def normalize_node_groups(node_group: NodeGroupSpec) -> tuple[str, ...]:
    """Turn a node-group selection into a tuple of labels.

    Args:
        node_group: None (the ``cluster`` group), a label, a comma-joined string
            of labels, or a sequence of labels.

    Returns:
        The labels in order.

    Raises:
        ValueError: On an empty selection, an empty or non-string label, or a
            label listed twice.
    """
    if node_group is None:
        return (DEFAULT_NODE_GROUP,)
    raw: list[object]
    if isinstance(node_group, str):
        raw = [part.strip() for part in node_group.split(",")]
    elif isinstance(node_group, Sequence):
        raw = list(node_group)
    else:
        raise ValueError(
            f"node_group={node_group!r} is invalid: expected a label, "
            "a comma-joined string of labels or a list of labels"
        )
    if not raw:
        raise ValueError(f"node_group={node_group!r} is empty: name at least one node group")
    labels: list[str] = []
    for item in raw:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(
                f"node_group={node_group!r} contains {item!r}: every label must be "
                "a non-empty string"
            )
        label = item.strip()
        if label in labels:
            raise ValueError(f"node_group={node_group!r} lists {label!r} twice")
        labels.append(label)
    return tuple(labels)


def _group_kind(cluster: ClusterInfo, group: NodeGroupInfo, nodes: Sequence[NodeInfo]) -> str:
    if group.ignore_hardware:
        return ResourceKind.NODE.value
    if group.hardware_type == "Accelerator":
        return ResourceKind.ACCELERATOR.value
    if group.hardware_type is not None:
        return group.hardware_type
    if any(n.num_accelerators > 0 for n in nodes):
        return ResourceKind.ACCELERATOR.value
    if cluster.cpu_slots_per_node > 0:
        return ResourceKind.CPU_SLOT.value
    return ResourceKind.NODE.value


def _units_on_node(cluster: ClusterInfo, kind: str, node: NodeInfo) -> int:
    if kind == ResourceKind.ACCELERATOR:
        return node.num_accelerators
    if kind == ResourceKind.CPU_SLOT:
        return cluster.cpu_slots_per_node
    return 1


class ResourceSpace:
    """The numbered resources of one or more node groups of a cluster.

    Args:
        cluster: The cluster snapshot.
        node_group: The node-group selection (see :func:`normalize_node_groups`).

    Raises:
        ValueError: On an unknown label, or a group naming a node the cluster
            does not have.
    """

    def __init__(self, cluster: ClusterInfo, node_group: NodeGroupSpec) -> None:
        self.labels = normalize_node_groups(node_group)
        nodes_by_rank = {n.node_rank: n for n in cluster.nodes}
        resources: list[Resource] = []
        kinds: list[str] = []
        nodes: list[tuple[str, int]] = []
        for label in self.labels:
            group = cluster.node_groups.get(label)
            if group is None:
                known = ", ".join(repr(k) for k in sorted(cluster.node_groups))
                raise ValueError(
                    f"node_group {label!r} is not a node group of the cluster; "
                    f"known groups: {known}"
                )
            missing = [r for r in group.node_ranks if r not in nodes_by_rank]
            if missing:
                raise ValueError(
                    f"node group {label!r} names node ranks {missing} that the cluster does "
                    f"not have (valid: 0-{cluster.num_nodes - 1})"
                )
            group_nodes = [nodes_by_rank[r] for r in group.node_ranks]
            kind = _group_kind(cluster, group, group_nodes)
            kinds.append(kind)
            group_rank = 0
            for node in group_nodes:
                nodes.append((label, node.node_rank))
                for local in range(_units_on_node(cluster, kind, node)):
                    resources.append(
                        Resource(len(resources), group_rank, label, node.node_rank, local, kind)
                    )
                    group_rank += 1
        self.kinds: tuple[str, ...] = tuple(kinds)
        self.resources: tuple[Resource, ...] = tuple(resources)
        self.nodes: tuple[tuple[str, int], ...] = tuple(nodes)

    @property
    def size(self) -> int:
        """Number of resources across the selected groups."""
        return len(self.resources)

    @property
    def has_hardware(self) -> bool:
        """True when no selected group counts whole nodes as resources."""
        return all(k != ResourceKind.NODE for k in self.kinds)

    def describe(self) -> str:
        """Human-readable summary for error messages, e.g. ``8 accelerator(s) in 'cluster'``."""
        kinds = "/".join(dict.fromkeys(self.kinds))
        labels = ", ".join(repr(label) for label in self.labels)
        return f"{self.size} {kinds} resource(s) in node group(s) {labels}"
