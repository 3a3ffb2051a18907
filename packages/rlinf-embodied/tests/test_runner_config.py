"""EmbodiedConfig: the example configs validate; every rule's error names its key."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from rlinf.core.config import ConfigError, compose_config, validate_config
from rlinf.embodied.config import EmbodiedConfig

ROOT = Path(__file__).resolve().parents[3]
CONFIG_DIR = ROOT / "examples" / "embodiment" / "config"
EXAMPLES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def base() -> dict[str, Any]:
    return compose_config("cartpole_ppo_mlp", CONFIG_DIR)


def errors_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        validate_config(data, EmbodiedConfig)
    return [(issue.path, issue.message) for issue in info.value.issues]


def test_every_example_config_validates() -> None:
    assert set(EXAMPLES) >= {
        "cartpole_ppo_mlp",
        "cartpole_grpo_mlp",
        "maniskill_pickcube_ppo_mlp",
        "maniskill_pushcube_ppo_mlp",
        "maniskill_pickcube_ppo_cnn",
        "robosuite_lift_ppo_mlp",
    }
    for name in EXAMPLES:
        cfg = validate_config(compose_config(name, CONFIG_DIR), EmbodiedConfig)
        assert cfg.runner.total_steps > 0
        text = (CONFIG_DIR / f"{name}.yaml").read_text()
        for mode in ("collocated", "disaggregated", "hybrid"):
            assert mode in text, f"{name}.yaml does not show the {mode} placement"


def edit(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base())
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [
        ("env.train.num_envs", 15, "env.train.num_envs", ["pipeline_stage_num", "16"]),
        ("env.eval.num_envs", 7, "env.eval.num_envs", ["not divisible"]),
        ("actor.micro_batch_size", 300, "actor.global_batch_size", ["micro_batch_size=300"]),
        ("env.train.max_steps_per_rollout_epoch", 0, "env.train.max_steps_per_rollout_epoch", []),
        ("actor.model.add_value_head", False, "actor.model.add_value_head", ["gae"]),
        ("algorithm.loss_type", "actor", "algorithm.loss_type", ["actor_critic"]),
        ("algorithm.adv_type", "gea", "algorithm.adv_type", ["gae"]),
        ("actor.model.model_type", "mlpp", "actor.model.model_type", ["mlp"]),
        ("runner.val_check_interval", 0, "runner.val_check_interval", ["-1"]),
        ("env.eval.max_steps_per_rollout_epoch", 100, "env.eval.max_steps_per_rollout_epoch", []),
        ("actor.optim.lr_scheduler", "cosine_warm", "actor.optim.lr_scheduler", ["cosine"]),
        ("rollout.pipeline_stages", 2, "rollout.pipeline_stages", ["pipeline_stage_num"]),
        ("algorithm.logprob_type", "chunk_level", "algorithm.logprob_type", ["reward_type"]),
        ("actor.optim.lr", -1e-3, "actor.optim.lr", []),
    ],
)
def test_errors_name_the_key_the_value_and_the_fix(
    path: str, value: Any, key: str, words: list[str]
) -> None:
    data = edit(path, value)
    data["rollout"]["pipeline_stage_num"] = 2  # stage divisibility needs stages to divide
    issues = errors_of(data)
    assert any(p == key for p, _ in issues), issues
    message = next(m for p, m in issues if p == key)
    for word in words:
        assert word in message, (word, message)


def test_grpo_rules() -> None:
    data = compose_config("cartpole_grpo_mlp", CONFIG_DIR)
    bad = copy.deepcopy(data)
    bad["env"]["train"]["group_size"] = 4
    ((path, message),) = errors_of(bad)
    assert path == "env.train.group_size" and "algorithm.group_size=8" in message
    bad = copy.deepcopy(data)
    bad["env"]["train"]["auto_reset"] = True
    ((path, message),) = errors_of(bad)
    assert path == "env.train.auto_reset" and "first episode" in message
    bad = copy.deepcopy(data)
    bad["env"]["train"]["num_envs"] = 24  # 24 % (2 stages * 8) != 0
    ((path, message),) = errors_of(bad)
    assert path == "env.train.num_envs" and "group_size (8) = 16" in message


def test_placement_places_rollout_exactly_when_a_rollout_group_runs() -> None:
    """The README job (``in_env_process: true``) places actor and env only; a rollout entry
    there, or none with ``in_env_process: false``, is refused by name."""
    assert validate_config(base(), EmbodiedConfig).rollout.in_env_process is True
    assert "rollout" not in base()["cluster"]["component_placement"]
    for placement in ({"actor": "0-1", "env": 0, "rollout": 1}, {"actor,env,rollout": "0-1"}):
        issues = errors_of(edit("cluster.component_placement", placement))
        message = next(m for _, m in issues if "rollout.in_env_process" in m)
        assert "places rollout under" in message and "remove rollout" in message
    separate = edit("rollout.in_env_process", False)
    issues = errors_of(separate)
    message = next(m for _, m in issues if "rollout.in_env_process" in m)
    assert "places no rollout" in message
    separate["cluster"]["component_placement"] = {"actor": "0-1", "env": 0, "rollout": 1}
    assert validate_config(separate, EmbodiedConfig).rollout.in_env_process is False
    issues = errors_of(edit("cluster.component_placement", {"actor": "0-1"}))
    assert issues[0][0] == "cluster.component_placement" and "env" in issues[0][1]
    issues = errors_of(
        edit("cluster.component_placement", {"actor": 0, "env": 0, "rollout": 1, "critic": 1})
    )
    assert "critic" in issues[0][1]


@pytest.mark.parametrize(
    ("edits", "words"),
    [
        ({"runner.mode": "async"}, ["runner.mode='async'", "rollout.in_env_process: false"]),
        ({"runner.online_scaling": True}, ["runner.online_scaling=True"]),
    ],
)
def test_policy_in_the_env_process_needs_the_sync_runner(
    edits: dict[str, Any], words: list[str]
) -> None:
    data = edit("rollout.in_env_process", True)
    for path, value in edits.items():
        section, key = path.split(".")
        data[section][key] = value
    assert validate_config(edit("rollout.in_env_process", True), EmbodiedConfig)
    issues = errors_of(data)
    message = next(m for p, m in issues if "rollout.in_env_process" in m)
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("adaptive_stages", True, ["rollout.adaptive_stages was removed", "as configured"]),
        ("in_env_process", "auto", ["rollout.in_env_process=auto was removed", "true", "false"]),
        ("in_env_process", "sometimes", []),
    ],
)
def test_removed_rollout_settings_are_refused_by_name(
    key: str, value: Any, words: list[str]
) -> None:
    """``rollout.in_env_process`` is a plain bool and ``adaptive_stages`` is gone: a config
    that still sets them gets an error naming the key."""
    issues = errors_of(edit(f"rollout.{key}", value))
    assert issues[0][0].startswith("rollout"), issues
    for word in words:
        assert word in issues[0][1], (word, issues)


def test_world_size_rules_name_the_key() -> None:
    cfg = validate_config(base(), EmbodiedConfig)
    cfg.check_world_sizes(actor=2, env=1, rollout=1, max_episode_steps=500)
    with pytest.raises(ConfigError) as info:
        cfg.check_world_sizes(actor=3, env=1, rollout=1, max_episode_steps=500)
    paths = [i.path for i in info.value.issues]
    assert "env.train.num_envs" in paths and "actor.global_batch_size" in paths
    with pytest.raises(ConfigError, match=r"cluster\.component_placement"):
        cfg.check_world_sizes(actor=2, env=1, rollout=2, max_episode_steps=500)
    big = validate_config(edit("actor.global_batch_size", 1536), EmbodiedConfig)
    with pytest.raises(ConfigError, match=r"actor.global_batch_size: each actor rank trains on"):
        big.check_world_sizes(actor=2, env=1, rollout=1)


def test_script_help_and_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "train_embodied_agent", ROOT / "examples" / "embodiment" / "train_embodied_agent.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as info:
        script.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--config-name" in out and "cartpole_grpo_mlp" in out
    # A bad value fails before any worker starts, naming the key and the fix.
    assert script.main(["--config-name", "cartpole_ppo_mlp", "rollout.pipeline_stage_num=3"]) == 2
    err = capsys.readouterr().err
    assert "env.train.num_envs" in err and "pipeline_stage_num" in err
    # A placement that does not fit the machine: one clear line and exit code 2 after
    # the cluster starts (sizes are known only then), and Ray is shut down again.
    import ray

    over = "cluster.component_placement.actor=0-5"
    assert script.main(["--config-name", "cartpole_ppo_mlp", over]) == 2
    err = capsys.readouterr().err
    assert "cannot place the run on this cluster" in err
    assert "resource rank 5 is out of range" in err
    assert not ray.is_initialized()


# ----------------------------------------------------------------------------- SAC


def sac(**edits: Any) -> dict[str, Any]:
    data = compose_config("pendulum_sac_mlp", CONFIG_DIR)
    for path, value in edits.items():
        node = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("edits", "key", "words"),
    [
        ({"runner__mode": "sync"}, "runner.mode", ["async", "sac"]),
        ({"actor__model__model_type": "mlp"}, "actor.model.model_type", ["sac_mlp"]),
        ({"actor__micro_batch_size": 128}, "actor.micro_batch_size", ["256"]),
        ({"algorithm__replay_ratio": 0}, "algorithm.replay_ratio", []),
        ({"actor__optim__lr_scheduler": "cosine"}, "actor.optim.lr_scheduler", ["constant"]),
        ({"algorithm__tau": 1.5}, "algorithm.tau", []),
        ({"algorithm__updates_per_step": 0}, "algorithm.updates_per_step", []),
        ({"actor__model__num_action_chunks": 2}, "env.train.max_steps_per_rollout_epoch", []),
    ],
)
def test_sac_errors_name_the_key(edits: dict[str, Any], key: str, words: list[str]) -> None:
    issues = errors_of(sac(**edits))
    assert any(p == key for p, _ in issues), issues
    text = " ".join(m for _, m in issues)
    for word in words:
        assert word in text, (word, issues)


def test_sac_world_sizes_need_one_actor_rank() -> None:
    cfg = validate_config(sac(), EmbodiedConfig)
    cfg.check_world_sizes(actor=1, env=2, rollout=1)
    with pytest.raises(ConfigError, match="one resource rank"):
        cfg.check_world_sizes(actor=2, env=1, rollout=1)
