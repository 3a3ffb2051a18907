"""VLA building blocks shared by both families, loading/saving, construction errors, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models import BasePolicy, PolicyConfig, build_policy
from rlinf.embodied.models.config import ValueType
from rlinf.embodied.models.vla.action_bins import ActionBins
from rlinf.embodied.models.vla.instructions import (
    build_instruction_tokenizer,
    encode_instructions,
)
from rlinf.embodied.models.vla.preprocessing import VLAImageProcessor
from rlinf.embodied.models.vla.statistics import (
    STATISTICS_FILE,
    load_action_normalizer,
    write_dataset_statistics,
)
from rlinf.embodied.models.vla.tiny import (
    DEFAULT_INSTRUCTIONS,
    main,
    make_tiny_vla,
    random_observations,
    tiny_env_spec,
)

STATE_DIM = 3
ACTION_DIM = 2
CHUNKS = 4
Kind = Literal["token", "flow"]
KINDS: tuple[Kind, ...] = ("token", "flow")


pytestmark = pytest.mark.usefixtures("vla_offline")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vla_common")
    return {
        kind: make_tiny_vla(
            kind,
            root / kind,
            state_dim=STATE_DIM,
            action_dim=ACTION_DIM,
            num_action_chunks=CHUNKS,
            action_horizon=6 if kind == "flow" else None,
        )
        for kind in KINDS
    }


def spec() -> EnvSpec:
    return tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM)


def _build(kind: str, path: Path, **overrides: Any) -> BasePolicy:
    cfg = PolicyConfig(
        model_type=f"{kind}_vla", model_path=path, num_action_chunks=CHUNKS, **overrides
    )
    return build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))


# --- action bins -------------------------------------------------------------------------------


def test_bin_round_trip_is_within_half_a_bin_and_ids_fill_the_reserved_range() -> None:
    bins = ActionBins(n_bins=32, vocab_size=50)
    values = torch.cat([torch.linspace(-1.0, 1.0, 1001), torch.tensor([-1.0, 1.0, 0.0])])
    ids = bins.values_to_ids(values)
    assert int(ids.min()) == 50 - 32 and int(ids.max()) == 49
    assert set(ids.tolist()) == set(range(18, 50))  # every reserved id is used, nothing else
    centres = bins.ids_to_values(ids)
    assert float((centres - values).abs().max()) <= bins.width / 2 + 1e-6
    # the documented mapping, both ways: bin b <-> id vocab - n_bins + b, centre -1 + (b + .5) w
    assert bins.bins_to_ids(torch.tensor([0, 31])).tolist() == [18, 49]
    assert bins.ids_to_bins(torch.tensor([18, 49])).tolist() == [0, 31]
    assert bins.bins_to_values(torch.tensor([0])).item() == pytest.approx(-1 + 1 / 32)
    assert bins.values_to_bins(torch.tensor([-0.99, 0.99, 5.0, -5.0])).tolist() == [0, 31, 31, 0]
    for outside in (17, 50):
        with pytest.raises(ValueError, match="outside the action bins"):
            bins.ids_to_bins(torch.tensor([outside]))


# --- statistics ----------------------------------------------------------------------------------


def _write_stats(directory: Path) -> None:
    write_dataset_statistics(
        directory,
        {
            "bridge": {
                "q01": [0.0, -2.0, 5.0],
                "q99": [10.0, 2.0, 7.0],
                "min": [-1.0, -4.0, 0.0],
                "max": [11.0, 4.0, 9.0],
                "mask": [True, True, False],
            },
            "libero_spatial_no_noops": {
                "q01": [0.0] * 3,
                "q99": [1.0] * 3,
                "min": [0.0] * 3,
                "max": [1.0] * 3,
                "mask": [True] * 3,
            },
        },
    )


def test_denormalize_matches_a_hand_computation_with_a_masked_dim(tmp_path: Path) -> None:
    _write_stats(tmp_path)
    key, q99 = load_action_normalizer(tmp_path, "bridge")
    assert key == "bridge"
    x = torch.tensor([[-1.0, 0.0, 0.5], [1.0, 0.5, -0.3]])
    # low + (x + 1) / 2 * (high - low); dim 2 is masked and passes through
    expected = torch.tensor([[0.0, 0.0, 0.5], [10.0, 1.0, -0.3]])
    assert torch.allclose(q99.denormalize(x), expected, atol=1e-6)
    _, min_max = load_action_normalizer(tmp_path, "bridge", bounds="min_max")
    expected_mm = torch.tensor([[-1.0, 0.0, 0.5], [11.0, 2.0, -0.3]])
    assert torch.allclose(min_max.denormalize(x), expected_mm, atol=1e-6)
    assert torch.allclose(q99.normalize(q99.denormalize(x)), x, atol=1e-6)


def test_unnorm_key_errors_list_the_available_keys(tmp_path: Path) -> None:
    _write_stats(tmp_path)
    with pytest.raises(ValueError, match=r"actor\.model\.unnorm_key") as ambiguous:
        load_action_normalizer(tmp_path, None)
    assert "bridge" in str(ambiguous.value) and "libero_spatial_no_noops" in str(ambiguous.value)
    with pytest.raises(ValueError, match=r"actor\.model\.unnorm_key='fractal'") as missing:
        load_action_normalizer(tmp_path, "fractal")
    assert "['bridge', 'libero_spatial_no_noops']" in str(missing.value)
    key, _ = load_action_normalizer(tmp_path, "libero_spatial")  # the _no_noops fallback
    assert key == "libero_spatial_no_noops"


# --- tokenizer and preprocessing ---------------------------------------------------------------


def test_instruction_tokenizer_round_trips_through_auto_tokenizer(tmp_path: Path) -> None:
    tokenizer = build_instruction_tokenizer(["Move to the red square.", "go to the green block"])
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids, mask = encode_instructions(loaded, ["move to the red square.", "go to the green block"], 8)
    vocab = loaded.get_vocab()
    expected_first = [vocab[w] for w in ["[BOS]", "move", "to", "the", "red", "square", "."]]
    assert ids[0].tolist() == [0, *expected_first]  # left-padded with [PAD] = 0
    assert mask[0].tolist() == [0] + [1] * 7
    assert mask[1].tolist() == [0, 0] + [1] * 6
    assert torch.equal(
        ids,
        encode_instructions(tokenizer, ["move to the red square.", "go to the green block"], 8)[0],
    )
    with pytest.raises(ValueError, match=r"\['purple'\]"):
        encode_instructions(loaded, ["move to the purple square"], 8)
    with pytest.raises(ValueError, match="max_prompt_length is 4"):
        encode_instructions(loaded, ["move to the red square"], 4)


def test_image_preprocessing_is_a_fixed_affine_map(tmp_path: Path) -> None:
    processor = VLAImageProcessor(image_size=4, image_mean=[0.5, 0.0, 0.5], image_std=[0.5, 1, 2])
    processor.save(tmp_path)
    loaded = VLAImageProcessor.load(tmp_path)
    assert loaded == processor
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    images[..., 0] = 255
    images[1, ..., 2] = 51
    pixels = loaded(images)
    assert pixels.shape == (2, 3, 4, 4)
    assert torch.allclose(pixels[:, 0], torch.ones(2, 4, 4))  # (1 - 0.5) / 0.5
    assert torch.allclose(pixels[:, 1], torch.zeros(2, 4, 4))
    assert torch.allclose(pixels[1, 2], torch.full((4, 4), (0.2 - 0.5) / 2))
    with pytest.raises(ValueError, match="do_resize"):
        loaded(torch.zeros(1, 8, 8, 3, dtype=torch.uint8))


def test_importing_the_models_package_does_not_import_transformers() -> None:
    code = "import sys, rlinf.embodied.models; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- loading, saving, construction errors ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["token", "flow"])
def test_save_pretrained_then_from_pretrained_is_bit_identical(
    kind: str, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    first = _build(kind, model_dirs[kind])
    copy = tmp_path / "copy"
    shutil.copytree(model_dirs[kind], copy)
    (copy / "model.safetensors").unlink()
    assert isinstance(first.model, PreTrainedModel)
    first.model.save_pretrained(str(copy))
    second = _build(kind, copy)
    assert isinstance(
        AutoModel.from_pretrained(str(copy), local_files_only=True), type(first.model)
    )
    obs = random_observations(spec(), 5, torch.Generator().manual_seed(0))
    for mode in ("eval", "train"):
        a = first.predict_action_batch(obs, mode, generator=torch.Generator().manual_seed(1))
        b = second.predict_action_batch(obs, mode, generator=torch.Generator().manual_seed(1))
        assert torch.equal(a.actions, b.actions)
        assert a.prev_logprobs is not None and b.prev_logprobs is not None
        assert torch.equal(a.prev_logprobs, b.prev_logprobs)
        assert a.prev_values is not None and b.prev_values is not None
        assert torch.equal(a.prev_values, b.prev_values)
    for (name, p), (_, q) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("kind", ["token", "flow"])
def test_missing_model_path_names_the_key(kind: str) -> None:
    cfg = PolicyConfig(model_type=f"{kind}_vla", num_action_chunks=CHUNKS)
    with pytest.raises(ValueError, match=r"actor\.model\.model_path"):
        build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))


@pytest.mark.parametrize("kind", ["token", "flow"])
def test_spec_and_config_mismatches_name_key_value_and_fix(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    path = model_dirs[kind]
    model_type = f"{kind}_vla"

    def build(spec_kwargs: dict[str, Any], **cfg_kwargs: Any) -> None:
        cfg_kwargs.setdefault("num_action_chunks", CHUNKS)
        cfg = PolicyConfig(model_type=model_type, model_path=path, **cfg_kwargs)
        build_policy(
            cfg, tiny_env_spec(**{"state_dim": STATE_DIM, "action_dim": ACTION_DIM, **spec_kwargs})
        )

    with pytest.raises(ValueError, match=r"EnvSpec\.action_dim=3 .*action_dim=2.*--action-dim 3"):
        build({"action_dim": 3})
    with pytest.raises(
        ValueError, match=r"actor\.model\.num_action_chunks=2 .*num_action_chunks: 4"
    ):
        build({}, num_action_chunks=2)
    with pytest.raises(ValueError, match=r"EnvSpec\.state_dim=5 .*state_dim=3"):
        build({"state_dim": 5})
    with pytest.raises(ValueError, match=r"EnvSpec\.image_shape=\(64, 64, 3\).*do_resize"):
        build({"image_size": 64})
    with pytest.raises(ValueError, match=r"actor\.model\.value_type='chunk_level'.*action_level"):
        build({}, value_type="chunk_level")
    with pytest.raises(ValueError, match=r"'reach the violet target'.*\['violet'\]"):
        build({"instructions": ("reach the violet target",)})
    with pytest.raises(ValueError, match="needs language instructions"):
        no_language = replace(
            tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM), instructions=None
        )
        build_policy(
            PolicyConfig(model_type=model_type, model_path=path, num_action_chunks=CHUNKS),
            no_language,
        )
    with pytest.raises(ValueError, match=r"actor\.model\.unnorm_key='bridge'.*\['tiny'\]"):
        build({}, unnorm_key="bridge")
    other = "flow" if kind == "token" else "token"
    with pytest.raises(ValueError, match=f"needs a 'rlinf_{other}_vla' model"):
        cfg = PolicyConfig(model_type=f"{other}_vla", model_path=path, num_action_chunks=CHUNKS)
        build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))


def test_a_model_without_value_head_refuses_add_value_head(tmp_path: Path) -> None:
    path = make_tiny_vla("token", tmp_path, action_dim=ACTION_DIM, add_value_head=False)
    with pytest.raises(ValueError, match=r"actor\.model\.add_value_head=true.*no value head"):
        build_policy(
            PolicyConfig(model_type="token_vla", model_path=path, num_action_chunks=4),
            tiny_env_spec(action_dim=ACTION_DIM),
        )
    policy = build_policy(
        PolicyConfig(
            model_type="token_vla", model_path=path, num_action_chunks=4, add_value_head=False
        ),
        tiny_env_spec(action_dim=ACTION_DIM),
    )
    obs = random_observations(tiny_env_spec(action_dim=ACTION_DIM), 3)
    assert torch.equal(policy.get_value(obs), torch.zeros(3, 4))
    out = policy.predict_action_batch(obs)
    with pytest.raises(ValueError, match="add_value_head"):
        policy.default_forward(out.forward_inputs, compute_values=True)


@pytest.mark.parametrize("kind", ["token", "flow"])
@pytest.mark.parametrize(("value_type", "width"), [("action_level", CHUNKS), ("chunk_level", 1)])
def test_values_are_n_by_v(kind: Kind, value_type: ValueType, width: int, tmp_path: Path) -> None:
    path = make_tiny_vla(
        kind,
        tmp_path,
        action_dim=ACTION_DIM,
        value_type=value_type,
        num_action_chunks=CHUNKS,
    )
    policy = build_policy(
        PolicyConfig(
            model_type=f"{kind}_vla",
            model_path=path,
            num_action_chunks=CHUNKS,
            value_type=value_type,
        ),
        tiny_env_spec(action_dim=ACTION_DIM),
    )
    obs = random_observations(
        tiny_env_spec(action_dim=ACTION_DIM), 6, torch.Generator().manual_seed(3)
    )
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(0))
    assert out.prev_values is not None and out.prev_values.shape == (6, width)
    values = policy.get_value(obs)
    assert values.shape == (6, width) and values.dtype == torch.float32
    recomputed = policy.default_forward(out.forward_inputs, compute_values=True)["values"]
    assert torch.allclose(recomputed, out.prev_values, atol=1e-6)
    assert torch.allclose(values, out.prev_values, atol=1e-6)
    assert float(values.std()) > 0  # depends on the observation


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_writes_a_complete_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny"
    assert (
        main(
            [
                "--kind",
                "flow",
                "--out",
                str(out),
                "--action-dim",
                "3",
                "--state-dim",
                "2",
                "--num-action-chunks",
                "2",
                "--action-horizon",
                "3",
                "--instruction",
                "pick up the cube",
                "--instruction",
                "open the drawer",
            ]
        )
        == 0
    )
    assert "wrote a tiny flow VLA" in capsys.readouterr().out
    expected = {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        STATISTICS_FILE,
    }
    assert expected <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["action_dim"], config["action_horizon"]) == (
        "rlinf_flow_vla",
        3,
        3,
    )
    policy = build_policy(
        PolicyConfig(model_type="flow_vla", model_path=out, num_action_chunks=2),
        tiny_env_spec(
            state_dim=2, action_dim=3, instructions=("open the drawer", "pick up the cube")
        ),
    )
    assert sum(p.numel() for p in policy.parameters()) > 100_000
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    assert "--num-action-chunks" in capsys.readouterr().out


def test_cli_sft_steps_train_on_the_task_and_need_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--kind", "flow", "--state-dim", "2", "--no-value-head"]
    assert main([*args, "--out", str(tmp_path / "a"), "--sft-steps", "3"]) == 2
    assert "--task" in capsys.readouterr().err and not (tmp_path / "a").exists()
    out = tmp_path / "b"
    assert main([*args, "--out", str(out), "--task", "lang_reach_fixed", "--sft-steps", "3"]) == 0
    assert "SFT on lang_reach_fixed: success" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file()


def test_default_instructions_are_the_lang_reach_templates() -> None:
    assert len(DEFAULT_INSTRUCTIONS) == 3 and "move to the red square" in DEFAULT_INSTRUCTIONS


def test_the_vla_tests_cannot_reach_the_network() -> None:
    """The ``vla_offline`` guard: loading code that tried a hub would fail these tests."""
    import socket

    with pytest.raises(OSError, match=r"tried to reach 'huggingface\.co'"):
        socket.create_connection(("huggingface.co", 443), timeout=1)
    with socket.socket() as sock, pytest.raises(OSError, match=r"tried to reach '203\.0\.113\.7'"):
        sock.connect(("203.0.113.7", 443))


@pytest.mark.parametrize("kind", KINDS)
def test_wrist_image_is_a_second_image_the_actions_depend_on(kind: Kind, tmp_path: Path) -> None:
    path = make_tiny_vla(kind, tmp_path / kind, state_dim=STATE_DIM, wrist_image=True)
    wrist_spec = tiny_env_spec(state_dim=STATE_DIM, wrist_image=True)
    cfg = PolicyConfig(model_type=f"{kind}_vla", model_path=path, num_action_chunks=CHUNKS)
    policy = build_policy(cfg, wrist_spec)
    obs = random_observations(wrist_spec, 6, torch.Generator().manual_seed(0))
    out = policy.predict_action_batch(obs, "train", generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.forward_inputs["wrist_images"], obs["wrist_images"])
    with torch.no_grad():  # the actor re-scores with both images
        stats = policy.default_forward(out.forward_inputs)
    assert out.prev_logprobs is not None
    assert float((stats["logprobs"] - out.prev_logprobs).abs().max()) <= 1e-5
    other = {**obs, "wrist_images": torch.flip(obs["wrist_images"], dims=[1])}
    first = policy.predict_action_batch(obs, "eval").actions
    assert not torch.equal(first, policy.predict_action_batch(other, "eval").actions)
    with pytest.raises(KeyError, match="wrist_images"):
        policy.predict_action_batch({k: v for k, v in obs.items() if k != "wrist_images"})
    with pytest.raises(ValueError, match="wrist_camera"):
        build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM))
