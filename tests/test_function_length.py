"""Function-length gate over the packages' source: short functions that read as what they do.

A function over ``LIMIT`` lines fails the build unless it is listed in
``EXCEPTIONS`` with a reason (config validators only: one flat list of checks
reads better than checks spread over helpers). Functions over ``LONG`` lines
are allowed up to ``MAX_LONG`` of them; a change that adds one must shorten
another. Lines count from the ``def`` (decorators excluded) to the last line of
the body, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LIMIT = 120
LONG = 80
MAX_LONG = 6  # ratchet: the count at the time of writing; lower it when one is shortened

EXCEPTIONS: dict[str, str] = {
    "rlinf-embodied/src/rlinf/embodied/config.py::EmbodiedConfig._check": (
        "config validator: one flat list of cross-key checks, each naming its key"
    ),
}
"""``<package>/<path>::<qualified name>`` -> why it may exceed ``LIMIT`` lines."""


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def function_lengths(root: Path = REPO) -> dict[str, int]:
    """``<package>/<path>::<qualified name>`` -> length in lines, for ``packages/*/src``."""
    lengths: dict[str, int] = {}
    packages = root / "packages"
    for path in sorted(packages.glob("*/src/**/*.py")):
        where = path.relative_to(packages).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), filename=str(path))):
            assert node.end_lineno is not None
            lengths[f"{where}::{name}"] = node.end_lineno - node.lineno + 1
    return lengths


def _listing(items: dict[str, int]) -> str:
    return "\n".join(f"  {n:4d}  {k}" for k, n in sorted(items.items(), key=lambda kv: -kv[1]))


def test_the_gate_sees_the_source() -> None:
    lengths = function_lengths()
    assert len(lengths) > 1000, "no functions found under packages/*/src"
    assert "rlinf-core/src/rlinf/core/heap.py::freeze_heap" in lengths


def test_no_function_over_the_limit() -> None:
    lengths = function_lengths()
    over = {k: n for k, n in lengths.items() if n > LIMIT and k not in EXCEPTIONS}
    assert not over, (
        f"functions over {LIMIT} lines (split them into named helpers, or list a config "
        f"validator in EXCEPTIONS with a reason):\n{_listing(over)}"
    )


def test_the_exceptions_are_still_needed() -> None:
    lengths = function_lengths()
    stale = [k for k in EXCEPTIONS if lengths.get(k, 0) <= LIMIT]
    assert not stale, f"EXCEPTIONS entries that no longer exceed {LIMIT} lines: {stale}"


def test_long_functions_do_not_grow_in_number() -> None:
    lengths = function_lengths()
    long = {k: n for k, n in lengths.items() if n > LONG}
    assert len(long) <= MAX_LONG, (
        f"{len(long)} functions over {LONG} lines, at most {MAX_LONG} allowed (shorten one "
        f"before adding another):\n{_listing(long)}"
    )
