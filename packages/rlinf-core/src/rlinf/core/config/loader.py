"""Load configs: compose YAML files with Hydra, then validate them with a pydantic schema.

Hydra's failures become :class:`ConfigIssue` items from Hydra's exception types, their
attributes and the ``Override`` objects Hydra's parser returns, not from its message wording.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from pydantic import BaseModel, ValidationError
from typing_extensions import TypeVar

from rlinf.core.config.errors import (
    NO_VALUE,
    ConfigError,
    ConfigIssue,
    config_error_from_validation,
    suggest,
)
from rlinf.core.config.schema import CoreConfig

# The default makes ``load_config(...)`` without ``schema`` type-check as ``CoreConfig``.
M = TypeVar("M", bound=BaseModel, default=CoreConfig)

SCHEMA_GROUP = "rlinf.config_schemas"
"""Entry-point group under which packages register their top-level config schema."""

_OVERRIDE_HELP = "use KEY=VALUE to set, +KEY=VALUE to add a new key, ~KEY to delete"


def compose_config(
    config_name: str, config_path: str | Path, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Compose a config with Hydra and return it as a plain, interpolation-resolved dict.

    Args:
        config_name: Primary config file in ``config_path``, without ``.yaml``.
        config_path: Directory holding the config and its config groups.
        overrides: Hydra overrides: ``a.b=1``, ``+a.new=1``, ``~a.b``, ``group=option``.

    Returns:
        The composed config, without Hydra's own ``hydra`` key.

    Raises:
        ConfigError: A missing directory or file, a bad override, a YAML error or a
            missing/unresolvable value.
    """
    config_dir = Path(config_path).expanduser().resolve()
    file_name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    source = str(config_dir / file_name)
    if not config_dir.is_dir():
        issue = ConfigIssue(
            "config_path", f"config directory not found: {config_dir}", str(config_path)
        )
        raise ConfigError([issue], source)
    if not (config_dir / file_name).is_file():
        names = [p.stem for p in config_dir.glob("*.yaml")]
        hint = suggest(Path(file_name).stem, names, "configs") or "; the directory has no .yaml"
        issue = ConfigIssue(
            "config_name", f"config file '{file_name}' not found in {config_dir}{hint}", config_name
        )
        raise ConfigError([issue], source)
    try:
        data = _compose(config_dir, config_name, overrides)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        issue = _compose_issue(exc, config_dir, config_name, list(overrides))
        raise ConfigError([issue], source) from exc
    data.pop("hydra", None)
    return data


def _compose(config_dir: Path, config_name: str, overrides: Sequence[str]) -> dict[str, Any]:
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra.compose(config_name=config_name, overrides=list(overrides))
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def _compose_unresolved(config_dir: Path, config_name: str, overrides: Sequence[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra.compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    OmegaConf.set_struct(cfg, False)
    return cfg


def _override_key(override: str) -> str:
    """The key of an override Hydra cannot parse (so there is no parsed ``Override``)."""
    return override.lstrip("~+").split("=", 1)[0].split("@", 1)[0].strip()


def _closest_key(cfg: DictConfig, key: str) -> str:
    """``"; did you mean 'a.b'?"`` for the first part of ``key`` that ``cfg`` lacks."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return ""
        if part not in node:
            keys = [str(k) for k in node]
            close = difflib.get_close_matches(part, keys, n=1)
            if close:
                return f"; did you mean '{'.'.join([*parts[:i], close[0], *parts[i + 1 :]])}'?"
            return suggest(part, keys)
        node = node[part]
    return ""


def _has_key(cfg: DictConfig, key: str) -> bool:
    """Whether every part of the dotted ``key`` exists (``???`` and interpolations count)."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _compose_issue(
    exc: Exception, config_dir: Path, config_name: str, overrides: list[str]
) -> ConfigIssue:
    """Map a Hydra/OmegaConf/YAML error to one issue naming the key, override or file.

    Hydra's exception types and attributes decide (``OverrideParseException.override``,
    ``MissingConfigException.missing_cfg_file``/``.options``, OmegaConf's ``full_key``); a
    ``ConfigCompositionException`` carries only text, so the override it is about is found
    by replaying the overrides Hydra parsed (:func:`_override_issue`), not by matching text.
    """
    if isinstance(exc, OverrideParseException):
        bad = exc.override
        # Hydra's explanation, shown as is; only its header and doc-link lines are dropped.
        detail = "; ".join(
            line.strip()
            for line in exc.message.splitlines()
            if line.strip() and not line.startswith(("Error parsing", "See http"))
        )
        path = _override_key(bad) or "overrides"
        return ConfigIssue(path, f"invalid override ({detail}); {_OVERRIDE_HELP}", bad)
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        if group:
            options = list(exc.options or [])
            hint = suggest(option, options, "options") or f"; no {config_dir / group}/{option}.yaml"
            text = f"no option '{option}' in config group '{group}'{hint}"
            return ConfigIssue(group.replace("/", "."), text, option)
        names = [p.stem for p in config_dir.glob("*.yaml")]
        text = f"config '{option}' (in a defaults list) not found in {config_dir}"
        return ConfigIssue("config_name", text + suggest(option, names, "configs"), option)
    if isinstance(exc, yaml.YAMLError):
        return _yaml_issue(exc, config_dir)
    if isinstance(exc, OmegaConfBaseException) and getattr(exc, "full_key", None):
        key = str(exc.full_key)
        if isinstance(exc, MissingMandatoryValue):
            return ConfigIssue(key, f"mandatory value '???' not set; set it, e.g. {key}=VALUE")
        return ConfigIssue(key, str(exc).strip().splitlines()[0])
    if isinstance(exc, ConfigCompositionException) and overrides:
        if issue := _override_issue(config_dir, config_name, overrides):
            return issue
        cause = exc.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            key = str(cause.full_key)
            value = next((o for o in overrides if _override_key(o) == key), NO_VALUE)
            return ConfigIssue(key, str(cause).strip().splitlines()[0], value)
    msg = str(exc)
    return ConfigIssue("config_name", " ".join(msg.split()) or type(exc).__name__, config_name)


def _is_group_override(override: Override, config_dir: Path) -> bool:
    """Hydra's rule: a config group (a folder of options) unless the value is a dict."""
    if override.package is not None:
        return True
    if isinstance(override.value(), dict):
        return False
    key = override.key_or_group
    return key.split("/")[0] == "hydra" or (config_dir / key).is_dir()


def _override_issue(config_dir: Path, config_name: str, overrides: list[str]) -> ConfigIssue | None:
    """The first override Hydra cannot apply, from the ``Override`` objects Hydra parses.

    Composes with the group overrides alone, then checks the key overrides in order the way
    Hydra applies them: ``a.b=1`` needs an existing key, ``~a.b`` an existing value (equal
    to the one given, if any) and ``+a.b=1`` a free key; sweeps are refused.

    Returns:
        The issue, or ``None`` when the replay finds nothing (the caller falls back).
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return None
    for override in parsed:
        if override.is_sweep_override():
            text = (
                "a sweep (a,b / range / choice) is not supported here; for a list write "
                "KEY=[a,b], for a string quote it: KEY='a,b'"
            )
            return ConfigIssue(override.key_or_group, text, override.input_line)
    groups = [o for o in parsed if _is_group_override(o, config_dir)]
    try:
        cfg = _compose_unresolved(config_dir, config_name, [str(o.input_line) for o in groups])
    except Exception:
        return None
    for override in parsed:
        key, line = override.key_or_group, str(override.input_line)
        if override in groups or key.split(".")[0] == "hydra":
            continue  # Hydra's own config is not part of ours
        value = override.value()
        try:
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if override.is_delete():
                if current is None:
                    text = f"cannot delete '{key}': no such key{_closest_key(cfg, key)}"
                    return ConfigIssue(key, text, line)
                if value is not None and value != current:
                    text = f"cannot delete '{key}': its value is {current!r}, not {value!r}"
                    return ConfigIssue(key, f"{text}; write ~{key} to delete any value", line)
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                del node[leaf]
            elif override.is_add() or override.is_force_add():
                if override.is_add() and current is not None and not isinstance(value, dict | list):
                    text = (
                        f"cannot add '{key}' with '+': it exists; use {key}=VALUE, or ++{key}=VALUE"
                    )
                    return ConfigIssue(key, text, line)
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            elif not _has_key(cfg, key):
                hint = _closest_key(cfg, key)
                text = (
                    f"cannot override '{key}': no such key{hint} (to add it as a new key: +{line})"
                )
                return ConfigIssue(key, text, line)
            else:
                OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException:
            return None  # a value problem, not the key: the caller reports Hydra's cause
    return None


def _yaml_issue(exc: yaml.YAMLError, config_dir: Path) -> ConfigIssue:
    """Name the YAML file that failed to parse (relative to the config directory) and the line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return ConfigIssue("(yaml)", f"YAML syntax error: {' '.join(str(exc).split())}")
    file = Path(mark.name)
    where = str(file.relative_to(config_dir)) if file.is_relative_to(config_dir) else mark.name
    text = f"YAML syntax error: {problem} (line {mark.line + 1}, column {mark.column + 1})"
    return ConfigIssue(where, text)


def validate_config(data: Mapping[str, Any], schema: type[M], source: str | None = None) -> M:
    """Validate a plain config dict against a schema.

    Args:
        data: The config, e.g. from :func:`compose_config`.
        schema: The pydantic model to validate against.
        source: The config file or name, for error reports.

    Returns:
        The validated model.

    Raises:
        ConfigError: Every problem found, each with its dotted key path.
    """
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(exc, schema, data, source) from exc


def load_config(
    config_name: str,
    config_path: str | Path,
    overrides: Sequence[str] = (),
    schema: type[M] = CoreConfig,  # type: ignore[assignment]
) -> M:
    """Compose a config with Hydra and validate it.

    Args:
        config_name: Primary config file in ``config_path``, without ``.yaml``.
        config_path: Directory holding the config and its config groups.
        overrides: Hydra overrides (``a.b=1``, ``+a.new=1``, ``~a.b``).
        schema: The pydantic model to validate against.

    Returns:
        The validated config.

    Raises:
        ConfigError: If the config cannot be composed or is invalid.
    """
    data = compose_config(config_name, config_path, overrides)
    file_name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    source = str(Path(config_path).expanduser().resolve() / file_name)
    return validate_config(data, schema, source)


def load_config_file(
    path: str | Path,
    overrides: Sequence[str] = (),
    schema: type[M] = CoreConfig,  # type: ignore[assignment]
) -> M:
    """Load and validate one YAML file (its ``defaults`` resolve relative to its folder).

    Args:
        path: The ``.yaml`` file.
        overrides: Hydra overrides (``a.b=1``, ``+a.new=1``, ``~a.b``).
        schema: The pydantic model to validate against.

    Returns:
        The validated config.

    Raises:
        ConfigError: If the file is missing, is not ``.yaml``, or is invalid.
    """
    file = Path(path).expanduser().resolve()
    problem = None
    if file.suffix == ".yml":
        problem = f"Hydra only reads .yaml files; rename it to {file.with_suffix('.yaml').name}"
    elif file.suffix != ".yaml":
        problem = "expected a YAML config file ending in .yaml"
    elif not file.is_file():
        problem = f"config file not found: {file}"
    if problem:
        raise ConfigError([ConfigIssue("config_file", problem, str(path))], str(path))
    return load_config(file.stem, file.parent, overrides, schema)


def add_config_arguments(
    parser: argparse.ArgumentParser,
    default_config_path: str | None = None,
    default_config_name: str | None = None,
) -> None:
    """Add ``--config-path``, ``--config-name`` and positional ``KEY=VALUE`` overrides.

    Args:
        parser: The parser to extend.
        default_config_path: Default for ``--config-path``.
        default_config_name: Default for ``--config-name``.
    """
    parser.add_argument(
        "--config-path",
        default=default_config_path,
        help=f"folder with the YAML config and its config groups (default: {default_config_path})",
    )
    parser.add_argument(
        "--config-name",
        default=default_config_name,
        help=f"config file in --config-path, without .yaml (default: {default_config_name})",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help=f"Hydra overrides, e.g. runner.max_steps=10; {_OVERRIDE_HELP}",
    )


def config_from_args(
    args: argparse.Namespace,
    schema: type[M] = CoreConfig,  # type: ignore[assignment]
) -> M:
    """Load the config named by arguments from :func:`add_config_arguments`.

    Args:
        args: Parsed arguments with ``config_path``, ``config_name`` and ``overrides``.
        schema: The pydantic model to validate against.

    Returns:
        The validated config.

    Raises:
        ConfigError: If no config was given or it cannot be loaded.
    """
    missing = [
        ConfigIssue(key, f"no config given: pass --{key.replace('_', '-')}")
        for key in ("config_path", "config_name")
        if not getattr(args, key, None)
    ]
    if missing:
        raise ConfigError(missing)
    return load_config(args.config_name, args.config_path, getattr(args, "overrides", ()), schema)


def available_schemas() -> dict[str, type[BaseModel]]:
    """Load the schemas registered under the ``rlinf.config_schemas`` entry-point group.

    Returns:
        Entry-point name -> schema class, e.g. ``{"core": CoreConfig}``.

    Raises:
        ImportError: An entry point cannot be imported (the message names it).
        TypeError: An entry point is not a pydantic model class.
    """
    schemas: dict[str, type[BaseModel]] = {}
    for ep in entry_points(group=SCHEMA_GROUP):
        where = f"config schema entry point '{ep.name} = {ep.value}' (group {SCHEMA_GROUP}"
        where += f", package {ep.dist.name})" if ep.dist is not None else ")"
        try:
            obj = ep.load()
        except Exception as exc:
            raise ImportError(f"{where} failed to load: {type(exc).__name__}: {exc}") from exc
        if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
            raise TypeError(f"{where} is {obj!r}, not a pydantic model class")
        schemas[ep.name] = obj
    return schemas


def dump_config(cfg: BaseModel) -> str:
    """Render a validated config as YAML (paths as strings, keys in schema order).

    Args:
        cfg: The validated config.

    Returns:
        The YAML text.
    """
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
