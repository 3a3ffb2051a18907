"""LoRA on both VLA policies (pi0, OpenVLA-OFT): identity at init, what trains, save/reload,
rollout/actor state-dict compatibility, logprob parity with adapters on, and config errors.

pi0 adapts only its VLM (``model.model.vlm``); its action expert, the expert's input and
output projections and the RL heads (``heads.*``) train fully, and the heads are saved
beside the weights (``rlinf_heads.safetensors``). OpenVLA adapts
:data:`~rlinf.embodied.models.vla.openvla.policy.LORA_TARGET_MODULES` and trains its
value head, saved in the adapter directory (:data:`~rlinf.embodied.models.vla.lora.HEADS_FILE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor, nn

from rlinf.embodied.models import BasePolicy, PolicyConfig, build_policy
from rlinf.embodied.models.config import DEFAULT_LORA_TARGET_MODULES, LoRAConfig
from rlinf.embodied.models.vla.lora import HEADS_FILE, count_parameters
from rlinf.embodied.models.vla.openvla.policy import LORA_TARGET_MODULES, OpenVLAPolicy
from rlinf.embodied.models.vla.pi0.policy import HEADS_FILE as PI0_HEADS_FILE
from rlinf.embodied.models.vla.pi0.policy import Pi0Policy
from rlinf.embodied.models.vla.tiny import make_tiny_vla, random_observations, tiny_env_spec

STATE_DIM, ACTION_DIM, CHUNKS, HORIZON, N, RANK = 2, 2, 3, 4, 5, 16
KINDS = ("pi0", "openvla-oft")
MODEL_TYPES = {"pi0": "pi0", "openvla-oft": "openvla"}
TARGETS = {"pi0": DEFAULT_LORA_TARGET_MODULES, "openvla-oft": LORA_TARGET_MODULES}
"""The suffixes ``target_modules: null`` adapts."""
SCOPE = {"pi0": "model.model.vlm.", "openvla-oft": "model."}
"""Where the adapters go (policy parameter names)."""
FULLY_TRAINED = {
    "pi0": (
        "heads.",
        "model.model.dit.layers.",
        "model.model.dit.norm.",
        "model.embed_action_time.",
        "model.action_out_proj.",
    ),
    "openvla-oft": ("model.value_head.",),
}
"""Name prefixes of the non-adapter parameters that train under LoRA."""
ADAPTED_PARTS = {
    "pi0": {
        "model.model.vlm.vision_tower.": ("q_proj", "fc1"),
        "model.model.vlm.language_model.": ("o_proj", "down_proj"),
    },
    "openvla-oft": {
        "model.vision_backbone.featurizer.": ("qkv", "proj"),
        "model.vision_backbone.fused_featurizer.": ("qkv", "proj"),
        "model.language_model.": ("o_proj", "down_proj", "lm_head"),
    },
}
"""Parts that must carry adapters, with module suffixes adapted in each."""


pytestmark = pytest.mark.usefixtures("vla_offline")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora_vla")
    common: dict[str, Any] = {
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "num_action_chunks": CHUNKS,
    }
    pi0 = make_tiny_vla("pi0", root / "pi0", seed=4, action_horizon=HORIZON, **common)
    # pi0's RL heads start random in every build unless the directory has them: save a
    # set so that independent builds (plain and LoRA, actor and rollout) start equal
    torch.manual_seed(5)
    make_policy("pi0", pi0).save_pretrained(pi0)
    return {
        "pi0": pi0,
        "openvla-oft": make_tiny_vla("openvla-oft", root / "openvla_oft", seed=3, **common),
    }


def spec() -> Any:
    return tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM)


def make_policy(
    kind: str, model_path: Path, lora: LoRAConfig | None = None, **overrides: Any
) -> BasePolicy:
    cfg = PolicyConfig(
        model_type=MODEL_TYPES[kind],
        model_path=model_path,
        num_action_chunks=CHUNKS,
        lora=lora,
        **overrides,
    )
    policy = build_policy(cfg, spec())
    assert isinstance(policy, Pi0Policy | OpenVLAPolicy)
    return policy


def fully_trained(kind: str, name: str) -> bool:
    """Whether the non-adapter parameter ``name`` trains under LoRA."""
    return name.startswith(FULLY_TRAINED[kind])


def trains(kind: str, name: str) -> bool:
    return "lora_" in name or fully_trained(kind, name)


def head_modules(policy: BasePolicy) -> list[nn.Module]:
    """The RL heads: pi0's ``heads`` (value and noise std), OpenVLA's value head."""
    if isinstance(policy, Pi0Policy):
        return [policy.heads]
    assert isinstance(policy, OpenVLAPolicy) and policy.model.value_head is not None
    return [policy.model.value_head]


def observations(n: int = N, seed: int = 0) -> dict[str, Tensor]:
    return random_observations(spec(), n, torch.Generator().manual_seed(seed))


def outputs(policy: BasePolicy, obs: dict[str, Tensor]) -> dict[str, Tensor]:
    """Eval actions, train actions/logprobs (fixed generator) and values."""
    evaluated = policy.predict_action_batch(obs, "eval")
    sampled = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(9))
    assert sampled.prev_logprobs is not None and sampled.prev_values is not None
    return {
        "eval_actions": evaluated.actions,
        "train_actions": sampled.actions,
        "logprobs": sampled.prev_logprobs,
        "values": sampled.prev_values,
    }


def assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    return max(float((a[key] - b[key]).abs().max()) for key in a)


def lora_b(policy: BasePolicy) -> list[nn.Parameter]:
    return [p for name, p in policy.named_parameters() if "lora_B" in name]


def perturb_adapters(policy: BasePolicy, seed: int = 0, std: float = 0.05) -> None:
    """Gives every ``B`` a random value so the adapters change the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in lora_b(policy):
            param.copy_(torch.randn(param.shape, generator=gen) * std)


def expert_actions(policy: BasePolicy, n: int = N) -> Tensor:
    """Random in-range expert actions in the shape ``behaviour_cloning_loss`` takes."""
    steps = HORIZON if isinstance(policy, Pi0Policy) else CHUNKS
    return torch.rand(n, steps, ACTION_DIM, generator=torch.Generator().manual_seed(1)) * 2 - 1


def train_step(policy: BasePolicy, lr: float = 0.5) -> None:
    """One SGD step on the behaviour-cloning loss over ALL parameters (frozen ones included)."""
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
    loss = policy.behaviour_cloning_loss(
        observations(), expert_actions(policy), generator=torch.Generator().manual_seed(2)
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("kind", KINDS)
def test_fresh_adapter_leaves_outputs_unchanged(kind: str, model_dirs: dict[str, Path]) -> None:
    plain = make_policy(kind, model_dirs[kind])
    adapted = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK))
    assert lora_b(adapted) and all(not bool(p.any()) for p in lora_b(adapted))
    obs = observations()
    reference = outputs(plain, obs)
    # B = 0 adds exact zeros, but the extra add can change the memory layout a later
    # kernel sees, so pi0's 4-step ODE may differ in the last bits (~1e-7)
    assert max_difference(outputs(adapted, obs), reference) <= 1e-6
    # the check can fail: a non-zero B changes the outputs
    perturb_adapters(adapted)
    assert max_difference(outputs(adapted, obs), reference) > 1e-4


def fully_trained_count(kind: str, plain: BasePolicy) -> int:
    return sum(p.numel() for name, p in plain.named_parameters() if fully_trained(kind, name))


def hand_count(kind: str, plain: BasePolicy) -> int:
    """``r * (in + out)`` per adapted linear layer (``r * (in * kh * kw + out)`` per conv),
    plus every fully trained parameter."""
    count = 0
    for name, module in plain.named_modules():
        if not name.startswith(SCOPE[kind]) or name.rsplit(".", 1)[-1] not in TARGETS[kind]:
            continue
        if isinstance(module, nn.Linear):
            count += RANK * (module.in_features + module.out_features)
        elif isinstance(module, nn.Conv2d):
            kernel = module.kernel_size[0] * module.kernel_size[1]
            count += RANK * (module.in_channels * kernel + module.out_channels)
    return count + fully_trained_count(kind, plain)


@pytest.mark.parametrize("kind", KINDS)
def test_only_adapters_and_heads_are_trainable(kind: str, model_dirs: dict[str, Path]) -> None:
    plain = make_policy(kind, model_dirs[kind])
    adapted = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK))
    expected = hand_count(kind, plain)
    assert count_parameters(adapted.parameters()) == expected
    total = sum(p.numel() for p in plain.parameters())
    frozen = total - fully_trained_count(kind, plain)
    assert count_parameters(adapted.parameters(), trainable=False) == frozen
    for name, param in adapted.named_parameters():
        assert param.requires_grad == trains(kind, name), name
    # the vision tower(s) and the language model are adapted (attention and MLP), and
    # nothing outside the scope (pi0: the VLM; its action expert trains fully instead)
    adapted_names = {name for name, _ in adapted.named_parameters() if "lora_A" in name}
    assert all(name.startswith(SCOPE[kind]) for name in adapted_names)
    for part, suffixes in ADAPTED_PARTS[kind].items():
        for suffix in suffixes:
            assert any(n.startswith(part) and f".{suffix}." in n for n in adapted_names), (
                part,
                suffix,
            )
    # a smaller rank gives a different count: the hand count is not vacuous
    small = make_policy(kind, model_dirs[kind], LoRAConfig(rank=2))
    assert count_parameters(small.parameters()) < expected


@pytest.mark.parametrize("kind", KINDS)
def test_one_step_changes_adapters_but_no_frozen_tensor(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    policy = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    train_step(policy)
    changed = {
        name for name, p in policy.named_parameters() if not torch.equal(p.detach(), before[name])
    }
    frozen = {name for name, p in policy.named_parameters() if not p.requires_grad}
    assert frozen and not (changed & frozen)
    assert any("lora_B" in name for name in changed)
    assert all(trains(kind, name) for name in changed)


@pytest.mark.parametrize("kind", KINDS)
def test_save_then_reload_with_lora_path_is_bit_identical(
    kind: str, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    lora = LoRAConfig(rank=RANK, alpha=8.0)
    policy = make_policy(kind, model_dirs[kind], lora)
    train_step(policy)
    with torch.no_grad():  # make sure the saved heads differ from the base model's
        for head in head_modules(policy):
            for param in head.parameters():
                param.add_(0.01)
    obs = observations()
    expected = outputs(policy, obs)
    out = policy.save_pretrained(tmp_path / "saved")
    adapter = out / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    if kind == "pi0":  # the heads live beside the weights, not in the adapter
        assert (out / PI0_HEADS_FILE).is_file() and not (adapter / HEADS_FILE).exists()
    else:
        assert (adapter / HEADS_FILE).is_file()
    saved_lora = lora.model_copy(update={"path": adapter})
    reloaded = make_policy(kind, out, saved_lora)
    assert_identical(outputs(reloaded, obs), expected)
    reloaded_state = reloaded.state_dict()
    for key, value in policy.state_dict().items():
        assert torch.equal(value, reloaded_state[key]), key
    from_base = make_policy(kind, model_dirs[kind], saved_lora)
    if kind == "pi0":
        # the trained expert and heads are in the saved directory, not in the adapter:
        # the original base model + lora.path does not restore the policy
        assert max_difference(outputs(from_base, obs), expected) > 1e-4
    else:
        # the adapter directory is self-contained: the original base model + lora.path
        assert_identical(outputs(from_base, obs), expected)
    # a loaded adapter is trainable again
    assert count_parameters(reloaded.parameters()) == count_parameters(policy.parameters())
    # the check can fail: fresh adapters on the same base give other outputs
    fresh = make_policy(kind, model_dirs[kind], lora)
    assert max_difference(outputs(fresh, obs), expected) > 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_independent_builds_share_state_dict_keys_and_load_strict(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    lora = LoRAConfig(rank=RANK)
    actor = make_policy(kind, model_dirs[kind], lora)
    rollout = make_policy(kind, model_dirs[kind], lora)
    assert list(actor.state_dict()) == list(rollout.state_dict())
    train_step(actor)
    obs = observations()
    expected = outputs(actor, obs)
    assert max_difference(outputs(rollout, obs), expected) > 1e-4  # they differ before the sync
    rollout.load_state_dict(actor.state_dict(), strict=True)
    assert_identical(outputs(rollout, obs), expected)
    actor.load_state_dict(rollout.state_dict(), strict=True)
    # a plain policy's state dict does not fit: strict loading would catch a mismatch
    plain = make_policy(kind, model_dirs[kind])
    with pytest.raises(RuntimeError):
        rollout.load_state_dict(plain.state_dict(), strict=True)


@pytest.mark.parametrize("kind", KINDS)
def test_actor_logprobs_equal_rollout_logprobs_with_lora(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    overrides: dict[str, Any] = (
        {"temperature": 1.6, "top_k": 5} if kind == "openvla-oft" else {"flow_sampler": "sde"}
    )
    policy = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK), **overrides)
    perturb_adapters(policy, seed=5)
    out = policy.predict_action_batch(
        observations(8), "train", generator=torch.Generator().manual_seed(13)
    )
    assert out.prev_logprobs is not None and float(out.prev_logprobs.abs().sum()) > 0
    stats = policy(out.forward_inputs, compute_values=True)
    assert float((stats["logprobs"].detach() - out.prev_logprobs).abs().max()) <= 1e-5
    assert out.prev_values is not None
    assert torch.allclose(stats["values"].detach(), out.prev_values, atol=1e-6)
    # gradients reach the adapters and nothing frozen
    (stats["logprobs"].mean() + stats["values"].mean()).backward()
    assert all(p.grad is None for p in policy.parameters() if not p.requires_grad)
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in lora_b(policy))
    # the check can fail: other stored actions score differently
    moved = dict(out.forward_inputs)
    if kind == "openvla-oft":
        moved["action_tokens"] = moved["action_tokens"].roll(1, dims=0)
    else:
        jitter = torch.randn(moved["chains"].shape, generator=torch.Generator().manual_seed(0))
        moved["chains"] = moved["chains"] + 0.05 * jitter
    shifted = policy.default_forward(moved)["logprobs"].detach()
    assert float((shifted - out.prev_logprobs).abs().max()) > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_merged_model_matches_the_adapter_model(kind: str, model_dirs: dict[str, Path]) -> None:
    policy = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK, alpha=32.0))
    perturb_adapters(policy, seed=6)
    assert isinstance(policy, Pi0Policy | OpenVLAPolicy)
    merged = policy.merged_model()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    obs = observations()
    expected = outputs(policy, obs)
    policy.model = merged  # type: ignore[assignment]
    assert max_difference(outputs(policy, obs), expected) <= 1e-5
    # the live policy is untouched by the export
    assert any("lora_" in name for name in policy.peft_model.state_dict())  # type: ignore[union-attr]


def test_bad_lora_configs_name_the_key(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"actor\.model\.lora\.rank=0"):
        LoRAConfig(rank=0)
    with pytest.raises(ValidationError, match=r"actor\.model\.lora\.rank=0"):
        PolicyConfig(model_type="pi0", lora={"rank": 0})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"actor\.model\.lora\.dropout=1\.0"):
        LoRAConfig(rank=4, dropout=1.0)
    with pytest.raises(ValidationError, match=r"actor\.model\.lora\.alpha=-1\.0"):
        LoRAConfig(rank=4, alpha=-1.0)
    with pytest.raises(ValidationError, match=r"actor\.model\.lora\.target_modules"):
        LoRAConfig(rank=4, target_modules=[])
    with pytest.raises(ValidationError, match="rnak"):
        LoRAConfig(rank=4, rnak=4)  # type: ignore[call-arg]
    assert LoRAConfig(rank=8).lora_alpha == 8.0
    assert LoRAConfig(rank=8).modules == list(DEFAULT_LORA_TARGET_MODULES)
    # suffixes the model lacks (pi0 has no fused ``qkv``; OpenVLA's towers do)
    missing = {"pi0": "qkv", "openvla-oft": "c_attn"}
    for kind in KINDS:
        bad = missing[kind]
        with pytest.raises(ValueError, match=r"actor\.model\.lora\.target_modules") as info:
            make_policy(kind, model_dirs[kind], LoRAConfig(rank=4, target_modules=[bad]))
        assert f"'{bad}'" in str(info.value) and "q_proj" in str(info.value)
        with pytest.raises(ValueError, match=rf"\['{bad}'\] match no"):
            make_policy(kind, model_dirs[kind], LoRAConfig(rank=4, target_modules=["v_proj", bad]))
        with pytest.raises(ValueError, match=r"actor\.model\.lora\.path"):
            make_policy(kind, model_dirs[kind], LoRAConfig(rank=4, path=tmp_path / "missing"))
        saved = make_policy(kind, model_dirs[kind], LoRAConfig(rank=4)).save_pretrained(
            tmp_path / f"{kind}_rank4"
        )
        with pytest.raises(ValueError, match=r"actor\.model\.lora\.rank=8 .* rank 4"):
            make_policy(kind, saved, LoRAConfig(rank=8, path=saved / "adapter"))
        with pytest.raises(ValueError, match=r"actor\.model\.lora\.alpha"):
            make_policy(kind, saved, LoRAConfig(rank=4, alpha=2.0, path=saved / "adapter"))


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_holds_only_the_trainable_tensors_and_restores_them(
    kind: str, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The actor's checkpoint layout with LoRA: adapters and heads, no frozen base."""
    from torch.distributed.checkpoint import FileSystemReader

    from rlinf.core.train_state import load_train_state, save_train_state

    policy = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK))
    assert policy.frozen_from_disk and not make_policy(kind, model_dirs[kind]).frozen_from_disk
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    perturb_adapters(policy)
    loss = policy.behaviour_cloning_loss(observations(), expert_actions(policy))
    loss.backward()
    for param in policy.parameters():  # the heads get no gradient from this loss
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    save_train_state(tmp_path, policy, optimizer, {"step": 1}, frozen_from_disk=True)

    saved = {
        key.removeprefix("model.")
        for key in FileSystemReader(str(tmp_path / "dcp")).read_metadata().state_dict_metadata
        if key.startswith("model.")
    }
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert saved == trainable and saved.isdisjoint(policy.frozen_parameter_names())

    fresh = make_policy(kind, model_dirs[kind], LoRAConfig(rank=RANK))
    fresh_optimizer = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    assert load_train_state(tmp_path, fresh, fresh_optimizer, frozen_from_disk=True) == {"step": 1}
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[name]), name
