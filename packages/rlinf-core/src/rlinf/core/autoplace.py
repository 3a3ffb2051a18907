"""What ``rlinf auto-place`` prints, and how it finds the stack that places a config.

Auto placement needs three layers: the command line lives here, in rlinf-core
(the ``rlinf`` console script ships with it); the cost model and the search
over placements are pure functions in :mod:`rlinf.sched.autoplace` (placement
is rlinf-sched's job); profiling needs the real workers of a stack
(``rlinf.embodied.autoplace_profile``, ``rlinf.reasoning.autoplace_profile``).
rlinf-core may not import the layers above it, so each stack registers an
*auto placer* under the entry-point group :data:`AUTOPLACE_GROUP`, named like
its config schema (``rlinf.config_schemas``); the command line loads the one
that matches ``--schema`` and formats what it returns. The result types below
are plain data, so the placer above builds them and the formatter here reads
them without either importing the other's layer.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from typing import Any

__all__ = [
    "AUTOPLACE_GROUP",
    "AutoPlaceReport",
    "AutoPlacer",
    "PlacementCandidate",
    "available_autoplacers",
    "format_report",
    "medians",
    "ranked_report",
    "report_to_json",
]

AUTOPLACE_GROUP = "rlinf.autoplace"
"""Entry-point group of the auto placers, one per config schema (``embodied``, ``reasoning``)."""


@dataclass(frozen=True)
class PlacementCandidate:
    """One placement auto-place considered, with its predicted step time.

    Attributes:
        placement: ``cluster.component_placement`` (component keys -> rank maps).
        overrides: Other config keys the placement needs, dotted
            (``rollout.pipeline_stage_num``; ``env.train.num_envs`` where the env
            world size changes and the total number of envs is kept).
        mode: ``collocated``, ``hybrid`` or ``disaggregated``.
        predicted_step_s: Predicted seconds per training step.
        breakdown: The cost model's terms (seconds), for the reader.
    """

    placement: dict[str, str]
    overrides: dict[str, Any]
    mode: str
    predicted_step_s: float
    breakdown: dict[str, float] = field(default_factory=dict)

    def yaml_snippet(self) -> str:
        """The candidate as YAML to paste into a config (``cluster:`` and the overrides)."""
        lines = ["cluster:", "  component_placement:"]
        lines += [f"    {_yaml_key(k)}: {_yaml_value(v)}" for k, v in self.placement.items()]
        sections: dict[str, list[tuple[list[str], Any]]] = {}
        for key, value in self.overrides.items():
            head, *rest = key.split(".")
            sections.setdefault(head, []).append((rest, value))
        for head, items in sections.items():
            lines.append(f"{head}:")
            for path, value in items:
                indent = "  "
                for depth, part in enumerate(path[:-1]):
                    lines.append(f"{indent * (depth + 1)}{part}:")
                lines.append(f"{indent * len(path)}{path[-1]}: {_yaml_value(value)}")
        return "\n".join(lines)


def _yaml_key(key: str) -> str:
    return f'"{key}"' if "," in key else key


def _yaml_value(value: Any) -> str:
    if isinstance(value, str):
        return value if value.replace("-", "").isdigit() or value == "all" else f'"{value}"'
    return json.dumps(value)


@dataclass(frozen=True)
class AutoPlaceReport:
    """What an auto placer returns: the ranked candidates and what they were predicted from.

    Attributes:
        candidates: Every valid placement enumerated, fastest predicted first.
        profile: The per-component costs the model used (seconds per step, and
            how many slots they were measured on).
        source: ``profile_data`` (from the config) or ``profiled`` (measured now).
        num_slots: Resource ranks (GPUs, or CPU slots) the search placed on.
        skipped: Enumerated placements the config's rules refuse, with why.
    """

    candidates: list[PlacementCandidate]
    profile: dict[str, float]
    source: str
    num_slots: int
    skipped: list[str] = field(default_factory=list)


AutoPlacer = Callable[..., AutoPlaceReport]
"""``placer(cfg, *, profile_steps=3, force_profile=False, max_stages=4, slots=None)``.

A placer profiles ``profile_steps`` timed steps of ``cfg``'s workers (or reads
the config's ``profile_data`` unless ``force_profile``), searches the
placements on ``slots`` resource ranks (default: the config's cluster), trying
pipelines of up to ``max_stages`` stages where its stack has them, and returns
the :class:`AutoPlaceReport`, fastest predicted placement first; it raises
``ValueError`` when no placement passes the config's rules.
"""


def medians(records: Sequence[Mapping[str, float]]) -> Callable[[str], float]:
    """``med(key)``: the median of ``key`` over timed steps (a profile's inputs).

    Raises:
        ValueError: No steps.
    """
    if not records:
        raise ValueError("no timed steps to profile from; give at least one step")

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in records))

    return med


def ranked_report(
    candidates: list[PlacementCandidate],
    skipped: list[str],
    profile: dict[str, float],
    source: str,
    num_slots: int,
) -> AutoPlaceReport:
    """The report of a search (its fields as in :class:`AutoPlaceReport`).

    Raises:
        ValueError: No candidate: every placement was refused (``skipped`` says why).
    """
    if not candidates:
        raise ValueError("no placement passes the config's rules:\n  " + "\n  ".join(skipped))
    return AutoPlaceReport(candidates, profile, source, num_slots, skipped)


def available_autoplacers() -> dict[str, Callable[[], AutoPlacer]]:
    """Registered auto placers by schema name; each value loads its placer when called."""
    return {ep.name: ep.load for ep in entry_points(group=AUTOPLACE_GROUP)}


def format_report(report: AutoPlaceReport, top: int | None = None) -> str:
    """The human-readable table: rank, placement YAML, predicted step time, best first.

    Args:
        report: What the placer returned.
        top: Show this many candidates (None: all).

    Returns:
        The text to print.
    """
    shown = report.candidates if top is None else report.candidates[:top]
    profile = ", ".join(f"{k}={v:.4g}" for k, v in report.profile.items())
    out = [
        f"auto-place over {report.num_slots} resource rank(s); costs from {report.source}: "
        f"{profile}",
        "",
        f"{'rank':>4}  {'predicted step':>14}  {'vs best':>7}  placement",
    ]
    best = report.candidates[0].predicted_step_s if report.candidates else 0.0
    for i, cand in enumerate(shown, 1):
        ratio = cand.predicted_step_s / best if best > 0 else float("nan")
        snippet = cand.yaml_snippet().splitlines()
        out.append(
            f"{i:>4}  {cand.predicted_step_s:>12.3f} s  {ratio:>6.2f}x  # {cand.mode}: "
            + ", ".join(f"{k}={v:.3f}s" for k, v in cand.breakdown.items())
        )
        out += [f"{'':>32}{line}" for line in snippet]
    if len(shown) < len(report.candidates):
        out.append(f"({len(report.candidates) - len(shown)} more; --top to show them)")
    if report.skipped:
        out.append(f"skipped {len(report.skipped)} placement(s) the config's rules refuse:")
        out += [f"  {why}" for why in report.skipped]
    return "\n".join(out)


def report_to_json(report: AutoPlaceReport, top: int | None = None) -> str:
    """The report as JSON (``--json``): ``candidates`` best first, each with its ``rank``."""
    data = asdict(report)
    cands: Sequence[Mapping[str, Any]] = data["candidates"]
    if top is not None:
        cands = cands[:top]
    data["candidates"] = [{"rank": i, **c} for i, c in enumerate(cands, 1)]
    return json.dumps(data, indent=2)
