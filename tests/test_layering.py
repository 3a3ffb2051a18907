"""Arrows point down only: no package imports a layer above it (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
ALLOWED = {
    "core": {"core"},
    "sched": {"core", "sched"},
    "embodied": {"core", "sched", "embodied"},
    "reasoning": {"core", "sched", "reasoning"},
}


def _rlinf_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rlinf" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_itself_and_below(layer: str) -> None:
    src = PACKAGES / f"rlinf-{layer}" / "src" / "rlinf"
    files = list(src.rglob("*.py"))
    assert files, f"no sources found under {src}"
    for path in files:
        bad = _rlinf_imports(path) - ALLOWED[layer]
        assert not bad, f"{path} imports rlinf.{bad} from a higher or sibling layer"


def test_no_package_owns_the_namespace() -> None:
    offenders = list(PACKAGES.glob("*/src/rlinf/__init__.py"))
    assert not offenders, f"PEP 420 namespace broken by {offenders}"


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from rlinf.embodied import x\nimport rlinf.reasoning.y\n")
    assert _rlinf_imports(bad) == {"embodied", "reasoning"}
