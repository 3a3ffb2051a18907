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

import time
from collections.abc import Callable

from rlinf.sched.placement import ComponentPlacement, FlexiblePlacementStrategy
from rlinf.sched.wait import wait_all
from rlinf.sched.worker import GroupFuture, WorkerDiedError, WorkerError, WorkerGroup

__all__ = ["ScalingError", "grown_actor_strategy", "scale_actor"]

_PEER_GRACE_S = 10.0
"""How long a failed re-shard waits to see whether a peer rank died (the one to blame)."""


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


def scale_actor(
    actor: WorkerGroup,
    phase: str,
    timeout: float | None,
    on_error: Callable[[], object] | None = None,
) -> float:
    """Runs ``phase`` (``scale_up`` / ``scale_down``) on every actor rank; its seconds.

    Args:
        actor: The actor group (every rank takes part in the re-shard).
        phase: The actor method to call: ``"scale_up"`` or ``"scale_down"``.
        timeout: Seconds the ranks get (``runner.step_timeout_s``).
        on_error: Runs before the error propagates (the runners close their channels).

    Raises:
        ScalingError: A rank raised, died or hung while re-sharding. A rank that
            raised in a collective often only echoes a peer that died (gloo:
            connection closed): the dead rank is blamed when there is one.
    """
    start = time.perf_counter()
    future = getattr(actor, phase)()
    try:
        wait_all(
            [future],
            timeout,
            on_error=on_error,
            hint="a rank is stuck re-sharding; raise runner.step_timeout_s if it is slow",
        )
    except WorkerError as first:
        err = first if isinstance(first, WorkerDiedError) else _dead_peer(future, first)
        detail = "died" if isinstance(err, WorkerDiedError) else "raised"
        raise ScalingError(phase, err.group, err.rank, f"{detail}: {err}") from err
    except TimeoutError as err:
        raise ScalingError(phase, actor.name, -1, f"timed out: {err}") from err
    return time.perf_counter() - start


def _dead_peer(future: GroupFuture, err: WorkerError) -> WorkerError:
    """The first other rank of ``future`` that died within ``_PEER_GRACE_S``; else ``err``."""
    deadline = time.monotonic() + _PEER_GRACE_S
    for rank, ref in zip(future.ranks, future.refs, strict=True):
        if rank == err.rank:
            continue
        one = GroupFuture(future.group, [rank], [ref], future.method)
        try:
            wait_all([one], max(0.1, deadline - time.monotonic()))
        except WorkerDiedError as died:
            return died
        except (WorkerError, TimeoutError):
            continue
    return err
