"""PolicyConfig validation, the policy registry and spec checks."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

import rlinf.embodied.models.registry as registry
from rlinf.core.config import ConfigError, RLinfModel, validate_config
from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models import (
    BasePolicy,
    MLPPolicy,
    PolicyConfig,
    available_policies,
    build_policy,
    get_policy_class,
    register_policy,
)
from rlinf.embodied.models.config import ValueType

STATE_SPEC = EnvSpec(state_dim=4, image_shape=None, action_dim=2)
IMAGE_SPEC = EnvSpec(state_dim=None, image_shape=(64, 64, 3), action_dim=2)


pytestmark = pytest.mark.usefixtures("single_torch_thread")


class _Actor(RLinfModel):
    model: PolicyConfig


def test_defaults() -> None:
    cfg = PolicyConfig()
    assert cfg.model_type == "mlp"
    assert cfg.hidden_dims == [256, 256, 256]
    assert cfg.num_action_chunks == 1
    assert cfg.add_value_head is True
    assert cfg.init_log_std == -0.5
    assert cfg.precision == "fp32" and cfg.torch_dtype == torch.float32
    assert PolicyConfig(precision="bf16").torch_dtype == torch.bfloat16


@pytest.mark.parametrize(("value_type", "expected"), [("action_level", 3), ("chunk_level", 1)])
def test_value_dim(value_type: ValueType, expected: int) -> None:
    assert PolicyConfig(num_action_chunks=3, value_type=value_type).value_dim == expected


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(ValidationError, match="hidden_dim"):
        PolicyConfig(hidden_dim=64)  # type: ignore[call-arg]


def test_unknown_model_type_names_field_value_and_choices() -> None:
    with pytest.raises(ValidationError) as info:
        PolicyConfig(model_type="mlp_policy")
    text = str(info.value)
    assert "model_type" in text and "'mlp_policy'" in text
    assert "cnn, mlp, openvla, pi0, sac_mlp" in text
    assert "Did you mean model_type: mlp?" in text
    assert "register_policy" in text


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"hidden_dims": [64, 0]}, "hidden_dims", "hidden_dims: [64, 64]"),
        ({"cnn_channels": [8, 8, 8, 8]}, "cnn_channels", "cnn_channels: [32, 64, 64]"),
        ({"cnn_channels": [0]}, "cnn_channels", "cnn_channels: [32, 64, 64]"),
        ({"num_action_chunks": 0}, "num_action_chunks", "greater than or equal to 1"),
        ({"precision": "fp16"}, "precision", "'fp32' or 'bf16'"),
        ({"value_type": "token_level"}, "value_type", "'action_level' or 'chunk_level'"),
        ({"activation": "sigmoid"}, "activation", "'tanh'"),
        ({"init_log_std": float("nan")}, "init_log_std", "finite number"),
    ],
)
def test_invalid_values_name_field_value_and_fix(
    kwargs: dict[str, object], field: str, fix: str
) -> None:
    with pytest.raises(ValidationError) as info:
        PolicyConfig(**kwargs)  # type: ignore[arg-type]
    text = str(info.value)
    assert field in text
    assert f"input_value={next(iter(kwargs.values()))!r}" in text or "nan" in text
    assert fix in text


def test_config_error_has_dotted_path_inside_a_larger_schema() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({"model": {"model_type": "cnn", "hidden_dims": [0]}}, _Actor)
    assert [issue.path for issue in info.value.issues] == ["model.hidden_dims"]
    assert info.value.issues[0].value == [0]


def test_registry_lists_builtins() -> None:
    assert {"mlp", "cnn"} <= set(available_policies())
    assert get_policy_class("mlp") is MLPPolicy


def test_build_unknown_model_type_lists_registered() -> None:
    cfg = PolicyConfig.model_construct(model_type="nope")
    with pytest.raises(ValueError, match=r"unknown policy model_type 'nope'; registered: .*mlp"):
        build_policy(cfg, STATE_SPEC)


def test_register_custom_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))

    @register_policy("tiny")
    class Tiny(MLPPolicy):
        pass

    register_policy("tiny")(Tiny)  # same class again: no-op
    cfg = PolicyConfig(model_type="tiny", hidden_dims=[8])
    assert isinstance(build_policy(cfg, STATE_SPEC), Tiny)
    assert "tiny" in available_policies()

    with pytest.raises(ValueError, match="already registered"):

        @register_policy("tiny")
        class Other(MLPPolicy):
            pass

    with pytest.raises(TypeError, match="not a BasePolicy subclass"):
        register_policy("bad")(torch.nn.Linear)  # type: ignore[type-var]


def test_cnn_without_images_says_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"model_type: mlp.*obs_mode"):
        build_policy(PolicyConfig(model_type="cnn"), STATE_SPEC)


def test_mlp_without_states_says_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"model_type: cnn.*obs_mode"):
        build_policy(PolicyConfig(model_type="mlp"), IMAGE_SPEC)


def test_bad_action_specs() -> None:
    with pytest.raises(ValueError, match="action_dim must be 1"):
        build_policy(
            PolicyConfig(), EnvSpec(state_dim=4, image_shape=None, action_dim=2, num_actions=3)
        )
    with pytest.raises(ValueError, match="at least 2 actions"):
        build_policy(
            PolicyConfig(), EnvSpec(state_dim=4, image_shape=None, action_dim=1, num_actions=1)
        )
    with pytest.raises(ValueError, match="action_dim >= 1"):
        build_policy(PolicyConfig(), EnvSpec(state_dim=4, image_shape=None, action_dim=0))


def test_image_too_small() -> None:
    spec = EnvSpec(state_dim=None, image_shape=(32, 32, 3), action_dim=2)
    with pytest.raises(ValueError, match=r"image_shape=\(32, 32, 3\) is too small.*36x36"):
        build_policy(PolicyConfig(model_type="cnn"), spec)
    # Fewer conv layers accept smaller images.
    policy = build_policy(PolicyConfig(model_type="cnn", cnn_channels=[8, 8]), spec)
    assert isinstance(policy, BasePolicy)


def test_build_policy_precision_and_device() -> None:
    policy = build_policy(PolicyConfig(precision="bf16", hidden_dims=[8]), STATE_SPEC, device="cpu")
    assert policy.dtype == torch.bfloat16
    assert policy.device == torch.device("cpu")


def test_lora_on_a_policy_without_adapters_is_refused() -> None:
    from rlinf.embodied.models.config import LoRAConfig

    cfg = PolicyConfig(model_type="mlp", lora=LoRAConfig(rank=4))
    with pytest.raises(ValueError, match=r"actor.model.lora is set but model_type 'mlp'"):
        build_policy(cfg, STATE_SPEC)
