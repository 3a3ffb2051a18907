"""``rlinf auto-place`` for embodied configs: profile the components, then search placements.

The command line lives in rlinf-core, which may not import this stack; it
finds :func:`auto_place` through the entry point ``embodied`` of the group
``rlinf.autoplace`` (see :mod:`rlinf.core.autoplace`). The cost model and the
search are the pure functions of :mod:`rlinf.sched.autoplace`; this module
supplies what needs the embodied workers and config rules:

* the costs: ``profile_data`` from the config, or a few training steps with
  every component collocated on all slots (:func:`profile_embodied`), timed
  like :meth:`EmbodiedRunner._step <rlinf.embodied.runner.EmbodiedRunner>` and
  read from the runner's ``time/*`` metrics (env stepping, policy calls);
* the config of each candidate (:func:`candidate_config`): the placement,
  ``rollout.pipeline_stage_num`` and ``env.train.num_envs`` rescaled so every
  candidate steps the same number of envs in total; a candidate the config's
  rules refuse (``check_world_sizes``) is skipped with the reason.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from typing import Any

from rlinf.core.autoplace import AutoPlaceReport, PlacementCandidate, medians, ranked_report
from rlinf.core.config import ConfigError, validate_config
from rlinf.core.logging import get_logger
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.sched import (
    Cluster,
    HybridComponentPlacement,
    WorkerGroup,
    grown_actor_strategy,
    launch_groups,
)
from rlinf.sched.autoplace import (
    EmbodiedLayout,
    EmbodiedProfile,
    component_world_size,
    config_slots,
    refusal_from,
    search_embodied,
)
from rlinf.sched.placement import PlacementStrategy

__all__ = [
    "apply_candidate",
    "auto_place",
    "candidate_config",
    "collocated_layout",
    "embodied_actor_strategy",
    "launch_embodied_groups",
    "measure_steps",
    "num_slots",
    "profile_embodied",
    "profile_from_config",
    "profile_from_steps",
    "rank_placements",
    "rounds_per_rollout",
    "total_envs",
]

_log = get_logger("rlinf.embodied.autoplace")


def num_slots(cfg: EmbodiedConfig, slots: int | None = None) -> int:
    """Resource ranks to place on: ``slots`` if given, else what the config's cluster offers."""
    if slots is not None:
        if slots < 1:
            raise ValueError(f"--slots {slots}: give at least 1 resource rank")
        return slots
    return config_slots(
        cfg.cluster.component_placement,
        num_nodes=cfg.cluster.num_nodes,
        cpu_slots_per_node=cfg.cluster.cpu_slots_per_node,
    )


def total_envs(cfg: EmbodiedConfig, slots: int) -> int:
    """Train envs over all env ranks of the config's placement (kept by every candidate)."""
    ranks = component_world_size(cfg.cluster.component_placement, "env", slots)
    return cfg.env.train.num_envs * ranks


def collocated_layout(slots: int) -> EmbodiedLayout:
    """Every component on all ``slots`` slots, one stage: the layout profiling runs."""
    return EmbodiedLayout((0, slots - 1), (0, slots - 1), (0, slots - 1), 1)


def candidate_config(cfg: EmbodiedConfig, layout: EmbodiedLayout, envs: int) -> EmbodiedConfig:
    """``cfg`` with the layout's placement and stages, and ``envs`` train envs in total.

    Every candidate places a rollout group, so the candidate sets
    ``rollout.in_env_process: false``.

    Args:
        cfg: The config auto-place was given.
        layout: The candidate placement.
        envs: Train envs over all env ranks (:func:`total_envs`).

    Returns:
        The validated config, world sizes checked.

    Raises:
        ConfigError: The config's rules refuse the layout.
        ValueError: ``envs`` does not split evenly over the layout's env ranks.
    """
    n_env = layout.size("env")
    if envs % n_env:
        raise ValueError(
            f"{envs} train envs do not split over {n_env} env ranks; set env.train.num_envs "
            f"so that the total is a multiple of {n_env}"
        )
    data: dict[str, Any] = cfg.model_dump(mode="json")
    data["cluster"]["component_placement"] = layout.placement()
    data["rollout"]["pipeline_stage_num"] = layout.stages
    data["rollout"]["in_env_process"] = False
    data["env"]["train"]["num_envs"] = envs // n_env
    out = validate_config(data, EmbodiedConfig)
    out.check_world_sizes(actor=layout.size("actor"), env=n_env, rollout=layout.size("rollout"))
    return out


def embodied_actor_strategy(
    cfg: EmbodiedConfig, placement: HybridComponentPlacement
) -> tuple[PlacementStrategy, dict[str, Any]]:
    """Where the actor group's ranks go, and the extra constructor arguments of its class.

    Without online scaling: the placement's actor strategy and no arguments. With
    ``runner.online_scaling``: :func:`rlinf.sched.grown_actor_strategy` (base ranks
    on the actor's resources, extra ranks on the rollout's) and
    ``{"base_world_size": <actor resources>}``.

    Args:
        cfg: The validated config.
        placement: The run's placement.

    Returns:
        ``(strategy, kwargs)`` for ``EmbodiedFSDPActor.create_group(cfg, **kwargs)``.

    Raises:
        ValueError: Online scaling with actor and rollout on shared resources, or
            world sizes the grown actor cannot split the rollout over (the message
            names the key).
    """
    if not cfg.runner.online_scaling:
        return placement.get_strategy("actor"), {}
    strategy = grown_actor_strategy(placement, "actor", "rollout")
    grown = len(strategy.hardware_ranks_list)
    env = placement.get_world_size("env")
    rollout = placement.get_world_size("rollout")
    try:
        cfg.check_world_sizes(actor=grown, env=env, rollout=rollout)
    except ValueError as err:
        raise ValueError(
            f"runner.online_scaling=true trains on {grown} actor ranks (actor + rollout "
            f"resources), so each rollout is split over {grown}: {err}"
        ) from err
    return strategy, {"base_world_size": placement.get_world_size("actor")}


def launch_embodied_groups(
    cluster: Cluster, cfg: EmbodiedConfig, prefix: str = "autoplace"
) -> list[WorkerGroup]:
    """Launches actor, rollout and env groups on ``cfg``'s placement (all or none).

    With ``runner.online_scaling`` the actor group also gets extra ranks on the
    rollout's resources (:func:`embodied_actor_strategy`).

    Returns:
        ``[actor, rollout, env]``.

    Raises:
        ValueError: ``rollout.in_env_process: true`` (there is no rollout group to place).
    """
    from rlinf.embodied.workers import EmbodiedFSDPActor, EnvWorker, MultiStepRolloutWorker

    if cfg.rollout.in_env_process:
        raise ValueError(
            "rollout.in_env_process=true has no rollout group, and auto-place and online "
            "scaling place one; set rollout.in_env_process: false"
        )

    placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
    actor_strategy, actor_args = embodied_actor_strategy(cfg, placement)
    launched = launch_groups(
        cluster,
        {
            f"{prefix}-actor": (
                EmbodiedFSDPActor.create_group(cfg, **actor_args),
                actor_strategy,
            ),
            f"{prefix}-rollout": (
                MultiStepRolloutWorker.create_group(cfg),
                placement.get_strategy("rollout"),
            ),
            f"{prefix}-env": (EnvWorker.create_group(cfg), placement.get_strategy("env")),
        },
    )
    return list(launched.values())


def measure_steps(runner: EmbodiedRunner, steps: int, warmup: int = 1) -> list[dict[str, float]]:
    """Runs ``warmup + steps`` training steps (no eval, no checkpoints) and times each phase.

    The phases are those of the runner's own step: weight sync, rollout,
    advantages and training.

    Args:
        runner: An initialised runner (:meth:`EmbodiedRunner.init_workers` done).
        steps: Steps to time.
        warmup: Steps run first and not returned (first resets and inferences).

    Returns:
        Per timed step: ``step``, ``sync``, ``generate``, ``actor``, ``env`` and
        ``policy`` (busiest env / rollout rank; NaN if the workers do not report it).
    """
    out: list[dict[str, float]] = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        sync = runner.update_rollout_weights()
        metrics = runner.generate_rollouts()
        t_actor = time.perf_counter()
        runner.compute_advantages_and_returns()
        runner.run_training()
        actor = time.perf_counter() - t_actor
        runner.global_step += 1
        step = time.perf_counter() - start
        if i >= warmup:
            out.append(
                {
                    "step": step,
                    "sync": sync,
                    "generate": metrics["time/generate_rollouts"],
                    "actor": actor,
                    "env": metrics.get("time/env_chunk_steps", float("nan")),
                    "policy": metrics.get("time/policy_calls", float("nan")),
                }
            )
    return out


def rounds_per_rollout(cfg: EmbodiedConfig) -> int:
    """Chunk steps of one training rollout (``max_steps_per_rollout_epoch / num_action_chunks``).

    Falls back to ``env.train.max_episode_steps``, then to 1, when the rollout
    length is not in the config.
    """
    steps = cfg.env.train.max_steps_per_rollout_epoch or cfg.env.train.max_episode_steps or 1
    return max(1, steps // cfg.actor.model.num_action_chunks)


def profile_from_steps(
    records: Sequence[dict[str, float]], slots: int, rounds: int = 1
) -> EmbodiedProfile:
    """The cost model's inputs from :func:`measure_steps` of a collocated run (medians).

    Args:
        records: Timed steps.
        slots: Slots every component ran on.
        rounds: Chunk steps per rollout (:func:`rounds_per_rollout`).

    Returns:
        The profile: env and policy busy times, the rest of the rollout as
        hand-offs, advantages + training, weight sync, the rest of the step.

    Raises:
        ValueError: No steps, or the workers did not report env/policy times.
    """
    med = medians(records)
    env, policy = med("env"), med("policy")
    if env != env or policy != policy:  # NaN
        raise ValueError(
            "the env or rollout workers did not report time/env_chunk_steps and "
            "time/policy_calls; give profile_data in the config instead"
        )
    generate, actor, sync, step = med("generate"), med("actor"), med("sync"), med("step")
    return EmbodiedProfile(
        env_s=env,
        rollout_s=policy,
        actor_s=actor,
        slots=slots,
        sync_s=sync,
        handoff_s=max(0.0, generate - env - policy),
        overhead_s=max(0.0, step - generate - actor - sync),
        rounds=rounds,
    )


def profile_from_config(cfg: EmbodiedConfig, slots: int) -> EmbodiedProfile:
    """The profile from ``profile_data`` (measured on ``profile_data.slots``, else all slots).

    Raises:
        ValueError: The config has no ``profile_data``.
    """
    data = cfg.profile_data
    if data is None:
        raise ValueError(
            "the config has no profile_data; add profile_data: {env_cost: S, rollout_cost: S, "
            "actor_cost: S} (seconds per step, collocated) or let auto-place profile"
        )
    return EmbodiedProfile(
        env_s=data.env_cost,
        rollout_s=data.rollout_cost,
        actor_s=data.actor_cost,
        slots=data.slots or slots,
        sync_s=data.sync_cost,
        rounds=rounds_per_rollout(cfg),
    )


def _profiling_config(cfg: EmbodiedConfig, slots: int) -> EmbodiedConfig:
    try:
        data: dict[str, Any] = candidate_config(
            cfg, collocated_layout(slots), total_envs(cfg, slots)
        ).model_dump(mode="json")
    except (ConfigError, ValueError) as err:
        raise ValueError(
            f"profiling runs every component collocated on all {slots} slot(s), which the "
            f"config's rules refuse: {err}; change that key, or give profile_data"
        ) from err
    data["runner"]["resume_dir"] = None
    data["runner"]["logger"]["log_path"] = tempfile.mkdtemp(prefix="rlinf-autoplace-")
    data["runner"]["logger"]["logger_backends"] = []
    return validate_config(data, EmbodiedConfig)


def profile_embodied(
    cfg: EmbodiedConfig, *, steps: int = 3, slots: int | None = None
) -> EmbodiedProfile:
    """Profiles the real workers: ``steps`` timed training steps (after one warm-up), collocated.

    Starts a cluster (or attaches to a running Ray) per ``cfg.cluster``, places
    actor, env and rollout on all slots, and shuts the groups down afterwards.

    Args:
        cfg: The config (its total train envs are kept).
        steps: Timed steps.
        slots: Slots to profile on (default: :func:`num_slots`).

    Returns:
        The measured profile.
    """
    n = num_slots(cfg, slots)
    pcfg = _profiling_config(cfg, n)
    _log.info("auto-place: profiling %d step(s), collocated on %d slot(s)", steps, n)
    groups: list[WorkerGroup] = []
    with Cluster(num_nodes=pcfg.cluster.num_nodes, cluster_cfg=pcfg.cluster) as cluster:
        try:
            groups = launch_embodied_groups(cluster, pcfg)
            with EmbodiedRunner(pcfg, *groups) as runner:
                runner.init_workers()
                records = measure_steps(runner, steps)
        finally:
            for group in reversed(groups):
                group.close()
    return profile_from_steps(records, n, rounds_per_rollout(pcfg))


def auto_place(
    cfg: EmbodiedConfig,
    *,
    profile_steps: int = 3,
    force_profile: bool = False,
    max_stages: int = 4,
    slots: int | None = None,
) -> AutoPlaceReport:
    """The :data:`~rlinf.core.autoplace.AutoPlacer` of embodied configs (the CLI's work).

    ``max_stages`` bounds ``rollout.pipeline_stage_num``. It also raises
    ``ValueError`` for ``runner.mode: async`` (the model is the sync runner's).
    """
    if cfg.runner.mode != "sync":
        raise ValueError(
            f"runner.mode={cfg.runner.mode!r}: auto-place models the synchronous runner "
            "(runner.mode: sync) only"
        )
    n = num_slots(cfg, slots)
    if cfg.profile_data is not None and not force_profile:
        profile, source = profile_from_config(cfg, n), "profile_data"
    else:
        profile, source = profile_embodied(cfg, steps=profile_steps, slots=n), "profiled"
    return rank_placements(cfg, profile, source=source, slots=n, max_stages=max_stages)


def rank_placements(
    cfg: EmbodiedConfig,
    profile: EmbodiedProfile,
    *,
    source: str,
    slots: int,
    max_stages: int = 4,
) -> AutoPlaceReport:
    """Searches the placements of ``cfg`` on ``slots`` slots with ``profile``'s costs.

    Args:
        cfg: The embodied config (its total train envs are kept).
        profile: The costs.
        source: Where they came from (``profile_data`` or ``profiled``).
        slots: Resource ranks to place on.
        max_stages: Largest ``rollout.pipeline_stage_num`` tried.

    Returns:
        The report, fastest predicted placement first.

    Raises:
        ValueError: No placement passes the config's rules.
    """
    envs = total_envs(cfg, slots)
    candidates, skipped = search_embodied(
        profile,
        slots,
        max_stages=max_stages,
        overrides=lambda layout: {
            "env.train.num_envs": envs // layout.size("env"),
            "rollout.in_env_process": False,  # every candidate places a rollout group
        },
        refuse=refusal_from(lambda layout: candidate_config(cfg, layout, envs)),
    )
    costs = {
        "env_cost": profile.env_s,
        "rollout_cost": profile.rollout_s,
        "actor_cost": profile.actor_s,
        "sync_cost": profile.sync_s,
        "handoff_cost": profile.handoff_s,
        "overhead_cost": profile.overhead_s,
        "slots": float(profile.slots),
        "rounds": float(profile.rounds),
    }
    return ranked_report(candidates, skipped, costs, source, slots)


def apply_candidate(cfg: EmbodiedConfig, candidate: PlacementCandidate) -> EmbodiedConfig:
    """``cfg`` with a candidate's ``component_placement`` and dotted overrides applied.

    Returns:
        The validated config.
    """
    data: dict[str, Any] = cfg.model_dump(mode="json")
    data["cluster"]["component_placement"] = dict(candidate.placement)
    for key, value in candidate.overrides.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node[part]
        node[last] = value
    return validate_config(data, EmbodiedConfig)
