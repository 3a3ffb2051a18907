"""Placement strategies against fake and hand-built clusters (no Ray)."""

import ast
import pathlib

import pytest

from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo
from rlinf.sched.placement import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    ResourceSpace,
)


def hetero_cluster() -> ClusterInfo:
    """Node 0: 8 GPUs, node 1: 4 GPUs, node 2: CPU only, node 3: robot host."""
    nodes = (
        NodeInfo(0, num_accelerators=8, accelerator_model="NV_GPU:A800"),
        NodeInfo(1, num_accelerators=4, accelerator_model="NV_GPU:4090"),
        NodeInfo(2),
        NodeInfo(3, num_accelerators=1),
    )
    groups = {
        "cluster": NodeGroupInfo("cluster", (0, 1, 2, 3), hardware_type="Accelerator"),
        "node": NodeGroupInfo("node", (0, 1, 2, 3), ignore_hardware=True),
        "a800": NodeGroupInfo("a800", (0,)),
        "4090": NodeGroupInfo("4090", (1,)),
        "gpus": NodeGroupInfo("gpus", (0, 1)),
        "cpu": NodeGroupInfo("cpu", (2,)),
        "franka": NodeGroupInfo("franka", (3,), hardware_type="Franka"),
        "ghost": NodeGroupInfo("ghost", (9,)),
    }
    return ClusterInfo(nodes=nodes, node_groups=groups)


def test_no_ray_import_in_placement() -> None:
    import rlinf.sched.placement as pkg

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(not a.name.startswith("ray") for a in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("ray"), path


# ---------------------------------------------------------------- packed
def test_packed_one_per_process_across_nodes() -> None:
    cluster = ClusterInfo.fake(2, accelerators_per_node=4)
    ps = PackedPlacementStrategy(0, 7).get_placement(cluster)
    assert [p.rank for p in ps] == list(range(8))
    assert [p.node_rank for p in ps] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [p.local_rank for p in ps] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert {p.local_world_size for p in ps} == {4}
    assert [p.resource_ranks for p in ps] == [(i,) for i in range(8)]
    assert [p.local_accelerator_ids for p in ps] == [(i % 4,) for i in range(8)]
    assert ps[5].visible_devices == "1"
    assert ps[0].node_group == "cluster"
    assert ps[0].resource_kind == "accelerator"


def test_packed_stride() -> None:
    cluster = ClusterInfo.fake(1, accelerators_per_node=8)
    strategy = PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2)
    ps = strategy.get_placement(cluster)
    assert [p.resource_ranks for p in ps] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert [p.visible_devices for p in ps] == ["0,2", "1,3", "4,6", "5,7"]
    assert strategy.world_size == 4


def test_packed_multiple_per_process_subrange() -> None:
    cluster = ClusterInfo.fake(2, accelerators_per_node=4)
    ps = PackedPlacementStrategy(2, 5, num_hardware_per_process=2).get_placement(cluster)
    assert [p.resource_ranks for p in ps] == [(2, 3), (4, 5)]
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in ps] == [(0, 0, 1), (1, 0, 1)]
    assert [p.visible_devices for p in ps] == ["2,3", "0,1"]


def test_packed_cross_node_rejected() -> None:
    cluster = ClusterInfo.fake(2, accelerators_per_node=4)
    with pytest.raises(
        ValueError, match=r"process 1 gets resources \[3, 4\] on more than one node"
    ):
        PackedPlacementStrategy(1, 4, num_hardware_per_process=2).get_placement(cluster)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_hardware_rank": -1, "end_hardware_rank": 3}, "start_hardware_rank=-1"),
        (
            {"start_hardware_rank": 4, "end_hardware_rank": 3},
            "end_hardware_rank=3 is out of range: must be >= 4",
        ),
        (
            {"start_hardware_rank": 0, "end_hardware_rank": 3, "num_hardware_per_process": 0},
            "num_hardware_per_process=0",
        ),
        ({"start_hardware_rank": 0, "end_hardware_rank": 3, "stride": 0}, "stride=0"),
        (
            {"start_hardware_rank": 0, "end_hardware_rank": 3, "stride": True},
            "stride=True must be an int",
        ),
        (
            {
                "start_hardware_rank": 0,
                "end_hardware_rank": 5,
                "num_hardware_per_process": 2,
                "stride": 2,
            },
            (
                "holds 6 resources, which is not a multiple of "
                "num_hardware_per_process * stride = 2 * 2 = 4"
            ),
        ),
    ],
)
def test_packed_argument_errors(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        PackedPlacementStrategy(**kwargs)


def test_packed_out_of_range_and_node_group_errors() -> None:
    cluster = ClusterInfo.fake(1, accelerators_per_node=4)
    with pytest.raises(
        ValueError,
        match=(
            r"end_hardware_rank=7 is out of range: there are 4 "
            r"accelerator .*'cluster' \(valid: 0-3\)"
        ),
    ):
        PackedPlacementStrategy(0, 7).get_placement(cluster)
    with pytest.raises(
        ValueError, match="counts whole nodes, not hardware; use NodePlacementStrategy"
    ):
        PackedPlacementStrategy(0, 0, node_group="node").get_placement(cluster)
    with pytest.raises(
        ValueError,
        match=(
            "node_group 'nope' is not a node group of the cluster; known groups: 'cluster', 'node'"
        ),
    ):
        PackedPlacementStrategy(0, 0, node_group="nope").get_placement(cluster)


# -------------------------------------------------------------- flexible
def test_flexible_reorders_by_first_rank() -> None:
    cluster = ClusterInfo.fake(1, accelerators_per_node=8)
    strategy = FlexiblePlacementStrategy([[6, 4], [1], [3, 2]])
    assert strategy.hardware_ranks_list == [[1], [2, 3], [4, 6]]
    ps = strategy.get_placement(cluster)
    assert [p.resource_ranks for p in ps] == [(1,), (2, 3), (4, 6)]
    assert [p.local_rank for p in ps] == [0, 1, 2]
    assert ps[2].visible_devices == "4,6"


def test_flexible_shared_resources_allowed() -> None:
    cluster = ClusterInfo.fake(1, accelerators_per_node=2)
    ps = FlexiblePlacementStrategy([[0], [0], [1], [1]]).get_placement(cluster)
    assert [p.visible_devices for p in ps] == ["0", "0", "1", "1"]
    assert [p.local_world_size for p in ps] == [4] * 4


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ([], "hardware_ranks_list=\\[\\] must be a non-empty list"),
        ([[0], []], r"hardware_ranks_list\[1\]=\[\] must be a non-empty list"),
        ([[0, -1]], r"hardware_ranks_list\[0\] contains -1: resource ranks must be ints >= 0"),
        ([["a"]], r"hardware_ranks_list\[0\] contains 'a'"),
        ([[1, 1]], r"hardware_ranks_list\[0\]=\[1, 1\] repeats a resource rank"),
    ],
)
def test_flexible_argument_errors(arg: list[list[object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FlexiblePlacementStrategy(arg)  # type: ignore[arg-type]


def test_flexible_range_and_node_errors() -> None:
    cluster = ClusterInfo.fake(2, accelerators_per_node=2)
    with pytest.raises(
        ValueError,
        match=r"resource rank 4 of process 0 is out of range; there are 4 .* \(valid: 0-3\)",
    ):
        FlexiblePlacementStrategy([[4]]).get_placement(cluster)
    with pytest.raises(ValueError, match="on more than one node"):
        FlexiblePlacementStrategy([[1, 2]]).get_placement(cluster)


def test_flexible_multi_group_numbering() -> None:
    cluster = hetero_cluster()
    # 4090 first (4 GPUs on node 1), then a800 (8 GPUs on node 0)
    ps = FlexiblePlacementStrategy([[3], [4, 5]], node_group=["4090", "a800"]).get_placement(
        cluster
    )
    assert [(p.node_rank, p.node_group, p.resource_ranks, p.visible_devices) for p in ps] == [
        (1, "4090", (3,), "3"),
        (0, "a800", (0, 1), "0,1"),
    ]
    with pytest.raises(ValueError, match="on more than one node"):
        FlexiblePlacementStrategy([[3, 4]], node_group="4090,a800").get_placement(cluster)


# ------------------------------------------------------------------ node
def test_node_strategy_global_ranks() -> None:
    cluster = ClusterInfo.fake(3, accelerators_per_node=2)
    ps = NodePlacementStrategy([2, 0, 2]).get_placement(cluster)
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in ps] == [
        (0, 0, 1),
        (2, 0, 2),
        (2, 1, 2),
    ]
    assert ps[0].visible_devices == "0,1"
    assert ps[0].resource_ranks == ()
    assert ps[0].resource_kind == "node"


def test_node_strategy_with_groups() -> None:
    cluster = hetero_cluster()
    ps = NodePlacementStrategy([0, 1], node_group=["cpu", "4090"]).get_placement(cluster)
    assert [(p.node_rank, p.node_group, p.visible_devices) for p in ps] == [
        (2, "cpu", ""),
        (1, "4090", "0,1,2,3"),
    ]
    with pytest.raises(
        ValueError,
        match=(
            r"node_ranks contains 2, out of range for the 2 node\(s\) of "
            r"node group\(s\) \['cpu', '4090'\] \(valid: 0-1\)"
        ),
    ):
        NodePlacementStrategy([2], node_group=["cpu", "4090"]).get_placement(cluster)
    with pytest.raises(
        ValueError, match="node 0 is in both 'a800' and 'gpus'; the listed groups must not overlap"
    ):
        NodePlacementStrategy([0], node_group=["a800", "gpus"]).get_placement(cluster)


def test_node_strategy_errors() -> None:
    cluster = ClusterInfo.fake(2)
    with pytest.raises(ValueError, match=r"node_ranks=\[\] must be a non-empty list"):
        NodePlacementStrategy([])
    with pytest.raises(ValueError, match="node_ranks contains -1"):
        NodePlacementStrategy([-1])
    with pytest.raises(
        ValueError,
        match=r"node_ranks contains 2, out of range for the cluster's 2 node\(s\) \(valid: 0-1\)",
    ):
        NodePlacementStrategy([2]).get_placement(cluster)


# -------------------------------------------------------- resource space
def test_resource_counting_modes() -> None:
    assert ResourceSpace(ClusterInfo.fake(3, accelerators_per_node=4), None).size == 12
    assert ResourceSpace(ClusterInfo.fake(3, accelerators_per_node=4), "node").size == 3
    cpu_slots = ResourceSpace(ClusterInfo.fake(2, cpu_slots_per_node=8), None)
    assert cpu_slots.size == 16 and cpu_slots.kinds == ("cpu_slot",) and cpu_slots.has_hardware
    cpu_nodes = ResourceSpace(ClusterInfo.fake(2), None)
    assert cpu_nodes.size == 2 and not cpu_nodes.has_hardware
    hetero = hetero_cluster()
    assert ResourceSpace(hetero, None).size == 13  # 8 + 4 + 0 + 1
    assert ResourceSpace(hetero, "gpus").size == 12
    assert ResourceSpace(hetero, "franka").kinds == ("Franka",)
    assert ResourceSpace(hetero, "cpu").kinds == ("node",)


def test_resource_space_errors() -> None:
    hetero = hetero_cluster()
    with pytest.raises(
        ValueError,
        match=(
            r"node group 'ghost' names node ranks \[9\] that the cluster "
            r"does not have \(valid: 0-3\)"
        ),
    ):
        ResourceSpace(hetero, "ghost")
    with pytest.raises(ValueError, match="lists 'a800' twice"):
        ResourceSpace(hetero, ["a800", "a800"])
    with pytest.raises(ValueError, match="is empty"):
        ResourceSpace(hetero, [])
    with pytest.raises(ValueError, match="every label must be a non-empty string"):
        ResourceSpace(hetero, "a800,")


def test_cpu_slot_placement() -> None:
    cluster = ClusterInfo.fake(1, cpu_slots_per_node=8)
    ps = PackedPlacementStrategy(0, 7, num_hardware_per_process=2).get_placement(cluster)
    assert [p.resource_ranks for p in ps] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(p.visible_devices == "" and p.local_accelerator_ids == () for p in ps)
    assert {p.resource_kind for p in ps} == {"cpu_slot"}


def test_robot_hardware_sees_node_accelerators() -> None:
    ps = FlexiblePlacementStrategy([[0]], node_group="franka").get_placement(hetero_cluster())
    assert (ps[0].node_rank, ps[0].resource_kind, ps[0].visible_devices) == (3, "Franka", "0")
