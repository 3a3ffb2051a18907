"""docs/performance.md is the render of benchmarks/results/ratios.json (default tier)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JSON = REPO / "benchmarks" / "results" / "ratios.json"
PAGE = REPO / "docs" / "performance.md"


def _load_generator() -> ModuleType:
    name = "rlinf_performance_page"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "performance_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": "p2p 16 MiB stream",
        "ours": None,
        "baseline": None,
        "baseline_name": "Ray actor call",
        "unit": "GB/s",
        "target": 2.0,
        "floor": 1.0,
        "higher_is_better": True,
        "test": "benchmarks/test_p2p.py::test_p2p_16MiB_throughput_vs_ray",
        "ratio": None,
        "result": None,
    }
    return {**row, **overrides}


def test_committed_page_is_the_render_of_the_committed_json() -> None:
    assert PAGE.read_text() == gen.render(gen.load(JSON)), (
        "docs/performance.md is stale: run `uv run python benchmarks/performance_page.py`"
    )


def test_every_row_of_the_json_is_on_the_page_with_its_command() -> None:
    doc = gen.load(JSON)
    page = PAGE.read_text()
    assert doc["ratios"], "the committed ratio table has no rows"
    for row in doc["ratios"]:
        assert gen._cell(row["name"]) in page  # as the table cell writes it (| escaped)
        assert f"uv run pytest '{row['test']}'" in page


def test_an_unmeasured_row_says_so() -> None:
    page = gen.render({"ratios": [_row()], "machine": None})
    assert gen.NOT_MEASURED in page
    assert "The tier's duration: not measured yet." in page


def test_a_measured_row_shows_its_ratio_values_and_machine() -> None:
    row = _row(ours=3.2, baseline=1.6, ratio=2.0, result="pass")
    doc = {
        "ratios": [row],
        "machine": {"nproc": 2, "cpu": "Test CPU"},
        "duration_s": 150.0,
        "summary": "1 ratios: 1 pass -> passed",
    }
    page = gen.render(doc)
    line = next(x for x in page.splitlines() if x.startswith("| p2p 16 MiB stream"))
    assert "2.00x (3.20 GB/s vs 1.60 GB/s)" in line
    assert "| pass |" in line
    assert "2 cores, Test CPU" in line
    assert gen.NOT_MEASURED not in page
    assert "The tier took 2.5 min" in page


def test_a_bar_in_a_name_does_not_break_the_table() -> None:
    page = gen.render({"ratios": [_row(name="a | b")]})
    line = next(x for x in page.splitlines() if x.startswith("| a"))
    assert line.count(" | ") == 6  # seven cells


def test_check_fails_on_a_stale_page_and_passes_on_a_fresh_one(tmp_path: Path) -> None:
    data = tmp_path / "ratios.json"
    data.write_text(json.dumps({"ratios": [_row()]}))
    out = tmp_path / "performance.md"
    out.write_text("# stale\n")
    assert gen.main(["--json", str(data), "--out", str(out), "--check"]) == 1
    assert gen.main(["--json", str(data), "--out", str(out)]) == 0
    assert gen.main(["--json", str(data), "--out", str(out), "--check"]) == 0
