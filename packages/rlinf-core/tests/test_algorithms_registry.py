"""Registries of rlinf.core.algorithms: lookup, aliases, errors, stack dispatch."""

from __future__ import annotations

import pytest
import torch

from rlinf.core.algorithms import (
    AdvantageResult,
    EmbodiedAdvantageInputs,
    ReasoningAdvantageInputs,
    available_advantages,
    available_policy_losses,
    gae_advantage,
    get_advantage,
    get_policy_loss,
    grpo_advantage,
    ppo_policy_loss,
    register_advantage,
    register_policy_loss,
    reinforce_plus_plus_advantage,
)
from rlinf.core.algorithms.registry import Registry


def test_builtin_names() -> None:
    assert {"gae", "grpo", "reinforce_plus_plus", "reinpp"} <= set(available_advantages())
    assert {"ppo", "actor", "actor_critic"} <= set(available_policy_losses())
    assert get_advantage("gae") is gae_advantage
    assert get_advantage("grpo") is grpo_advantage
    assert get_advantage("reinpp") is reinforce_plus_plus_advantage
    assert get_policy_loss("ppo") is ppo_policy_loss
    assert get_policy_loss("actor") is ppo_policy_loss


def test_unknown_advantage_names_value_and_lists_registered() -> None:
    with pytest.raises(ValueError) as err:
        get_advantage("gea")
    msg = str(err.value)
    assert "algorithm.adv_type='gea'" in msg
    for name in available_advantages():
        assert name in msg


def test_unknown_policy_loss_names_value_and_lists_registered() -> None:
    with pytest.raises(ValueError) as err:
        get_policy_loss("ppo2")
    msg = str(err.value)
    assert "algorithm.loss_type='ppo2'" in msg
    assert "actor_critic" in msg and "ppo" in msg


def test_registry_register_alias_and_duplicates() -> None:
    reg: Registry[object] = Registry("thing", "algorithm.thing")

    @reg.register("a", aliases=("b",))
    def fn() -> int:
        return 1

    assert reg.get("a") is fn and reg.get("b") is fn
    assert reg.names() == ("a", "b")
    reg.register("a")(fn)  # re-registering the same function is a no-op

    def other() -> int:
        return 2

    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(other)
    with pytest.raises(ValueError, match="'b' is already registered"):
        reg.register("c", aliases=("b",))(other)
    assert "c" not in reg.names()  # nothing registered on failure
    with pytest.raises(ValueError, match="name '' is invalid"):
        reg.register("")(other)


def test_duplicate_builtin_name_is_rejected() -> None:
    def fake(inputs: object) -> AdvantageResult:
        raise AssertionError

    with pytest.raises(ValueError, match="'gae' is already registered"):
        register_advantage("gae")(fake)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'ppo' is already registered"):
        register_policy_loss("ppo")(fake)


def test_custom_estimator_is_resolvable() -> None:
    name = "test_only_raw_rewards"

    @register_advantage(name)
    def raw(inputs: EmbodiedAdvantageInputs | ReasoningAdvantageInputs) -> AdvantageResult:
        return AdvantageResult(inputs.rewards, None)

    rewards = torch.ones(2, 1, 1)
    out = get_advantage(name)(EmbodiedAdvantageInputs(rewards, torch.zeros(3, 1, 1, dtype=bool)))
    assert out.advantages is rewards and out.returns is None
    assert name in available_advantages()


def test_stack_mismatch_is_a_value_error() -> None:
    reasoning = ReasoningAdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]), response_mask=torch.ones(2, 3, dtype=torch.bool)
    )
    embodied = EmbodiedAdvantageInputs(
        rewards=torch.ones(2, 2, 1), dones=torch.zeros(3, 2, 1, dtype=torch.bool)
    )
    with pytest.raises(ValueError, match="adv_type='gae' supports embodied inputs only"):
        get_advantage("gae")(reasoning)
    with pytest.raises(ValueError, match="supports reasoning inputs only"):
        get_advantage("reinforce_plus_plus")(embodied)


def test_grpo_serves_both_stacks() -> None:
    embodied = EmbodiedAdvantageInputs(
        rewards=torch.tensor([[[1.0], [0.0]]]),
        dones=torch.zeros(2, 2, 1, dtype=torch.bool),
        group_size=2,
    )
    adv, ret = get_advantage("grpo")(embodied)
    assert adv.shape == (1, 2, 1) and ret is None
    reasoning = ReasoningAdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        response_mask=torch.ones(2, 3, dtype=torch.bool),
        group_size=2,
    )
    adv, ret = get_advantage("grpo")(reasoning)
    assert adv.shape == (2, 3) and ret is None
