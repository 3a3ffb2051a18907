"""MLP and CNN policies: shapes, logprob recomputation, determinism, entropy, state dicts."""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest
import torch
from torch.distributions import Categorical, Normal

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.embodied.models import (
    ActorCriticPolicy,
    CategoricalActionHead,
    CNNPolicy,
    GaussianActionHead,
    MLPPolicy,
    PolicyConfig,
    ValueHead,
    build_policy,
)
from rlinf.embodied.models.config import ValueType

N = 5


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def assert_close(
    actual: torch.Tensor | None,
    expected: torch.Tensor | None,
    atol: float = 1e-6,
    rtol: float = 0.0,
) -> None:
    """Like torch.testing.assert_close (whose first call costs seconds of imports)."""
    assert actual is not None and expected is not None
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    err = (actual.double() - expected.double()).abs()
    bound = atol + rtol * expected.double().abs()
    assert bool((err <= bound).all()), f"max abs error {err.max().item():.3g} > atol {atol}"


STATE_DIM = 6
ACTION_DIM = 3
NUM_ACTIONS = 4


def make_spec(
    model_type: str, discrete: bool, image_size: int = 64, with_states: bool = True
) -> EnvSpec:
    images = model_type == "cnn"
    return EnvSpec(
        state_dim=STATE_DIM if with_states else None,
        image_shape=(image_size, image_size, 3) if images else None,
        action_dim=1 if discrete else ACTION_DIM,
        num_actions=NUM_ACTIONS if discrete else None,
        action_low=None if discrete else (-1.0,) * ACTION_DIM,
        action_high=None if discrete else (1.0,) * ACTION_DIM,
    )


def make_obs(spec: EnvSpec, n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    obs: dict[str, torch.Tensor] = {}
    if spec.state_dim is not None:
        obs["states"] = torch.randn(n, spec.state_dim, generator=gen)
    if spec.image_shape is not None:
        obs["main_images"] = torch.randint(
            0, 256, (n, *spec.image_shape), generator=gen, dtype=torch.uint8
        )
    return obs


def make_policy(
    model_type: str,
    discrete: bool,
    chunks: int = 1,
    value_type: ValueType = "action_level",
    seed: int = 0,
    **cfg: Any,
) -> tuple[ActorCriticPolicy, EnvSpec]:
    torch.manual_seed(seed)
    spec = make_spec(model_type, discrete)
    config = PolicyConfig(
        model_type=model_type,
        hidden_dims=[32, 32],
        num_action_chunks=chunks,
        value_type=value_type,
        cnn_channels=[8, 16, 16],
        cnn_feature_dim=32,
        **cfg,
    )
    policy = build_policy(config, spec)
    assert isinstance(policy, ActorCriticPolicy)
    return policy, spec


def gaussian_head(policy: ActorCriticPolicy) -> GaussianActionHead:
    assert isinstance(policy.action_head, GaussianActionHead)
    return policy.action_head


def categorical_head(policy: ActorCriticPolicy) -> CategoricalActionHead:
    assert isinstance(policy.action_head, CategoricalActionHead)
    return policy.action_head


def value_head(policy: ActorCriticPolicy) -> ValueHead:
    assert policy.value_head is not None
    return policy.value_head


def logits_of(policy: ActorCriticPolicy, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = policy.action_head(policy.actor_backbone(policy._encode(inputs)))
    return logits


MATRIX = list(
    itertools.product(["mlp", "cnn"], [False, True], [1, 3], ["action_level", "chunk_level"])
)


@pytest.mark.parametrize(("model_type", "discrete", "chunks", "value_type"), MATRIX)
def test_output_shapes(model_type: str, discrete: bool, chunks: int, value_type: ValueType) -> None:
    policy, spec = make_policy(model_type, discrete, chunks, value_type)
    assert isinstance(policy, MLPPolicy if model_type == "mlp" else CNNPolicy)
    obs = make_obs(spec)
    a_dim = 1 if discrete else ACTION_DIM
    logprob_width = chunks if discrete else chunks * ACTION_DIM
    v_dim = chunks if value_type == "action_level" else 1
    assert policy.value_dim == v_dim

    for mode in ("train", "eval"):
        out = policy.predict_action_batch(obs, mode=mode)
        assert isinstance(out, PolicyOutput)
        assert out.actions.shape == (N, chunks, a_dim) and out.actions.dtype == torch.float32
        assert out.prev_logprobs is not None and out.prev_values is not None
        assert out.prev_logprobs.shape == (N, logprob_width)
        assert out.prev_logprobs.dtype == torch.float32
        assert out.prev_values.shape == (N, v_dim) and out.prev_values.dtype == torch.float32
        assert not out.actions.requires_grad and not out.prev_logprobs.requires_grad
        if discrete:
            assert out.forward_inputs["action"].dtype == torch.int64
            assert ((out.actions >= 0) & (out.actions < NUM_ACTIONS)).all()
            assert torch.equal(out.actions, out.actions.round())
        if model_type == "cnn":
            assert out.forward_inputs["main_images"].dtype == torch.uint8
        assert set(out.forward_inputs) == {*policy.obs_keys, "action"}

        res = policy(out.forward_inputs, compute_entropy=True, compute_values=True)
        assert res["logprobs"].shape == (N, logprob_width)
        assert res["entropy"].shape == (N, logprob_width)
        assert res["values"].shape == (N, v_dim)
        assert res["logprobs"].requires_grad and res["values"].requires_grad
        assert policy.get_value(obs).shape == (N, v_dim)


@pytest.mark.parametrize(
    ("model_type", "discrete"), [("mlp", False), ("mlp", True), ("cnn", False), ("cnn", True)]
)
def test_recomputed_logprobs_and_values_match(model_type: str, discrete: bool) -> None:
    policy, spec = make_policy(model_type, discrete, chunks=3)
    obs = make_obs(spec, n=16)
    out = policy.predict_action_batch(obs, mode="train")
    res = policy.default_forward(out.forward_inputs, compute_values=True)
    assert out.prev_logprobs is not None and out.prev_values is not None
    assert_close(res["logprobs"], out.prev_logprobs, atol=1e-6)
    assert_close(res["values"], out.prev_values, atol=1e-6)
    assert_close(policy.get_value(obs), out.prev_values, atol=1e-6)

    # After a channel round trip (to_cpu) and re-batching into micro-batches.
    cpu = out.to_cpu().forward_inputs
    halves = [
        policy.default_forward({k: v[s] for k, v in cpu.items()})
        for s in (slice(0, 7), slice(7, 16))
    ]
    assert_close(torch.cat([h["logprobs"] for h in halves]), out.prev_logprobs, atol=1e-5)


@pytest.mark.parametrize(
    ("model_type", "discrete"), [("mlp", False), ("mlp", True), ("cnn", False), ("cnn", True)]
)
def test_rollout_path_equals_module_calls(model_type: str, discrete: bool) -> None:
    """predict_action_batch == encoder, trunk, head and ``ActionHead.sample``, exactly."""
    policy, spec = make_policy(model_type, discrete, chunks=2)
    obs = make_obs(spec, n=3)
    for mode in ("train", "eval"):
        out = policy.predict_action_batch(
            obs, mode=mode, generator=torch.Generator().manual_seed(11)
        )
        with torch.no_grad():
            params = logits_of(policy, policy._to_device(policy._select_inputs(obs)))
            expected = policy.action_head.sample(
                params, mode == "eval", torch.Generator().manual_seed(11)
            )
        assert torch.equal(out.actions, expected[0])
        assert torch.equal(out.forward_inputs["action"], expected[1])
        assert out.prev_logprobs is not None and torch.equal(out.prev_logprobs, expected[2])


@pytest.mark.parametrize("model_type", ["mlp", "cnn"])
def test_rollout_path_is_the_same_in_inference_mode_and_records_no_graph(model_type: str) -> None:
    """The rollout loops act under ``torch.inference_mode()``; the outputs are the same there,
    and outside it the policy still records no graph on trainable weights."""
    policy, spec = make_policy(model_type, discrete=False, chunks=2)
    assert any(p.requires_grad for p in policy.parameters())
    obs = make_obs(spec, n=3)
    outs = []
    for inference in (False, True):
        with torch.inference_mode(inference):
            out = policy.predict_action_batch(obs, generator=torch.Generator().manual_seed(5))
        assert out.prev_values is not None and out.prev_logprobs is not None
        tensors = (out.actions, out.prev_logprobs, out.prev_values)
        assert not any(t.requires_grad for t in tensors)
        assert all(t.is_inference() == inference for t in tensors)
        outs.append(tensors)
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_stored_action_does_not_alias_env_actions() -> None:
    policy, spec = make_policy("mlp", discrete=False)
    out = policy.predict_action_batch(make_obs(spec))
    expected = policy.default_forward(out.forward_inputs)["logprobs"]
    out.actions.clamp_(-0.01, 0.01)  # an env clipping its actions in place
    assert_close(policy.default_forward(out.forward_inputs)["logprobs"], expected)


@pytest.mark.parametrize(
    ("model_type", "discrete"), [("mlp", False), ("mlp", True), ("cnn", False), ("cnn", True)]
)
def test_eval_is_deterministic_and_train_samples(model_type: str, discrete: bool) -> None:
    policy, spec = make_policy(model_type, discrete, chunks=2, init_log_std=0.0)
    obs = make_obs(spec, n=64)
    first = policy.predict_action_batch(obs, mode="eval")
    second = policy.predict_action_batch(obs, mode="eval")
    assert torch.equal(first.actions, second.actions)
    assert_close(first.prev_logprobs, second.prev_logprobs, atol=0.0)

    samples = [policy.predict_action_batch(obs, mode="train").actions for _ in range(2)]
    assert not torch.equal(samples[0], samples[1])

    seeded = [
        policy.predict_action_batch(obs, generator=torch.Generator().manual_seed(7)).actions
        for _ in range(2)
    ]
    assert torch.equal(seeded[0], seeded[1])

    if discrete:  # eval picks the argmax of the logits
        logits = logits_of(policy, first.forward_inputs)
        assert torch.equal(first.actions.squeeze(-1), logits.argmax(-1).float())


def test_train_samples_follow_the_gaussian() -> None:
    policy, spec = make_policy("mlp", discrete=False, init_log_std=-1.0)
    obs = make_obs(spec, n=1)
    obs = {"states": obs["states"].expand(20000, -1)}
    mean = policy.predict_action_batch(obs, mode="eval").actions
    actions = policy.predict_action_batch(obs, mode="train").actions
    std = (actions - mean).flatten(0, 1).std(0)
    assert_close(std, torch.full((ACTION_DIM,), torch.e**-1.0), atol=0.01)


def test_entropy_and_logprobs_match_torch_distributions() -> None:
    policy, spec = make_policy("mlp", discrete=False, chunks=2, init_log_std=-0.3)
    out = policy.predict_action_batch(make_obs(spec))
    res = policy.default_forward(out.forward_inputs, compute_entropy=True)
    mean = policy.predict_action_batch(make_obs(spec), mode="eval").actions.reshape(N, -1)
    dist = Normal(mean, torch.exp(gaussian_head(policy).log_std.detach()))
    assert_close(res["entropy"], dist.entropy())  # type: ignore[no-untyped-call]
    assert_close(res["logprobs"], dist.log_prob(out.actions.reshape(N, -1)))  # type: ignore[no-untyped-call]

    policy, spec = make_policy("mlp", discrete=True, chunks=2)
    with torch.no_grad():  # sharpen the logits so the entropy is not ~log(K)
        categorical_head(policy).logits.weight.mul_(300.0)
    out = policy.predict_action_batch(make_obs(spec))
    res = policy.default_forward(out.forward_inputs, compute_entropy=True)
    cat = Categorical(logits=logits_of(policy, out.forward_inputs))
    assert_close(res["entropy"], cat.entropy())  # type: ignore[no-untyped-call]
    assert_close(res["logprobs"], cat.log_prob(out.actions.squeeze(-1)))  # type: ignore[no-untyped-call]
    assert res["entropy"].min() < 0.9 * torch.log(torch.tensor(float(NUM_ACTIONS)))


@pytest.mark.parametrize("size", [64, 84, 128])
def test_cnn_image_sizes_and_image_only(size: int) -> None:
    spec = make_spec("cnn", discrete=False, image_size=size, with_states=size != 84)
    policy = build_policy(
        PolicyConfig(model_type="cnn", hidden_dims=[16], cnn_feature_dim=16), spec
    )
    out = policy.predict_action_batch(make_obs(spec, n=2))
    assert out.actions.shape == (2, 1, ACTION_DIM)
    assert ("states" in out.forward_inputs) == (size != 84)


@pytest.mark.parametrize("model_type", ["mlp", "cnn"])
def test_state_dict_round_trip(model_type: str) -> None:
    policy, spec = make_policy(model_type, discrete=False, chunks=2, seed=1)
    with torch.no_grad():
        gaussian_head(policy).log_std.add_(0.3)
    buffer = io.BytesIO()
    torch.save(policy.state_dict(), buffer)
    buffer.seek(0)
    other, _ = make_policy(model_type, discrete=False, chunks=2, seed=2)
    obs = make_obs(spec)
    assert not torch.equal(
        other.predict_action_batch(obs, mode="eval").actions,
        policy.predict_action_batch(obs, mode="eval").actions,
    )
    other.load_state_dict(torch.load(buffer, weights_only=True))
    out = policy.predict_action_batch(obs, generator=torch.Generator().manual_seed(3))
    again = other.predict_action_batch(obs, generator=torch.Generator().manual_seed(3))
    for a, b in [
        (out.actions, again.actions),
        (out.prev_logprobs, again.prev_logprobs),
        (out.prev_values, again.prev_values),
    ]:
        assert a is not None and b is not None and torch.equal(a, b)


def test_value_head_parameters_are_named_for_value_lr() -> None:
    policy, _ = make_policy("cnn", discrete=False)
    names = [n for n, _ in policy.named_parameters()]
    value = [n for n in names if "value_head" in n]
    assert value and all(n.startswith("value_head.") for n in value)
    assert "action_head.log_std" in names


def test_initialisation() -> None:
    torch.manual_seed(0)
    spec = make_spec("mlp", discrete=False)
    policy = build_policy(PolicyConfig(hidden_dims=[64, 64]), spec)
    assert isinstance(policy, ActorCriticPolicy)
    first = policy.actor_backbone[0]
    assert isinstance(first, torch.nn.Linear)
    w = first.weight.detach()
    # Orthogonal with gain sqrt(2): W W^T = 2 I (rows <= cols here: 64 x 6 -> cols are orthogonal).
    assert_close(w.T @ w, 2 * torch.eye(STATE_DIM), atol=1e-4)
    assert torch.count_nonzero(first.bias) == 0
    head = gaussian_head(policy).mean.weight.detach()
    assert_close(head @ head.T, (0.01 * 2**0.5) ** 2 * torch.eye(ACTION_DIM), atol=1e-8)
    assert_close(gaussian_head(policy).log_std.detach(), torch.full((ACTION_DIM,), -0.5))
    assert value_head(policy).out.bias is None
    assert abs(value_head(policy).out.weight.std().item() - 0.02) < 0.015


def test_without_value_head() -> None:
    policy, spec = make_policy("mlp", discrete=False, chunks=2, add_value_head=False)
    assert not any("value_head" in n for n, _ in policy.named_parameters())
    out = policy.predict_action_batch(make_obs(spec))
    assert out.prev_values is not None and torch.equal(out.prev_values, torch.zeros(N, 2))
    with pytest.raises(ValueError, match="add_value_head"):
        policy(out.forward_inputs, compute_values=True)


def test_bf16_policy_returns_float32_and_recomputes_exactly() -> None:
    policy, spec = make_policy("cnn", discrete=False, chunks=2, precision="bf16")
    assert policy.dtype == torch.bfloat16
    out = policy.predict_action_batch(make_obs(spec))
    assert out.prev_logprobs is not None and out.prev_logprobs.dtype == torch.float32
    assert out.actions.dtype == torch.float32
    res = policy(out.forward_inputs, compute_values=True)
    assert res["values"].dtype == torch.float32
    assert_close(res["logprobs"], out.prev_logprobs, atol=1e-6)


def test_bad_inputs() -> None:
    policy, spec = make_policy("cnn", discrete=False)
    obs = make_obs(spec)
    with pytest.raises(ValueError, match="mode='sample'"):
        policy.predict_action_batch(obs, mode="sample")
    with pytest.raises(ValueError, match=r"mode='random' is not a mode of CNNPolicy"):
        policy.predict_action_batch(obs, mode="random")  # (SAC's warm-up mode only)
    with pytest.raises(KeyError, match="main_images"):
        policy.predict_action_batch({"states": obs["states"]})
    with pytest.raises(ValueError, match="must be uint8"):
        policy.predict_action_batch({**obs, "main_images": obs["main_images"].float()})
    with pytest.raises(ValueError, match=r"shape \(5, 7\), expected \[n, 6\]"):
        policy.predict_action_batch({**obs, "states": torch.zeros(N, 7)})
    with pytest.raises(ValueError, match="batch size"):
        policy.predict_action_batch({**obs, "states": torch.zeros(N + 1, STATE_DIM)})
    with pytest.raises(KeyError, match="'action'"):
        policy.default_forward(obs)
    # Extra obs keys are ignored; float64 states are accepted and stored as float32.
    out = policy.predict_action_batch(
        {**obs, "states": obs["states"].double(), "extra": obs["states"]}
    )
    assert out.forward_inputs["states"].dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_policy_accepts_cpu_obs(precision: str) -> None:
    torch.manual_seed(0)
    spec = make_spec("cnn", discrete=False)
    cfg = PolicyConfig(model_type="cnn", num_action_chunks=2, precision=precision)  # type: ignore[arg-type]
    policy = build_policy(cfg, spec, device="cuda")
    obs = make_obs(spec, n=32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = policy.predict_action_batch(obs, generator=gen)
    assert out.actions.device.type == "cuda" and out.prev_values is not None
    assert out.forward_inputs["main_images"].device.type == "cpu"  # not copied back
    assert out.forward_inputs["action"].device.type == "cuda"
    cpu = out.to_cpu()
    res = policy(cpu.forward_inputs, compute_values=True)
    assert_close(res["logprobs"].cpu(), cpu.prev_logprobs, atol=1e-5)
    assert_close(res["values"].cpu(), cpu.prev_values, atol=1e-5)
    assert_close(policy.get_value(obs).cpu(), cpu.prev_values, atol=1e-5)
