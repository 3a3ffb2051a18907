"""Online scaling of the embodied FSDP actor (``runner.online_scaling``).

* exactness (two processes, gloo, no Ray): PPO steps with the actor grown from
  1 to 2 ranks give bit-identical parameters and AdamW state to a static 2-rank
  actor on the same data, while grown and after shrinking back; the grown copy
  is scrambled before every scale-up, so a scale-up that copied nothing fails;
* config: online scaling is refused with async modes (SAC, async PPO) and
  ``actor.enable_offload: true``, naming the key; the launch helper refuses
  collocated placement and places the extra ranks on the rollout's resources.

The Ray runs (CartPole end to end with resume; a rank killed mid re-shard) are
in ``test_online_scaling_e2e.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf.core.config import ConfigError, compose_config, validate_config
from rlinf.embodied.autoplace_profile import embodied_actor_strategy
from rlinf.embodied.config import EmbodiedConfig
from rlinf.sched import ClusterInfo, HybridComponentPlacement

RANKS_SCRIPT = Path(__file__).with_name("online_scaling_ranks.py")
CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _unequal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The keys whose tensors differ (any bit), each with its largest difference."""
    assert a.keys() == b.keys()
    return [
        f"{k}: {float((a[k].double() - b[k].double()).abs().max()):.2e}"
        for k in a
        if not torch.equal(a[k], b[k])
    ]


def test_grown_step_equals_static_two_rank_actor(
    tmp_path: Path, run_ranks: Callable[..., list[str]]
) -> None:
    run_ranks(RANKS_SCRIPT, str(tmp_path))
    for step in range(3):
        got = torch.load(tmp_path / f"step{step}.pt", weights_only=False)
        params = {k: v for k, v in got["static"].items() if k in got["initial"]}
        moved = _max_diff(params, got["initial"])
        assert moved > 1e-4  # the steps really changed the weights: the checks have teeth
        assert any(k.endswith("exp_avg_sq") for k in got["static"])  # AdamW state compared
        print(f"\nstep {step}: scale up/down seconds {got['seconds']}")
        assert not _unequal(got["grown"], got["static"]), f"step {step}, grown"
        assert not _unequal(got["scaled"], got["static"]), f"step {step}, after scale-down"
        assert got["lrs"][0] == got["lrs"][1]
        assert got["sched"][0] == got["sched"][1]
        assert got["steps"] == (step + 1, step + 1)
        assert got["loss"][0] == got["loss"][1]


def _cfg(placement: Any = None, *overrides: str) -> EmbodiedConfig:
    data = compose_config(
        "cartpole_ppo_mlp",
        CONFIG_DIR,
        [
            "+runner.online_scaling=true",
            "env.train.num_envs=8",
            "env.train.max_steps_per_rollout_epoch=32",
            "actor.global_batch_size=128",
            "actor.micro_batch_size=32",
            *overrides,
        ],
    )
    data["cluster"]["component_placement"] = placement or {"actor": 0, "env": 1, "rollout": 1}
    data["rollout"]["in_env_process"] = False  # online scaling grows onto the rollout's slot
    return validate_config(data, EmbodiedConfig)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["runner.mode=async"], "runner.mode"),
        (
            [
                "runner.mode=async",
                "algorithm.loss_type=sac",
                "algorithm.adv_type=gae",
                "actor.model.model_type=sac_mlp",
            ],
            "runner.mode",
        ),
        (["actor.enable_offload=true"], "actor.enable_offload"),
    ],
)
def test_config_refuses_unsupported_online_scaling(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=r"runner\.online_scaling") as info:
        _cfg(None, *overrides)
    assert needle in str(info.value)
    assert _cfg().runner.online_scaling  # sync PPO, disaggregated: fine


def test_launch_places_extra_actor_ranks_on_the_rollout() -> None:
    info = ClusterInfo.fake(1, cpu_slots_per_node=2)
    cfg = _cfg()
    placement = HybridComponentPlacement(cfg.cluster.component_placement, info)
    strategy, args = embodied_actor_strategy(cfg, placement)
    assert strategy.hardware_ranks_list == [[0], [1]]
    assert args == {"base_world_size": 1}
    off = _cfg(None, "runner.online_scaling=false")
    assert embodied_actor_strategy(off, placement)[1] == {}
    shared = _cfg({"actor": "0-1", "env": 0, "rollout": 1})
    with pytest.raises(ValueError, match=r"runner\.online_scaling.*disaggregated"):
        embodied_actor_strategy(
            shared, HybridComponentPlacement(shared.cluster.component_placement, info)
        )
    # The grown actor splits each rollout over 2 ranks: world-size rules are checked for 2.
    odd = _cfg(None, "actor.global_batch_size=32", "actor.micro_batch_size=32")
    with pytest.raises(ValueError, match=r"online_scaling=true trains on 2 actor ranks"):
        embodied_actor_strategy(odd, placement)


def test_runner_config_refuses_online_scaling_in_async_mode() -> None:
    from rlinf.embodied.config import EmbodiedRunnerConfig

    with pytest.raises(ValueError, match=r"runner\.online_scaling=true .* runner\.mode='async'"):
        EmbodiedRunnerConfig(online_scaling=True, mode="async")
    assert EmbodiedRunnerConfig(online_scaling=True).online_scaling  # sync: allowed
