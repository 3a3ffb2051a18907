"""The shared ``cluster`` config section: placement and node_groups checked at load."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from rlinf.core.config import ConfigError, RLinfModel, validate_config
from rlinf.sched.config import ClusterConfig
from rlinf.sched.node_groups import NodeEnv, NodeGroupSpec, parse_node_groups


class TwoRoleCluster(ClusterConfig):
    components: ClassVar[tuple[str, ...]] = ("actor", "rollout")
    placement_examples: ClassVar[str] = "'actor,rollout: 0' or actor: 0, rollout: 1"


def test_valid_placements() -> None:
    cfg = TwoRoleCluster(component_placement={"actor,rollout": "0-1"}, cpu_slots_per_node=2)
    assert cfg.num_nodes == 1 and cfg.node_groups is None
    TwoRoleCluster(component_placement={"actor": 0, "rollout": 1})


def test_missing_and_unknown_components_are_named() -> None:
    with pytest.raises(ValidationError, match=r"does not place \[.rollout.\].*rollout: 1"):
        TwoRoleCluster(component_placement={"actor": 0})
    with pytest.raises(ValidationError, match=r"unknown components \['critic'\]"):
        TwoRoleCluster(component_placement={"actor": 0, "rollout": 1, "critic": 0})


def test_unknown_keys_fail() -> None:
    with pytest.raises(ValidationError, match="num_gpus"):
        TwoRoleCluster(component_placement={"actor,rollout": 0}, num_gpus=8)  # type: ignore[call-arg]


def test_base_class_accepts_any_component_names() -> None:
    assert ClusterConfig(component_placement={"anything": 0}).component_placement == {"anything": 0}


@pytest.mark.parametrize(
    ("rank_map", "fragment"),
    [
        ("zero", "'zero' is not a rank or range"),
        ("0-x", "'0-x' is not a rank or range"),
        ("0,,1", "empty segment"),
        ("0:1:2", "at most one ':'"),
        ("3-1", "runs backwards"),
        ("0-3:all", "process ranks may not be 'all'"),
        ("1,0", "unique and ascending"),
        ("0:1", "contiguous and ascending from 0"),
        ("0-2:0-1", "one count must divide the other"),
    ],
)
def test_rank_map_grammar_is_checked_without_a_cluster(rank_map: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment) as info:
        TwoRoleCluster(component_placement={"actor": rank_map, "rollout": 1})
    assert "component_placement['actor']" in str(info.value)


@pytest.mark.parametrize("rank_map", ["all", "0-3", "0-1:0-3,2-3:4-5", "all:0-7", " 0 - 1 "])
def test_rank_map_grammar_accepts_valid_forms(rank_map: str) -> None:
    TwoRoleCluster(component_placement={"actor": rank_map, "rollout": 1})


# --- node_groups: validated at load, with the key path; Cluster() uses the same models --------

GROUPS: list[dict[str, Any]] = [
    {
        "label": "trainers",
        "node_ranks": "0-1",
        "env_configs": [
            {
                "node_ranks": "0-1",
                "env_vars": [{"NCCL_P2P_DISABLE": 1}],
                "python_interpreter_path": "/p",
            }
        ],
    },
    {"label": "sims", "node_ranks": "2,3", "ignore_hardware": True},
]


def test_valid_node_groups_load_and_resolve() -> None:
    data = {"component_placement": {"actor,rollout": 0}, "num_nodes": 4, "node_groups": GROUPS}
    cfg = TwoRoleCluster.model_validate(data)
    assert cfg.node_groups is not None and cfg.node_groups[0].env_configs[0].env_vars == [
        {"NCCL_P2P_DISABLE": "1"}
    ]
    for entries in (GROUPS, cfg.node_groups):  # Cluster's dict input and the loaded models
        specs, envs = parse_node_groups(entries, 4)
        assert specs == [
            NodeGroupSpec("trainers", (0, 1)),
            NodeGroupSpec("sims", (2, 3), ignore_hardware=True),
        ]
        assert envs == {r: NodeEnv({"NCCL_P2P_DISABLE": "1"}, "/p") for r in (0, 1)}
    assert parse_node_groups(None, 1) == ([], {})


@pytest.mark.parametrize(
    ("groups", "path", "fragment", "value"),
    [
        ([{"label": "node", "node_ranks": 0}], "[0].label", "is reserved", "node"),
        ([{"label": "", "node_ranks": 0}], "[0].label", "non-empty label", ""),
        (
            [{"label": "a", "node_ranks": 0}, {"label": "a", "node_ranks": 1}],
            "[1].label",
            "already used by node_groups[0]",
            "a",
        ),
        ([{"label": "a", "node_ranks": "0-x"}], "[0].node_ranks", "not a node rank", "0-x"),
        ([{"label": "a", "node_ranks": True}], "[0].node_ranks", "write e.g. 0, '0-3'", True),
        ([{"label": "a", "node_ranks": "1,1"}], "[0].node_ranks", "appears twice", "1,1"),
        ([{"label": "a", "node_ranks": "0-4"}], "[0].node_ranks", "cluster.num_nodes", "0-4"),
        ([{"label": "a", "node_ranks": 0, "env_config": []}], "[0].env_config", "did you mean", []),
        (
            [{"label": "a", "node_ranks": 0, "env_configs": [{"node_ranks": "0-1"}]}],
            "[0].env_configs[0].node_ranks",
            "nodes [1] are not in the group's node_ranks [0]",
            "0-1",
        ),
        (
            [
                {
                    "label": "a",
                    "node_ranks": "all",
                    "env_configs": [{"node_ranks": "0-1"}, {"node_ranks": 1}],
                }
            ],
            "[0].env_configs[1].node_ranks",
            "already configured by an earlier",
            1,
        ),
        (
            [
                {
                    "label": "a",
                    "node_ranks": 0,
                    "env_configs": [{"node_ranks": 0, "env_vars": ["A=1"]}],
                }
            ],
            "[0].env_configs[0].env_vars[0]",
            "one-key mapping",
            "A=1",
        ),
        (
            [
                {
                    "label": g,
                    "node_ranks": 0,
                    "env_configs": [{"node_ranks": 0, "env_vars": [{"A": 1}]}],
                }
                for g in ("a", "b")
            ],
            "[1].env_configs[0].env_vars",
            "node 0 already sets ['A'] through another group",
            [{"A": "1"}],
        ),
    ],
)
def test_bad_node_groups_name_the_key_at_load_and_in_cluster(
    groups: list[dict[str, Any]], path: str, fragment: str, value: object
) -> None:
    class Top(RLinfModel):
        cluster: TwoRoleCluster

    data = {
        "cluster": {
            "component_placement": {"actor,rollout": 0},
            "num_nodes": 4,
            "node_groups": groups,
        }
    }
    for check in (lambda: validate_config(data, Top), lambda: parse_node_groups(groups, 4)):
        with pytest.raises(ConfigError) as err:
            check()
        (issue,) = err.value.issues
        assert issue.path == f"cluster.node_groups{path}"
        assert fragment in issue.message
        assert issue.value == value
