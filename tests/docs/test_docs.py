"""Docs that are executed: the code blocks of docs/**/*.md, README.md and packages/*/README.md.

Default tier (fast, no training):
    * every shell block carries a well-formed ``docs-check`` marker (run or skip);
    * every repository path the docs name exists;
    * every shipped example config, every config a documented command loads (with
      the command's overrides) and every YAML block marked ``config`` passes
      ``rlinf check-config``; documented ``rlinf check-config`` commands pass;
    * every Python block type-checks (mypy, our ``rlinf.*`` modules resolved) and
      its imports run.

Docs tier (``uv run pytest -m docs tests/docs``, deselected by default):
    * every shell block marked ``run`` runs from the repository root with
      ``bash -euo pipefail``, a private TMPDIR and a timeout; training commands
      get the marker's ``append`` overrides (short runs);
    * every Python block marked ``run`` runs.

The marker syntax is described in ``docs_blocks.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml


def _load_parser() -> ModuleType:
    # --import-mode=importlib puts no test folder on sys.path: load the sibling by path.
    name = "rlinf_docs_blocks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("docs_blocks.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


db = _load_parser()
REPO: Path = db.REPO
BLOCKS, STRAY = db.all_blocks()
SHELL = [b for b in BLOCKS if b.family == "shell"]
PYTHON_CHECKED = [b for b in BLOCKS if b.family == "python" and b.kind != "skip"]
PYTHON_RUN = [b for b in BLOCKS if b.family == "python" and b.kind == "run"]
YAML_CONFIGS = [b for b in BLOCKS if b.family == "yaml" and b.kind == "config"]
SHELL_RUN = [b for b in SHELL if b.kind == "run" and not b.problems]
DEFAULT_TIMEOUT_S = 600


def _param(block: Any, *marks: pytest.MarkDecorator) -> Any:
    return pytest.param(block, id=block.where, marks=marks)


# ---------------------------------------------------------------- markers and paths


@pytest.mark.parametrize("path", db.docs_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shell_blocks_carry_a_wellformed_marker(path: Path) -> None:
    blocks, stray = db.parse_file(path)
    problems = stray + [p for b in blocks for p in b.problems]
    assert not problems, "docs-check markers to fix:\n  " + "\n  ".join(problems)


_BAD_DOC = """\
# Title

```bash
echo no marker
```

<!-- docs-check: skip -->
```bash
echo skip without a reason
```

<!-- docs-check: run append="runner.max_epochs=2" -->
```bash
echo nothing to append to
```

<!-- docs-check: runn -->
```sh
echo unknown kind
```

<!-- docs-check: run reason="unterminated -->
```bash
echo malformed attribute
```

<!-- docs-check: run -->

```bash
echo marker separated by a blank line
```

<!-- docs-check: run -->
```text
a marker on a text block
```

<!-- docs-check: config -->
```yaml
runner: {max_epochs: 1}
```
"""


def test_marker_problems_name_the_line_and_the_fix(tmp_path: Path) -> None:
    doc = tmp_path / "bad.md"
    doc.write_text(_BAD_DOC, encoding="utf-8")
    blocks, stray = db.parse_file(doc)
    problems = stray + [p for b in blocks for p in b.problems]
    text = "\n".join(problems)
    assert f"{doc}:3: this bash block has no docs-check marker" in text
    assert 'docs-check: skip reason="needs a GPU"' in text  # the fix is spelled out
    assert f"{doc}:7: docs-check skip needs a reason" in text
    assert f"{doc}:12: append= given but the block has no training command" in text
    assert f"{doc}:17: 'runn' is not a docs-check kind" in text
    assert f"{doc}:22: cannot parse" in text
    assert f"{doc}:27: docs-check marker not followed by a code block" in text
    assert f"{doc}:29: this bash block has no docs-check marker" in text
    assert f"{doc}:33: docs-check markers apply to shell, python and yaml blocks" in text
    assert f"{doc}:38: docs-check config needs schema=NAME" in text
    assert len(problems) == 9, text


def test_run_script_appends_overrides_and_omits_commands(tmp_path: Path) -> None:
    doc = tmp_path / "ok.md"
    doc.write_text(
        '<!-- docs-check: run append="runner.max_epochs=2 x.y=1" omit="tensorboard" '
        'reason="serves until stopped" -->\n'
        "```bash\n"
        "# train\n"
        "uv run python examples/embodiment/train_embodied_agent.py \\\n"
        "    --config-name cartpole_ppo_mlp  # the main job\n"
        "tensorboard --logdir results\n"
        "uv run python examples/reasoning/make_toy_task.py --out /tmp/x\n"
        "```\n",
        encoding="utf-8",
    )
    (block,), stray = db.parse_file(doc)
    assert not stray and not block.problems
    script, applied = db.shell_script(block)
    assert applied == 1
    assert script.splitlines() == [
        "# train",
        "uv run python examples/embodiment/train_embodied_agent.py --config-name "
        "cartpole_ppo_mlp runner.max_epochs=2 x.y=1 # the main job",
        ": omitted by docs-check: 'tensorboard --logdir results'",
        "uv run python examples/reasoning/make_toy_task.py --out /tmp/x",  # takes no overrides
    ]


def _ignored_by_git(rel: str) -> bool:
    probe = rel.split("*", 1)[0].rstrip("/") or rel
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", probe], cwd=REPO, capture_output=True
    )
    return proc.returncode == 0


def test_paths_named_in_the_docs_exist() -> None:
    missing = []
    for path in db.docs_files():
        for line, rel in db.referenced_paths(path):
            pattern = re.sub(r"\{[^}]*\}", "*", rel)  # rank_{r}.pt and the like
            if any(REPO.glob(pattern)) or (REPO / pattern).exists() or _ignored_by_git(rel):
                continue
            missing.append(f"{path.relative_to(REPO).as_posix()}:{line}: {rel}")
    assert not missing, "the docs name paths that do not exist:\n  " + "\n  ".join(missing)


# ---------------------------------------------------------------- configs


def _check_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from rlinf.core.cli import main

    code = main(["check-config", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def _schema_of_config_dir() -> dict[Path, str]:
    """Config folder -> schema, from the example mains that load it."""
    schemas: dict[Path, str] = {}
    for script in sorted(REPO.glob("examples/*/*.py")):
        cmd = db.training_command(f"python {script.relative_to(REPO).as_posix()}")
        if cmd is not None:
            schemas[cmd.config_path] = cmd.schema
    return schemas


EXAMPLE_CONFIGS = sorted(REPO.glob("examples/*/config/*.yaml"))


@pytest.mark.parametrize("config", EXAMPLE_CONFIGS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_example_config_passes_check_config(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = _schema_of_config_dir().get(config.parent, "core")
    code, out = _check_config(["--schema", schema, str(config)], capsys)
    assert code == 0, f"rlinf check-config --schema {schema} {config}:\n{out}"


def _documented_commands() -> Iterator[tuple[Any, str, dict[str, str]]]:
    """(block, command, env) for every command of every shell block, run or skip."""
    for block in SHELL:
        env = db.exported_env(block.text)
        if block.lang == "console":
            commands = db.console_commands(block.text)[0]
        elif block.kind == "run":
            commands = [c for _, c in db.logical_lines(db.shell_script(block)[0])]
        else:
            commands = [c for _, c in db.logical_lines(block.text)]
        for command in commands:
            yield block, command, env


def _config_commands() -> list[Any]:
    params = []
    for block, command, env in _documented_commands():
        words = db.tokens(command)
        if words[:2] == ["uv", "run"]:
            words = words[2:]
        if db.training_command(command, env) is not None or words[:2] == ["rlinf", "check-config"]:
            params.append(pytest.param(block, command, env, id=f"{block.where}:{words[-1][:40]}"))
    return params


@pytest.mark.parametrize(("block", "command", "env"), _config_commands())
def test_documented_command_config_passes_check_config(
    block: Any,
    command: str,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The config a documented command loads, with its overrides, is valid (run or skip)."""
    monkeypatch.chdir(REPO)
    cmd = db.training_command(command, env)
    if cmd is not None:
        for key, value in cmd.env.items():
            monkeypatch.setenv(key, value)
        unknown = [f for f in cmd.flags if f not in ("-h", "--help")]
        assert not unknown, f"{block.where}: {cmd.script.name} takes no {unknown} (`{command}`)"
        args = ["--config-path", str(cmd.config_path), "--config-name", cmd.config_name]
        args += ["--schema", cmd.schema, *cmd.overrides]
    else:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        words = db.tokens(command)
        args = words[words.index("check-config") + 1 :]
    code, out = _check_config(args, capsys)
    assert code == 0, f"{block.where}: the config of `{command}` is invalid:\n{out}"


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def _drop_path(data: dict[str, Any], dotted: str) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data.get(key, {})
    data.pop(keys[-1], None)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _named_snippets(block: Any) -> dict[str, str]:
    """Python blocks of the same doc that open with ``# name.py``: file name -> code."""
    out = {}
    for other in BLOCKS:
        if other.path == block.path and other.family == "python":
            first = other.text.split("\n", 1)[0].strip()
            match = re.fullmatch(r"#\s*(\w+\.py)", first)
            if match:
                out[match.group(1)] = other.text
    return out


@pytest.mark.parametrize("block", [_param(b) for b in YAML_CONFIGS])
def test_yaml_config_block_passes_check_config(
    block: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config block validates; ``plugin_modules`` it names may be the doc's ``# x.py`` blocks."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name, source in _named_snippets(block).items():
        (plugins / name).write_text(source, encoding="utf-8")
        monkeypatch.syspath_prepend(str(plugins))
        monkeypatch.delitem(sys.modules, name.removesuffix(".py"), raising=False)
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.where}: a config block must be a YAML mapping"
    folder = tmp_path / "config"
    if block.attr("dir"):
        shutil.copytree(REPO / block.attr("dir"), folder)
    elif block.attr("base"):
        base_file = REPO / block.attr("base")
        shutil.copytree(base_file.parent, folder)
        base = yaml.safe_load(base_file.read_text(encoding="utf-8"))
        at = block.attr("at")
        for dotted in (block.attr("replace") or "").split(";"):
            if dotted.strip():
                _drop_path(base, dotted.strip())
        if at:
            wrapped: dict[str, Any] = {}
            _set_path(wrapped, at, data)
            data = wrapped
        data = _merge(base, data)
    else:
        folder.mkdir()
    config = folder / f"docs_block_{block.slug}.yaml"
    text = block.text if not block.attr("base") else yaml.safe_dump(data, sort_keys=False)
    config.write_text(text, encoding="utf-8")
    schema = block.attr("schema")
    code, out = _check_config(["--schema", schema, str(config)], capsys)
    assert code == 0, f"{block.where}: the YAML block is not a valid {schema} config:\n{out}"


# ---------------------------------------------------------------- python snippets

_THIRD_PARTY_UNTYPED = ("tensorboardX.*", "tensorboard.*", "hydra.*", "wandb.*", "swanlab.*")
_ANALYSED = (
    "rlinf.*",
    "numpy.*",
    "pydantic.*",
    "pydantic_core.*",
    "annotated_types.*",
    "typing_extensions",
)


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One mypy run over every checked Python block: slug -> its errors (doc lines)."""
    root = tmp_path_factory.mktemp("snippets")
    report: dict[str, list[str]] = {}
    by_slug = {}
    for block in PYTHON_CHECKED:
        try:
            ast.parse(block.text)
        except SyntaxError as exc:  # one unparsable file would stop mypy for all
            line = block.line + (exc.lineno or 0)
            report[block.slug] = [f"{block.rel}:{line}: error: not valid Python: {exc.msg}"]
            continue
        report[block.slug] = []
        by_slug[block.slug] = block
        (root / f"{block.slug}.py").write_text(block.text, encoding="utf-8")
    src = [str(REPO / "packages" / p / "src") for p in sorted(os.listdir(REPO / "packages"))]
    # Snippets use names defined by the prose around them (cfg, batch...): name-defined
    # is off. Imports are checked (every imported module must exist, our own rlinf.*
    # ones included); mypy analyses rlinf and the libraries its types are built on,
    # and treats the rest (torch, ray, transformers...) as Any: the check is about
    # our API, and following those costs a minute or more on 2 cores.
    ini = root / "mypy.ini"
    ini.write_text(
        "[mypy]\n"
        "python_version = 3.11\n"
        f"mypy_path = {':'.join(src)}\n"
        "namespace_packages = True\n"
        "explicit_package_bases = True\n"
        "check_untyped_defs = True\n"
        "disable_error_code = name-defined\n"
        "follow_imports = skip\n"
        f"cache_dir = {REPO / '.mypy_cache' / 'docs-snippets'}\n"
        f"\n[mypy-{','.join(_ANALYSED)}]\nfollow_imports = silent\n"
        f"\n[mypy-{','.join(_THIRD_PARTY_UNTYPED)}]\nignore_missing_imports = True\n",
        encoding="utf-8",
    )
    files = [f"{slug}.py" for slug in by_slug]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-error-summary", *files],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode not in (0, 1):
        pytest.fail(f"mypy did not run (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    for line in proc.stdout.splitlines():
        match = re.match(r"(?P<slug>\w+)\.py:(?P<line>\d+): (?P<msg>.*)", line)
        if match is None or match.group("slug") not in by_slug:
            continue
        block = by_slug[match.group("slug")]
        doc_line = block.line + int(match.group("line"))
        report[block.slug].append(f"{block.rel}:{doc_line}: {match.group('msg')}")
    return report


@pytest.mark.parametrize("block", [_param(b) for b in PYTHON_CHECKED])
def test_python_block_typechecks(block: Any, mypy_report: dict[str, list[str]]) -> None:
    errors = [e for e in mypy_report[block.slug] if ": error:" in e]
    assert not errors, (
        f"{block.where}: the snippet does not type-check against the code:\n  "
        + "\n  ".join(mypy_report[block.slug])
    )


@pytest.mark.parametrize("block", [_param(b) for b in PYTHON_CHECKED])
def test_python_block_imports_run(block: Any) -> None:
    try:
        tree = ast.parse(block.text)
    except SyntaxError as exc:
        pytest.fail(f"{block.rel}:{block.line + (exc.lineno or 0)}: not valid Python: {exc.msg}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            code = compile(ast.Module(body=[node], type_ignores=[]), block.where, "exec")
            try:
                exec(code, {})
            except ImportError as exc:
                source = ast.get_source_segment(block.text, node)
                pytest.fail(f"{block.rel}:{block.line + node.lineno}: `{source}` fails: {exc}")


# ---------------------------------------------------------------- docs tier: run the blocks

_RUNS: dict[str, tuple[int | None, str, float]] = {}
_RUN_IDS = iter(range(1_000_000))


def _run(argv: list[str], timeout: float) -> tuple[int | None, str, float]:
    """Runs argv from the repository root in its own session, TMPDIR and channel namespace."""
    namespace = f"docs{os.getpid()}x{next(_RUN_IDS)}"
    # A short private TMPDIR: Ray puts its sockets under it (AF_UNIX paths: <= 107 bytes).
    tmp = Path(tempfile.mkdtemp(prefix="docs"))
    try:
        return _run_in(argv, timeout, namespace, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_in(
    argv: list[str], timeout: float, namespace: str, tmp: Path
) -> tuple[int | None, str, float]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(
        TMPDIR=str(tmp),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        RLINF_CHANNEL_NAMESPACE=namespace,
        PYTHONUNBUFFERED="1",
    )
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    code: int | None
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    elapsed = time.monotonic() - start
    leaked = sorted(Path("/dev/shm").glob(f"rlinf.{namespace}.*"))
    for segment in leaked:
        segment.unlink(missing_ok=True)
    if leaked and code == 0:
        out += f"\n[docs-check] left shared-memory segments behind: {[p.name for p in leaked]}"
        code = -1
    return code, out, elapsed


def _failure(block: Any, script: str, code: int | None, out: str, elapsed: float) -> str:
    what = f"timed out after {elapsed:.0f} s" if code is None else f"exit {code}"
    tail = out[-8000:]
    return (
        f"{block.where}: the documented commands fail ({what}, {elapsed:.0f} s).\n"
        f"--- script (bash -euo pipefail, from the repository root) ---\n{script}"
        f"--- output{' (last 8000 characters)' if len(out) > 8000 else ''} ---\n{tail}"
    )


def _timeout(block: Any) -> int:
    return int(block.attr("timeout") or DEFAULT_TIMEOUT_S)


@pytest.mark.docs
@pytest.mark.parametrize(
    "block", [_param(b, pytest.mark.timeout(_timeout(b) + 120)) for b in SHELL_RUN]
)
def test_shell_block_runs(block: Any, tmp_path: Path) -> None:
    script, _ = db.shell_script(block)
    # The same commands in two docs (the README's and embodied.md's quickstart) run once.
    key = "\n".join(
        code
        for _, line in db.logical_lines(script)
        if (code := db.split_comment(line)[0].strip()) and not code.startswith(": omitted")
    )
    if key not in _RUNS:
        path = tmp_path / "block.sh"
        path.write_text(script, encoding="utf-8")
        _RUNS[key] = _run(["bash", "-euo", "pipefail", str(path)], _timeout(block))
    code, out, elapsed = _RUNS[key]
    assert code == 0, _failure(block, script, code, out, elapsed)
    if block.lang == "console":
        shown = db.console_commands(block.text)[1]
        got = {" ".join(line.split()) for line in out.splitlines()}
        missing = [line for line in shown if " ".join(line.split()) not in got]
        assert not missing, (
            f"{block.where}: the output shown in the docs differs from what the commands "
            f"print; missing lines:\n  " + "\n  ".join(missing) + f"\n--- output ---\n{out}"
        )


@pytest.mark.docs
@pytest.mark.parametrize(
    "block", [_param(b, pytest.mark.timeout(_timeout(b) + 120)) for b in PYTHON_RUN]
)
def test_python_block_runs(block: Any, tmp_path: Path) -> None:
    path = tmp_path / f"{block.slug}.py"
    path.write_text(block.text, encoding="utf-8")
    code, out, elapsed = _run([sys.executable, str(path)], _timeout(block))
    assert code == 0, _failure(block, block.text, code, out, elapsed)
