"""ReasoningConfig validation, the example configs, and bad inputs at the runner level.

No Ray here: the runner checks paths, the tokenizer and the data before it
touches a worker, so fake groups are enough to see those errors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rlinf.core.config import ConfigError, load_config, validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.data import DatasetError
from rlinf.reasoning.runner import ReasoningRunner, find_latest_checkpoint
from rlinf.reasoning.toy_task import build_tokenizer, make_smoke_task
from rlinf.reasoning.workers import FSDPActor, RewardWorker, RolloutWorker

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "reasoning"
CONFIG_DIR = EXAMPLES / "config"


def _base(tmp: Path, **sections: Any) -> dict[str, Any]:
    data = {
        "cluster": {
            "cpu_slots_per_node": 2,
            "component_placement": {"actor": 0, "rollout": 1, "reward": 1},
        },
        "runner": {
            "max_steps": 2,
            "val_check_interval": -1,
            "val_before_train": False,
            "logger": {"log_path": str(tmp / "logs"), "logger_backends": []},
        },
        "data": {
            "train_files": [str(tmp / "train.jsonl")],
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 16,
        },
        "algorithm": {
            "group_size": 4,
            "rollout_batch_size": 4,
            "sampling_params": {"max_new_tokens": 8},
        },
        "actor": {"model_path": str(tmp / "model"), "micro_batch_size": 4},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def _issue_paths(err: ConfigError) -> list[str]:
    return [issue.path for issue in err.issues]


@pytest.fixture
def toy_dir(tmp_path: Path) -> Path:
    return make_smoke_task(tmp_path, num_prompts=12)


class _FakeGroup:
    """Stands in for a WorkerGroup: the checks below fail before any worker call."""

    def __init__(self, name: str, worker_cls: type) -> None:
        self.name, self.world_size, self.worker_cls = name, 1, worker_cls

    def __getattr__(self, method: str) -> Any:
        raise AssertionError(f"the runner called {self.name}.{method} before validating inputs")


def _runner(cfg: ReasoningConfig) -> ReasoningRunner:
    groups = [
        _FakeGroup("actor", FSDPActor),
        _FakeGroup("rollout", RolloutWorker),
        _FakeGroup("reward", RewardWorker),
    ]
    return ReasoningRunner(cfg, *groups)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", ["toy_grpo_cpu", "qwen2.5_1.5b_grpo_math"])
def test_example_configs_validate(name: str) -> None:
    cfg = load_config(name, CONFIG_DIR, [], ReasoningConfig)
    assert cfg.algorithm.adv_type == "grpo"
    assert set(cfg.cluster.component_placement) == {"actor", "rollout", "reward"}
    # Hydra overrides reach the schema; the collocated switch of the toy config works.
    collocated = load_config(
        name,
        CONFIG_DIR,
        [
            "cluster.component_placement.rollout=0",
            "cluster.component_placement.reward=0",
            "cluster.component_placement.actor=0",
            "runner.max_steps=3",
        ],
        ReasoningConfig,
    )
    assert collocated.runner.max_steps == 3


def test_main_help_and_bad_override(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("main_grpo", EXAMPLES / "main_grpo.py")
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--config-name" in out and "--config-path" in out and "KEY=VALUE" in out
    assert module.main(["--config-name", "toy_grpo_cpu", "algorithm.group_sise=4"]) == 2
    assert "algorithm.group_size" in capsys.readouterr().err  # did-you-mean


# ------------------------------------------------------------------- cross-field rules


@pytest.mark.parametrize(
    ("sections", "path", "text"),
    [
        ({"algorithm": {"group_size": 1}}, "algorithm.group_size", "too small for GRPO"),
        ({"algorithm": {"n_minibatches": 3}}, "algorithm.rollout_batch_size", "n_minibatches=3"),
        ({"actor": {"micro_batch_size": 3}}, "actor.micro_batch_size", "does not divide"),
        (
            {"runner": {"val_check_interval": 5, "val_before_train": False}},
            "data.val_files",
            "evaluation is on",
        ),
        ({"rollout": {"engine": "tgi"}}, "rollout.engine", "unknown rollout engine"),
        ({"algorithm": {"loss_type": "dpo"}}, "algorithm.loss_type", "unknown policy loss"),
        ({"algorithm": {"clip_ratio_c": 0.5}}, "algorithm.clip_ratio_c", "greater than 1"),
        (
            {"cluster": {"component_placement": {"actor": 0, "rollout": 1}}},
            "cluster.component_placement",
            "does not place ['reward']",
        ),
        (
            {"cluster": {"component_placement": {"actor": 0, "rollout": 1, "reward": 1, "env": 0}}},
            "cluster.component_placement",
            "unknown components ['env']",
        ),
        ({"actor": {"learning_rate": 1e-3}}, "actor.learning_rate", "unknown key"),
        (
            {"algorithm": {"adv_type": "reinpp", "kl_beta": 0.1}},
            "algorithm.kl_beta",
            "reinpp_kl_beta",
        ),
    ],
)
def test_cross_field_errors_name_the_key(
    tmp_path: Path, sections: dict[str, Any], path: str, text: str
) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(_base(tmp_path, **sections), ReasoningConfig)
    assert path in _issue_paths(info.value), str(info.value)
    assert text in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(_base(tmp_path, rollout={"engine": "vllm"}), ReasoningConfig)
    assert "rollout.engine" in _issue_paths(info.value)
    assert "rlinf-reasoning[vllm]" in str(info.value)


def test_vllm_options_are_typed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(
            _base(tmp_path, rollout={"vllm": {"gpu_memory_utilization": 1.5}}), ReasoningConfig
        )
    assert "rollout.vllm.gpu_memory_utilization" in _issue_paths(info.value)


def test_world_size_rules(tmp_path: Path) -> None:
    cfg = validate_config(
        _base(
            tmp_path,
            algorithm={"rollout_batch_size": 6, "group_size": 4, "n_minibatches": 2},
            actor={"micro_batch_size": 4},
        ),
        ReasoningConfig,
    )
    cfg.check_world_sizes(actor=1, rollout=3, reward=2)
    with pytest.raises(ValueError, match=r"rollout_batch_size=6 is not divisible by the 4 rollout"):
        cfg.check_world_sizes(actor=1, rollout=4, reward=1)
    with pytest.raises(ValueError, match=r"n_minibatches \(2\) \* actor ranks \(2\) = 4"):
        cfg.check_world_sizes(actor=2, rollout=1, reward=1)
    cfg2 = validate_config(
        _base(
            tmp_path,
            algorithm={"rollout_batch_size": 4, "group_size": 3},
            actor={"micro_batch_size": 6},
        ),
        ReasoningConfig,
    )
    with pytest.raises(ValueError, match=r"actor.micro_batch_size=6 does not divide the 3"):
        cfg2.check_world_sizes(actor=4, rollout=1, reward=1)


def test_model_path_is_not_checked_by_the_schema(tmp_path: Path) -> None:
    # A config must validate where the weights are absent (CI, a login node).
    cfg = validate_config(
        _base(tmp_path, actor={"model_path": "/nonexistent/model"}), ReasoningConfig
    )
    assert str(cfg.actor.model_path) == "/nonexistent/model"
    assert cfg.rollout_model_path == cfg.actor.model_path


# -------------------------------------------------------------- runner-level bad inputs


def test_missing_model_path_names_the_key(toy_dir: Path) -> None:
    cfg = validate_config(
        _base(toy_dir, actor={"model_path": str(toy_dir / "nope")}), ReasoningConfig
    )
    with pytest.raises(FileNotFoundError, match=r"actor.model_path=.*nope.* does not exist"):
        _runner(cfg).init_workers()
    cfg = validate_config(_base(toy_dir, rollout={"model_path": str(toy_dir)}), ReasoningConfig)
    with pytest.raises(FileNotFoundError, match=r"rollout.model_path=.* has no config.json"):
        _runner(cfg).init_workers()


def test_tokenizer_without_pad_token(toy_dir: Path) -> None:
    tok = build_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(toy_dir / "nopad")
    cfg = validate_config(
        _base(toy_dir, actor={"tokenizer_path": str(toy_dir / "nopad")}), ReasoningConfig
    )
    with pytest.raises(ValueError, match=r"has no pad token.*tok.pad_token = tok.eos_token"):
        _runner(cfg).init_workers()


def test_row_without_answer_key(toy_dir: Path) -> None:
    (toy_dir / "bad.jsonl").write_text('{"problem": "1+1=", "answer": "2"}\n{"problem": "2+2="}\n')
    cfg = validate_config(
        _base(toy_dir, data={"train_files": [str(toy_dir / "bad.jsonl")]}), ReasoningConfig
    )
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: record has no answer key 'answer'"):
        _runner(cfg).init_workers()


def test_prompt_longer_than_the_limit(toy_dir: Path) -> None:
    (toy_dir / "long.jsonl").write_text(
        '{"problem": "1+1=", "answer": "2"}\n'
        + json.dumps({"problem": "1+" * 20 + "1=", "answer": "21"})
        + "\n"
    )
    cfg = validate_config(
        _base(
            toy_dir, data={"train_files": [str(toy_dir / "long.jsonl")], "filter_overlong": False}
        ),
        ReasoningConfig,
    )
    with pytest.raises(DatasetError, match=r"has 43 tokens, more than data.max_prompt_length=16"):
        _runner(cfg).init_workers()


def test_batch_larger_than_the_data(toy_dir: Path) -> None:
    cfg = validate_config(
        _base(toy_dir, algorithm={"rollout_batch_size": 16, "group_size": 2}), ReasoningConfig
    )
    with pytest.raises(ValueError, match=r"rollout_batch_size=16 is larger than the 12"):
        _runner(cfg).init_workers()


def test_resume_dir_must_be_a_complete_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert find_latest_checkpoint(root) is None
    for step, complete in ((3, True), (6, True), (9, False)):
        d = root / f"global_step_{step}"
        d.mkdir(parents=True)
        if complete:
            (d / "COMPLETE").write_text(f"{step}\n")
    (root / "notes").mkdir()
    assert find_latest_checkpoint(root) == root / "global_step_6"
