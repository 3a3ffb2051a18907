"""``rlinf auto-place`` for reasoning configs: profile the components, then search placements.

The command line lives in rlinf-core, which may not import this stack; it
finds :func:`auto_place` through the entry point ``reasoning`` of the group
``rlinf.autoplace`` (see :mod:`rlinf.core.autoplace`). The cost model and the
search are the pure functions of :mod:`rlinf.sched.autoplace`; this module
supplies what needs the reasoning workers and config rules:

* the costs: ``profile_data`` from the config, or a few GRPO steps with actor,
  rollout and reward collocated on all slots (:func:`profile_reasoning`), read
  from the runner's ``time/*`` metrics (``time/rollout``, ``time/reward``,
  ``time/actor/inference``, ``time/actor/training``, ``time/sync_weights``);
* which candidates the config's rules allow (``check_world_sizes``, and
  asynchronous GRPO needing a disaggregated placement).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

from rlinf.core.autoplace import AutoPlaceReport, medians, ranked_report
from rlinf.core.config import ConfigError, validate_config
from rlinf.core.logging import get_logger
from rlinf.reasoning.async_grpo import check_async_placement
from rlinf.reasoning.config import ReasoningConfig
from rlinf.sched import Cluster
from rlinf.sched.autoplace import (
    ReasoningLayout,
    ReasoningProfile,
    config_slots,
    refusal_from,
    search_reasoning,
)

__all__ = [
    "auto_place",
    "candidate_config",
    "profile_from_config",
    "profile_from_metrics",
    "profile_reasoning",
    "stream_units",
]

_log = get_logger("rlinf.reasoning.autoplace")


def stream_units(cfg: ReasoningConfig) -> int:
    """Chunks of prompt groups a step streams between stages.

    ``rollout_batch_size / groups_per_chunk``, rounded up.
    """
    n, chunk = cfg.algorithm.rollout_batch_size, cfg.rollout.groups_per_chunk
    return max(1, -(-n // chunk))


def candidate_config(cfg: ReasoningConfig, layout: ReasoningLayout) -> ReasoningConfig:
    """``cfg`` with the layout's placement, its world-size rules checked.

    Raises:
        ConfigError: The config's rules refuse the placement.
        ValueError: A world-size rule, or asynchronous GRPO on a collocated placement.
    """
    data: dict[str, Any] = cfg.model_dump(mode="json")
    data["cluster"]["component_placement"] = layout.placement()
    out = validate_config(data, ReasoningConfig)
    n_actor = layout.actor[1] - layout.actor[0] + 1
    n_rollout = layout.rollout[1] - layout.rollout[0] + 1
    out.check_world_sizes(actor=n_actor, rollout=n_rollout, reward=n_rollout)
    check_async_placement(out, layout.mode == "collocated")
    return out


def profile_from_metrics(
    records: Sequence[dict[str, float]], slots: int, groups: int
) -> ReasoningProfile:
    """The cost model's inputs from the ``time/*`` metrics of collocated steps (medians).

    Raises:
        ValueError: No steps.
    """
    med = medians(records)
    parts = ("time/rollout", "time/reward", "time/actor/inference", "time/actor/training")
    rollout, reward, inference, train = (med(k) for k in parts)
    sync, step = med("time/sync_weights"), med("time/step")
    return ReasoningProfile(
        rollout_s=rollout,
        reward_s=reward,
        inference_s=inference,
        actor_s=train,
        slots=slots,
        groups=groups,
        sync_s=sync,
        overhead_s=max(0.0, step - (rollout + reward + inference + train + sync)),
    )


def profile_from_config(cfg: ReasoningConfig, slots: int) -> ReasoningProfile:
    """The profile from ``profile_data`` (measured on ``profile_data.slots``, else all slots).

    Raises:
        ValueError: The config has no ``profile_data``.
    """
    data = cfg.profile_data
    if data is None:
        raise ValueError(
            "the config has no profile_data; add profile_data: {rollout_cost: S, "
            "inference_cost: S, actor_cost: S} (seconds per step, collocated) or let "
            "auto-place profile"
        )
    return ReasoningProfile(
        rollout_s=data.rollout_cost,
        reward_s=data.reward_cost,
        inference_s=data.inference_cost,
        actor_s=data.actor_cost,
        slots=data.slots or slots,
        groups=stream_units(cfg),
        sync_s=data.sync_cost,
    )


def profile_reasoning(cfg: ReasoningConfig, *, steps: int = 3, slots: int) -> ReasoningProfile:
    """Profiles the real workers: ``steps`` GRPO steps (after one warm-up), collocated on all slots.

    Args:
        cfg: The config.
        steps: Timed steps.
        slots: Slots to profile on.

    Returns:
        The measured profile.
    """
    from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups

    layout = ReasoningLayout((0, slots - 1), (0, slots - 1))
    try:
        data: dict[str, Any] = candidate_config(cfg, layout).model_dump(mode="json")
    except (ConfigError, ValueError) as err:
        raise ValueError(
            f"profiling runs actor, rollout and reward collocated on all {slots} slot(s), "
            f"which the config's rules refuse: {err}; change that key, or give profile_data"
        ) from err
    data["runner"]["resume_dir"] = None
    data["runner"]["val_before_train"] = False
    data["runner"]["val_check_interval"] = -1
    data["runner"]["logger"]["log_path"] = tempfile.mkdtemp(prefix="rlinf-autoplace-")
    data["runner"]["logger"]["logger_backends"] = []
    pcfg = validate_config(data, ReasoningConfig)
    _log.info("auto-place: profiling %d step(s), collocated on %d slot(s)", steps, slots)
    with Cluster(num_nodes=pcfg.cluster.num_nodes, cluster_cfg=pcfg.cluster) as cluster:
        placement, actor, rollout, reward = launch_reasoning_groups(pcfg, cluster, "autoplace-")
        try:
            runner = ReasoningRunner(
                pcfg, actor, rollout, reward, collocated=placement.is_collocated
            )
            try:
                runner.init_workers()
                records = [runner.train_step() for _ in range(steps + 1)][1:]
            finally:
                runner.close()
        finally:
            for group in (actor, rollout, reward):
                group.close()
    return profile_from_metrics(records, slots, stream_units(pcfg))


def auto_place(
    cfg: ReasoningConfig,
    *,
    profile_steps: int = 3,
    force_profile: bool = False,
    max_stages: int = 4,
    slots: int | None = None,
) -> AutoPlaceReport:
    """The :data:`~rlinf.core.autoplace.AutoPlacer` of reasoning configs (the CLI's work).

    ``max_stages`` is unused: reasoning streams prompt groups, so there is no
    stage count to choose.
    """
    del max_stages
    if slots is not None and slots < 1:
        raise ValueError(f"--slots {slots}: give at least 1 resource rank")
    n = slots or config_slots(
        cfg.cluster.component_placement,
        num_nodes=cfg.cluster.num_nodes,
        cpu_slots_per_node=cfg.cluster.cpu_slots_per_node,
    )
    if cfg.profile_data is not None and not force_profile:
        profile, source = profile_from_config(cfg, n), "profile_data"
    else:
        profile, source = profile_reasoning(cfg, steps=profile_steps, slots=n), "profiled"
    candidates, skipped = search_reasoning(
        profile, n, refuse=refusal_from(lambda layout: candidate_config(cfg, layout))
    )
    costs = {
        "rollout_cost": profile.rollout_s,
        "reward_cost": profile.reward_s,
        "inference_cost": profile.inference_s,
        "actor_cost": profile.actor_s,
        "sync_cost": profile.sync_s,
        "overhead_cost": profile.overhead_s,
        "slots": float(profile.slots),
        "stream_units": float(profile.groups),
    }
    return ranked_report(candidates, skipped, costs, source, n)
