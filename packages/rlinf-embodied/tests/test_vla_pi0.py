"""``model_type: pi0`` on transformers' PI0ForConditionalGeneration: layouts, numerics, RL contract.

Every model here is the stock class at a tiny size, written to a directory in a
real checkpoint layout and loaded through the policy's own loading code, offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PI0ForConditionalGeneration

from rlinf.embodied.models import PolicyConfig, build_policy
from rlinf.embodied.models.config import FlowSampler, FlowStart, LoRAConfig
from rlinf.embodied.models.vla.pi0.checkpoint import LAYOUTS, Layout, read_pi0_config, to_layout
from rlinf.embodied.models.vla.pi0.images import Pi0ImageProcessor, resize_with_pad
from rlinf.embodied.models.vla.pi0.layout_list import LAYOUT_FILE, full_size_layout
from rlinf.embodied.models.vla.pi0.policy import HEADS_FILE, Pi0Policy
from rlinf.embodied.models.vla.pi0.prompts import clean_instruction
from rlinf.embodied.models.vla.pi0.sampling import sample_chain
from rlinf.embodied.models.vla.pi0.tiny import make_tiny_pi0
from rlinf.embodied.models.vla.tiny import DEFAULT_INSTRUCTIONS, random_observations, tiny_env_spec

pytestmark = pytest.mark.usefixtures("vla_offline")

STATE_DIM, ACTION_DIM, CHUNKS, HORIZON, STEPS, N = 3, 2, 3, 5, 4, 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_pi0(
        tmp_path_factory.mktemp("pi0"),
        instructions=DEFAULT_INSTRUCTIONS,
        action_dim=ACTION_DIM,
        chunk_size=HORIZON,
        num_steps=STEPS,
        state_dim=STATE_DIM,
        seed=3,
    )


def spec(wrist: bool = False) -> object:
    return tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM, wrist_image=wrist)


def make_policy(
    model_dir: Path,
    sampler: FlowSampler = "sde",
    start: FlowStart = "zero",
    *,
    wrist: bool = False,
    **overrides: object,
) -> Pi0Policy:
    cfg = PolicyConfig(
        model_type="pi0",
        model_path=model_dir,
        num_action_chunks=CHUNKS,
        flow_sampler=sampler,
        flow_start=start,
        **overrides,  # type: ignore[arg-type]
    )
    policy = build_policy(cfg, spec(wrist))  # type: ignore[arg-type]
    assert isinstance(policy, Pi0Policy)
    return policy


def observations(n: int = N, seed: int = 0, wrist: bool = False) -> dict[str, torch.Tensor]:
    return random_observations(spec(wrist), n, torch.Generator().manual_seed(seed))  # type: ignore[arg-type]


# ---------------------------------------------------------------- checkpoint layouts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_loads_bit_identical_with_no_missing_or_unexpected_keys(
    tmp_path: Path, layout: Layout
) -> None:
    directory = make_tiny_pi0(
        tmp_path / layout, layout=layout, instructions=DEFAULT_INSTRUCTIONS, seed=5
    )
    reference = make_tiny_pi0(tmp_path / "reference", instructions=DEFAULT_INSTRUCTIONS, seed=5)
    expected = load_file(str(reference / "model.safetensors"))
    stored = load_file(str(directory / "model.safetensors"))
    if layout != "transformers":
        assert set(stored) != set(expected)  # really another naming
    config, _ = read_pi0_config(directory)
    model, info = PI0ForConditionalGeneration.from_pretrained(
        str(directory), config=config, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    loaded = model.state_dict()
    assert set(loaded) == set(expected)
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    policy = build_policy(
        PolicyConfig(model_type="pi0", model_path=directory, num_action_chunks=2),
        tiny_env_spec(),
    )
    assert isinstance(policy, Pi0Policy)


def test_lerobot_layout_uses_lerobot_names_and_config(tmp_path: Path) -> None:
    directory = make_tiny_pi0(tmp_path, layout="lerobot", instructions=DEFAULT_INSTRUCTIONS)
    names = set(load_file(str(directory / "model.safetensors")))
    assert "model.paligemma_with_expert.paligemma.lm_head.weight" in names
    assert "model.state_proj.weight" in names
    assert any(".vision_tower.vision_model.encoder.layers.0." in name for name in names)
    config = json.loads((directory / "config.json").read_text())
    assert config["type"] == "pi0" and "model_type" not in config


def test_lerobot_config_translation_reads_the_sizes_and_rejects_unknown_variants(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "type": "pi0",
                "chunk_size": 50,
                "max_state_dim": 32,
                "max_action_dim": 32,
                "num_inference_steps": 10,
                "paligemma_variant": "gemma_2b",
                "action_expert_variant": "gemma_300m",
                "image_resolution": [224, 224],
            }
        )
    )
    config, layout = read_pi0_config(tmp_path)
    assert layout == "lerobot"
    assert config.vlm_config.text_config.hidden_size == 2048
    assert config.dit_config.hidden_size == 1024
    assert config.vlm_config.vision_config.image_size == 224
    assert (config.chunk_size, config.num_inference_steps) == (50, 10)
    (tmp_path / "config.json").write_text(
        json.dumps({"type": "pi0", "paligemma_variant": "gemma_9b"})
    )
    with pytest.raises(ValueError, match="paligemma_variant='gemma_9b'"):
        read_pi0_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="not a pi0 config"):
        read_pi0_config(tmp_path)


def test_full_size_key_list_matches_the_checked_in_pi0_base_layout() -> None:
    checked_in = json.loads(LAYOUT_FILE.read_text())
    rebuilt = full_size_layout()  # on the meta device: no memory allocated
    assert rebuilt == checked_in["tensors"]
    total = sum(int(torch.Size(shape).numel()) for shape in rebuilt.values())
    assert total == checked_in["parameters"]
    assert 3.4e9 < total < 3.6e9
    assert rebuilt["model.paligemma_with_expert.paligemma.lm_head.weight"] == [257152, 2048]
    assert rebuilt["model.state_proj.weight"] == [1024, 32]


def test_save_pretrained_writes_a_transformers_layout_that_reloads_exactly(
    model_dir: Path, tmp_path: Path
) -> None:
    policy = make_policy(model_dir, add_value_head=True, value_type="chunk_level")
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.01)
    out = policy.save_pretrained(tmp_path / "saved")
    assert json.loads((out / "config.json").read_text())["model_type"] == "pi0"
    assert (out / HEADS_FILE).is_file() and (out / "tokenizer.json").is_file()
    again = make_policy(out, add_value_head=True, value_type="chunk_level")
    for (name, a), (_, b) in zip(
        policy.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- numerics


def test_ode_with_a_given_start_equals_transformers_sample_actions(model_dir: Path) -> None:
    policy = make_policy(model_dir, "ode")
    obs = observations()
    inputs = policy._read_obs(obs)
    noise = torch.randn(N, HORIZON, 8, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        prefix = policy._prefix(inputs)
        chain = sample_chain(
            policy.model, policy.heads, prefix, sampler="ode", noise_level=0.5, start=noise
        )
        texts = policy.spec.task_descriptions(inputs["task_ids"])
        input_ids, mask = policy.prompts.batch(texts, torch.device("cpu"))
        pixels = policy.image_processor(inputs["main_images"]).unsqueeze(1)
        reference = policy.model.sample_actions(
            state=prefix.state,
            input_ids=input_ids,
            pixel_values=pixels,
            noise=noise.clone(),
            attention_mask=mask,
            pixel_attention_mask=torch.ones(N, 1, dtype=torch.bool),
        )
    assert (chain.actions - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("start", ["zero", "sampled"])
@pytest.mark.parametrize("sampler", ["sde", "noise"])
def test_actor_logprobs_equal_rollout_logprobs(
    model_dir: Path, sampler: FlowSampler, start: FlowStart
) -> None:
    policy = make_policy(model_dir, sampler, start, add_value_head=True)
    out = policy.predict_action_batch(observations(), generator=torch.Generator().manual_seed(1))
    assert out.actions.shape == (N, CHUNKS, ACTION_DIM)
    assert out.prev_logprobs.shape == (N, CHUNKS * ACTION_DIM)
    again = policy(out.forward_inputs, compute_entropy=True, compute_values=True)
    assert (again["logprobs"] - out.prev_logprobs).abs().max() <= 1e-5
    assert out.prev_values is not None
    assert (again["values"] - out.prev_values).abs().max() <= 1e-5
    assert again["logprobs"].requires_grad and again["entropy"].shape == out.prev_logprobs.shape


def test_only_the_executed_chunk_and_env_dims_are_scored(model_dir: Path) -> None:
    policy = make_policy(model_dir, "noise")
    out = policy.predict_action_batch(observations(), generator=torch.Generator().manual_seed(2))
    chains = out.forward_inputs["chains"]
    assert chains.shape == (N, STEPS + 1, HORIZON, 8)  # the whole padded chunk is stored
    assert out.prev_logprobs.shape == (N, CHUNKS * ACTION_DIM)  # but only C x A_env scored
    assert (out.forward_inputs["denoise_inds"] == 1).all()


def test_eval_is_deterministic_and_sde_marks_one_step(model_dir: Path) -> None:
    policy = make_policy(model_dir, "sde")
    obs = observations()
    first = policy.predict_action_batch(obs, mode="eval").actions
    second = policy.predict_action_batch(obs, mode="eval").actions
    assert torch.equal(first, second)
    train = policy.predict_action_batch(obs, generator=torch.Generator().manual_seed(3))
    marked = train.forward_inputs["denoise_inds"]
    assert (marked.sum(dim=1) == 1).all() and (marked == marked[:1]).all()


def test_the_prefix_attends_to_the_wrist_camera_too(model_dir: Path) -> None:
    policy = make_policy(model_dir, "ode", wrist=True)
    obs = observations(wrist=True)
    base = policy.predict_action_batch(obs, mode="eval").actions
    changed = {**obs, "wrist_images": 255 - obs["wrist_images"]}
    assert not torch.equal(base, policy.predict_action_batch(changed, mode="eval").actions)
    assert policy.prompts.image_tokens == 2 * 16


def test_behaviour_cloning_loss_decreases(model_dir: Path) -> None:
    policy = make_policy(model_dir)
    obs = observations(16)
    actions = torch.rand(16, CHUNKS, ACTION_DIM, generator=torch.Generator().manual_seed(4)) - 0.5
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for step in range(40):
        loss = policy.behaviour_cloning_loss(
            obs, actions, generator=torch.Generator().manual_seed(step % 4)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-4:]) < 0.6 * sum(losses[:4])
    with pytest.raises(ValueError, match="A_env=2"):
        policy.behaviour_cloning_loss(obs, torch.zeros(16, CHUNKS, 5))


# ---------------------------------------------------------------- inputs


def test_resize_with_pad_keeps_the_aspect_ratio_and_pads_black() -> None:
    frames = torch.full((1, 16, 32, 3), 255, dtype=torch.uint8)  # wide white frame
    pixels = Pi0ImageProcessor(image_size=32)(frames)
    assert pixels.shape == (1, 3, 32, 32)
    assert torch.allclose(pixels[:, :, 8:24], torch.ones(1, 3, 16, 32))  # the frame, centred
    assert torch.allclose(pixels[:, :, :8], -torch.ones(1, 3, 8, 32))  # black bands
    assert resize_with_pad(torch.zeros(2, 3, 10, 10), 10, -1.0).shape == (2, 3, 10, 10)


def test_a_hugging_face_processor_config_with_extra_keys_loads(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "PI0ImageProcessor",
                "resample": 3,
                "image_seq_length": 256,
                "size": {"max_height": 224, "max_width": 224},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )
    processor = Pi0ImageProcessor.from_directory(tmp_path, 224)
    assert processor.image_size == 224 and "resample" in processor.ignored_keys
    with pytest.raises(ValueError, match=r"vision_config\.image_size=32"):
        Pi0ImageProcessor.from_directory(tmp_path, 32)


def test_prompt_is_image_tokens_bos_instruction_newline(model_dir: Path) -> None:
    policy = make_policy(model_dir)
    tokenizer = policy.prompts.tokenizer
    ids, mask = policy.prompts.encode("move_to the red square\n")
    image_tokens = policy.prompts.image_tokens
    assert (ids[:image_tokens] == policy.model.config.vlm_config.image_token_id).all()
    assert int(ids[image_tokens]) == tokenizer.bos_token_id
    text = tokenizer.decode(ids[image_tokens + 1 : int(mask.sum())])
    assert (
        text == clean_instruction("move_to the red square\n") + "\n" == "move to the red square\n"
    )
    assert (ids[int(mask.sum()) :] == tokenizer.pad_token_id).all()


def test_an_instruction_never_seen_in_training_tokenizes_without_unknown_ids(
    model_dir: Path,
) -> None:
    policy = make_policy(model_dir)
    ids, mask = policy.prompts.encode("nudge the crimson cube!")
    assert policy.prompts.tokenizer.unk_token_id not in ids[: int(mask.sum())].tolist()
    with pytest.raises(ValueError, match="more than the model's prompt length 16"):
        policy.prompts.encode("go " * 40)


def test_openpi_norm_stats_denormalise_with_mean_and_std(tmp_path: Path) -> None:
    directory = make_tiny_pi0(
        tmp_path, instructions=DEFAULT_INSTRUCTIONS, stats_format="openpi", state_dim=STATE_DIM
    )
    stats = {
        "actions": {"mean": [1.0, -2.0], "std": [0.5, 3.0]},
        "state": {"mean": [0.0] * STATE_DIM, "std": [2.0] * STATE_DIM},
    }
    (directory / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}))
    policy = build_policy(
        PolicyConfig(model_type="pi0", model_path=directory, num_action_chunks=2),
        spec(),  # type: ignore[arg-type]
    )
    assert isinstance(policy, Pi0Policy)
    normalizer = policy.statistics.actions
    assert torch.allclose(
        normalizer.denormalize(torch.tensor([[2.0, 1.0]])), torch.tensor([[2.0, 1.0]]), atol=1e-5
    )
    assert policy.statistics.state is not None and policy.statistics.source == "norm_stats.json"


# ---------------------------------------------------------------- LoRA and errors


def test_lora_adapts_only_the_vlm_and_the_expert_trains_fully(
    model_dir: Path, tmp_path: Path
) -> None:
    policy = make_policy(model_dir, lora=LoRAConfig(rank=4))
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    adapters = {name for name in trainable if "lora_" in name}
    assert adapters and all(name.startswith("model.model.vlm.") for name in adapters)
    assert any(name.startswith("model.model.dit.") for name in trainable)
    assert (
        "model.action_out_proj.weight" in trainable and "heads.value_head.net.0.weight" in trainable
    )
    frozen = policy.frozen_parameter_names()
    unused = {"model.model.dit.embed_tokens.weight"}  # no forward reads it
    assert frozen and all(name.startswith("model.model.vlm.") for name in frozen - unused)
    assert unused <= frozen
    obs = observations()
    before = policy.predict_action_batch(obs, mode="eval").actions  # B = 0: identity
    assert torch.equal(
        before, make_policy(model_dir).predict_action_batch(obs, mode="eval").actions
    )
    out = policy.save_pretrained(tmp_path / "lora")
    assert (out / "adapter" / "adapter_config.json").is_file()
    reloaded = make_policy(out, lora=LoRAConfig(rank=4, path=out / "adapter"))
    assert torch.equal(before, reloaded.predict_action_batch(obs, mode="eval").actions)


def test_errors_name_the_key_the_value_and_the_fix(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"actor\.model\.model_path is not set"):
        build_policy(PolicyConfig(model_type="pi0"), spec())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_action_chunks=9 exceeds the model's chunk_size=5"):
        build_policy(
            PolicyConfig(model_type="pi0", model_path=model_dir, num_action_chunks=9),
            spec(),  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="action_dim=3"):
        build_policy(
            PolicyConfig(model_type="pi0", model_path=model_dir, num_action_chunks=2),
            tiny_env_spec(state_dim=STATE_DIM, action_dim=3),
        )
    with pytest.raises(ValueError, match="action_dim=12 exceeds the model's max_action_dim=8"):
        build_policy(
            PolicyConfig(model_type="pi0", model_path=model_dir, num_action_chunks=2),
            tiny_env_spec(state_dim=STATE_DIM, action_dim=12),
        )
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in model_dir.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors.pop("action_out_proj.weight")
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="1 missing"):
        build_policy(
            PolicyConfig(model_type="pi0", model_path=broken, num_action_chunks=2),
            spec(),  # type: ignore[arg-type]
        )


def test_to_layout_inverts_the_transformers_conversion_map() -> None:
    names = {"model.vlm.language_model.embed_tokens.weight": torch.zeros(1)}
    assert list(to_layout(names, "openpi")) == ["paligemma_with_expert.paligemma.lm_head.weight"]
    assert list(to_layout(names, "lerobot")) == [
        "model.paligemma_with_expert.paligemma.lm_head.weight"
    ]


def test_save_pretrained_copies_side_files_but_no_stale_weight_index(
    model_dir: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for item in model_dir.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    (source / "model.safetensors.index.json").write_text("{}")  # a sharded checkpoint's index
    (source / "README.md").write_text("model card")
    out = make_policy(source).save_pretrained(tmp_path / "out")
    assert (out / "README.md").read_text() == "model card"
    assert (out / "tokenizer.json").is_file() and (out / "dataset_statistics.json").is_file()
    assert not (out / "model.safetensors.index.json").exists()
    assert isinstance(make_policy(out), Pi0Policy)
