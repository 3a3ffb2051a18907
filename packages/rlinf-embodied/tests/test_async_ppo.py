"""Async PPO pieces on CPU, without Ray: the decoupled loss, staleness, config rules.

* the decoupled loss (ratio and clip against the proximal logprobs, advantages
  times ``truncated_is_weights(proximal, behaviour)``) gives the same loss and
  gradients as sync PPO when the batch comes from the current weights;
* with stale behaviour logprobs the IS weights differ from 1 and are clipped;
* :func:`batch_staleness` and the config rules of ``runner.mode: async`` with PPO.

The actor's ``_micro_step`` runs unbound on a stand-in ``self`` holding only the
config and the episode limit (the FSDP worker needs a process group and Ray);
the policy, the loss functions and the data are the real ones.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlinf.core.algorithms import truncated_is_weights
from rlinf.core.config import ConfigError, compose_config, validate_config
from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.async_ppo_runner import check_async_ppo_placement
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.models import build_policy
from rlinf.embodied.workers.actor_worker import (
    EmbodiedFSDPActor,
    _TrainData,
    batch_staleness,
    proximal_logprobs,
)

CONFIG_DIR = Path(__file__).resolve().parents[3] / "examples" / "embodiment" / "config"
DISAGG = {"actor": 0, "env": 1, "rollout": 1}
N = 64


def cartpole(*overrides: str) -> EmbodiedConfig:
    data = compose_config("cartpole_ppo_mlp", CONFIG_DIR, list(overrides))
    data["cluster"]["component_placement"] = DISAGG
    data["rollout"]["in_env_process"] = False  # async PPO runs a rollout group
    return validate_config(data, EmbodiedConfig)


def errors_of(*overrides: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        cartpole(*overrides)
    return [(issue.path, issue.message) for issue in info.value.issues]


def _setup(seed: int = 0) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A CartPole MLP policy, one sampled batch: inputs, behaviour logprobs, values."""
    cfg = cartpole()
    spec = EnvSpec(
        state_dim=4, image_shape=None, action_dim=1, num_actions=2, max_episode_steps=500
    )
    torch.manual_seed(seed)
    policy = build_policy(cfg.actor.model, spec)
    states = torch.randn(N, 4, generator=torch.Generator().manual_seed(seed))
    out = policy.predict_action_batch(
        {"states": states}, mode="train", generator=torch.Generator().manual_seed(1)
    )
    assert out.prev_logprobs is not None and out.prev_values is not None
    return policy, out.forward_inputs, out.prev_logprobs, out.prev_values


def _data(
    inputs: dict[str, torch.Tensor],
    old: torch.Tensor,
    values: torch.Tensor,
    is_weights: torch.Tensor | None,
) -> _TrainData:
    gen = torch.Generator().manual_seed(7)
    advantages = torch.randn(N, 1, generator=gen)
    returns = values + torch.randn(N, 1, generator=gen)
    mask = torch.ones(N, 1, dtype=torch.bool)
    mask[::5] = False  # some dead sub-steps
    return _TrainData(
        n=N,
        chunks=1,
        chunk_level=False,
        logprob_level="action_level",
        inputs=inputs,
        old_logprobs=old,
        old_values=values,
        advantages=advantages,
        returns=returns,
        mask=mask,
        mask_sum=None,
        is_weights=is_weights,
    )


def _loss_and_grads(
    cfg: EmbodiedConfig, policy: Any, data: _TrainData
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    policy.zero_grad(set_to_none=True)
    stand_in = SimpleNamespace(cfg=cfg, _max_episode_steps=500)
    idx = torch.arange(N)
    metrics = EmbodiedFSDPActor._micro_step(stand_in, policy, data, idx, 1)  # type: ignore[arg-type]
    grads = [p.grad.detach().clone() for p in policy.parameters() if p.grad is not None]
    return metrics, grads


def test_decoupled_loss_equals_sync_ppo_when_the_batch_is_current() -> None:
    policy, inputs, behaviour, values = _setup()
    # The update's first epoch after a few optimizer steps: perturb the weights so
    # that ratios differ from 1 (the clip is exercised) in both variants alike.
    sync_cfg = cartpole()
    async_cfg = cartpole("runner.mode=async")
    proximal = proximal_logprobs(policy, inputs, 1, "action_level", micro_batch_size=16)
    assert torch.allclose(proximal, behaviour, atol=1e-6)  # rollout == actor numerics
    mask = torch.ones(N, 1, dtype=torch.bool)
    mask[::5] = False
    weights = truncated_is_weights(
        proximal, behaviour, async_cfg.algorithm.importance_sampling_clip, mask
    )
    assert torch.allclose(weights[mask], torch.ones(()), atol=1e-6)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    sync_metrics, sync_grads = _loss_and_grads(
        sync_cfg, policy, _data(inputs, behaviour, values, None)
    )
    async_metrics, async_grads = _loss_and_grads(
        async_cfg, policy, _data(inputs, proximal, values, weights)
    )
    assert float(sync_metrics["actor/clip_fraction"]) > 0  # the clip is active
    for key in ("actor/total_loss", "actor/policy_loss"):
        assert abs(float(sync_metrics[key]) - float(async_metrics[key])) <= 1e-6, key
    assert len(sync_grads) == len(async_grads) > 0
    for a, b in zip(sync_grads, async_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), (a - b).abs().max()
    assert abs(float(async_metrics["actor/is_weight_mean"]) - 1.0) <= 1e-6


def test_stale_behaviour_logprobs_are_reweighted_and_clipped() -> None:
    policy, inputs, behaviour, values = _setup()
    proximal = proximal_logprobs(policy, inputs, 1, "action_level", micro_batch_size=N)
    stale = behaviour.clone()
    stale[:8] -= 2.0  # the old policy found these actions much less likely: w = e^2 -> clip
    stale[8:16] += 0.5  # more likely: w = e^-0.5
    weights = truncated_is_weights(proximal, stale, 2.0)
    assert torch.allclose(weights[:8], torch.full((8, 1), 2.0))
    assert torch.allclose(weights[8:16], torch.full((8, 1), float(torch.exp(torch.tensor(-0.5)))))
    cfg = cartpole("runner.mode=async")
    current, _ = _loss_and_grads(cfg, policy, _data(inputs, proximal, values, None))
    reweighted, _ = _loss_and_grads(cfg, policy, _data(inputs, proximal, values, weights))
    # At the proximal weights every ratio is 1: the loss is -mean(w * A) over valid entries.
    data = _data(inputs, proximal, values, weights)
    want = -(data.advantages * weights)[data.mask].mean()
    assert abs(float(reweighted["actor/policy_loss"]) - float(want)) <= 1e-6
    assert float(reweighted["actor/policy_loss"]) != float(current["actor/policy_loss"])


def test_batch_staleness() -> None:
    assert batch_staleness(torch.tensor([4, 4, 4]), 4) == (0, 0.0)
    worst, mean = batch_staleness(torch.tensor([3, 3, 2]), 4)
    assert worst == 2 and mean == pytest.approx(4 / 3)
    with pytest.raises(RuntimeError, match="newer than the actor's step 4"):
        batch_staleness(torch.tensor([5]), 4)


def test_async_ppo_config_rules() -> None:
    cfg = cartpole("runner.mode=async")
    assert cfg.algorithm.staleness_bound(cfg.runner.mode) == 1
    assert cartpole().algorithm.staleness_bound("sync") == 0
    assert cartpole("runner.mode=async", "algorithm.max_staleness=3").algorithm.max_staleness == 3
    negative = errors_of("runner.mode=async", "algorithm.max_staleness=-1")
    assert [p for p, _ in negative] == ["algorithm.max_staleness"]
    assert "set algorithm.max_staleness: 1" in negative[0][1]
    in_sync = errors_of("algorithm.max_staleness=2")
    assert [p for p, _ in in_sync] == ["algorithm.max_staleness"]
    assert "runner.mode: async" in in_sync[0][1]
    # A placement where the actor shares the rollout's slots is refused by name.
    check_async_ppo_placement(cfg, shared=False)
    with pytest.raises(ConfigError) as info:
        check_async_ppo_placement(cfg, shared=True)
    assert [i.path for i in info.value.issues] == ["cluster.component_placement"]
    assert "actor: 0, env: 1, rollout: 1" in info.value.issues[0].message
    with pytest.raises(ConfigError, match=r"runner\.mode"):
        check_async_ppo_placement(cartpole(), shared=False)
