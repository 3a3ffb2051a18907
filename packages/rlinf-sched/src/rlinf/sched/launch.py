"""``launch_groups``: start several worker groups at once, all or none.

Worker start-up (a fresh Python process importing torch, a simulator or an
engine) dominates small runs, so groups are launched concurrently, one thread
each: Ray creates the actors and each group waits for its own ranks. If any
group fails to start, every group of the call is shut down before the first
error is raised, so a failed launch leaves no worker behind.
:func:`relaunch_groups` (used by ``runner.max_restarts``) goes through the
same path.

Example::

    groups = launch_groups(
        cluster,
        {
            "ActorGroup": (Actor.create_group(cfg), placement.get_strategy("actor")),
            "EnvGroup": (EnvWorker.create_group(cfg), placement.get_strategy("env")),
        },
    )
    actor, env = groups["ActorGroup"], groups["EnvGroup"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rlinf.core.logging import get_logger
from rlinf.sched.worker import WorkerGroup

if TYPE_CHECKING:
    from rlinf.sched.cluster import Cluster

__all__ = ["launch_groups", "relaunch_groups"]

_log = get_logger("rlinf.sched.launch")


def launch_groups(
    cluster: Cluster,
    groups: Mapping[str, tuple[WorkerGroup, Any]],
    *,
    timeout: float = 600.0,
) -> dict[str, WorkerGroup]:
    """Launches every group concurrently; if one fails, shuts all of them down and raises.

    Args:
        cluster: The cluster.
        groups: Group name -> ``(unlaunched group, placement strategy)``; a strategy
            of ``None`` takes :meth:`WorkerGroup.launch`'s default.
        timeout: Seconds each group waits for its ranks' constructors (imports
            of torch and simulators take a while on a loaded machine).

    Returns:
        Group name -> launched group, in the order given.

    Raises:
        WorkerError: The first group (in the order given) whose start failed,
            naming group and rank; the other failures are logged.
        ValueError: A bad group name or an empty placement.
    """

    def start(name: str) -> None:
        group, strategy = groups[name]
        group.launch(cluster, strategy, name=name, timeout=timeout)

    _all_or_none(list(groups), [group for group, _ in groups.values()], start)
    return {name: group for name, (group, _) in groups.items()}


def relaunch_groups(groups: Sequence[WorkerGroup]) -> None:
    """Shuts every group down, then launches them again on their placements, concurrently.

    Raises:
        Exception: The first group that failed to start again (all are shut down).
    """
    for group in groups:
        group.close()
    by_name = {group.name: group for group in groups}
    _all_or_none(list(by_name), list(groups), lambda name: by_name[name].relaunch())


def _all_or_none(
    names: list[str], groups: list[WorkerGroup], start: Callable[[str], object]
) -> None:
    """Runs ``start(name)`` for every name at once; on any failure shuts ``groups`` down.

    Also on Ctrl-C while waiting: the launches still running are let finish (each
    is bounded by its timeout) and then every group is shut down.
    """
    if not names:
        return
    errors: list[tuple[str, BaseException]] = []
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="rlinf-launch") as pool:
        futures = {name: pool.submit(start, name) for name in names}
        try:
            for name, future in futures.items():
                error = future.exception()
                if error is not None:
                    errors.append((name, error))
        except BaseException:
            pool.shutdown(wait=True)
            _shutdown(groups)
            raise
    if errors:
        for name, error in errors[1:]:
            _log.error("group %s also failed to start: %s", name, error)
        _shutdown(groups)
        raise errors[0][1]


def _shutdown(groups: list[WorkerGroup]) -> None:
    for group in groups:
        try:
            group.close()
        except Exception as exc:  # the launch error is the one to report
            _log.warning("shutting %s down after a failed launch raised %r", group.name, exc)
