"""The ``rlinf`` command line, run as a real subprocess of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


CARTPOLE = REPO / "examples" / "embodiment" / "config" / "cartpole_ppo_mlp.yaml"
TOY_GRPO = REPO / "examples" / "reasoning" / "config" / "toy_grpo_cpu.yaml"
EMBODIED_COSTS = (
    "+profile_data={env_cost: 0.2, rollout_cost: 0.6, actor_cost: 0.1, sync_cost: 0.01}"
)


def test_auto_place_help_names_the_options() -> None:
    proc = _rlinf("auto-place", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--config-name", "--top", "--json", "--profile", "--max-stages", "--slots"):
        assert option in proc.stdout
    assert "profile_data" in proc.stdout


def test_auto_place_ranks_placements_from_profile_data() -> None:
    """No Ray: the costs come from the config, the search is pure."""
    proc = _rlinf("auto-place", str(CARTPOLE), EMBODIED_COSTS, "--top", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "costs from profile_data" in out
    lines = [line for line in out.splitlines() if line.strip()[:1].isdigit() and " s " in line]
    assert [line.split()[0] for line in lines] == ["1", "2"]
    assert "collocated" in lines[0]
    assert '"actor,env,rollout": 0-1' in out and "pipeline_stage_num: 1" in out
    assert "more; --top to show them" in out

    as_json = _rlinf(
        "auto-place", str(CARTPOLE), EMBODIED_COSTS, "--json", "--top", "3", "--slots", "3"
    )
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["source"] == "profile_data" and report["num_slots"] == 3
    ranks = [c["rank"] for c in report["candidates"]]
    times = [c["predicted_step_s"] for c in report["candidates"]]
    assert ranks == [1, 2, 3] and times == sorted(times)
    assert all("rollout.pipeline_stage_num" in c["overrides"] for c in report["candidates"])


def _auto_place(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Runs ``rlinf auto-place`` in this process (no interpreter start-up per call)."""
    from rlinf.core.cli import main

    code = main(["auto-place", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_auto_place_reasoning_from_profile_data(capsys: pytest.CaptureFixture[str]) -> None:
    costs = "+profile_data={rollout_cost: 1.0, inference_cost: 0.2, actor_cost: 0.4}"
    code, out, err = _auto_place(capsys, str(TOY_GRPO), costs, "--schema", "reasoning", "--json")
    assert code == 0, err
    report = json.loads(out)
    modes = [c["mode"] for c in report["candidates"]]
    assert modes and set(modes) <= {"collocated", "disaggregated"}
    assert report["profile"]["stream_units"] >= 1


def test_auto_place_errors(capsys: pytest.CaptureFixture[str]) -> None:
    schema = ("--schema", "embodied")
    code, _, err = _auto_place(
        capsys,
        str(CARTPOLE),
        "+profile_data={env_cost: 1, rollout_cost: 1, actor_cost: 1, inference_cost: 1}",
        *schema,
    )
    assert code == 1 and "profile_data.inference_cost" in err
    code, _, err = _auto_place(
        capsys, str(CARTPOLE), "+profile_data={rollout_cost: 1, actor_cost: 1}", *schema
    )
    assert code == 1 and "profile_data.env_cost" in err
    code, _, err = _auto_place(
        capsys,
        str(CARTPOLE),
        "+profile_data={env_cost: -1, rollout_cost: 1, actor_cost: 1}",
        *schema,
    )
    assert code == 1 and "greater than or equal to 0" in err
    code, _, err = _auto_place(capsys, str(CARTPOLE), "+foo=1")  # no stack accepts it
    assert code == 1
    assert "as an embodied config" in err and "as a reasoning config" in err
    assert _auto_place(capsys)[0] == 2
    code, _, err = _auto_place(capsys, str(CARTPOLE), "--schema", "core")
    assert code == 2 and "has no auto placer" in err
    assert _auto_place(capsys, str(CARTPOLE), "--top", "0")[0] == 2
    code, _, err = _auto_place(capsys, str(CARTPOLE), EMBODIED_COSTS, "--slots", "0")
    assert code == 1 and "--slots 0" in err


def test_overrides_may_follow_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _auto_place(capsys, str(CARTPOLE), "--top", "1", EMBODIED_COSTS)
    assert code == 0, err
    assert "costs from profile_data" in out
    from rlinf.core.cli import main

    with pytest.raises(SystemExit):
        main(["auto-place", str(CARTPOLE), "--top", "1", "--bogus=1"])
    assert "unrecognized arguments: --bogus=1" in capsys.readouterr().err
