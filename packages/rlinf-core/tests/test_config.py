"""Tests of rlinf.core.config: real YAML files, real Hydra composition, real validation."""

from __future__ import annotations

import argparse
import pickle
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Literal

import hydra
import pytest
import yaml
from pydantic import model_validator

from rlinf.core.config import (
    ConfigError,
    ConfigIssue,
    CoreConfig,
    RLinfModel,
    add_config_arguments,
    available_schemas,
    compose_config,
    config_from_args,
    dump_config,
    load_config,
    load_config_file,
    validate_config,
)
from rlinf.core.config import loader as loader_module
from rlinf.core.config.schema import RunnerConfig

MAIN = """\
defaults:
  - runner: base
  - _self_
runner:
  max_steps: 7
  logger:
    experiment_name: seed_${runner.seed}
"""
BASE = """\
max_epochs: 2
max_steps: 3
seed: 42
logger:
  log_path: /tmp/rlinf-logs
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    root = tmp_path / "conf"
    write(root / "main.yaml", MAIN)
    write(
        root / "self_first.yaml",
        MAIN.replace("  - runner: base\n  - _self_", "  - _self_\n  - runner: base"),
    )
    write(root / "runner" / "base.yaml", BASE)
    write(root / "runner" / "long.yaml", "max_epochs: 100\nseed: 5\n")
    return root


def only_issue(err: pytest.ExceptionInfo[ConfigError]) -> ConfigIssue:
    assert len(err.value.issues) == 1, str(err.value)
    return err.value.issues[0]


# --- composition -------------------------------------------------------------------------


def test_defaults_group_and_self_last(conf: Path) -> None:
    data = compose_config("main", conf)
    assert "hydra" not in data
    # runner/base.yaml gives seed and max_epochs; the primary file (_self_ last) wins on max_steps.
    assert data == {
        "runner": {
            "max_epochs": 2,
            "max_steps": 7,
            "seed": 42,
            "logger": {"log_path": "/tmp/rlinf-logs", "experiment_name": "seed_42"},
        }
    }


def test_self_first_lets_the_group_win(conf: Path) -> None:
    assert compose_config("self_first", conf)["runner"]["max_steps"] == 3


def test_group_option_override(conf: Path) -> None:
    cfg = load_config("main", conf, ["runner=long"])
    assert (cfg.runner.max_epochs, cfg.runner.seed, cfg.runner.max_steps) == (100, 5, 7)
    assert cfg.runner.logger.experiment_name == "seed_5"


def test_overrides_and_interpolation(conf: Path) -> None:
    cfg = load_config("main", str(conf), ["runner.max_steps=5", "runner.seed=9"])
    assert cfg.runner.max_steps == 5
    assert cfg.runner.logger.experiment_name == "seed_9"  # ${runner.seed} sees the override
    assert cfg.runner.logger.log_path == Path("/tmp/rlinf-logs")


def test_delete_override_falls_back_to_schema_default(conf: Path) -> None:
    data = compose_config("main", conf, ["~runner.logger.log_path"])
    assert "log_path" not in data["runner"]["logger"]
    cfg = validate_config(data, CoreConfig)
    assert cfg.runner.logger.log_path == Path("logs")


def test_added_key_is_rejected_by_the_schema(conf: Path) -> None:
    assert compose_config("main", conf, ["+runner.new=1"])["runner"]["new"] == 1
    with pytest.raises(ConfigError) as err:
        load_config("main", conf, ["+runner.new=1"])
    issue = only_issue(err)
    assert issue.path == "runner.new"
    assert issue.message.startswith(
        "unknown key 'new'; valid keys: allow_config_change, freeze_gc_heap, log_interval, logger"
    )
    assert issue.value == 1
    with pytest.raises(ConfigError) as err:
        load_config("main", conf, ["+runner.max_stepss=1"])
    assert only_issue(err).message == "unknown key 'max_stepss'; did you mean 'max_steps'?"


def test_repeated_calls_and_existing_hydra_state(conf: Path, tmp_path: Path) -> None:
    for steps in (1, 2):
        assert load_config("main", conf, [f"runner.max_steps={steps}"]).runner.max_steps == steps
    other = write(tmp_path / "other" / "x.yaml", "a: 1\n").parent
    with hydra.initialize_config_dir(config_dir=str(other), version_base=None):
        assert compose_config("main", conf)["runner"]["seed"] == 42


def test_load_config_file_and_dump_round_trip(conf: Path) -> None:
    # Keys the YAML lacks (schema defaults) need "+" in Hydra's struct mode.
    cfg = load_config_file(conf / "main.yaml", ["+runner.save_interval=4"])
    assert cfg.runner.save_interval == 4
    dumped = yaml.safe_load(dump_config(cfg))
    assert dumped["runner"]["logger"]["log_path"] == "/tmp/rlinf-logs"
    assert CoreConfig.model_validate(dumped) == cfg


def test_cli_arguments(conf: Path) -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, default_config_name="main")
    args = parser.parse_args(["--config-path", str(conf), "runner.max_steps=9", "runner=long"])
    assert args.config_name == "main"
    cfg = config_from_args(args)
    assert (cfg.runner.max_steps, cfg.runner.max_epochs) == (9, 100)
    with pytest.raises(ConfigError) as err:
        config_from_args(parser.parse_args([]))
    assert only_issue(err).path == "config_path"
    assert "--config-path" in str(err.value)


# --- bad configs: one issue each, with the exact key path -----------------------------------

BAD_CASES = [
    (
        "runer:\n  max_steps: 3\n",
        "runer",
        "unknown key 'runer'; did you mean 'runner'?",
        {"max_steps": 3},
    ),
    (
        "runner:\n  logger:\n    log_pth: /x\n",
        "runner.logger.log_pth",
        "unknown key 'log_pth'; did you mean 'log_path'?",
        "/x",
    ),
    ("runner:\n  max_steps: abc\n", "runner.max_steps", "Input should be a valid integer", "abc"),
    ("runner:\n  max_epochs: 0\n", "runner.max_epochs", "greater than or equal to 1", 0),
    (
        "runner:\n  logger:\n    logger_backends: [tensorbord]\n",
        "runner.logger.logger_backends[0]",
        "Input should be 'tensorboard', 'wandb' or 'swanlab'",
        "tensorbord",
    ),
    (
        "runner:\n  logger:\n    logger_backends: [wandb, tensorbord]\n",
        "runner.logger.logger_backends[1]",
        "Input should be 'tensorboard', 'wandb' or 'swanlab' (did you mean 'tensorboard'?)",
        "tensorbord",
    ),
    (
        "runner:\n  save_interval: 10\n  val_check_interval: 3\n",
        "runner.save_interval",
        "runner.save_interval (10) must be a multiple of runner.val_check_interval (3)",
        10,
    ),
    ("runner:\n  max_steps: 0\n", "runner.max_steps", "use a positive number of steps, or -1", 0),
    ("runner:\n  log_interval: 0\n", "runner.log_interval", "use a positive number of steps", 0),
    ("runner:\n  log_interval: -3\n", "runner.log_interval", "runner.log_interval=-3 is not", -3),
    ("runner:\n  resume_dir: 5\n", "runner.resume_dir", "or Input should be 'auto'", 5),
    ("runner: 5\n", "runner", "valid dictionary or instance of RunnerConfig", 5),
]


@pytest.mark.parametrize(("text", "path", "message", "value"), BAD_CASES)
def test_bad_config_names_the_key(
    tmp_path: Path, text: str, path: str, message: str, value: object
) -> None:
    file = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config_file(file)
    issue = only_issue(err)
    assert (issue.path, issue.value) == (path, value)
    assert message in issue.message
    assert "Value error" not in issue.message
    assert err.value.source == str(file)
    assert f"  - {path}: " in str(err.value)


def test_override_of_missing_key(conf: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("main", conf, ["runner.seed=1", "runner.max_stepz=5"])
    issue = only_issue(err)
    assert issue.path == "runner.max_stepz"
    assert issue.value == "runner.max_stepz=5"
    assert "did you mean 'runner.max_steps'?" in issue.message
    assert "+runner.max_stepz=5" in issue.message
    with pytest.raises(ConfigError) as err:
        load_config("main", conf, ["runer.seed=1"])
    assert only_issue(err).path == "runer.seed"
    assert "did you mean 'runner.seed'?" in only_issue(err).message


@pytest.mark.parametrize(
    ("override", "path", "message"),
    [
        (
            "~runner.seedd",
            "runner.seedd",
            "cannot delete 'runner.seedd': no such key; did you mean 'runner.seed'?",
        ),
        ("+runner.seed=1", "runner.seed", "use runner.seed=VALUE, or ++runner.seed=VALUE"),
        ("runner.seed", "runner.seed", "invalid override (missing EQUAL"),
        ("runner=bse", "runner", "no option 'bse' in config group 'runner'; did you mean 'base'?"),
    ],
)
def test_bad_overrides(conf: Path, override: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_config("main", conf, [override])
    issue = only_issue(err)
    assert issue.path == path
    assert message in issue.message


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        (["runner.seed=2,3"], "runner.seed", "a sweep (a,b / range / choice) is not supported"),
        (["~runner.seed=3"], "runner.seed", "cannot delete 'runner.seed': its value is 42, not 3"),
        (  # checked in Hydra's order: the added key exists for the later override
            ["+runner.new=1", "runner.new=2", "runner.neww=3"],
            "runner.neww",
            "no such key; did you mean 'runner.new'? (to add it as a new key: +runner.neww=3)",
        ),
        (["runner=long", "runner.sed=1"], "runner.sed", "did you mean 'runner.seed'?"),
        (["~runner.seedd"], "runner.seedd", "cannot delete 'runner.seedd': no such key"),
        (["+runner.seed=1"], "runner.seed", "use runner.seed=VALUE, or ++runner.seed=VALUE"),
        (["runner.max_stepz=5"], "runner.max_stepz", "did you mean 'runner.max_steps'?"),
    ],
)
def test_override_issues_come_from_parsed_overrides(
    conf: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], path: str, message: str
) -> None:
    """Hydra's composition errors are diagnosed without reading their wording."""
    compose = loader_module._compose

    def reworded(*args: object) -> dict[str, object]:
        try:
            return compose(*args)  # type: ignore[arg-type]
        except hydra.errors.ConfigCompositionException as exc:
            raise hydra.errors.ConfigCompositionException("reworded") from exc.__cause__

    monkeypatch.setattr(loader_module, "_compose", reworded)
    with pytest.raises(ConfigError) as err:
        compose_config("main", conf, overrides)
    issue = only_issue(err)
    assert (issue.path, issue.value) == (path, overrides[-1])
    assert message in issue.message


def test_missing_plain_default_is_named(tmp_path: Path) -> None:
    write(tmp_path / "main.yaml", "defaults:\n  - shared\n  - _self_\n")
    write(tmp_path / "shard.yaml", "a: 1\n")
    with pytest.raises(ConfigError) as err:
        compose_config("main", tmp_path)
    issue = only_issue(err)
    assert (issue.path, issue.value) == ("config_name", "shared")
    assert "config 'shared' (in a defaults list) not found" in issue.message
    assert "did you mean 'shard'?" in issue.message


def test_missing_config_file_dir_and_suffix(conf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("mian", conf)
    issue = only_issue(err)
    assert issue.path == "config_name"
    assert f"config file 'mian.yaml' not found in {conf}; did you mean 'main'?" == issue.message
    assert err.value.source == str(conf / "mian.yaml")

    with pytest.raises(ConfigError) as err:
        load_config("main", tmp_path / "nowhere")
    assert only_issue(err).path == "config_path"
    assert "config directory not found" in only_issue(err).message

    for name, message in [
        ("gone.yaml", "config file not found"),
        ("main.yml", "rename it to main.yaml"),
        ("main.json", "expected a YAML config file"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config_file(conf / name)
        assert only_issue(err).path == "config_file"
        assert message in only_issue(err).message
        assert name in str(err.value)


def test_yaml_and_interpolation_errors(tmp_path: Path) -> None:
    root = tmp_path / "c"
    write(root / "main.yaml", "defaults:\n  - grp: broken\n  - _self_\n")
    write(root / "grp" / "broken.yaml", "a: [1\n")
    with pytest.raises(ConfigError) as err:
        compose_config("main", root)
    assert only_issue(err).path == "grp/broken.yaml"
    assert "YAML syntax error" in only_issue(err).message
    write(root / "interp.yaml", "a:\n  b: ${a.nope}\n  c: ???\n")
    with pytest.raises(ConfigError) as err:
        compose_config("interp", root)
    assert only_issue(err).path == "a.b"
    assert "Interpolation key 'a.nope' not found" in only_issue(err).message


# --- reports ---------------------------------------------------------------------------------


def test_report_lists_every_issue(tmp_path: Path) -> None:
    text = "runer: 1\nrunner:\n  max_epochs: 0\n  logger:\n    project_name: ''\n"
    file = write(tmp_path / "multi.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config_file(file)
    paths = [issue.path for issue in err.value.issues]
    assert sorted(paths) == ["runer", "runner.logger.project_name", "runner.max_epochs"]
    lines = str(err.value).splitlines()
    assert lines[0] == f"Invalid config {file}: 3 problem(s)"
    assert lines[1:] == [f"  - {issue}" for issue in err.value.issues]
    assert "  - runner.max_epochs: Input should be greater than or equal to 1 (got 0)" in lines
    assert isinstance(err.value, ValueError)


def test_issue_rendering_and_pickle() -> None:
    long = ConfigIssue("a.b[2]", "too long", "x" * 200)
    shown = str(long)
    assert shown.startswith("a.b[2]: too long (got 'xxx") and shown.endswith("...)")
    assert len(shown) < 110
    assert str(ConfigIssue("config_name", "missing")) == "config_name: missing"
    err = ConfigError([long, ConfigIssue("config_name", "missing")], "src.yaml")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.issues, copy.source, str(copy)) == (err.issues, "src.yaml", str(err))
    assert str(copy).endswith("\n  - config_name: missing")


class Pair(RLinfModel):
    low: int = 0
    high: int = 1

    @model_validator(mode="after")
    def _ordered(self) -> Pair:
        if self.low == self.high:
            raise ValueError("low and high must differ")
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


def test_root_model_validator_paths() -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"low": 3, "high": 2}, Pair)
    # Not a dotted key path, so the issue stays at the model's own path.
    assert only_issue(err) == ConfigIssue(
        "(root)", "low (3) must not exceed high (2)", {"low": 3, "high": 2}
    )
    with pytest.raises(ConfigError) as err:
        validate_config({"low": 1}, Pair)
    assert (only_issue(err).path, only_issue(err).message) == ("(root)", "low and high must differ")


class Item(RLinfModel):
    name: str


class ModelA(RLinfModel):
    kind: Literal["a"] = "a"
    x: int = 0


class ModelB(RLinfModel):
    kind: Literal["b"] = "b"
    y: int = 0


class Nested(RLinfModel):
    items: list[Item] = []
    named: dict[str, Item] = {}
    maybe: Item | None = None
    either: ModelA | ModelB = ModelA()


def test_paths_through_lists_dicts_optionals_and_unions() -> None:
    data = {
        "items": [{"name": "a"}, {"name": "b", "nme": "b"}],
        "named": {"k": {"name": "n", "nam": 1}},
        "maybe": {"name": "m", "nmae": "x"},
        "either": {"z": 1},
    }
    with pytest.raises(ConfigError) as err:
        validate_config(data, Nested, "nested")
    assert [(i.path, i.message) for i in err.value.issues] == [
        ("items[1].nme", "unknown key 'nme'; did you mean 'name'?"),
        ("named.k.nam", "unknown key 'nam'; did you mean 'name'?"),
        ("maybe.nmae", "unknown key 'nmae'; did you mean 'name'?"),
        ("either.z", "unknown key 'z'; valid keys: kind, x, y"),
    ]
    with pytest.raises(ConfigError) as err:
        validate_config({"items": [{}], "either": {"kind": "b", "y": "q"}}, Nested)
    # ModelB is the closest union member (one error), so ModelA's errors are not reported.
    assert [str(i) for i in err.value.issues] == [
        "items[0].name: required key is missing",
        "either.y: Input should be a valid integer, unable to parse string as an integer (got 'q')",
    ]


# --- schema registry -----------------------------------------------------------------------


def test_available_schemas_has_core() -> None:
    assert available_schemas()["core"] is CoreConfig


def test_broken_schema_entry_point_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "rlinf_no_such_module:Schema", "rlinf.config_schemas")
    monkeypatch.setattr(loader_module, "entry_points", lambda group: [broken])
    with pytest.raises(
        ImportError, match=r"'broken = rlinf_no_such_module:Schema'.*failed to load"
    ):
        available_schemas()
    not_model = EntryPoint("odd", "pathlib:Path", "rlinf.config_schemas")
    monkeypatch.setattr(loader_module, "entry_points", lambda group: [not_model])
    with pytest.raises(TypeError, match=r"'odd = pathlib:Path'.*not a pydantic model"):
        available_schemas()


@pytest.mark.parametrize(
    ("log_interval", "val_check_interval", "expected"),
    [(5, 20, 5), (None, 20, 20), (None, -1, 10), (1, -1, 1)],
)
def test_summary_interval_defaults_to_the_eval_interval(
    log_interval: int | None, val_check_interval: int, expected: int
) -> None:
    runner = RunnerConfig(log_interval=log_interval, val_check_interval=val_check_interval)
    assert runner.summary_interval == expected
