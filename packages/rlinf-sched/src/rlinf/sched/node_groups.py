"""``cluster.node_groups``: labelled node sets with per-node environments.

Each entry: ``label`` (unique; ``cluster`` and ``node`` are built in),
``node_ranks`` (``"0-3"``, ``"0,2,5-6"``, ``"all"`` or an int) and optional
``env_configs``: ``[{node_ranks, env_vars: [{KEY: VAL}, ...],
python_interpreter_path}]`` giving the workers on those nodes extra
environment variables and another Python interpreter.

The entries are pydantic models (:data:`NodeGroups`), so config loading and
``rlinf check-config`` report a bad entry with its key path
(``cluster.node_groups[0].env_configs[1].node_ranks``), value and fix; the
checks that need the node count (``all``, ranks in range, env entries inside
their group and not overlapping) run in :func:`resolve_node_groups`, once at
load against ``cluster.num_nodes`` and again in ``Cluster()`` against the nodes
that joined. :func:`parse_node_groups` validates ``Cluster``'s programmatic
input (dicts or models) through the same models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, NoReturn

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from rlinf.core.config import ConfigError, RLinfModel
from rlinf.core.config.errors import config_error_from_validation

__all__ = [
    "NodeEnv",
    "NodeEnvConfig",
    "NodeGroupConfig",
    "NodeGroupSpec",
    "NodeGroups",
    "parse_node_groups",
    "resolve_node_groups",
]

_RESERVED = ("cluster", "node")
_RANKS_HINT = "write e.g. 0, '0-3', '0,2,5-6' or 'all'"

_Loc = tuple[str | int, ...]


@dataclass
class NodeEnv:
    """What workers on one node get on top of the scheduler's variables."""

    env_vars: dict[str, str] = field(default_factory=dict)
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class NodeGroupSpec:
    """One resolved ``cluster.node_groups`` entry."""

    label: str
    node_ranks: tuple[int, ...]
    ignore_hardware: bool = False


def _fail(loc: _Loc, message: str, value: Any) -> NoReturn:
    """Raise a validation error at ``loc`` (relative to where the validator runs)."""
    error = PydanticCustomError("node_groups", "{message}", {"message": message})
    raise ValidationError.from_exception_data(
        "node_groups", [InitErrorDetails(type=error, loc=loc, input=value)]
    )


def _ranks(value: int | str, num_nodes: int | None) -> tuple[int, ...]:
    """Expand ``3``, ``"0-3"``, ``"0,2,5-6"`` or ``"all"`` to sorted node ranks.

    Args:
        value: The ``node_ranks`` value.
        num_nodes: Nodes of the run; ``None`` checks the syntax only (``all`` is empty).

    Raises:
        ValueError: On bad syntax, a repeated rank or (with ``num_nodes``) a rank out of range.
    """
    ranks: list[int] = []
    for part in [str(value)] if isinstance(value, int) else value.split(","):
        text = part.strip()
        if text == "all":
            ranks.extend(range(num_nodes or 0))
            continue
        lo, dash, hi = (s.strip() for s in text.partition("-"))
        if not lo.isdecimal() or (dash and not hi.isdecimal()):
            raise ValueError(f"{text!r} is not a node rank or range; {_RANKS_HINT}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"range {text!r} runs backwards; write 'a-b' with a <= b")
        ranks.extend(range(first, last + 1))
    seen: set[int] = set()
    shown = "" if isinstance(value, int) else f" in {value!r}"
    for r in ranks:
        if r in seen:
            raise ValueError(f"node rank {r} appears twice{shown}")
        seen.add(r)
        if num_nodes is not None and r >= num_nodes:
            raise ValueError(
                f"node rank {r}{shown} is out of range: the run has {num_nodes} node(s) "
                f"(ranks 0-{num_nodes - 1}); use lower ranks or raise cluster.num_nodes"
            )
    return tuple(sorted(ranks))


def _int_or_str(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected node ranks; {_RANKS_HINT}")
    return value


def _check_syntax(value: int | str) -> int | str:
    _ranks(value, None)
    return value


NodeRanks = Annotated[
    StrictInt | StrictStr, BeforeValidator(_int_or_str), AfterValidator(_check_syntax)
]
"""``3``, ``"0-3"``, ``"0,2,5-6"`` or ``"all"``."""


class NodeEnvConfig(RLinfModel):
    """One ``cluster.node_groups[i].env_configs[j]`` entry."""

    node_ranks: NodeRanks = Field(..., description="Nodes (of the group) this entry configures.")
    env_vars: list[dict[str, str]] = Field(
        default_factory=list,
        description="One-key mappings such as {GLOO_SOCKET_IFNAME: eth0}; values become strings.",
    )
    python_interpreter_path: str | None = Field(
        None, description="Python the workers on these nodes run; null: the driver's."
    )

    @field_validator("env_vars", mode="before")
    @classmethod
    def _one_key_items(cls, value: Any) -> Any:
        if value is None:
            return []
        if not isinstance(value, Sequence) or isinstance(value, str):
            return value  # pydantic reports the type
        items: list[dict[str, str]] = []
        seen: set[str] = set()
        for k, item in enumerate(value):
            if not isinstance(item, Mapping) or len(item) != 1:
                _fail(
                    (k,),
                    "each item must be a one-key mapping such as {GLOO_SOCKET_IFNAME: eth0}",
                    item,
                )
            ((key, var),) = item.items()
            if str(key) in seen:
                _fail((k,), f"{key!r} is set twice in this entry; keep one", item)
            seen.add(str(key))
            items.append({str(key): str(var)})
        return items


class NodeGroupConfig(RLinfModel):
    """One ``cluster.node_groups[i]`` entry."""

    label: str = Field(..., description="Unique name placement can target.")
    node_ranks: NodeRanks = Field(..., description="The group's nodes.")
    env_configs: list[NodeEnvConfig] = Field(
        default_factory=list, description="Extra environment for some of the group's nodes."
    )
    ignore_hardware: bool = Field(False, description="Count each node as one resource.")

    @field_validator("label")
    @classmethod
    def _label(cls, value: str) -> str:
        if not value:
            raise ValueError("give each node group a non-empty label")
        if value in _RESERVED:
            raise ValueError(f"label {value!r} is reserved (built in: {_RESERVED}); rename it")
        return value

    @field_validator("env_configs", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


def _unique_labels(groups: list[NodeGroupConfig]) -> list[NodeGroupConfig]:
    first: dict[str, int] = {}
    for i, group in enumerate(groups):
        if group.label in first:
            _fail(
                (i, "label"),
                f"label {group.label!r} is already used by node_groups[{first[group.label]}]; "
                "labels must be unique",
                group.label,
            )
        first[group.label] = i
    return groups


NodeGroups = Annotated[list[NodeGroupConfig], AfterValidator(_unique_labels)]
"""The ``cluster.node_groups`` list: entries checked one by one, labels unique."""


def _resolved(value: int | str, num_nodes: int, loc: _Loc) -> tuple[int, ...]:
    try:
        return _ranks(value, num_nodes)
    except ValueError as exc:
        _fail(loc, str(exc), value)


def resolve_node_groups(
    groups: Sequence[NodeGroupConfig], num_nodes: int
) -> tuple[list[NodeGroupSpec], dict[int, NodeEnv]]:
    """The checks that need the node count, and the groups' ranks and per-node environments.

    Args:
        groups: Validated entries (see :data:`NodeGroups`).
        num_nodes: Nodes of the run.

    Returns:
        The groups, and each configured node's extra environment.

    Raises:
        pydantic.ValidationError: Located at ``node_groups[i]...`` (a rank out of range, an
            ``env_configs`` entry outside its group or overlapping an earlier one, a
            variable set twice for one node), with the value and the fix.
    """
    specs: list[NodeGroupSpec] = []
    envs: dict[int, NodeEnv] = {}
    for i, group in enumerate(groups):
        ranks = _resolved(group.node_ranks, num_nodes, ("node_groups", i, "node_ranks"))
        specs.append(NodeGroupSpec(group.label, ranks, group.ignore_hardware))
        covered: set[int] = set()
        for j, env_cfg in enumerate(group.env_configs):
            loc: _Loc = ("node_groups", i, "env_configs", j)
            env_ranks = _resolved(env_cfg.node_ranks, num_nodes, (*loc, "node_ranks"))
            if outside := sorted(set(env_ranks) - set(ranks)):
                message = f"nodes {outside} are not in the group's node_ranks {list(ranks)}"
                _fail((*loc, "node_ranks"), message, env_cfg.node_ranks)
            if overlap := sorted(set(env_ranks) & covered):
                message = f"nodes {overlap} are already configured by an earlier env_configs entry"
                _fail((*loc, "node_ranks"), message, env_cfg.node_ranks)
            covered.update(env_ranks)
            variables = {k: v for item in env_cfg.env_vars for k, v in item.items()}
            for r in env_ranks:
                node_env = envs.setdefault(r, NodeEnv())
                if clash := sorted(set(node_env.env_vars) & set(variables)):
                    message = f"node {r} already sets {clash} through another group; set each once"
                    _fail((*loc, "env_vars"), message, env_cfg.env_vars)
                node_env.env_vars.update(variables)
                if env_cfg.python_interpreter_path:
                    node_env.python_interpreter_path = env_cfg.python_interpreter_path
    return specs, envs


class _NodeGroupsOnly(RLinfModel):
    """The ``node_groups`` key alone, to validate ``Cluster``'s programmatic input."""

    node_groups: NodeGroups | None = None


def parse_node_groups(
    entries: Sequence[Any] | None, num_nodes: int
) -> tuple[list[NodeGroupSpec], dict[int, NodeEnv]]:
    """Validates ``cluster.node_groups`` (dicts, or models validated at load) and resolves it.

    Args:
        entries: The ``node_groups`` list, or ``None``.
        num_nodes: Nodes of the cluster.

    Returns:
        The groups, and each configured node's extra environment.

    Raises:
        ConfigError: Naming each bad entry (``cluster.node_groups[i]...``), the value and the
            fix (a ``ValueError``).
    """
    data = {"node_groups": None if entries is None else list(entries)}
    try:
        section = _NodeGroupsOnly.model_validate(data, from_attributes=True)
        return resolve_node_groups(section.node_groups or [], num_nodes)
    except ValidationError as exc:
        err = config_error_from_validation(exc, _NodeGroupsOnly, data)
        issues = [replace(issue, path=f"cluster.{issue.path}") for issue in err.issues]
        raise ConfigError(issues, "cluster_cfg") from None
