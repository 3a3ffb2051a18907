"""``ComponentPlacement``: the parsed ``component_placement`` of a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.flexible import FlexiblePlacementStrategy
from rlinf.sched.placement.grammar import ComponentSpec, parse_component_placement, parse_rank_map
from rlinf.sched.placement.node import NodePlacementStrategy
from rlinf.sched.placement.packed import PackedPlacementStrategy
from rlinf.sched.placement.record import Placement
from rlinf.sched.placement.resources import ResourceSpace
from rlinf.sched.placement.strategy import PlacementStrategy


class PlacementMode(Enum):
    """How components share resources."""

    COLLOCATED = "collocated"
    DISAGGREGATED = "disaggregated"
    HYBRID = "hybrid"
    AUTO = "auto"


class ComponentPlacement:
    """Strategies for every component named in ``cluster.component_placement``.

    When every selected node group counts hardware (accelerators, CPU slots or
    another hardware type), a component gets a :class:`FlexiblePlacementStrategy`
    over those resources; when a group counts whole nodes (``node``, or a CPU
    cluster with ``cpu_slots_per_node == 0``) it gets a
    :class:`NodePlacementStrategy`. Components under one key share one strategy
    object. All strategies are placed eagerly, so errors surface here.

    Args:
        config_placement: The ``component_placement`` mapping.
        cluster: The cluster snapshot.

    Raises:
        ValueError: On any grammar, rule or fit error; the message names the key.
    """

    placement_mode: PlacementMode | None = None

    def __init__(self, config_placement: Mapping[str, Any], cluster: ClusterInfo) -> None:
        self._cluster = cluster
        self._specs: dict[str, ComponentSpec] = {}
        self._strategies: dict[str, PlacementStrategy] = {}
        self._placements: dict[str, list[Placement]] = {}
        self._ranks: dict[str, list[int]] = {}
        for spec in parse_component_placement(config_placement):
            strategy, ranks = self._build(spec)
            placements = self._place(spec.key, strategy)
            for name in spec.names:
                self._specs[name] = spec
                self._strategies[name] = strategy
                self._placements[name] = placements
                self._ranks[name] = ranks

    def _build(self, spec: ComponentSpec) -> tuple[PlacementStrategy, list[int]]:
        where = f"component_placement[{spec.key!r}]"
        if spec.node_group is not None:
            where += ".placement"
        try:
            space = ResourceSpace(self._cluster, spec.node_group)
        except ValueError as e:
            raise ValueError(f"component_placement[{spec.key!r}]: {e}") from None
        per_process = parse_rank_map(spec.rank_map, space.size, where, space.describe())
        ranks = sorted({r for rs in per_process for r in rs})
        if space.has_hardware:
            return FlexiblePlacementStrategy(per_process, space.labels), ranks
        for proc, rs in enumerate(per_process):
            if len(rs) > 1:
                raise ValueError(
                    f"{where}={spec.rank_map!r}: process {proc} gets nodes {rs}, but "
                    f"{space.describe()} count whole nodes and a process runs on one node"
                )
        return NodePlacementStrategy([rs[0] for rs in per_process], space.labels), ranks

    def _place(self, key: str, strategy: PlacementStrategy) -> list[Placement]:
        try:
            return strategy.get_placement(self._cluster)
        except ValueError as e:
            raise ValueError(f"component_placement[{key!r}]: {e}") from None

    def _check(self, component: str) -> None:
        if component not in self._strategies:
            known = ", ".join(repr(c) for c in self._strategies)
            raise ValueError(f"unknown component {component!r}; known components: {known}")

    @property
    def cluster(self) -> ClusterInfo:
        """The cluster snapshot the placement was built for."""
        return self._cluster

    @property
    def components(self) -> list[str]:
        """Component names in config order."""
        return list(self._strategies)

    def has_component(self, component: str) -> bool:
        """Whether ``component`` is placed."""
        return component in self._strategies

    def get_strategy(self, component: str) -> PlacementStrategy:
        """The strategy of ``component``.

        Raises:
            ValueError: For an unknown component (the message lists known ones).
        """
        self._check(component)
        return self._strategies[component]

    def get_placements(self, component: str) -> list[Placement]:
        """The placements of ``component``'s processes, by rank."""
        self._check(component)
        return list(self._placements[component])

    def get_world_size(self, component: str) -> int:
        """Number of processes of ``component``."""
        self._check(component)
        return len(self._placements[component])

    def get_hardware_ranks(self, component: str) -> list[int]:
        """Resource ranks ``component`` uses, sorted and deduplicated.

        They index the resources of the component's node group(s), as written
        in the config (node indices for node-level components).
        """
        self._check(component)
        return list(self._ranks[component])

    def get_node_groups(self, component: str) -> tuple[str, ...]:
        """Labels of the node groups ``component`` was placed on."""
        self._check(component)
        return self._specs[component].node_group or ("cluster",)

    def _replace_strategy(self, component: str, strategy: PackedPlacementStrategy) -> None:
        """Swap in another strategy for ``component`` (used by subclasses)."""
        self._strategies[component] = strategy
        self._placements[component] = self._place(self._specs[component].key, strategy)


class HybridComponentPlacement(ComponentPlacement):
    """:class:`ComponentPlacement` in :attr:`PlacementMode.HYBRID`, with no extra rules.

    Used by embodied training, e.g. ``actor: 0-7, env: 0-3, rollout: 4-7``.
    """

    placement_mode: PlacementMode | None = PlacementMode.HYBRID
