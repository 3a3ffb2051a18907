"""Parser for the ``cluster.component_placement`` grammar.

Each key is one component name or comma-joined names that share one strategy
(``"actor,rollout"``). Each value is either a *rank map* (a string or an int,
placed on the ``cluster`` group) or ``{node_group: <label | "a,b" | [a, b]>,
placement: <rank map>}``.

A rank map is comma-separated segments ``resources[:processes]``, where
``resources`` is ``all``, ``a`` or ``a-b`` and ``processes`` is ``a`` or ``a-b``.
A segment without processes gets one process per resource, numbered on from the
previous segment. Rules:

* resource ranks are within range and ascend strictly across segments;
* process ranks start at 0, are contiguous and ascend across segments, and may
  not be ``all``;
* in each segment one of #processes and #resources divides the other: several
  processes share each resource (``0-1:0-3``) or each process gets several
  resources (``0-3:0-1``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_ALL = "all"


@dataclass(frozen=True)
class ComponentSpec:
    """One parsed ``component_placement`` entry (before it meets the cluster).

    Attributes:
        key: The key as written (for messages).
        names: Component names sharing the strategy.
        node_group: Labels from the node-group form, or None for the short form.
        rank_map: The rank-map text.
    """

    key: str
    names: tuple[str, ...]
    node_group: tuple[str, ...] | None
    rank_map: str


def parse_component_key(key: object) -> tuple[str, ...]:
    """Split a key into component names.

    Raises:
        ValueError: If the key is not a string or has an empty / repeated name.
    """
    if not isinstance(key, str):
        raise ValueError(
            f"component_placement key {key!r} must be a string of component names, "
            "e.g. 'actor' or 'actor,rollout'"
        )
    names = tuple(part.strip() for part in key.split(","))
    if any(not n for n in names):
        raise ValueError(
            f"component_placement key {key!r} has an empty component name; write "
            "comma-separated names such as 'actor,rollout'"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"component_placement key {key!r} lists a component twice")
    return names


def _node_group_labels(key: str, value: object) -> tuple[str, ...]:
    raw: list[object]
    if isinstance(value, str):
        raw = [p.strip() for p in value.split(",")]
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        raw = list(value)
    else:
        raise ValueError(
            f"component_placement[{key!r}].node_group={value!r} must be a label, "
            "a comma-joined string of labels or a list of labels"
        )
    if not raw or any(not isinstance(x, str) or not x.strip() for x in raw):
        raise ValueError(
            f"component_placement[{key!r}].node_group={value!r} must name one or more "
            "non-empty labels"
        )
    return tuple(str(x).strip() for x in raw)


def _rank_map_text(where: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"{where}={value!r} must be a rank map string such as 'all', '0-7', '0-3,6' "
            "or '0-1:0-3', or an int"
        )
    text = str(value).strip()
    if not text:
        raise ValueError(f"{where} is empty; write e.g. 'all' or '0-7'")
    return text


def parse_component_entry(key: object, value: object) -> ComponentSpec:
    """Parse one ``key: value`` entry of ``component_placement``.

    Raises:
        ValueError: On a malformed key or value; the message names both.
    """
    names = parse_component_key(key)
    assert isinstance(key, str)
    if isinstance(value, Mapping):
        allowed = {"node_group", "placement"}
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise ValueError(
                f"component_placement[{key!r}] has unknown field(s) {unknown}; "
                "allowed: node_group, placement"
            )
        missing = sorted(k for k in allowed if k not in value)
        if missing:
            raise ValueError(
                f"component_placement[{key!r}] is missing field(s) {missing}; the node-group "
                "form is {node_group: <label>, placement: <rank map>}"
            )
        labels = _node_group_labels(key, value["node_group"])
        text = _rank_map_text(f"component_placement[{key!r}].placement", value["placement"])
        return ComponentSpec(key, names, labels, text)
    text = _rank_map_text(f"component_placement[{key!r}]", value)
    return ComponentSpec(key, names, None, text)


def _parse_range(where: str, text: str, num_resources: int | None) -> range:
    """Parse ``a``, ``a-b`` or (when ``num_resources`` is given) ``all``."""
    t = text.strip()
    if t == _ALL:
        if num_resources is None:
            raise ValueError(f"{where}: process ranks may not be 'all'; write 'a' or 'a-b'")
        return range(num_resources)
    lo_s, dash, hi_s = t.partition("-")
    lo_s, hi_s = lo_s.strip(), hi_s.strip()
    allowed = "'a' or 'a-b' (or 'all' for resources)"
    if not lo_s.isdecimal() or (dash and not hi_s.isdecimal()):
        raise ValueError(f"{where}: {text!r} is not a rank or range; write {allowed}")
    lo = int(lo_s)
    hi = int(hi_s) if dash else lo
    if hi < lo:
        raise ValueError(f"{where}: range {text!r} runs backwards; write 'a-b' with a <= b")
    return range(lo, hi + 1)


def _segments(rank_map: str, where: str) -> Iterator[tuple[str, str, str, str]]:
    """Splits a rank map into ``(where-label, resources, ':' or '', processes)`` per segment."""
    for raw_seg in rank_map.split(","):
        seg = raw_seg.strip()
        at = f"{where}={rank_map!r}, segment {seg!r}"
        if not seg:
            raise ValueError(
                f"{where}={rank_map!r} has an empty segment; segments are comma-separated "
                "'resources[:processes]'"
            )
        if seg.count(":") > 1:
            raise ValueError(f"{at}: use at most one ':' (resources:processes)")
        res_txt, colon, proc_txt = seg.partition(":")
        yield at, res_txt, colon, proc_txt


def parse_rank_map(
    rank_map: str, num_resources: int, where: str = "placement", resources: str = ""
) -> list[list[int]]:
    """Turn a rank map into resource ranks per process.

    Args:
        rank_map: The rank-map text, e.g. ``"0-1:0-199,2-3:200-399"``.
        num_resources: How many resources the ranks may index.
        where: Prefix naming the config entry in error messages.
        resources: Description of the resources for error messages.

    Returns:
        For each process rank, its resource ranks.

    Raises:
        ValueError: On any grammar or rule violation; the message shows the
            offending segment and what is allowed.
    """
    desc = resources or f"{num_resources} resource(s)"
    valid = f"0-{num_resources - 1}" if num_resources else "none"
    out: list[list[int]] = []
    prev_res = -1
    for at, res_txt, colon, proc_txt in _segments(rank_map, where):
        if res_txt.strip() == _ALL and num_resources == 0:
            raise ValueError(f"{at}: 'all' selects nothing, there are {desc}")
        res = _parse_range(at, res_txt, num_resources)
        first = len(out)
        procs = _parse_range(at, proc_txt, None) if colon else range(first, first + len(res))
        if res[-1] >= num_resources:
            raise ValueError(
                f"{at}: resource rank {res[-1]} is out of range; there are {desc} (valid: {valid})"
            )
        if res[0] <= prev_res:
            raise ValueError(
                f"{at}: resource ranks must be unique and ascending across segments, but "
                f"{res[0]} does not come after {prev_res}"
            )
        if procs[0] != len(out):
            raise ValueError(
                f"{at}: process ranks must be unique, contiguous and ascending from 0; "
                f"expected this segment to start at process {len(out)}, got {procs[0]}"
            )
        n_res, n_proc = len(res), len(procs)
        if n_proc % n_res and n_res % n_proc:
            raise ValueError(
                f"{at}: {n_proc} process(es) on {n_res} resource(s); one count must divide "
                "the other (several processes per resource, or several resources per process)"
            )
        if n_proc >= n_res:
            share = n_proc // n_res
            out.extend([res[i // share]] for i in range(n_proc))
        else:
            each = n_res // n_proc
            out.extend(list(res[i * each : (i + 1) * each]) for i in range(n_proc))
        prev_res = res[-1]
    return out


def check_rank_map_syntax(rank_map: str, where: str = "placement") -> None:
    """Checks a rank map without a cluster (only sizes are left for placement).

    Args:
        rank_map: The rank-map text, e.g. ``"0-1:0-3,2"`` or ``"all"``.
        where: Prefix naming the config entry in error messages.

    Raises:
        ValueError: On an empty segment, more than one ``:``, a range that is
            not ``a``, ``a-b`` (or ``all`` for resources), and (without ``all``)
            resource ranks out of order, process ranks not contiguous from 0, or
            counts that do not divide; the message shows the segment.
    """
    highest = -1
    uses_all = False
    for at, res_txt, colon, proc_txt in _segments(rank_map, where):
        if res_txt.strip() == _ALL:
            uses_all = True
        else:
            highest = max(highest, _parse_range(at, res_txt, None)[-1])
        if colon:
            _parse_range(at, proc_txt, None)
    if not uses_all:  # order, contiguity and divisibility do not depend on the cluster
        parse_rank_map(rank_map, highest + 1, where)


def parse_component_placement(config: Mapping[str, Any]) -> list[ComponentSpec]:
    """Parse a whole ``component_placement`` mapping (no cluster needed).

    Raises:
        ValueError: On a malformed entry, an empty mapping, or a component named
            under two keys.
    """
    if not isinstance(config, Mapping) or not config:
        raise ValueError(
            f"component_placement={config!r} must be a non-empty mapping of component "
            "name(s) to placement"
        )
    specs: list[ComponentSpec] = []
    owner: dict[str, str] = {}
    for key, value in config.items():
        spec = parse_component_entry(key, value)
        for name in spec.names:
            if name in owner:
                raise ValueError(
                    f"component {name!r} appears in keys {owner[name]!r} and {spec.key!r}; "
                    "component names must be unique across component_placement"
                )
            owner[name] = spec.key
        specs.append(spec)
    return specs
