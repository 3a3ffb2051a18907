"""What placement needs to know about a cluster, as plain data.

``Cluster`` (on Ray) builds a :class:`ClusterInfo` from the live cluster;
tests build one by hand (a fake cluster), so placement is pure logic that
runs without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeInfo:
    """One node of the cluster.

    Attributes:
        node_rank: The node's rank (0..num_nodes-1), from ``RLINF_NODE_RANK``
            or derived.
        num_accelerators: Accelerators (CUDA GPUs) on the node; 0 on CPU nodes.
        accelerator_model: e.g. ``"NV_GPU:H100"``; empty on CPU nodes.
        num_cpus: Logical CPUs Ray reports for the node.
        ip: The node's IP address.
        ray_node_id: Ray's id of the node (empty in fakes).
        env_vars: Extra environment variables for workers on this node (from
            ``cluster.node_groups[*].env_configs``).
        python_interpreter_path: Interpreter for workers on this node, if set.
    """

    node_rank: int
    num_accelerators: int = 0
    accelerator_model: str = ""
    num_cpus: int = 1
    ip: str = "127.0.0.1"
    ray_node_id: str = ""
    env_vars: dict[str, str] = field(default_factory=dict)
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class NodeGroupInfo:
    """A labelled set of nodes (``cluster.node_groups``, plus the built-in groups).

    Attributes:
        label: Unique, case-sensitive; ``cluster`` and ``node`` are built in.
        node_ranks: Ranks of the nodes in the group, ascending.
        ignore_hardware: Count each node as one resource (the built-in ``node`` group).
        hardware_type: ``"Accelerator"``, another registered type, or None (CPU only).
    """

    label: str
    node_ranks: tuple[int, ...]
    ignore_hardware: bool = False
    hardware_type: str | None = None


@dataclass(frozen=True)
class ClusterInfo:
    """A snapshot of the cluster that placement works against.

    Attributes:
        nodes: Every node, indexed by node rank.
        node_groups: Groups by label, including the built-in ``cluster`` (all
            nodes) and ``node`` (all nodes, one resource each).
        cpu_slots_per_node: On nodes without accelerators, how many resource
            ranks each node offers (so a config written for 8 GPUs launches on
            one CPU machine with ``cpu_slots_per_node: 8``). 0 = one per node.
    """

    nodes: tuple[NodeInfo, ...]
    node_groups: dict[str, NodeGroupInfo]
    cpu_slots_per_node: int = 0

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def num_accelerators(self) -> int:
        """Accelerators across the cluster."""
        return sum(n.num_accelerators for n in self.nodes)

    @classmethod
    def fake(
        cls,
        num_nodes: int,
        accelerators_per_node: int = 0,
        cpu_slots_per_node: int = 0,
        extra_groups: dict[str, NodeGroupInfo] | None = None,
    ) -> ClusterInfo:
        """A homogeneous cluster for tests and dry runs (no Ray)."""
        nodes = tuple(
            NodeInfo(
                node_rank=r,
                num_accelerators=accelerators_per_node,
                accelerator_model="NV_GPU:fake" if accelerators_per_node else "",
                num_cpus=max(1, cpu_slots_per_node),
                ip=f"10.0.0.{r + 1}",
            )
            for r in range(num_nodes)
        )
        all_ranks = tuple(range(num_nodes))
        groups = {
            "cluster": NodeGroupInfo(
                "cluster", all_ranks, hardware_type="Accelerator" if accelerators_per_node else None
            ),
            "node": NodeGroupInfo("node", all_ranks, ignore_hardware=True),
        }
        groups.update(extra_groups or {})
        return cls(nodes=nodes, node_groups=groups, cpu_slots_per_node=cpu_slots_per_node)
