"""Auto placement: a cost model of one training step and a search over placements.

Pure functions, no Ray: the stacks measure (or read from ``profile_data``) what
each component costs in a collocated run, and this module predicts the step
time of every placement it enumerates and ranks them. The ``rlinf auto-place``
command (rlinf-core) reaches it through the stacks' auto placers
(``rlinf.embodied.autoplace_profile``, ``rlinf.reasoning.autoplace_profile``),
registered under the entry-point group ``rlinf.autoplace``, because rlinf-core
may not import the layers above it; the model sits here, with the rest of
placement, so both stacks share it and it is tested without workers.

Resource ranks ("slots") are GPUs, or CPU slots on a CPU machine. Assumptions
of the model (keep them in mind when reading its numbers):

* **Data-parallel scaling.** A component's work is its profiled seconds times
  the slots it was profiled on (slot-seconds); on ``n`` slots it takes
  ``work / n``. The total batch is kept (the embodied env count per rank is
  rescaled), so this is ideal data parallelism: fixed per-rank costs and
  collectives are not modelled.
* **A slot does one thing at a time.** Components that share slots take turns:
  their times add up. Pipelining env and policy on the *same* slots therefore
  gains nothing, and collocated placements are enumerated with one stage.
* **Pipelining** (embodied, ``rollout.pipeline_stage_num = S``), env and
  rollout on disjoint slots: with one stage they take turns (``T_env + T_pol``);
  with ``S >= 2`` stages the env steps one stage while the policy acts on
  another, so one rollout of ``K`` chunk steps takes about
  ``max(T_env, T_pol) + min(T_env, T_pol) / (S * K)``: the shorter side hides
  behind the longer except for the fill and drain of one stage of one chunk
  step (as in :mod:`rlinf.embodied.pipelining`). Each stage adds the hand-offs
  measured in the profile (``handoff_s`` per stage).
* **Synchronous training.** The actor trains after the rollout in every
  placement: in sync mode its training overlaps nothing, disaggregated or not.
  Weight sync (``sync_s``, measured) and the rest of the step (``overhead_s``:
  advantages, driver work) are added as measured, the same for every placement.
* **Reasoning** streams prompt groups rollout -> reward -> actor
  (logprob recomputation): on disjoint slots the three overlap except for one
  group's fill and drain (``max + (sum - max) / groups``); collocated they add.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from rlinf.core.autoplace import PlacementCandidate
from rlinf.sched.placement.grammar import parse_component_placement, parse_rank_map

__all__ = [
    "EmbodiedLayout",
    "EmbodiedProfile",
    "ReasoningLayout",
    "ReasoningProfile",
    "component_world_size",
    "config_slots",
    "enumerate_embodied",
    "enumerate_reasoning",
    "predict_embodied",
    "predict_reasoning",
    "rank_map",
    "refusal_from",
    "search_embodied",
    "search_reasoning",
]


_Layout = TypeVar("_Layout")


def refusal_from(build: Callable[[_Layout], object]) -> Callable[[_Layout], str | None]:
    """A search's ``refuse`` argument from a stack's candidate-config builder.

    Args:
        build: Builds and validates the config of a layout; raises ``ValueError``
            (``ConfigError`` included) when the stack's rules refuse it.

    Returns:
        A function giving the builder's error on one line, or None if the layout passes.
    """

    def refuse(layout: _Layout) -> str | None:
        try:
            build(layout)
        except ValueError as err:
            return " ".join(str(err).split())
        return None

    return refuse


def rank_map(first: int, last: int) -> str:
    """The placement-grammar range of slots ``first..last`` (``"3"`` or ``"0-3"``)."""
    return str(first) if first == last else f"{first}-{last}"


def config_slots(
    component_placement: Mapping[str, Any], *, num_nodes: int, cpu_slots_per_node: int
) -> int:
    """Resource ranks a config places on.

    ``num_nodes * cpu_slots_per_node`` on CPU slots, else one more than the
    highest rank its ``component_placement`` names.

    Raises:
        ValueError: The placement uses node groups or ``all`` without CPU slots (pass
            the number of slots instead).
    """
    if cpu_slots_per_node > 0:
        return num_nodes * cpu_slots_per_node
    highest = -1
    for spec in parse_component_placement(component_placement):
        if spec.node_group is not None or "all" in spec.rank_map:
            raise ValueError(
                f"cluster.component_placement[{spec.key!r}]={spec.rank_map!r}: cannot tell "
                "how many resource ranks to place on; give them (rlinf auto-place --slots N)"
            )
        ranks = parse_rank_map(spec.rank_map, 1 << 20, f"component_placement[{spec.key!r}]")
        highest = max([highest, *(r for proc in ranks for r in proc)])
    return highest + 1


def component_world_size(
    component_placement: Mapping[str, Any], component: str, num_slots: int
) -> int:
    """Processes a ``component_placement`` starts for ``component`` on ``num_slots`` slots.

    Raises:
        ValueError: The component is not placed.
    """
    for spec in parse_component_placement(component_placement):
        if component in spec.names:
            return len(
                parse_rank_map(spec.rank_map, num_slots, f"component_placement[{spec.key!r}]")
            )
    raise ValueError(f"cluster.component_placement does not place {component!r}")


def _check_costs(profile: EmbodiedProfile | ReasoningProfile) -> None:
    """Refuses a profile's negative or NaN ``*_s`` costs (named ``*_cost``) and ``slots < 1``."""
    for f in fields(profile):
        value = getattr(profile, f.name)
        if f.name.endswith("_s") and not value >= 0.0:  # also refuses NaN
            raise ValueError(
                f"profile {f.name[:-2]}_cost={value!r}: a cost must be a number of seconds >= 0"
            )
    if profile.slots < 1:
        raise ValueError(f"profile slots={profile.slots!r}: the costs must come from >= 1 slot")


# ---------------------------------------------------------------------- embodied


@dataclass(frozen=True)
class EmbodiedProfile:
    """Seconds per training step of each embodied component, measured on ``slots`` slots.

    The usual source is a collocated run (every component on the same
    ``slots`` slots), as ``rlinf auto-place`` profiles it.

    Attributes:
        env_s: The busiest env rank's time stepping its envs in one rollout.
        rollout_s: The busiest rollout rank's time in policy calls in one rollout.
        actor_s: Advantages plus training on the actor ranks.
        slots: Slots each component ran on while measured.
        sync_s: Weight sync actor -> rollout.
        handoff_s: Rest of the rollout with one stage (channel hand-offs, wake-ups).
        overhead_s: Rest of the step (driver, metrics).
        rounds: Chunk steps per rollout (``max_steps_per_rollout_epoch /
            num_action_chunks``): the pipeline fills and drains once per rollout.
    """

    env_s: float
    rollout_s: float
    actor_s: float
    slots: int
    sync_s: float = 0.0
    handoff_s: float = 0.0
    overhead_s: float = 0.0
    rounds: int = 1

    def __post_init__(self) -> None:
        _check_costs(self)
        if self.rounds < 1:
            raise ValueError(f"profile rounds={self.rounds!r}: a rollout has >= 1 chunk step")


@dataclass(frozen=True)
class EmbodiedLayout:
    """One embodied placement: a contiguous slot range per component, and the stages.

    Attributes:
        env: ``(first, last)`` slots of the env group.
        rollout: ``(first, last)`` slots of the rollout group.
        actor: ``(first, last)`` slots of the actor group.
        stages: ``rollout.pipeline_stage_num``.
    """

    env: tuple[int, int]
    rollout: tuple[int, int]
    actor: tuple[int, int]
    stages: int = 1

    def size(self, component: str) -> int:
        """Slots (= ranks, one per slot) of ``env``, ``rollout`` or ``actor``."""
        first, last = getattr(self, component)
        return int(last - first + 1)

    @property
    def mode(self) -> str:
        """``collocated`` (all share), ``hybrid`` (some share) or ``disaggregated``."""
        spans = [set(range(a, b + 1)) for a, b in (self.env, self.rollout, self.actor)]
        shared = [bool(spans[0] & spans[1]), bool(spans[0] & spans[2]), bool(spans[1] & spans[2])]
        return "collocated" if all(shared) else "hybrid" if any(shared) else "disaggregated"

    def placement(self) -> dict[str, str]:
        """``cluster.component_placement``; components on the same slots share one key."""
        by_range: dict[tuple[int, int], list[str]] = {}
        for name in ("actor", "env", "rollout"):
            by_range.setdefault(getattr(self, name), []).append(name)
        return {",".join(names): rank_map(*span) for span, names in by_range.items()}


def enumerate_embodied(num_slots: int, max_stages: int = 4) -> list[EmbodiedLayout]:
    """Every embodied placement the search considers on ``num_slots`` slots.

    * collocated: all three on every slot, one stage;
    * for each split ``k`` (env on slots ``0..k-1``, rollout on ``k..N-1``) and
      each stage count ``S`` in 1, 2, 4, ... up to ``max_stages``:
      hybrid (the actor on every slot) and disaggregated (the actor with the
      rollout; with 3+ slots also the actor on slots of its own, after the
      rollout's).

    Args:
        num_slots: Resource ranks to place on (GPUs, or CPU slots).
        max_stages: Largest ``pipeline_stage_num`` tried.

    Returns:
        The layouts, in a fixed order.

    Raises:
        ValueError: ``num_slots`` or ``max_stages`` < 1.
    """
    if num_slots < 1:
        raise ValueError(f"num_slots={num_slots}: auto-place needs at least one slot")
    if max_stages < 1:
        raise ValueError(f"max_stages={max_stages}: pipeline_stage_num is at least 1")
    last = num_slots - 1
    stage_counts = [1]
    while stage_counts[-1] * 2 <= max_stages:
        stage_counts.append(stage_counts[-1] * 2)
    out = [EmbodiedLayout((0, last), (0, last), (0, last), 1)]
    for k in range(1, num_slots):
        env, rollout = (0, k - 1), (k, last)
        actors = [(0, last), rollout]
        for stages in stage_counts:
            out += [EmbodiedLayout(env, rollout, actor, stages) for actor in actors]
    # Fully disaggregated: env, rollout and actor on slots of their own.
    for a in range(1, num_slots):
        for b in range(a + 1, num_slots):
            for stages in stage_counts:
                out.append(EmbodiedLayout((0, a - 1), (a, b - 1), (b, last), stages))
    return out


def predict_embodied(profile: EmbodiedProfile, layout: EmbodiedLayout) -> dict[str, float]:
    """The model's step time for one layout, term by term.

    Args:
        profile: Measured costs.
        layout: The placement.

    Returns:
        ``rollout``, ``actor``, ``sync``, ``overhead`` and their sum ``step`` (seconds).
    """
    work = profile.slots
    t_env = profile.env_s * work / layout.size("env")
    t_pol = profile.rollout_s * work / layout.size("rollout")
    env = set(range(layout.env[0], layout.env[1] + 1))
    rollout = set(range(layout.rollout[0], layout.rollout[1] + 1))
    s = layout.stages
    if env & rollout or s == 1:  # take turns (on shared slots stages cannot overlap them)
        generate = t_env + t_pol + profile.handoff_s * s
    else:  # overlap, but for one stage of one chunk step (fill and drain)
        generate = max(t_env, t_pol) + min(t_env, t_pol) / (s * profile.rounds)
        generate += profile.handoff_s * s
    train = profile.actor_s * work / layout.size("actor")
    terms = {
        "rollout": generate,
        "actor": train,
        "sync": profile.sync_s,
        "overhead": profile.overhead_s,
    }
    terms["step"] = sum(terms.values())
    return terms


def search_embodied(
    profile: EmbodiedProfile,
    num_slots: int,
    *,
    max_stages: int = 4,
    overrides: Callable[[EmbodiedLayout], dict[str, object]] | None = None,
    refuse: Callable[[EmbodiedLayout], str | None] | None = None,
) -> tuple[list[PlacementCandidate], list[str]]:
    """Predicts every enumerated embodied layout and ranks them, fastest first.

    Args:
        profile: Measured costs.
        num_slots: Slots to place on.
        max_stages: Largest ``pipeline_stage_num`` tried.
        overrides: Extra config keys a layout needs (the stack's, e.g. the env
            count per rank); ``rollout.pipeline_stage_num`` is always set.
        refuse: Why the stack's config rules refuse a layout (None: allowed).

    Returns:
        The ranked candidates and the refused layouts with their reasons.
    """
    candidates: list[PlacementCandidate] = []
    skipped: list[str] = []
    for layout in enumerate_embodied(num_slots, max_stages):
        why = refuse(layout) if refuse is not None else None
        if why is not None:
            skipped.append(f"{layout.placement()} stages={layout.stages}: {why}")
            continue
        terms = predict_embodied(profile, layout)
        step = terms.pop("step")
        extra: dict[str, object] = {"rollout.pipeline_stage_num": layout.stages}
        if overrides is not None:
            extra.update(overrides(layout))
        candidates.append(PlacementCandidate(layout.placement(), extra, layout.mode, step, terms))
    candidates.sort(key=lambda c: c.predicted_step_s)
    return candidates, skipped


# --------------------------------------------------------------------- reasoning


@dataclass(frozen=True)
class ReasoningProfile:
    """Seconds per GRPO step of each reasoning component, measured on ``slots`` slots.

    Attributes:
        rollout_s: The busiest rollout rank's generation time.
        reward_s: The busiest reward rank's scoring time.
        inference_s: The actor's logprob recomputation.
        actor_s: The actor's training.
        slots: Slots each component ran on while measured.
        groups: Prompt groups per step (the unit that streams between stages).
        sync_s: Weight sync actor -> rollout.
        overhead_s: Rest of the step.
    """

    rollout_s: float
    reward_s: float
    inference_s: float
    actor_s: float
    slots: int
    groups: int = 1
    sync_s: float = 0.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        _check_costs(self)
        if self.groups < 1:
            raise ValueError(f"profile groups={self.groups!r}: a step has >= 1 prompt group")


@dataclass(frozen=True)
class ReasoningLayout:
    """One reasoning placement: the actor's and the rollout's slots (reward with the rollout).

    Attributes:
        actor: ``(first, last)`` slots of the actor (training and inference).
        rollout: ``(first, last)`` slots of the rollout and the reward.
    """

    actor: tuple[int, int]
    rollout: tuple[int, int]

    @property
    def mode(self) -> str:
        """``collocated`` or ``disaggregated``."""
        return "collocated" if self.actor == self.rollout else "disaggregated"

    def placement(self) -> dict[str, str]:
        """``cluster.component_placement``."""
        if self.mode == "collocated":
            return {"actor,rollout,reward": rank_map(*self.actor)}
        return {
            "actor": rank_map(*self.actor),
            "rollout": rank_map(*self.rollout),
            "reward": rank_map(*self.rollout),
        }


def enumerate_reasoning(num_slots: int) -> list[ReasoningLayout]:
    """Collocated on every slot, then the actor on ``0..k-1`` and rollout+reward on ``k..N-1``."""
    if num_slots < 1:
        raise ValueError(f"num_slots={num_slots}: auto-place needs at least one slot")
    last = num_slots - 1
    out = [ReasoningLayout((0, last), (0, last))]
    out += [ReasoningLayout((0, k - 1), (k, last)) for k in range(1, num_slots)]
    return out


def predict_reasoning(profile: ReasoningProfile, layout: ReasoningLayout) -> dict[str, float]:
    """The model's GRPO step time for one layout, term by term (see the module docstring)."""
    work = profile.slots
    n_actor = layout.actor[1] - layout.actor[0] + 1
    n_rollout = layout.rollout[1] - layout.rollout[0] + 1
    stages = [
        profile.rollout_s * work / n_rollout,
        profile.reward_s * work / n_rollout,
        profile.inference_s * work / n_actor,
    ]
    if layout.mode == "collocated":
        generate = sum(stages)
    else:
        generate = max(stages) + (sum(stages) - max(stages)) / profile.groups
    terms = {
        "generate": generate,
        "actor": profile.actor_s * work / n_actor,
        "sync": profile.sync_s,
        "overhead": profile.overhead_s,
    }
    terms["step"] = sum(terms.values())
    return terms


def search_reasoning(
    profile: ReasoningProfile,
    num_slots: int,
    *,
    refuse: Callable[[ReasoningLayout], str | None] | None = None,
) -> tuple[list[PlacementCandidate], list[str]]:
    """Predicts every enumerated reasoning layout and ranks them, fastest first.

    Args:
        profile: Measured costs.
        num_slots: Slots to place on.
        refuse: Why the stack's config rules refuse a layout (None: allowed).

    Returns:
        The ranked candidates and the refused layouts with their reasons.
    """
    candidates: list[PlacementCandidate] = []
    skipped: list[str] = []
    for layout in enumerate_reasoning(num_slots):
        why = refuse(layout) if refuse is not None else None
        if why is not None:
            skipped.append(f"{layout.placement()}: {why}")
            continue
        terms = predict_reasoning(profile, layout)
        step = terms.pop("step")
        candidates.append(PlacementCandidate(layout.placement(), {}, layout.mode, step, terms))
    candidates.sort(key=lambda c: c.predicted_step_s)
    return candidates, skipped
