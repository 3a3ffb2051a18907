"""The shared ``cluster`` config section: placement parsed, components checked per stack."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import ValidationError

from rlinf.sched.config import ClusterConfig


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
