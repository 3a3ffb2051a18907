"""Config errors that name the exact key path, say what is allowed and show what was given.

:class:`ConfigError` collects every problem of one config as :class:`ConfigIssue` items;
:func:`config_error_from_validation` turns a pydantic ``ValidationError`` into one.
"""

from __future__ import annotations

import difflib
import re
import types
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

ROOT_PATH = "(root)"
"""Path used for problems of the whole config (a validator of the top-level schema)."""

_MAX_REPR = 80
_PREFIXES = ("Value error, ", "Assertion failed, ")


class _NoValue:
    """Marker for issues that have no offending value (a missing key, a missing file)."""

    def __repr__(self) -> str:
        return "<no value>"

    def __reduce__(self) -> str:
        return "NO_VALUE"  # unpickle to the module's single instance


NO_VALUE: Any = _NoValue()
"""``ConfigIssue.value`` when there is nothing to show; the report then omits ``(got ...)``."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config.

    Attributes:
        path: Dotted key path such as ``runner.logger.log_path``; list items render as
            ``key[3]``. Cross-field rules use the dotted key their message starts with (e.g.
            ``runner.save_interval``), otherwise the section's path. Problems that are not
            about one key name what to fix: ``config_path``, ``config_name``,
            ``config_file``, ``overrides`` or the YAML file (``runner/base.yaml``).
        message: What is wrong and what is allowed.
        value: The offending value, or :data:`NO_VALUE`.
    """

    path: str
    message: str
    value: Any = NO_VALUE

    def __str__(self) -> str:
        line = f"{self.path}: {self.message}"
        if self.value is NO_VALUE:
            return line
        shown = repr(self.value)
        if len(shown) > _MAX_REPR:
            shown = shown[: _MAX_REPR - 3] + "..."
        return f"{line} (got {shown})"


class ConfigError(ValueError):
    """A config that cannot be loaded or validated, with every problem found.

    Attributes:
        issues: The problems, in the order they were found.
        source: The config file or name the problems belong to, if known.
    """

    def __init__(self, issues: Sequence[ConfigIssue], source: str | None = None) -> None:
        self.issues: list[ConfigIssue] = list(issues)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" {self.source}" if self.source else ""
        lines = [f"Invalid config{where}: {len(self.issues)} problem(s)"]
        lines += [f"  - {issue}" for issue in self.issues]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[ConfigIssue], str | None]]:
        return (type(self), (self.issues, self.source))


def format_path(parts: Sequence[str | int]) -> str:
    """Render key parts as a dotted path: ``("a", "b", 0)`` -> ``a.b[0]``.

    Args:
        parts: Keys (``str``) and list indices (``int``).

    Returns:
        The dotted path, or :data:`ROOT_PATH` when ``parts`` is empty.
    """
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or ROOT_PATH


def suggest(word: str, choices: Sequence[str], what: str = "keys", prefix: str = "") -> str:
    """Return ``"; did you mean 'x'?"`` for the closest choice, else a list of all choices.

    Args:
        word: The unknown name.
        choices: The valid names.
        what: What the choices are, for the listing (``"keys"``, ``"options"``).
        prefix: Put before the suggested name (e.g. the parent path ``"runner."``).

    Returns:
        A suffix to append to an error message (empty when there are no choices).
    """
    close = difflib.get_close_matches(word, list(choices), n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; valid {what}: {', '.join(sorted(choices))}" if choices else ""


def _unwrap(tp: Any) -> list[Any]:
    """Members of ``tp`` after removing ``Annotated``, ``Optional`` and unions."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        return [m for arg in get_args(tp) for m in _unwrap(arg) if m is not type(None)]
    return [tp]


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _walk(
    schema: type[BaseModel], loc: Sequence[str | int]
) -> tuple[list[str | int], Any, int | None]:
    """Follow a pydantic ``loc`` through the schema.

    Returns:
        The key parts (union member tags removed), the type found at the end (``None`` when
        unknown) and the index in ``loc`` of the first union member tag, if any.
    """
    parts: list[str | int] = []
    tp: Any = schema
    tag_at = None
    for i, item in enumerate(loc):
        members = _unwrap(tp) if tp is not None else []
        if len(members) > 1:  # pydantic tags each union member's errors with the member name
            tag_at = i if tag_at is None else tag_at
            tp = next((m for m in members if getattr(m, "__name__", None) == item), None)
            continue
        tp = members[0] if members else None
        parts.append(item)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = {f.alias or n: f for n, f in tp.model_fields.items()}
            tp = fields[item].annotation if item in fields else None
        elif get_origin(tp) in (list, tuple, set, frozenset, Sequence) and isinstance(item, int):
            tp = get_args(tp)[0] if get_args(tp) else None
        elif get_origin(tp) in (dict, Mapping) and len(get_args(tp)) == 2:
            tp = get_args(tp)[1]
        else:
            tp = None
    return parts, tp, tag_at


def _literal_values(tp: Any) -> list[str]:
    """The string values of the ``Literal`` members of ``tp`` (the schema's allowed values)."""
    members = _unwrap(tp) if tp is not None else []
    lits = [m for m in members if get_origin(m) is Literal]
    return [v for m in lits for v in get_args(m) if isinstance(v, str)]


def _models_in(tp: Any) -> list[type[BaseModel]]:
    return [m for m in _unwrap(tp) if isinstance(m, type) and issubclass(m, BaseModel)]


def _lookup(data: Any, parts: Sequence[str | int]) -> Any:
    for part in parts:
        in_list = (
            isinstance(data, list) and isinstance(part, int) and -len(data) <= part < len(data)
        )
        if not (in_list or (isinstance(data, Mapping) and part in data)):
            return NO_VALUE
        data = data[part]
    return data


def _issue(err: Mapping[str, Any], schema: type[BaseModel], data: Mapping[str, Any]) -> ConfigIssue:
    """Convert one pydantic error."""
    loc = err["loc"]
    parts, tp, tag_at = _walk(schema, loc)
    kind, msg, value = err["type"], str(err["msg"]), err.get("input", NO_VALUE)
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    if kind == "extra_forbidden" and parts:
        # Directly inside a union member: list the keys of every member.
        _, parent, _ = _walk(schema, loc[:-2] if tag_at == len(loc) - 2 else loc[:-1])
        valid = sorted({k for model in _models_in(parent) for k in _field_names(model)})
        key = str(parts[-1])
        msg = f"unknown key '{key}'" + suggest(key, valid)
    elif kind == "missing":
        msg, value = "required key is missing", NO_VALUE
    elif kind == "literal_error" and isinstance(value, str):
        # The schema's Literal values; pydantic's "'a' or 'b'" text only when the type is unknown.
        allowed = _literal_values(tp) or re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = difflib.get_close_matches(value, allowed, n=1)
        msg += f" (did you mean '{close[0]}'?)" if close else ""
    elif kind in ("value_error", "assertion_error") or msg.startswith(_PREFIXES):
        # The validator's own exception when pydantic passes it, else its text minus the prefix.
        error = ctx.get("error")
        msg = str(error) if isinstance(error, Exception) and str(error) else msg.split(", ", 1)[-1]
        named = _named_key(msg, schema, parts) if _models_in(tp) else None
        if named is not None:  # a model validator that names the key it is about
            parts, value = named, _lookup(data, named)
    return ConfigIssue(format_path(parts), msg, value)


def _named_key(msg: str, schema: type[BaseModel], parts: list[str | int]) -> list[str | int] | None:
    """The field a model validator's message starts with, as a dotted path inside that model.

    Only dotted names count (``runner.save_interval (10) must ...``), so that a message
    starting with an ordinary word that happens to be a field name is not misread.
    """
    match = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", msg)
    if match is None:
        return None
    named: list[str | int] = list(match.group().split("."))
    if len(named) <= len(parts) or named[: len(parts)] != parts:
        return None
    _, parent, _ = _walk(schema, named[:-1])
    models = _models_in(parent)
    return named if any(named[-1] in _field_names(m) for m in models) else None


def config_error_from_validation(
    exc: ValidationError,
    schema: type[BaseModel],
    data: Mapping[str, Any],
    source: str | None = None,
) -> ConfigError:
    """Convert a pydantic ``ValidationError`` into a :class:`ConfigError`.

    Unknown keys get a "did you mean" hint (or the list of valid keys), type and range errors
    keep pydantic's explanation of what is allowed and model-validator messages lose
    pydantic's ``Value error,`` prefix. For a union field only the members with the fewest
    errors are reported (the closest match), and their errors at one path are merged.

    Args:
        exc: The error raised by ``schema.model_validate(data)``.
        schema: The model that was validated.
        data: The data that was validated (to show values named by cross-field rules).
        source: The config file or name, for the report header.

    Returns:
        The error, ready to raise.
    """
    errors = exc.errors()
    tags: list[tuple[tuple[Any, ...], Any] | None] = []
    for err in errors:
        tag_at = _walk(schema, err["loc"])[2]
        tags.append(None if tag_at is None else (err["loc"][:tag_at], err["loc"][tag_at]))
    counts = Counter(tag for tag in tags if tag is not None)
    fewest: dict[tuple[Any, ...], int] = {}
    for (field, _), n in counts.items():
        fewest[field] = min(fewest.get(field, n), n)
    issues: list[ConfigIssue] = []
    for err, tag in zip(errors, tags, strict=True):
        if tag is not None and counts[tag] > fewest[tag[0]]:
            continue
        issue = _issue(err, schema, data)
        same = [i for i, old in enumerate(issues) if tag is not None and old.path == issue.path]
        if not same:
            issues.append(issue)
        elif issue.message not in issues[same[0]].message:
            old = issues[same[0]]
            issues[same[0]] = ConfigIssue(old.path, f"{old.message}, or {issue.message}", old.value)
    return ConfigError(issues, source)
