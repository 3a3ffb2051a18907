"""``cluster.node_groups``: labelled node sets with per-node environments.

Each entry: ``label`` (unique; ``cluster`` and ``node`` are built in),
``node_ranks`` (``"0-3"``, ``"0,2,5-6"``, ``"all"`` or an int) and optional
``env_configs``: ``[{node_ranks, env_vars: [{KEY: VAL}, ...],
python_interpreter_path}]`` giving the workers on those nodes extra
environment variables and another Python interpreter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.sched.placement.grammar import _parse_range

__all__ = ["NodeEnv", "NodeGroupSpec", "parse_node_groups"]

_RESERVED = ("cluster", "node")
_GROUP_KEYS = {"label", "node_ranks", "env_configs", "ignore_hardware"}
_ENV_KEYS = {"node_ranks", "env_vars", "python_interpreter_path"}


@dataclass
class NodeEnv:
    """What workers on one node get on top of the scheduler's variables."""

    env_vars: dict[str, str] = field(default_factory=dict)
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class NodeGroupSpec:
    """One parsed ``cluster.node_groups`` entry."""

    label: str
    node_ranks: tuple[int, ...]
    ignore_hardware: bool = False


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _keys(obj: Any) -> set[str]:
    if isinstance(obj, Mapping):
        return {str(k) for k in obj}
    return {k for k in ("label", "node_ranks", "env_configs", "ignore_hardware") if hasattr(obj, k)}


def _parse_ranks(where: str, value: Any, num_nodes: int) -> tuple[int, ...]:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: node_ranks={value!r}; write e.g. 0, '0-3', '0,2' or 'all'")
    text = str(value)
    ranks: list[int] = []
    for part in text.split(","):
        for r in _parse_range(where, part, num_nodes):
            if r >= num_nodes:
                raise ValueError(
                    f"{where}: node rank {r} in {text!r} is out of range; the cluster has "
                    f"{num_nodes} node(s) (ranks 0-{num_nodes - 1})"
                )
            if r in ranks:
                raise ValueError(f"{where}: node rank {r} appears twice in {text!r}")
            ranks.append(r)
    return tuple(sorted(ranks))


def parse_node_groups(
    entries: Sequence[Any] | None, num_nodes: int
) -> tuple[list[NodeGroupSpec], dict[int, NodeEnv]]:
    """Validates ``cluster.node_groups``.

    Returns:
        The groups, and each configured node's extra environment.

    Raises:
        ValueError: Naming the entry (``cluster.node_groups[i]...``), the
            value and the fix.
    """
    groups: list[NodeGroupSpec] = []
    envs: dict[int, NodeEnv] = {}
    for i, entry in enumerate(entries or []):
        where = f"cluster.node_groups[{i}]"
        unknown = _keys(entry) - _GROUP_KEYS
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_GROUP_KEYS)}"
            )
        label = _get(entry, "label")
        if not isinstance(label, str) or not label:
            raise ValueError(f"{where}.label={label!r}: give each node group a non-empty label")
        if label in _RESERVED:
            raise ValueError(
                f"{where}.label={label!r} is reserved (built in: {_RESERVED}); rename it"
            )
        if any(g.label == label for g in groups):
            raise ValueError(f"{where}.label={label!r} is used twice; labels must be unique")
        ranks = _parse_ranks(f"{where}.node_ranks", _get(entry, "node_ranks"), num_nodes)
        groups.append(NodeGroupSpec(label, ranks, bool(_get(entry, "ignore_hardware") or False)))
        covered: set[int] = set()
        for j, env_cfg in enumerate(_get(entry, "env_configs") or []):
            ewhere = f"{where}.env_configs[{j}]"
            unknown = _keys(env_cfg) - _ENV_KEYS if isinstance(env_cfg, Mapping) else set()
            if unknown:
                raise ValueError(
                    f"{ewhere}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_ENV_KEYS)}"
                )
            env_ranks = _parse_ranks(f"{ewhere}.node_ranks", _get(env_cfg, "node_ranks"), num_nodes)
            outside = sorted(set(env_ranks) - set(ranks))
            if outside:
                raise ValueError(
                    f"{ewhere}.node_ranks: nodes {outside} are not in the group's node_ranks "
                    f"{list(ranks)}"
                )
            overlap = sorted(set(env_ranks) & covered)
            if overlap:
                raise ValueError(
                    f"{ewhere}.node_ranks: nodes {overlap} are already configured by an "
                    "earlier entry"
                )
            covered.update(env_ranks)
            variables: dict[str, str] = {}
            for k, item in enumerate(_get(env_cfg, "env_vars") or []):
                if not isinstance(item, Mapping) or len(item) != 1:
                    raise ValueError(
                        f"{ewhere}.env_vars[{k}]={item!r}: each item must be a one-key "
                        "mapping such as {GLOO_SOCKET_IFNAME: eth0}"
                    )
                ((key, value),) = item.items()
                if key in variables:
                    raise ValueError(f"{ewhere}.env_vars: {key!r} is set twice")
                variables[str(key)] = str(value)
            python = _get(env_cfg, "python_interpreter_path")
            for r in env_ranks:
                node_env = envs.setdefault(r, NodeEnv())
                clash = sorted(set(node_env.env_vars) & set(variables))
                if clash:
                    raise ValueError(
                        f"{ewhere}: node {r} already sets {clash} through another group"
                    )
                node_env.env_vars.update(variables)
                if python:
                    node_env.python_interpreter_path = str(python)
    return groups, envs
