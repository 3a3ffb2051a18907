"""The ``rlinf`` command line: versions, config checks and auto placement.

Examples:
    rlinf version
    rlinf check-config examples/quickstart/config/demo.yaml runner.max_steps=10
    rlinf check-config --config-path examples/quickstart/config --config-name demo --schema core
    rlinf check-config --schema embodied examples/embodiment/config/cartpole_ppo_mlp.yaml
    rlinf check-config --schema reasoning examples/reasoning/config/toy_grpo_cpu.yaml
    rlinf auto-place --config-path examples/embodiment/config --config-name cartpole_ppo_mlp
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGES = ("rlinf-core", "rlinf-sched", "rlinf-embodied", "rlinf-reasoning")


def installed_versions() -> dict[str, str | None]:
    """Versions of the RLinf packages and of the native module.

    Returns:
        Map from distribution name (plus ``rlinf.core._native``) to its version,
        or None when that package is not installed.
    """
    versions: dict[str, str | None] = {}
    for dist in PACKAGES:
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    try:
        from rlinf.core import _native

        versions["rlinf.core._native"] = _native.version()
    except ImportError:
        versions["rlinf.core._native"] = None
    return versions


def _print_versions() -> None:
    for name, ver in installed_versions().items():
        print(f"{name:20s} {ver if ver is not None else 'not installed'}")


def _cmd_version(_args: argparse.Namespace) -> int:
    _print_versions()
    return 0


def _looks_like_override(arg: str) -> bool:
    return "=" in arg or arg.startswith("~")


def _error(message: str, code: int = 2) -> int:
    """Prints ``error: message`` to stderr and returns the exit ``code`` (2: a usage error)."""
    print(f"error: {message}", file=sys.stderr)
    return code


def _config_source(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The overrides, and a usage error (or None) for FILE / --config-path / --config-name."""
    overrides = list(args.overrides)
    if args.file is not None and _looks_like_override(args.file):
        overrides.insert(0, args.file)
        args.file = None
    if args.file is not None and (args.config_path or args.config_name):
        return overrides, "give either FILE or --config-path/--config-name, not both"
    if args.file is None and args.config_name is None:
        return overrides, "give a config FILE or --config-name (see --help)"
    return overrides, None


def _load(args: argparse.Namespace, overrides: list[str], schema: type[Any]) -> Any:
    from rlinf.core.config import load_config, load_config_file

    if args.file is not None:
        return load_config_file(args.file, overrides, schema=schema)
    return load_config(args.config_name, args.config_path or ".", overrides, schema=schema)


def _cmd_check_config(args: argparse.Namespace) -> int:
    from rlinf.core.config import ConfigError, available_schemas, dump_config

    overrides, usage = _config_source(args)
    if usage is not None:
        return _error(usage)
    schemas = available_schemas()
    if args.schema not in schemas:
        return _error(
            f"--schema {args.schema!r} is not registered; choose one of: "
            f"{', '.join(sorted(schemas))}"
        )

    _print_versions()
    source = args.file if args.file is not None else args.config_name
    try:
        cfg = _load(args, overrides, schemas[args.schema])
    except ConfigError as err:
        print(f"\n{err}", file=sys.stderr)
        return 1
    print(f"\nconfig {source!r} is valid for schema {args.schema!r}")
    if args.print:
        print(dump_config(cfg))
    return 0


def _cmd_auto_place(args: argparse.Namespace) -> int:
    from rlinf.core.autoplace import available_autoplacers, format_report, report_to_json
    from rlinf.core.config import ConfigError, available_schemas

    overrides, usage = _config_source(args)
    if usage is not None:
        return _error(usage)
    if args.top is not None and args.top < 1:
        return _error(f"--top {args.top}: show at least 1 placement")
    placers, schemas = available_autoplacers(), available_schemas()
    names = [args.schema] if args.schema is not None else sorted(placers)
    for name in names:
        if name not in placers or name not in schemas:
            return _error(
                f"--schema {name!r} has no auto placer; choose one of: "
                f"{', '.join(sorted(set(placers) & set(schemas))) or 'none installed'} "
                "(install rlinf-embodied or rlinf-reasoning)"
            )
    cfg, errors, schema = None, [], ""
    for name in names:  # without --schema: the first stack whose schema accepts the config
        try:
            cfg, schema = _load(args, overrides, schemas[name]), name
            break
        except ConfigError as err:
            errors.append(f"as a{'n' if name[0] in 'aeiou' else ''} {name} config:\n{err}")
    if cfg is None:
        print("\n\n".join(errors), file=sys.stderr)
        return 1
    try:
        report = placers[schema]()(
            cfg,
            profile_steps=args.profile_steps,
            force_profile=args.profile,
            max_stages=args.max_stages,
            slots=args.slots,
        )
    except (ConfigError, ValueError) as err:
        return _error(str(err), 1)
    print(report_to_json(report, args.top) if args.json else format_report(report, args.top))
    return 0


def _config_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """A subcommand that reads a config: FILE or --config-path/--config-name, overrides."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("file", nargs="?", help="YAML file (or use --config-path/--config-name)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra-style overrides")
    p.add_argument("--config-path", help="folder that holds the configs")
    p.add_argument("--config-name", help="config name inside --config-path, without .yaml")
    return p


def _add_check_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``check-config`` subcommand."""
    p_check = _config_parser(
        sub,
        "check-config",
        help="compose and validate a config (Hydra-style defaults and overrides)",
        description=(
            "Compose a YAML config (defaults lists, KEY=VALUE, +KEY=VALUE, ~KEY overrides) and "
            "validate it against a registered schema. Exit 0 if valid, 1 if invalid, 2 on usage "
            "errors."
        ),
    )
    p_check.add_argument(
        "--schema",
        default="core",
        help="schema to validate against (entry points 'rlinf.config_schemas'; default: core)",
    )
    p_check.add_argument("--print", action="store_true", help="print the validated config as YAML")
    p_check.set_defaults(func=_cmd_check_config)


def _add_auto_place(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``auto-place`` subcommand."""
    p_auto = _config_parser(
        sub,
        "auto-place",
        help="profile the components and print the fastest cluster.component_placement",
        description=(
            "Measure what each component costs per training step (a few steps with every "
            "component collocated on all slots, on the real cluster; or the config's "
            "profile_data), predict the step time of collocated, hybrid and disaggregated "
            "placements (splits, group sizes, rollout.pipeline_stage_num) with a cost model "
            "that accounts for pipelining and weight sync, and print them fastest first. "
            "See docs/scheduling.md. Exit 0 on success, 1 if the config or the search fails, "
            "2 on usage errors."
        ),
    )
    p_auto.add_argument(
        "--schema",
        default=None,
        help="stack of the config: embodied or reasoning (entry points 'rlinf.autoplace'); "
        "default: the first whose schema accepts the config",
    )
    p_auto.add_argument(
        "--top", type=int, default=5, help="show the N fastest placements (default: 5)"
    )
    p_auto.add_argument("--json", action="store_true", help="print the report as JSON")
    p_auto.add_argument(
        "--profile",
        action="store_true",
        help="profile the components even if the config has profile_data",
    )
    p_auto.add_argument(
        "--profile-steps", type=int, default=3, help="timed steps when profiling (default: 3)"
    )
    p_auto.add_argument(
        "--max-stages",
        type=int,
        default=4,
        help="largest rollout.pipeline_stage_num tried, embodied (default: 4)",
    )
    p_auto.add_argument(
        "--slots",
        type=int,
        default=None,
        help="resource ranks (GPUs or CPU slots) to place on (default: the config's cluster)",
    )
    p_auto.set_defaults(func=_cmd_auto_place)


def build_parser() -> argparse.ArgumentParser:
    """Builds the ``rlinf`` argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="rlinf",
        description="RLinf command line: show versions, validate configs, search placements.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_version = sub.add_parser("version", help="print the versions of the RLinf packages")
    p_version.set_defaults(func=_cmd_version)
    _add_check_config(sub)
    _add_auto_place(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rlinf`` command line and returns its exit code."""
    parser = build_parser()
    # Overrides may come after options (FILE --top 3 KEY=VALUE); argparse leaves those over.
    args, extra = parser.parse_known_args(argv)
    takes = hasattr(args, "overrides")
    stray = [a for a in extra if not (takes and not a.startswith("-") and _looks_like_override(a))]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
