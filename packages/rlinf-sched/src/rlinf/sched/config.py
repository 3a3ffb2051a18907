"""The ``cluster`` section shared by every stack's config.

A stack subclasses :class:`ClusterConfig` and names its components (and an
example placement for the error messages); the placement string itself is
parsed and checked here, with the placement grammar of
:mod:`rlinf.sched.placement`, and ``node_groups`` with the models of
:mod:`rlinf.sched.node_groups` (its ranks against ``num_nodes``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from rlinf.core.config import RLinfModel
from rlinf.sched.node_groups import NodeGroups, resolve_node_groups

__all__ = ["ClusterConfig"]


class ClusterConfig(RLinfModel):
    """Where the groups run (``cluster``).

    ``component_placement`` maps component names (alone or comma-joined, e.g.
    ``"actor,rollout": 0-1``) to resource ranks: GPUs, or CPU slots when
    ``cpu_slots_per_node`` > 0 on a CPU machine.

    Class attributes set by a stack's subclass:
        components: The component names a run of that stack may place, each once.
        optional_components: Those of ``components`` a run may leave out (the
            stack's config says when one must be placed).
        placement_examples: Example placements quoted in error messages.
    """

    components: ClassVar[tuple[str, ...]] = ()
    optional_components: ClassVar[tuple[str, ...]] = ()
    placement_examples: ClassVar[str] = ""

    num_nodes: int = Field(1, ge=1, description="Nodes the run needs.")
    component_placement: dict[str, Any] = Field(
        ..., description="Component names -> resource ranks (the placement grammar)."
    )
    cpu_slots_per_node: int = Field(
        0, ge=0, description="CPU machines: resource ranks per node (0: one per node)."
    )
    node_groups: NodeGroups | None = Field(
        None, description="Labelled node sets with per-node environments (optional)."
    )

    @field_validator("component_placement")
    @classmethod
    def _check_placement(cls, value: dict[str, Any]) -> dict[str, Any]:
        from rlinf.sched.placement.grammar import (
            check_rank_map_syntax,
            parse_component_placement,
        )

        specs = parse_component_placement(value)
        for spec in specs:
            check_rank_map_syntax(spec.rank_map, f"component_placement[{spec.key!r}]")
        if not cls.components:
            return value
        names = [n for spec in specs for n in spec.names]
        unknown = sorted(set(names) - set(cls.components))
        missing = [c for c in cls.components if c not in names and c not in cls.optional_components]
        if unknown:
            raise ValueError(
                f"names unknown components {unknown}; this run places "
                f"{', '.join(cls.components)} (e.g. {cls.placement_examples})"
            )
        if missing:
            raise ValueError(f"does not place {missing}; add them, e.g. {cls.placement_examples}")
        return value

    @model_validator(mode="after")
    def _check_node_groups(self) -> ClusterConfig:
        # Ranks against num_nodes, env_configs inside their group: errors carry the key path.
        if self.node_groups:
            resolve_node_groups(self.node_groups, self.num_nodes)
        return self
