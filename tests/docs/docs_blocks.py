"""Code blocks of the docs and READMEs, with their ``docs-check`` markers.

A marker is an HTML comment on the line right before a fenced code block (the
rendered site does not show it)::

    <!-- docs-check: run -->                                  runs on CPU as written
    <!-- docs-check: run append="runner.max_epochs=2" -->     + Hydra overrides on each
                                                              training command (short runs)
    <!-- docs-check: run omit="tensorboard" reason="..." -->  drops the commands that start
                                                              with one of the ';'-separated
                                                              prefixes (servers, the suite)
    <!-- docs-check: skip reason="needs a GPU" -->            not run; the reason is required
    <!-- docs-check: config schema=embodied -->               a YAML block that is a config

Every shell block (bash, sh, shell, console) must carry ``run`` or ``skip``, so
no new command escapes the check. Python blocks are type-checked and their
imports executed unless marked ``skip``; ``run`` also executes them. YAML blocks
are checked only when marked ``config`` (attributes: ``schema`` (required),
``dir`` (a config folder whose groups the block's defaults list uses), ``base``
(a config file the block is merged over), ``at`` (the key the block sits under
in ``base``), ``replace`` (';'-separated keys of ``base`` the block replaces
instead of merging into)).

This module only parses; ``test_docs.py`` runs the checks.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})
PYTHON_LANGS = frozenset({"python", "py"})
YAML_LANGS = frozenset({"yaml", "yml"})

# kind -> attributes it accepts, per language family
_ALLOWED: dict[str, dict[str, frozenset[str]]] = {
    "shell": {
        "run": frozenset({"append", "omit", "reason", "timeout"}),
        "skip": frozenset({"reason"}),
    },
    "python": {
        "run": frozenset({"timeout"}),
        "skip": frozenset({"reason"}),
    },
    "yaml": {
        "config": frozenset({"schema", "dir", "base", "at", "replace"}),
        "skip": frozenset({"reason"}),
    },
}

MARKER_HELP = (
    '<!-- docs-check: run --> (runs on CPU as written), <!-- docs-check: run append="runner.'
    'max_epochs=2" --> (runs with these Hydra overrides appended to each training command, for '
    'short runs) or <!-- docs-check: skip reason="needs a GPU" --> (never run; say why)'
)

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
_MARKER = re.compile(r"^[ \t]*<!--[ \t]*docs-check:(?P<body>.*?)-->[ \t]*$")
_ATTR = re.compile(r'\s*(?P<key>[A-Za-z][\w-]*)=(?:"(?P<quoted>[^"]*)"|(?P<bare>[^\s"]+))')
_KIND = re.compile(r"\s*(?P<kind>[A-Za-z]+)")


def docs_files() -> list[Path]:
    """The Markdown files the check covers: docs/**/*.md, README.md, packages/*/README.md."""
    files = sorted((REPO / "docs").rglob("*.md"))
    files.append(REPO / "README.md")
    files.extend(sorted((REPO / "packages").glob("*/README.md")))
    return files


def relative(path: Path) -> str:
    """The path relative to the repository (as given when it is outside)."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


@dataclass(frozen=True)
class Marker:
    """A parsed ``<!-- docs-check: KIND key="value" ... -->`` comment."""

    kind: str
    attrs: dict[str, str]
    line: int


@dataclass
class Block:
    """One fenced code block and the marker right above it (if any)."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: Marker | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def rel(self) -> str:
        """``docs/x.md`` (the path relative to the repository)."""
        return relative(self.path)

    @property
    def where(self) -> str:
        """``docs/x.md:12``: where the block starts."""
        return f"{self.rel}:{self.line}"

    @property
    def family(self) -> str | None:
        """``shell``, ``python``, ``yaml`` or None (blocks no check looks at)."""
        if self.lang in SHELL_LANGS:
            return "shell"
        if self.lang in PYTHON_LANGS:
            return "python"
        if self.lang in YAML_LANGS:
            return "yaml"
        return None

    @property
    def kind(self) -> str:
        """The marker's kind; unmarked python blocks are ``check``, others ``none``."""
        if self.marker is not None:
            return self.marker.kind
        return "check" if self.family == "python" else "none"

    def attr(self, key: str, default: str | None = None) -> str | None:
        """A marker attribute, or ``default``."""
        return self.marker.attrs.get(key, default) if self.marker is not None else default

    @property
    def slug(self) -> str:
        """An identifier for files and test ids: ``docs_cli_md_L16``."""
        stem = re.sub(r"[^A-Za-z0-9]+", "_", self.rel).strip("_")
        return f"{stem}_L{self.line}"


def _parse_marker(text: str, line: int) -> tuple[Marker | None, str | None]:
    match = _MARKER.match(text)
    if match is None:
        return None, 'malformed docs-check comment: write <!-- docs-check: KIND key="value" -->'
    body = match.group("body")
    kind_match = _KIND.match(body)
    if kind_match is None:
        return None, "docs-check comment without a kind (run, skip or config)"
    rest = body[kind_match.end() :]
    attrs: dict[str, str] = {}
    pos = 0
    while True:
        attr = _ATTR.match(rest, pos)
        if attr is None:
            break
        value = attr.group("quoted") if attr.group("quoted") is not None else attr.group("bare")
        if attr.group("key") in attrs:
            return None, f"attribute {attr.group('key')!r} given twice"
        attrs[attr.group("key")] = value
        pos = attr.end()
    if rest[pos:].strip():
        return None, (
            f'cannot parse {rest[pos:].strip()!r}: attributes are key="value" pairs '
            "separated by spaces"
        )
    return Marker(kind_match.group("kind"), attrs, line), None


def parse_file(path: Path) -> tuple[list[Block], list[str]]:
    """Fenced blocks of a Markdown file, and marker problems not tied to a block.

    Returns:
        The blocks (each with its marker and its own problems) and the stray or
        malformed markers as ``path:line: message`` strings.
    """
    rel = relative(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    stray: list[str] = []
    pending: tuple[Marker | None, str | None, int] | None = None
    i = 0
    while i < len(lines):
        text = lines[i]
        if "docs-check" in text and text.lstrip().startswith("<!--"):
            if pending is not None:
                stray.append(f"{rel}:{pending[2]}: docs-check marker not followed by a code block")
            marker, error = _parse_marker(text, i + 1)
            pending = (marker, error, i + 1)
            i += 1
            continue
        fence = _FENCE.match(text)
        if fence is None:
            if pending is not None:
                stray.append(
                    f"{rel}:{pending[2]}: docs-check marker not followed by a code block "
                    "(it must be on the line right before the opening ```)"
                )
                pending = None
            i += 1
            continue
        indent, marks = fence.group("indent"), fence.group("fence")
        lang = fence.group("info").lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(marks[0] * len(marks)) and set(close) == {marks[0]}:
                break
            raw = lines[j]
            body.append(raw[len(indent) :] if raw.startswith(indent) else raw.lstrip())
            j += 1
        block = Block(path, i + 1, lang, "\n".join(body) + ("\n" if body else ""))
        if pending is not None:
            marker, error, mline = pending
            if error is not None:
                block.problems.append(f"{rel}:{mline}: {error}")
            block.marker = marker
            pending = None
        _validate(block)
        blocks.append(block)
        i = j + 1
    if pending is not None:
        stray.append(f"{rel}:{pending[2]}: docs-check marker not followed by a code block")
    return blocks, stray


def _validate(block: Block) -> None:
    family = block.family
    marker = block.marker
    lang = block.lang or "plain"
    if marker is None:
        if family == "shell" and not block.problems:
            block.problems.append(
                f"{block.where}: this {lang} block has no docs-check marker. Put one on the line "
                f"right before its opening fence: {MARKER_HELP}"
            )
        return
    where = f"{block.rel}:{marker.line}"
    if family is None:
        block.problems.append(
            f"{where}: docs-check markers apply to shell, python and yaml blocks, not {lang}; "
            "remove it"
        )
        return
    allowed = _ALLOWED[family]
    if marker.kind not in allowed:
        block.problems.append(
            f"{where}: {marker.kind!r} is not a docs-check kind for a {lang} block; use one of "
            f"{', '.join(sorted(allowed))}" + (f" ({MARKER_HELP})" if family == "shell" else "")
        )
        return
    unknown = sorted(set(marker.attrs) - allowed[marker.kind])
    if unknown:
        block.problems.append(
            f"{where}: unknown attribute(s) {', '.join(unknown)} for docs-check {marker.kind}; "
            f"allowed: {', '.join(sorted(allowed[marker.kind])) or 'none'}"
        )
    if marker.kind == "skip" and not marker.attrs.get("reason", "").strip():
        block.problems.append(
            f'{where}: docs-check skip needs a reason: <!-- docs-check: skip reason="needs a '
            'GPU" --> (GPU, multi-node, long, interactive, installs...)'
        )
    if marker.kind == "run" and "omit" in marker.attrs and not marker.attrs.get("reason"):
        block.problems.append(
            f'{where}: docs-check run with omit= needs reason="why those commands do not run"'
        )
    if "timeout" in marker.attrs and not marker.attrs["timeout"].isdigit():
        block.problems.append(
            f"{where}: timeout must be whole seconds, got {marker.attrs['timeout']!r}"
        )
    if marker.kind == "config":
        if not marker.attrs.get("schema"):
            block.problems.append(
                f"{where}: docs-check config needs schema=NAME (core, embodied, reasoning)"
            )
        for key in ("dir", "base"):
            if key in marker.attrs and not (REPO / marker.attrs[key]).exists():
                block.problems.append(f"{where}: {key}={marker.attrs[key]!r} does not exist")
        if "dir" in marker.attrs and "base" in marker.attrs:
            block.problems.append(f"{where}: give dir= or base=, not both")
        if ("at" in marker.attrs or "replace" in marker.attrs) and "base" not in marker.attrs:
            block.problems.append(f"{where}: at= and replace= need base=")
    appends = family == "shell" and marker.kind == "run" and "append" in marker.attrs
    if appends and not shell_script(block)[1]:
        block.problems.append(
            f"{where}: append= given but the block has no training command that takes "
            "overrides (a `python examples/.../*.py` whose program uses add_config_arguments)"
        )


def all_blocks() -> tuple[list[Block], list[str]]:
    """Every block of every covered file, and every stray or malformed marker."""
    blocks: list[Block] = []
    stray: list[str] = []
    for path in docs_files():
        b, s = parse_file(path)
        blocks.extend(b)
        stray.extend(s)
    return blocks, stray


# ---------------------------------------------------------------- shell commands


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Joins backslash-continued lines: (0-based first line, command text)."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for n, line in enumerate(text.splitlines()):
        if not current:
            start = n
        if line.rstrip().endswith("\\"):
            current.append(line.rstrip()[:-1])
            continue
        current.append(line)
        out.append((start, " ".join(part.strip() for part in current)))
        current = []
    if current:
        out.append((start, " ".join(part.strip() for part in current)))
    return out


def console_commands(text: str) -> tuple[list[str], list[str]]:
    """A console block's ``$ `` commands and the output lines it shows."""
    commands: list[str] = []
    output: list[str] = []
    continuing = False
    for line in text.splitlines():
        if continuing:
            commands[-1] += " " + line.strip().removesuffix("\\").strip()
            continuing = line.rstrip().endswith("\\")
        elif line.startswith("$ "):
            commands.append(line[2:].rstrip().removesuffix("\\").strip())
            continuing = line.rstrip().endswith("\\")
        elif line.strip():
            output.append(line.rstrip())
    return commands, output


def split_comment(command: str) -> tuple[str, str]:
    """(command, trailing ``# comment``), honouring quotes."""
    quote: str | None = None
    for i, ch in enumerate(command):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip(), command[i:]
    return command, ""


def tokens(command: str) -> list[str]:
    """Shell words of one logical command line (comments dropped); [] if it does not parse."""
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return []


@dataclass(frozen=True)
class TrainingCommand:
    """``[uv run] python examples/.../X.py [--config-path P] [--config-name N] KEY=VALUE...``."""

    script: Path
    config_path: Path
    config_name: str
    overrides: list[str]
    schema: str
    env: dict[str, str]
    flags: list[str]  # other options (errors unless --help)


def _takes_overrides(script: Path) -> bool:
    return script.is_file() and "add_config_arguments" in script.read_text(encoding="utf-8")


def _script_index(words: list[str]) -> int | None:
    for i, word in enumerate(words[:-1]):
        if re.fullmatch(r"python3?", Path(word).name) and words[i + 1].endswith(".py"):
            return i + 1
    return None


def training_command(command: str, env: dict[str, str] | None = None) -> TrainingCommand | None:
    """Parses a command that runs an example main taking Hydra overrides, else None."""
    words = tokens(command)
    env = dict(env or {})
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    idx = _script_index(words)
    if idx is None:
        return None
    script = REPO / words[idx]
    if not _takes_overrides(script):
        return None
    source = script.read_text(encoding="utf-8")
    default = re.search(r"add_config_arguments\([^,]+,[^,]+,\s*\"([^\"]+)\"\)", source)
    config_path = script.parent / "config"
    config_name = default.group(1) if default else ""
    overrides: list[str] = []
    flags: list[str] = []
    rest = words[idx + 1 :]
    k = 0
    while k < len(rest):
        word = rest[k]
        for flag in ("--config-path", "--config-name"):
            if word == flag and k + 1 < len(rest):
                value = rest[k + 1]
                k += 1
                break
            if word.startswith(flag + "="):
                value = word.split("=", 1)[1]
                break
        else:
            if word.startswith("-"):
                flags.append(word)
            else:
                overrides.append(word)
            k += 1
            continue
        if flag == "--config-path":
            config_path = REPO / value
        else:
            config_name = value
        k += 1
    if "EmbodiedConfig" in source:
        schema = "embodied"
    elif "ReasoningConfig" in source:
        schema = "reasoning"
    else:
        schema = "core"
    return TrainingCommand(script, config_path, config_name, overrides, schema, env, flags)


def exported_env(text: str) -> dict[str, str]:
    """``export KEY=VALUE ...`` assignments of a block (for checking its configs)."""
    env: dict[str, str] = {}
    for _, command in logical_lines(text):
        words = tokens(command)
        if words[:1] == ["export"]:
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if sep:
                    env[key] = value
    return env


def shell_script(block: Block) -> tuple[str, int]:
    """The script a ``run`` block executes, and how many commands got ``append``.

    Omitted commands become ``: omitted ...`` lines; ``append`` overrides go at the
    end of each training command (before a trailing comment). Console blocks run
    their ``$`` commands.
    """
    append = (block.attr("append") or "").strip()
    omit = [p.strip() for p in (block.attr("omit") or "").split(";") if p.strip()]
    if block.lang == "console":
        commands = console_commands(block.text)[0]
    else:
        commands = [command for _, command in logical_lines(block.text)]
    out: list[str] = []
    applied = 0
    for command in commands:
        code, comment = split_comment(command)
        stripped = code.strip()
        if stripped and any(stripped.startswith(prefix) for prefix in omit):
            out.append(f": omitted by docs-check: {shlex.quote(stripped)}")
            continue
        if append and stripped and training_command(stripped) is not None:
            code = f"{code} {append}"
            applied += 1
        out.append(" ".join(part for part in (code, comment) if part))
    return "\n".join(out) + "\n", applied


# ---------------------------------------------------------------- paths in the docs

_PATH_REF = re.compile(
    r"(?<![\w/.-])((?:examples|benchmarks|packages|tests|crates|docs|\.ci)/[\w./*{}-]*[\w*])"
)


def referenced_paths(path: Path) -> list[tuple[int, str]]:
    """Repository paths a file names in code (inline or blocks): (line, path)."""
    out: list[tuple[int, str]] = []
    in_block = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line):
            in_block = not in_block
            continue
        spans = [line] if in_block else re.findall(r"`([^`]+)`", line)
        for span in spans:
            for match in _PATH_REF.finditer(span):
                out.append((n, match.group(1).rstrip(".")))
    return out
