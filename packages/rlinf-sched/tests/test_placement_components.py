"""component_placement grammar, ComponentPlacement and the model-parallel modes."""

from typing import Any

import pytest

from rlinf.sched.cluster_info import ClusterInfo, NodeGroupInfo, NodeInfo
from rlinf.sched.placement import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    NodePlacementStrategy,
    PlacementMode,
    RolloutSyncMode,
    parse_component_placement,
    parse_rank_map,
)

GPU8 = ClusterInfo.fake(1, accelerators_per_node=8)
GPU16 = ClusterInfo.fake(2, accelerators_per_node=8)


def resources(cp: ComponentPlacement, name: str) -> list[tuple[int, ...]]:
    return [p.resource_ranks for p in cp.get_placements(name)]


# ------------------------------------------------------------- rank maps
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", [[0], [1], [2], [3]]),
        ("2", [[2]]),
        ("1-3", [[1], [2], [3]]),
        ("0-1,3", [[0], [1], [3]]),
        ("0-3:0-1", [[0, 1], [2, 3]]),
        ("0-1:0-3", [[0], [0], [1], [1]]),
        ("0:0-1,1-2:2,3", [[0], [0], [1, 2], [3]]),
        (" 0 - 1 : 0 - 1 ", [[0], [1]]),
        ("all:0", [[0, 1, 2, 3]]),
    ],
)
def test_rank_map_forms(text: str, expected: list[list[int]]) -> None:
    assert parse_rank_map(text, 4) == expected


def test_rank_map_large_process_map() -> None:
    out = parse_rank_map("0-1:0-199,2-3:200-399", 4)
    assert len(out) == 400
    assert out[0] == out[99] == [0] and out[100] == [1] and out[200] == [2] and out[399] == [3]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,,1", r"has an empty segment; segments are comma-separated 'resources\[:processes\]'"),
        ("0:1:2", r"segment '0:1:2': use at most one ':'"),
        ("x", r"'x' is not a rank or range; write 'a' or 'a-b' \(or 'all' for resources\)"),
        ("-1", r"'-1' is not a rank or range"),
        ("0-", r"'0-' is not a rank or range"),
        ("3-1", r"range '3-1' runs backwards"),
        ("0-1:all", "process ranks may not be 'all'"),
        (
            "0-4",
            (
                r"segment '0-4': resource rank 4 is out of range; there are 4 "
                r"resource\(s\) \(valid: 0-3\)"
            ),
        ),
        (
            "2,1",
            (
                r"segment '1': resource ranks must be unique and ascending "
                r"across segments, but 1 does not come after 2"
            ),
        ),
        ("0-1,1-2", "unique and ascending"),
        ("all,0", "unique and ascending"),
        (
            "0:1",
            (
                r"segment '0:1': process ranks must be unique, contiguous and "
                r"ascending from 0; expected this segment to start at process "
                r"0, got 1"
            ),
        ),
        ("0:0-1,1:1", "expected this segment to start at process 2, got 1"),
        ("0-2:0-1", r"2 process\(es\) on 3 resource\(s\); one count must divide the other"),
        ("0-1:0-2", r"3 process\(es\) on 2 resource\(s\)"),
    ],
)
def test_rank_map_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rank_map(text, 4, where="component_placement['actor']")


def test_rank_map_error_names_entry() -> None:
    with pytest.raises(ValueError, match=r"component_placement\['actor'\]='0-9'"):
        parse_rank_map("0-9", 4, where="component_placement['actor']")
    with pytest.raises(ValueError, match="'all' selects nothing"):
        parse_rank_map("all", 0)


# ---------------------------------------------------------- entry parsing
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "must be a non-empty mapping"),
        ({"actor,": "all"}, r"key 'actor,' has an empty component name"),
        ({"actor,actor": "all"}, r"key 'actor,actor' lists a component twice"),
        ({1: "all"}, "key 1 must be a string of component names"),
        (
            {"actor": "all", "rollout,actor": "0"},
            r"component 'actor' appears in keys 'actor' and 'rollout,actor'",
        ),
        ({"actor": ""}, r"component_placement\['actor'\] is empty"),
        ({"actor": 1.5}, r"component_placement\['actor'\]=1.5 must be a rank map string"),
        ({"actor": True}, r"component_placement\['actor'\]=True must be a rank map string"),
        (
            {"actor": {"placement": "0"}},
            r"component_placement\['actor'\] is missing field\(s\) \['node_group'\]",
        ),
        (
            {"actor": {"node_group": "a", "placement": "0", "x": 1}},
            r"unknown field\(s\) \['x'\]; allowed: node_group, placement",
        ),
        (
            {"actor": {"node_group": 3, "placement": "0"}},
            r"component_placement\['actor'\].node_group=3 must be a label",
        ),
        ({"actor": {"node_group": [], "placement": "0"}}, "must name one or more non-empty labels"),
        (
            {"actor": {"node_group": "a", "placement": None}},
            r"component_placement\['actor'\].placement=None must be a rank map",
        ),
    ],
)
def test_config_errors(config: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_component_placement(config)


def test_config_forms_parse() -> None:
    specs = parse_component_placement(
        {"env, rollout,actor": "all", "agent": {"node_group": "a, b", "placement": 3}}
    )
    assert specs[0].names == ("env", "rollout", "actor") and specs[0].node_group is None
    assert specs[1].node_group == ("a", "b") and specs[1].rank_map == "3"


# --------------------------------------------------- ComponentPlacement
def test_shared_key_shares_one_strategy() -> None:
    cp = ComponentPlacement({"env,rollout,actor": "all"}, GPU8)
    assert cp.components == ["env", "rollout", "actor"]
    assert cp.get_strategy("env") is cp.get_strategy("actor")
    assert isinstance(cp.get_strategy("env"), FlexiblePlacementStrategy)
    assert cp.get_world_size("rollout") == 8
    assert cp.get_hardware_ranks("actor") == list(range(8))
    assert cp.placement_mode is None


def test_int_and_list_values() -> None:
    cp = ComponentPlacement({"actor": "0-2,5,7", "reward": 6}, GPU8)
    assert cp.get_hardware_ranks("actor") == [0, 1, 2, 5, 7]
    assert [p.visible_devices for p in cp.get_placements("actor")] == ["0", "1", "2", "5", "7"]
    assert cp.get_world_size("reward") == 1


def test_unknown_component_lists_known() -> None:
    cp = ComponentPlacement({"actor": "all", "rollout": "all"}, GPU8)
    with pytest.raises(
        ValueError, match="unknown component 'critic'; known components: 'actor', 'rollout'"
    ):
        cp.get_strategy("critic")
    with pytest.raises(ValueError, match="unknown component"):
        cp.get_world_size("critic")


def test_resource_out_of_range_names_key_and_group() -> None:
    with pytest.raises(
        ValueError,
        match=(
            r"component_placement\['actor'\]='0-8', segment '0-8': "
            r"resource rank 8 is out of range; there are 8 accelerator "
            r"resource\(s\) in node group\(s\) 'cluster' \(valid: 0-7\)"
        ),
    ):
        ComponentPlacement({"actor": "0-8"}, GPU8)


def test_process_spanning_nodes_names_key() -> None:
    with pytest.raises(
        ValueError,
        match=(
            r"component_placement\['actor'\]: .*process 1 gets resources "
            r"\[6, 7, 8, 9\] on more than one node"
        ),
    ):
        ComponentPlacement({"actor": "2-13:0-2"}, GPU16)


def test_unknown_node_group_names_key() -> None:
    with pytest.raises(
        ValueError,
        match=(
            r"component_placement\['env'\]: node_group 'robot' is not a "
            r"node group of the cluster; known groups: 'cluster', 'node'"
        ),
    ):
        ComponentPlacement({"env": {"node_group": "robot", "placement": "0"}}, GPU8)


def test_multi_node_accelerator_counting() -> None:
    cp = ComponentPlacement({"actor": "0-15:0-3", "rollout": "6-9"}, GPU16)
    assert resources(cp, "actor") == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    actor = cp.get_placements("actor")
    assert [(p.node_rank, p.local_rank, p.visible_devices) for p in actor] == [
        (0, 0, "0,1,2,3"),
        (0, 1, "4,5,6,7"),
        (1, 0, "0,1,2,3"),
        (1, 1, "4,5,6,7"),
    ]
    rollout = cp.get_placements("rollout")
    assert [(p.node_rank, p.visible_devices) for p in rollout] == [
        (0, "6"),
        (0, "7"),
        (1, "0"),
        (1, "1"),
    ]


def test_node_group_node_counts_nodes() -> None:
    cluster = ClusterInfo.fake(4, accelerators_per_node=8)
    cp = ComponentPlacement(
        {"agent": {"node_group": "node", "placement": "0-1:0-199,2-3:200-399"}}, cluster
    )
    strategy = cp.get_strategy("agent")
    assert isinstance(strategy, NodePlacementStrategy)
    ps = cp.get_placements("agent")
    assert len(ps) == 400
    assert [ps[i].node_rank for i in (0, 99, 100, 200, 399)] == [0, 0, 1, 2, 3]
    assert ps[0].local_world_size == 100 and ps[150].local_rank == 50
    assert ps[0].visible_devices == "0,1,2,3,4,5,6,7"
    with pytest.raises(
        ValueError,
        match=(
            r"process 0 gets nodes \[0, 1\], but 4 node resource\(s\) in "
            r"node group\(s\) 'node' count whole nodes"
        ),
    ):
        ComponentPlacement({"agent": {"node_group": "node", "placement": "0-1:0"}}, cluster)
    with pytest.raises(
        ValueError, match=r"resource rank 4 is out of range; there are 4 node resource\(s\)"
    ):
        ComponentPlacement({"agent": {"node_group": "node", "placement": "4"}}, cluster)


def test_heterogeneous_node_groups() -> None:
    nodes = (*(NodeInfo(r, num_accelerators=4) for r in range(4)), NodeInfo(4), NodeInfo(5))
    groups = {
        "cluster": NodeGroupInfo("cluster", tuple(range(6)), hardware_type="Accelerator"),
        "node": NodeGroupInfo("node", tuple(range(6)), ignore_hardware=True),
        "a800": NodeGroupInfo("a800", (0, 1)),
        "4090": NodeGroupInfo("4090", (2, 3)),
        "franka": NodeGroupInfo("franka", (4, 5), hardware_type="Franka"),
    }
    cluster = ClusterInfo(nodes=nodes, node_groups=groups)
    cp = HybridComponentPlacement(
        {
            "actor": {"node_group": "a800", "placement": "0-7"},
            "rollout": {"node_group": "4090", "placement": "0-7"},
            "env": {"node_group": "franka", "placement": "0-1"},
            "both": {"node_group": ["a800", "4090"], "placement": "6-9"},
        },
        cluster,
    )
    assert cp.placement_mode is PlacementMode.HYBRID
    assert [p.node_rank for p in cp.get_placements("rollout")] == [2] * 4 + [3] * 4
    assert [(p.node_rank, p.resource_kind) for p in cp.get_placements("env")] == [
        (4, "Franka"),
        (5, "Franka"),
    ]
    both = cp.get_placements("both")
    assert [(p.node_group, p.node_rank, p.resource_ranks) for p in both] == [
        ("a800", 1, (6,)),
        ("a800", 1, (7,)),
        ("4090", 2, (0,)),
        ("4090", 2, (1,)),
    ]
    assert cp.get_node_groups("both") == ("a800", "4090")


# ------------------------------------------------------------- CPU slots
HYBRID_8 = {"actor": "0-7", "env": "0-3", "rollout": "4-7"}


def test_gpu_config_on_one_cpu_node_with_slots() -> None:
    cluster = ClusterInfo.fake(1, cpu_slots_per_node=8)
    cp = HybridComponentPlacement(HYBRID_8, cluster)
    assert [cp.get_world_size(c) for c in ("actor", "env", "rollout")] == [8, 4, 4]
    ps = cp.get_placements("rollout")
    assert [p.resource_ranks for p in ps] == [(4,), (5,), (6,), (7,)]
    assert all(
        p.node_rank == 0 and p.visible_devices == "" and p.resource_kind == "cpu_slot" for p in ps
    )
    assert [p.local_rank for p in cp.get_placements("actor")] == list(range(8))


def test_cpu_slots_span_nodes() -> None:
    cluster = ClusterInfo.fake(2, cpu_slots_per_node=4)
    cp = ComponentPlacement({"actor": "all"}, cluster)
    assert [p.node_rank for p in cp.get_placements("actor")] == [0] * 4 + [1] * 4


def test_gpu_config_without_slots_counts_nodes() -> None:
    cluster = ClusterInfo.fake(1)
    with pytest.raises(
        ValueError,
        match=(
            r"resource rank 7 is out of range; there are 1 node "
            r"resource\(s\) in node group\(s\) 'cluster' \(valid: 0-0\)"
        ),
    ):
        HybridComponentPlacement(HYBRID_8, cluster)
    cp = ComponentPlacement({"actor,rollout": "all", "env": "0:0-3"}, ClusterInfo.fake(2))
    assert isinstance(cp.get_strategy("actor"), NodePlacementStrategy)
    assert [p.node_rank for p in cp.get_placements("actor")] == [0, 1]
    assert [p.node_rank for p in cp.get_placements("env")] == [0] * 4


# -------------------------------------------------------- model parallel
def test_collocated_detection_and_strided_rollout() -> None:
    cp = ModelParallelComponentPlacement(
        {"actor,rollout,reward": "all"}, GPU8, actor_tp_size=4, rollout_tp_size=2
    )
    assert cp.is_collocated and not cp.is_pipeline and cp.placement_mode is PlacementMode.COLLOCATED
    assert cp.rollout_sync_mode is RolloutSyncMode.COLLOCATED
    assert resources(cp, "rollout") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert cp.get_world_size("actor") == 8 and cp.actor_dp_size == 2
    assert cp.rollout_world_size == 4 and cp.rollout_dp_size == 4
    assert cp.get_strategy("actor") is not cp.get_strategy("rollout")
    assert cp.reward_world_size == 8 and not cp.has_dedicated_inference


def test_disaggregated_detection() -> None:
    cp = ModelParallelComponentPlacement(
        {"rollout": "0-9", "inference": "10-11", "actor": "12-15", "reward": "0-15"},
        GPU16,
        rollout_tp_size=2,
        inference_tp_size=2,
        actor_tp_size=2,
    )
    assert cp.is_disaggregated and cp.is_pipeline and not cp.is_auto
    assert cp.rollout_sync_mode is RolloutSyncMode.DISAGGREGATED
    assert resources(cp, "rollout") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert cp.rollout_world_size == 5 and cp.rollout_dp_size == 5
    assert cp.has_dedicated_inference and cp.inference_world_size == 2 and cp.inference_dp_size == 1
    assert cp.actor_world_size == 4 and cp.actor_dp_size == 2
    assert cp.critic_world_size == 0


def test_auto_mode() -> None:
    cp = ModelParallelComponentPlacement(
        {"actor": "0-3", "rollout": "4-7", "reward": "0"}, GPU8, auto_scheduler=True
    )
    assert cp.is_auto and cp.is_pipeline
    assert cp.actor_world_size == 8 and cp.actor_dp_size == 4
    with pytest.raises(
        ValueError, match="auto_scheduler needs actor -> rollout back to back from resource 0"
    ):
        ModelParallelComponentPlacement(
            {"rollout": "0-3", "actor": "4-7", "reward": "0"}, GPU8, auto_scheduler=True
        )
    with pytest.raises(ValueError, match="to end at the last resource 7"):
        ModelParallelComponentPlacement(
            {"actor": "0-3", "rollout": "4-6", "reward": "0"}, GPU8, auto_scheduler=True
        )
    with pytest.raises(ValueError, match="auto_scheduler needs a disaggregated placement"):
        ModelParallelComponentPlacement({"actor,rollout,reward": "all"}, GPU8, auto_scheduler=True)
    with pytest.raises(ValueError, match="does not support a 'critic'"):
        ModelParallelComponentPlacement(
            {"actor": "0-3", "rollout": "4-7", "reward,critic": "0"}, GPU8, auto_scheduler=True
        )


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        (
            {"actor,rollout": "all"},
            {},
            r"needs components \['actor', 'rollout', 'reward'\]; missing \['reward'\]",
        ),
        (
            {"actor,rollout,reward": "0-2,5"},
            {},
            r"component 'actor' uses resource ranks \[0, 1, 2, 5\], which are not contiguous",
        ),
        (
            {"actor": "0-3", "rollout": "2-5", "reward": "0"},
            {},
            r"unsupported placement \(actor=0-3, rollout=2-5\)",
        ),
        (
            {"actor,rollout,reward": "all", "inference": "0-1"},
            {},
            "may not have a dedicated 'inference' component",
        ),
        (
            {"actor": "0-3", "rollout": "4-7", "inference": "3", "reward": "0"},
            {},
            r"unsupported placement \(actor=0-3, rollout=4-7, inference=3-3\)",
        ),
        (
            {"actor,rollout,reward": "all"},
            {"actor_tp_size": 2, "rollout_tp_size": 4},
            r"actor_tp_size \(2\) to be a multiple of rollout_tp_size \(4\)",
        ),
        (
            {"actor,rollout,reward": "0-5"},
            {"actor_tp_size": 4},
            (
                r"component 'actor' has 6 resource\(s\) \(0-5\), not a "
                r"multiple of its tp_size \* pp_size = 4 \* 1 = 4"
            ),
        ),
        (
            {"actor": "0-3", "rollout": "4-7", "inference": "7", "reward": "0"},
            {},
            "unsupported placement",
        ),
        (
            {"actor": "0-5", "rollout": "6", "inference": "7", "reward": "0"},
            {"inference_tp_size": 2},
            r"component 'inference' has 1 resource\(s\)",
        ),
        (
            {"actor,rollout,reward": "all", "inference,actor_inference": "0"},
            {},
            "are aliases of the dedicated inference",
        ),
        (
            {"actor,rollout,reward": "all"},
            {"rollout_pp_size": 0},
            "rollout_pp_size=0 is out of range",
        ),
        (
            {"actor,rollout": "all", "reward": {"node_group": "node", "placement": "0"}},
            {},
            r"component 'reward' is on node group\(s\) \['node'\] but actor is on \['cluster'\]",
        ),
    ],
)
def test_model_parallel_errors(
    config: dict[str, Any], kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelParallelComponentPlacement(config, GPU8, **kwargs)


def test_model_parallel_on_cpu_slots() -> None:
    cp = ModelParallelComponentPlacement(
        {"actor,rollout,reward": "all"},
        ClusterInfo.fake(1, cpu_slots_per_node=8),
        actor_tp_size=2,
        rollout_tp_size=2,
    )
    assert cp.is_collocated and resources(cp, "rollout") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    with pytest.raises(
        ValueError,
        match="count whole nodes; model-parallel components need accelerators or CPU slots",
    ):
        ModelParallelComponentPlacement({"actor,rollout,reward": "all"}, ClusterInfo.fake(2))
