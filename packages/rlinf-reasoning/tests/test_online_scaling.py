"""Online scaling of the FSDP actor (``runner.online_scaling``).

* exactness (two processes, gloo, no Ray): training steps with the actor grown
  from 1 to 2 ranks give bit for bit the parameters and AdamW state of a static
  2-rank actor on the same data, while grown and after shrinking back (then
  only the base rank holds the model; the extra rank keeps only its idle shard
  of the grown one, for the next scale-up). The idle grown copy is filled
  with noise before every scale-up, so a scale-up that moved nothing fails;
* the same for the Megatron actor: grown from 1 to 2 data-parallel replicas =
  a static 2-replica actor (weights, AdamW state, schedule, on both replicas;
  the extra one scrambled before every scale-up), with TP = 1 (2 ranks) and,
  in the slow tier, TP = 2 (4 ranks);
* config: online scaling is refused with async GRPO, KL terms (FSDP), Megatron
  with PP > 1 or the distributed optimizer, and the embodied runner, with
  errors naming the key;
* placement: the grown actor's ranks sit on the actor's then the rollout's
  resources; collocated placement is refused.

The Ray run with a rank killed mid-re-shard is in ``test_online_scaling_ray.py``
(slow tier); timings are in ``benchmarks/test_online_scaling.py``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf.core.config import ConfigError, validate_config
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.toy_task import make_smoke_task
from rlinf.sched import ClusterInfo, ScalingError, WorkerError, grown_actor_strategy
from rlinf.sched.placement import ModelParallelComponentPlacement

RANKS_SCRIPT = Path(__file__).with_name("online_scaling_ranks.py")
MEGATRON_SCRIPT = Path(__file__).with_name("megatron_scaling_ranks.py")


def _assert_equal(a: dict[str, Any], b: dict[str, Any], where: str = "") -> None:
    """``a`` and ``b`` hold the same keys and bit-identical tensors (``torch.equal``)."""
    assert a.keys() == b.keys(), where
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            _assert_equal(x, y, f"{where}/{key}")
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f"{where}/{key}"
        elif isinstance(x, list):
            assert len(x) == len(y), f"{where}/{key}"
            for u, v in zip(x, y, strict=True):
                if isinstance(u, dict):
                    _assert_equal(u, v, f"{where}/{key}")
                else:
                    assert u == v, f"{where}/{key}"
        else:
            assert x == y, f"{where}/{key}"


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            worst = max(worst, _max_diff(x, y))
        elif isinstance(x, torch.Tensor):
            worst = max(worst, float((x.double() - y.double()).abs().max()))
        elif isinstance(x, list):
            assert len(x) == len(y)
            for u, v in zip(x, y, strict=True):
                if isinstance(u, dict):
                    worst = max(worst, _max_diff(u, v))
                else:
                    assert u == v, key
        else:
            assert x == y, key
    return worst


def _step_results(task: Path, out: Path, steps: int, suffix: str = "") -> list[dict[str, Any]]:
    """The rank script's ``step{k}{suffix}.pt`` files, each checked to have moved the weights."""
    from safetensors.torch import load_file

    init = load_file(task / "model" / "model.safetensors")
    results = []
    for step in range(steps):
        got = torch.load(out / f"step{step}{suffix}.pt", weights_only=False)
        moved = max(
            float((got["static"][k] - init[k]).abs().max()) for k in init if k in got["static"]
        )
        assert moved > 1e-3  # the steps really changed the weights: the checks have teeth
        results.append(got)
    return results


def test_grown_step_equals_static_two_rank_actor(
    tmp_path: Path, run_ranks: Callable[..., list[str]]
) -> None:
    task = make_smoke_task(tmp_path / "task")
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(RANKS_SCRIPT, str(task), str(out), "2")
    for step, got in enumerate(_step_results(task, out, 2)):
        grown = _max_diff(got["grown"], got["static"])
        shrunk = _max_diff(got["scaled"], got["static"])
        grown_optim = _max_diff(got["grown_optim"], got["static_optim"])
        shrunk_optim = _max_diff(got["scaled_optim"], got["static_optim"])
        print(
            f"\nstep {step}: |grown - static| params {grown:.2e}, optim {grown_optim:.2e}; "
            f"after scale-down params {shrunk:.2e}, optim {shrunk_optim:.2e}; "
            f"scale up/down seconds {got['timings'][-1]}"
        )
        _assert_equal(got["grown"], got["static"], "grown params")
        _assert_equal(got["scaled"], got["static"], "shrunk params")
        _assert_equal(got["grown_optim"], got["static_optim"], "grown AdamW")
        _assert_equal(got["scaled_optim"], got["static_optim"], "shrunk AdamW")
        assert got["static_lr"] == got["scaled_lr"]
        assert got["static_sched"] == got["scaled_sched"]
        assert got["optim_steps"][0] == got["optim_steps"][1] == 2 * (step + 1)
        state = got["scaled_optim"]["state"]
        assert state and all(float(s["step"]) == 2 * (step + 1) for s in state.values())


def _cfg(**sections: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "cluster": {"component_placement": {"actor": 0, "rollout": 1, "reward": 1}},
        "runner": {
            "online_scaling": True,
            "val_before_train": False,
            "logger": {"logger_backends": []},
        },
        "data": {"train_files": ["train.jsonl"]},
        "algorithm": {"group_size": 4, "rollout_batch_size": 4},
        "actor": {"model_path": "model", "micro_batch_size": 4},
    }
    for key, value in sections.items():
        base[key] = {**base[key], **value}
    return base


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"algorithm": {"max_staleness": 1}}, "algorithm.max_staleness"),
        ({"algorithm": {"kl_beta": 0.1}}, "algorithm.kl_beta"),
        ({"actor": {"enable_offload": True}}, "actor.enable_offload"),
    ],
)
def test_config_refuses_unsupported_online_scaling(sections: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=r"runner\.online_scaling") as info:
        validate_config(_cfg(**sections), ReasoningConfig)
    assert needle in str(info.value)
    validate_config(_cfg(), ReasoningConfig)  # the plain FSDP setting is fine


@pytest.mark.parametrize(
    ("parallel", "needle"),
    [
        ({"pipeline_model_parallel_size": 2}, "actor.model.pipeline_model_parallel_size"),
        ({"use_distributed_optimizer": True}, "use_distributed_optimizer"),
    ],
)
def test_config_refuses_megatron_online_scaling_it_cannot_grow(
    parallel: dict[str, Any], needle: str
) -> None:
    from rlinf.reasoning.config import _check_online_scaling

    cfg = validate_config(_cfg(), ReasoningConfig)
    cfg.actor.__dict__["training_backend"] = "megatron"  # megatron-core may not be installed
    _check_online_scaling(cfg)  # TP/DP without the distributed optimizer grows
    cfg.actor.model.__dict__.update(parallel)
    with pytest.raises(ValueError, match=r"runner\.online_scaling") as info:
        _check_online_scaling(cfg)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "tp", [pytest.param(1, id="tp1"), pytest.param(2, marks=pytest.mark.slow, id="tp2-4ranks")]
)
def test_megatron_grown_step_equals_static_two_replica_actor(
    tmp_path: Path, run_ranks: Callable[..., list[str]], tp: int
) -> None:
    """Megatron: grown from 1 to 2 replicas of TP ranks = a static 2-replica actor, bit for bit.

    Replica 1 scrambles its idle parameters and AdamW state before every
    scale-up; its grown weights and moments are compared too.
    """
    pytest.importorskip("megatron.core")
    task = make_smoke_task(tmp_path / "task")
    if tp == 2:  # TP splits the key/value heads too: the smoke model has one
        from rlinf.reasoning.toy_task import build_tokenizer, build_toy_model, toy_model_config

        tok = build_tokenizer()
        config = toy_model_config(
            tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64
        )
        build_toy_model(config).save_pretrained(task / "model")
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        second_port = str(s.getsockname()[1])
    run_ranks(MEGATRON_SCRIPT, str(task), str(out), second_port, str(tp), ranks=2 * tp, timeout=600)
    for step, got in enumerate(_step_results(task, out, 2)):
        grown = _max_diff(got["grown"], got["static"])
        shrunk = _max_diff(got["scaled"], got["static"])
        optim = _max_diff(got["scaled_optim"], got["static_optim"])
        print(
            f"\nmegatron step {step}: |grown - static| {grown:.2e}, after scale-down "
            f"{shrunk:.2e}, optim {optim:.2e}; scale up/down seconds {got['timings']}"
        )
        _assert_equal(got["grown"], got["static"], "grown params")
        _assert_equal(got["scaled"], got["static"], "shrunk params")
        _assert_equal(got["scaled_optim"], got["static_optim"], "AdamW")
        assert got["static_optim"] and got["static_sched"] == got["scaled_sched"]
        assert got["optim_steps"] == 2 * (step + 1)
    for got in _step_results(task, out, 2, suffix=".replica1"):  # the scrambled replica
        _assert_equal(got["grown"], got["static"], "replica 1 grown params")
        _assert_equal(got["grown_optim"], got["static_optim"], "replica 1 grown AdamW")


def _placement(spec: dict[str, Any], slots: int = 2) -> ModelParallelComponentPlacement:
    info = ClusterInfo.fake(1, cpu_slots_per_node=slots)
    return ModelParallelComponentPlacement(spec, info)


def test_grown_actor_strategy_places_extra_ranks_on_rollout() -> None:
    placement = _placement({"actor": "0", "rollout": "1-2", "reward": "1-2"}, slots=3)
    strategy = grown_actor_strategy(placement)
    assert strategy.hardware_ranks_list == [[0], [1], [2]]
    with pytest.raises(ValueError, match=r"runner\.online_scaling.*disaggregated"):
        grown_actor_strategy(_placement({"actor": 0, "rollout": 0, "reward": 0}))


def test_scaling_error_names_phase_and_rank() -> None:
    err = ScalingError("scale_up", "ActorGroup", 1, "died: killed")
    assert isinstance(err, WorkerError)
    assert (err.phase, err.group, err.rank) == ("scale_up", "ActorGroup", 1)
    assert "scale_up" in str(err) and "ActorGroup[rank 1]" in str(err)
