"""Online scaling: where the grown actor's ranks go, and the error a failed re-shard raises.

With ``runner.online_scaling`` in disaggregated placement the actor group is
launched over the actor's resources *and* the rollout's: the first ranks (the
*base* ranks, one per actor resource) hold the model all the time; the others
(the *extra* ranks, one per rollout resource, collocated with the rollout)
start idle and hold no model state. After a step's generation the actor grows
onto all ranks for training, and shrinks back to the base ranks before the
next generation (the mechanism is the actor's, e.g.
:meth:`rlinf.reasoning.workers.FSDPActor.scale_up`). Pre-launching the extra
ranks keeps process start-up (seconds: imports, process groups) out of the
step; growing only re-shards state in memory.

A rank that fails or dies while the state is re-sharded surfaces as
:class:`ScalingError`, naming the phase and the rank; it is a
:class:`~rlinf.sched.WorkerError`, so ``runner.max_restarts`` relaunches the
groups and resumes from the last checkpoint as for any dead worker.
"""

from __future__ import annotations

from rlinf.sched.placement import ComponentPlacement, FlexiblePlacementStrategy
from rlinf.sched.worker import WorkerError

__all__ = ["ScalingError", "grown_actor_strategy"]


class ScalingError(WorkerError):
    """A rank failed or died while the actor grew (``phase="scale_up"``) or shrank.

    Attributes:
        phase: ``"scale_up"`` or ``"scale_down"``.
        group: The actor group's name.
        rank: The rank that failed.
    """

    def __init__(self, phase: str, group: str, rank: int, detail: str) -> None:
        RuntimeError.__init__(
            self,
            f"online scaling failed in {phase}: {group}[rank {rank}] {detail}; the actor's "
            "state may be half re-sharded: relaunch and resume from the last checkpoint "
            "(runner.max_restarts > 0 does it), or set runner.online_scaling: false",
        )
        self.phase, self.group, self.rank = phase, group, rank


def grown_actor_strategy(
    placement: ComponentPlacement, actor: str = "actor", rollout: str = "rollout"
) -> FlexiblePlacementStrategy:
    """One actor process per actor resource, then one per rollout resource.

    Args:
        placement: The run's placement (disaggregated: actor and rollout on
            different resources of the same node group).
        actor: The actor component's name.
        rollout: The component whose resources the actor grows onto.

    Returns:
        A strategy whose ranks ``0..k-1`` sit on the actor's ``k`` resources
        and the next ones on the rollout's.

    Raises:
        ValueError: If the two components share a resource (collocated: nothing
            to grow onto) or are on different node groups.
    """
    base = placement.get_hardware_ranks(actor)
    extra = placement.get_hardware_ranks(rollout)
    shared = sorted(set(base) & set(extra))
    if shared:
        raise ValueError(
            f"runner.online_scaling=true needs disaggregated placement, but {actor} and "
            f"{rollout} share resources {shared} (cluster.component_placement); place them "
            "on different resources or set runner.online_scaling: false"
        )
    groups = placement.get_node_groups(actor)
    if placement.get_node_groups(rollout) != groups:
        raise ValueError(
            f"runner.online_scaling=true: {actor} is on node groups {list(groups)} but "
            f"{rollout} on {list(placement.get_node_groups(rollout))}; the actor can only "
            "grow onto resources of its own node group"
        )
    if min(extra) < max(base):
        # FlexiblePlacementStrategy orders processes by resource: the base ranks
        # must come first so that they are ranks 0..k-1.
        raise ValueError(
            f"runner.online_scaling=true needs the {actor} resources {base} before the "
            f"{rollout} resources {extra} (cluster.component_placement); swap them"
        )
    return FlexiblePlacementStrategy([[r] for r in base + extra], groups)
