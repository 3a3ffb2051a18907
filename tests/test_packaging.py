"""Build every package's sdist and wheel, then install each wheel alone in a fresh venv.

This is the real thing: ``uv build`` runs maturin (compiling the Rust crate
in release mode) and hatchling, and each venv gets only the package's wheel,
its RLinf dependencies' wheels and their declared third-party dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "core": [],
    "sched": ["core"],
    "embodied": ["core", "sched"],
    "reasoning": ["core", "sched"],
}


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is required for the packaging test: install it with `pip install uv`")
    return uv


def _run(*args: str | Path, cwd: Path = REPO) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(_uv(), "build", "--all-packages", "--out-dir", out)
    return out


def _wheel(dist: Path, short: str) -> Path:
    (wheel,) = dist.glob(f"rlinf_{short}-*.whl")
    return wheel


def test_each_package_has_an_sdist_and_a_wheel(dist: Path) -> None:
    for short in PACKAGES:
        assert len(list(dist.glob(f"rlinf_{short}-*.tar.gz"))) == 1, short
        assert len(list(dist.glob(f"rlinf_{short}-*.whl"))) == 1, short
    (core_sdist,) = dist.glob("rlinf_core-*.tar.gz")
    listing = subprocess.run(["tar", "tzf", core_sdist], capture_output=True, text=True).stdout
    assert "crates/channel/src/lib.rs" in listing, "core sdist must carry the Rust crate"


def test_wheels_ship_only_their_namespace_portion(dist: Path) -> None:
    for short in PACKAGES:
        names = zipfile.ZipFile(_wheel(dist, short)).namelist()
        assert "rlinf/__init__.py" not in names, f"{short} wheel breaks the PEP 420 namespace"
        code = [n for n in names if n.startswith("rlinf/")]
        assert code and all(n.startswith(f"rlinf/{short}/") for n in code), code
    core = zipfile.ZipFile(_wheel(dist, "core")).namelist()
    assert any(n.startswith("rlinf/core/_native") and n.endswith(".so") for n in core)


@pytest.mark.parametrize("short", list(PACKAGES))
def test_wheel_imports_alone_in_a_fresh_venv(dist: Path, tmp_path: Path, short: str) -> None:
    venv = tmp_path / f"venv-{short}"
    _run(_uv(), "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    wheels = [_wheel(dist, dep) for dep in [*PACKAGES[short], short]]
    # --no-config: the workspace's compile-bytecode setting would compile torch
    # again in each throw-away venv (~30 s each); this test only imports.
    _run(_uv(), "pip", "install", "--quiet", "--no-config", "--python", python, *wheels)
    installed = _run(_uv(), "pip", "list", "--python", python)
    for other in set(PACKAGES) - {short, *PACKAGES[short]}:
        assert f"rlinf-{other}" not in installed, f"rlinf-{short} pulled in rlinf-{other}"

    check = f"import rlinf.{short} as m; print(m.__version__)"
    if short == "core":
        # Every public module must import with only the declared dependencies.
        check += (
            "\nfrom rlinf.core import _native, cli, config, logging, metrics, progress"
            "\nprint(_native.segment_name('ns', 'ch'))"
        )
    out = _run(python, "-I", "-c", check, cwd=tmp_path)
    assert out.splitlines()[0] == "0.1.0"
    if short == "core":
        assert "rlinf.ns.ch" in out
        version_out = _run(venv / "bin" / "rlinf", "version", cwd=tmp_path)
        assert "rlinf-core           0.1.0" in version_out
        assert "rlinf-sched          not installed" in version_out
