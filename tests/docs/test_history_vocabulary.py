"""User-facing text says what a thing is and how to use it, not how it came to be.

Default tier (fast, text only). Scanned: ``docs/``, ``README.md``,
``packages/*/README.md``, ``crates/*/README.md``, ``benchmarks/README.md``,
``examples/`` and the comments and docstrings of ``packages/*/src``.

* No history vocabulary: ``pass <n>``, "the session before", "this
  pass/stop/session", "earlier runs/stops", "(was ...)", dates, "not adopted".
  Development measurements belong in commit messages and ``benchmarks/notes/``
  (not scanned); figures in the generated ``docs/performance.md``.
* A ratio-range literal such as ``0.65-0.76x`` appears in one file at most, so
  copies cannot drift apart.
* The site does not list the hot-path lab notebook.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HISTORY = {
    "a numbered pass": re.compile(
        r"\bpass(?:es)? \d+\b(?! (?:argument|value|item|byte)s?\b)", re.I
    ),
    "'the session before'": re.compile(r"\bthe (?:session|run|pass) before\b", re.I),
    "'this pass/stop/session'": re.compile(r"\bthis (?:pass|stop|session)\b", re.I),
    "'earlier runs/stops'": re.compile(r"\bearlier (?:runs|stops|sessions|passes)\b", re.I),
    "'(was ...)'": re.compile(r"\(was\b[^)]*\)", re.I),
    "a date": re.compile(
        r"\b20\d\d-[01]\d-[0-3]\d\b(?! \d\d:\d\d)"  # a log line's stamp is a format
        r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.? 20\d\d\b"
    ),
    "'not adopted'": re.compile(r"\bnot adopted\b", re.I),
}
RATIO_RANGE = re.compile(r"(?<![\w.])\d+\.\d+ ?[-\u2013] ?\d+\.\d+x\b")


def _text_files() -> Iterator[Path]:
    yield from sorted((REPO / "docs").rglob("*.md"))
    yield REPO / "README.md"
    yield REPO / "benchmarks" / "README.md"
    yield from sorted(REPO.glob("packages/*/README.md"))
    yield from sorted(REPO.glob("crates/*/README.md"))
    for path in sorted((REPO / "examples").rglob("*")):
        if ".venv" in path.parts:  # a uv project's environment (examples/embodiment/libero)
            continue
        if path.is_file() and path.suffix in {".md", ".yaml", ".yml", ".py", ".txt", ".toml"}:
            yield path


def _source_files() -> Iterator[Path]:
    yield from sorted(REPO.glob("packages/*/src/**/*.py"))


def _prose_of_python(text: str) -> str:
    """The comments and string literals of a Python file (docstrings included).

    Code is blanked out, line structure is kept, so that a hit's line number is
    the file's.
    """
    lines = [""] * (text.count("\n") + 2)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            parts = tok.string.split("\n")
            for k, part in enumerate(parts):
                lines[tok.start[0] - 1 + k] += " " + part
    return "\n".join(lines)


def _scanned() -> Iterator[tuple[str, str]]:
    """(repository-relative path, prose) for every scanned file."""
    for path in _text_files():
        if path.exists():
            yield path.relative_to(REPO).as_posix(), path.read_text(errors="replace")
    for path in _source_files():
        text = path.read_text(errors="replace")
        yield path.relative_to(REPO).as_posix(), _prose_of_python(text)


SCANNED = list(_scanned())


def history_hits(rel: str, text: str) -> list[str]:
    """Every history-vocabulary hit of one file, as ``path:line: kind: match``."""
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for kind, pattern in HISTORY.items():
            for m in pattern.finditer(line):
                hits.append(f"{rel}:{lineno}: {kind}: {m.group(0)!r}")
    return hits


def test_no_history_vocabulary() -> None:
    hits = [h for rel, text in SCANNED for h in history_hits(rel, text)]
    assert not hits, (
        "history vocabulary in user-facing text (say what the thing is and when to use it; "
        "measurements go in commit messages, benchmarks/notes/ and docs/performance.md):\n  "
        + "\n  ".join(hits)
    )


def test_a_ratio_range_appears_in_one_file_at_most() -> None:
    files: dict[str, set[str]] = defaultdict(set)
    for rel, text in SCANNED:
        for m in RATIO_RANGE.finditer(text):
            files[_normal(m.group())].add(rel)
    copied = {r: sorted(f) for r, f in files.items() if len(f) > 1}
    assert not copied, (
        "ratio ranges copied into several files (state one figure once, or link "
        "docs/performance.md):\n  " + "\n  ".join(f"{r}: {', '.join(f)}" for r, f in copied.items())
    )


def _normal(literal: str) -> str:
    return literal.replace(" ", "").replace("\u2013", "-")


def test_the_site_does_not_list_the_hot_path_notebook() -> None:
    mkdocs = (REPO / "mkdocs.yml").read_text()
    assert "embodied_hot_path" not in mkdocs
    assert not (REPO / "docs" / "embodied_hot_path.md").exists()


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("after pass 7 the row read", "a numbered pass"),
        ("the session before", "'the session before'"),
        ("measured in this session", "'this pass/stop/session'"),
        ("as in earlier runs", "'earlier runs/stops'"),
        ("182 us (was 248-265)", "'(was ...)'"),
        ("on 2026-11-30", "a date"),
        ("since Dec 2026", "a date"),
        ("Measured and not adopted", "'not adopted'"),
    ],
)
def test_each_pattern_catches_its_offender(text: str, kind: str) -> None:
    assert any(kind in h for h in history_hits("x.md", text))


@pytest.mark.parametrize(
    "text",
    ["pass 2 arguments to the call", "a second pass over the data", "passes the test", "v2.0"],
)
def test_legit_text_is_not_flagged(text: str) -> None:
    assert history_hits("x.md", text) == []


def test_python_prose_is_comments_and_strings_only() -> None:
    code = 'x = 1  # after pass 7\ny = "2026-01-02"\nz = pass7 = 3\n'
    prose = _prose_of_python(code)
    assert "after pass 7" in prose and "2026-01-02" in prose
    assert "pass7" not in prose
