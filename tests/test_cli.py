"""The ``rlinf`` command line, run as a real subprocess of the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "quickstart" / "config" / "demo.yaml"
RLINF = Path(sys.executable).parent / "rlinf"


def _rlinf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RLINF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_version_lists_every_package_and_the_native_module() -> None:
    proc = _rlinf("version")
    assert proc.returncode == 0, proc.stderr
    for name in ("rlinf-core", "rlinf-sched", "rlinf-embodied", "rlinf-reasoning"):
        assert f"{name:20s} 0.1.0" in proc.stdout
    assert "rlinf.core._native   0.1.0" in proc.stdout


def test_check_config_accepts_the_demo_with_overrides() -> None:
    proc = _rlinf("check-config", str(DEMO), "runner.max_steps=10", "--print")
    assert proc.returncode == 0, proc.stderr
    assert "is valid for schema 'core'" in proc.stdout
    assert "max_steps: 10" in proc.stdout
    assert "experiment_name: quickstart" in proc.stdout  # from the defaults list


def test_check_config_with_config_name_and_leading_override() -> None:
    proc = _rlinf(
        "check-config",
        "--config-path",
        str(DEMO.parent),
        "--config-name",
        "demo",
        "runner.seed=7",
        "--print",
    )
    assert proc.returncode == 0, proc.stderr
    assert "seed: 7" in proc.stdout


def test_check_config_reports_bad_values_with_key_paths() -> None:
    proc = _rlinf("check-config", str(DEMO), "runner.max_epochs=0", "runner.save_interval=7")
    assert proc.returncode == 1
    assert "runner.max_epochs" in proc.stderr
    assert "greater than or equal to 1" in proc.stderr


def test_check_config_usage_errors() -> None:
    missing = _rlinf("check-config")
    assert missing.returncode == 2
    assert "--config-name" in missing.stderr
    bad_schema = _rlinf("check-config", str(DEMO), "--schema", "nope")
    assert bad_schema.returncode == 2
    assert "'nope' is not registered" in bad_schema.stderr
    assert "core" in bad_schema.stderr


def test_help_lists_the_commands() -> None:
    proc = _rlinf("--help")
    assert proc.returncode == 0
    assert "check-config" in proc.stdout and "version" in proc.stdout
