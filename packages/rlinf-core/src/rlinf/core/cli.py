"""The ``rlinf`` command line: versions and config checks.

Examples:
    rlinf version
    rlinf check-config examples/quickstart/config/demo.yaml runner.max_steps=10
    rlinf check-config --config-path examples/quickstart/config --config-name demo --schema core
    rlinf check-config --schema embodied examples/embodiment/config/cartpole_ppo_mlp.yaml
    rlinf check-config --schema reasoning examples/reasoning/config/toy_grpo_cpu.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

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


def _cmd_check_config(args: argparse.Namespace) -> int:
    from rlinf.core.config import (
        ConfigError,
        available_schemas,
        dump_config,
        load_config,
        load_config_file,
    )

    overrides = list(args.overrides)
    if args.file is not None and _looks_like_override(args.file):
        overrides.insert(0, args.file)
        args.file = None
    if args.file is not None and (args.config_path or args.config_name):
        print("error: give either FILE or --config-path/--config-name, not both", file=sys.stderr)
        return 2
    if args.file is None and args.config_name is None:
        print("error: give a config FILE or --config-name (see --help)", file=sys.stderr)
        return 2
    schemas = available_schemas()
    if args.schema not in schemas:
        print(
            f"error: --schema {args.schema!r} is not registered; choose one of: "
            f"{', '.join(sorted(schemas))}",
            file=sys.stderr,
        )
        return 2

    _print_versions()
    source = args.file if args.file is not None else args.config_name
    try:
        if args.file is not None:
            cfg = load_config_file(args.file, overrides, schema=schemas[args.schema])
        else:
            cfg = load_config(
                args.config_name, args.config_path or ".", overrides, schema=schemas[args.schema]
            )
    except ConfigError as err:
        print(f"\n{err}", file=sys.stderr)
        return 1
    print(f"\nconfig {source!r} is valid for schema {args.schema!r}")
    if args.print:
        print(dump_config(cfg))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Builds the ``rlinf`` argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="rlinf",
        description="RLinf command line: show versions, validate configs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_version = sub.add_parser("version", help="print the versions of the RLinf packages")
    p_version.set_defaults(func=_cmd_version)

    p_check = sub.add_parser(
        "check-config",
        help="compose and validate a config (Hydra-style defaults and overrides)",
        description=(
            "Compose a YAML config (defaults lists, KEY=VALUE, +KEY=VALUE, ~KEY overrides) and "
            "validate it against a registered schema. Exit 0 if valid, 1 if invalid, 2 on usage "
            "errors."
        ),
    )
    p_check.add_argument("file", nargs="?", help="YAML file (or use --config-path/--config-name)")
    p_check.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra-style overrides")
    p_check.add_argument("--config-path", help="folder that holds the configs")
    p_check.add_argument("--config-name", help="config name inside --config-path, without .yaml")
    p_check.add_argument(
        "--schema",
        default="core",
        help="schema to validate against (entry points 'rlinf.config_schemas'; default: core)",
    )
    p_check.add_argument("--print", action="store_true", help="print the validated config as YAML")
    p_check.set_defaults(func=_cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rlinf`` command line and returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
