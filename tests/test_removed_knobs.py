"""Knobs removed for determinism and simplicity stay removed.

``rollout.adaptive_stages`` (a timing-based stage trial that merged the stages a
user asked for) is gone: it may only appear in the error that refuses it and in
that error's test. ``rollout.in_env_process`` is a plain bool (no ``auto`` that
changes behaviour with the device).
"""

from __future__ import annotations

from pathlib import Path

from rlinf.embodied.config import RolloutConfig

REPO = Path(__file__).resolve().parents[1]
SEARCHED = ("packages", "examples", "benchmarks", "docs", "tests", "README.md", "mkdocs.yml")
ALLOWED = {
    # the validator that refuses the removed key, naming it
    "packages/rlinf-embodied/src/rlinf/embodied/config.py",
    # the test of that refusal
    "packages/rlinf-embodied/tests/test_runner_config.py",
    # this file
    "tests/test_removed_knobs.py",
}


def _text_files() -> list[Path]:
    files: list[Path] = []
    for entry in SEARCHED:
        path = REPO / entry
        if path.is_file():
            files.append(path)
            continue
        files.extend(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".json"}
            and ".venv" not in p.parts
        )
    return files


def test_adaptive_stages_appears_nowhere_but_in_its_refusal() -> None:
    found = sorted(
        str(p.relative_to(REPO))
        for p in _text_files()
        if "adaptive_stages" in p.read_text(errors="replace")
    )
    stray = [p for p in found if p not in ALLOWED]
    assert not stray, f"rollout.adaptive_stages was removed; still mentioned in {stray}"


def test_in_env_process_is_a_plain_bool() -> None:
    field = RolloutConfig.model_fields["in_env_process"]
    assert field.annotation is bool, field.annotation
    assert isinstance(field.default, bool)
