"""Placement: which process runs where. Pure logic over :class:`ClusterInfo`; no Ray.

See ``docs/placement.md`` for the ``component_placement`` grammar.
"""

from rlinf.sched.placement.component import (
    ComponentPlacement,
    HybridComponentPlacement,
    PlacementMode,
)
from rlinf.sched.placement.flexible import FlexiblePlacementStrategy
from rlinf.sched.placement.grammar import (
    ComponentSpec,
    parse_component_placement,
    parse_rank_map,
)
from rlinf.sched.placement.model_parallel import ModelParallelComponentPlacement, RolloutSyncMode
from rlinf.sched.placement.node import NodePlacementStrategy
from rlinf.sched.placement.packed import PackedPlacementStrategy
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import Resource, ResourceKind, ResourceSpace
from rlinf.sched.placement.strategy import PlacementStrategy

__all__ = [
    "ComponentPlacement",
    "ComponentSpec",
    "FlexiblePlacementStrategy",
    "HybridComponentPlacement",
    "ModelParallelComponentPlacement",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementMode",
    "PlacementStrategy",
    "Resource",
    "ResourceKind",
    "ResourceSpace",
    "RolloutSyncMode",
    "parse_component_placement",
    "parse_rank_map",
]
