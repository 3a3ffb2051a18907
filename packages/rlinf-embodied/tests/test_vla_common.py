"""What both VLA policies (pi0, OpenVLA-OFT) share: action statistics, loading and saving,
construction errors, values, the wrist camera, the ``make-tiny-vla`` CLI, the offline guard."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models import BasePolicy, PolicyConfig, build_policy
from rlinf.embodied.models.config import ValueType
from rlinf.embodied.models.vla.action_bins import ActionBins
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
HORIZON = 6
"""pi0's ``chunk_size`` (it executes the first ``CHUNKS``)."""
Kind = Literal["pi0", "openvla-oft"]
KINDS: tuple[Kind, ...] = ("pi0", "openvla-oft")
MODEL_TYPES = {"pi0": "pi0", "openvla-oft": "openvla"}


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
            action_horizon=HORIZON if kind == "pi0" else None,
        )
        for kind in KINDS
    }


def spec() -> EnvSpec:
    return tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM)


def _build(kind: str, path: Path, **overrides: Any) -> BasePolicy:
    cfg = PolicyConfig(
        model_type=MODEL_TYPES[kind], model_path=path, num_action_chunks=CHUNKS, **overrides
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


def test_importing_the_models_package_does_not_import_transformers() -> None:
    code = "import sys, rlinf.embodied.models; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- loading, saving, construction errors ---------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_save_pretrained_then_loading_is_bit_identical(
    kind: str, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    first = _build(kind, model_dirs[kind])
    with torch.no_grad():  # weights that differ from the loaded directory's
        for param in first.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=torch.Generator().manual_seed(0)))
    copy = first.save_pretrained(tmp_path / "copy")
    second = _build(kind, copy)
    assert type(second.model) is type(first.model)
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
    # the check can fail: the original directory holds other weights
    original = _build(kind, model_dirs[kind])
    assert not torch.equal(
        original.predict_action_batch(obs, "eval").actions,
        first.predict_action_batch(obs, "eval").actions,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_missing_model_path_names_the_key(kind: str) -> None:
    cfg = PolicyConfig(model_type=MODEL_TYPES[kind], num_action_chunks=CHUNKS)
    with pytest.raises(ValueError, match=r"actor\.model\.model_path"):
        build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))


MISMATCHES: dict[str, list[tuple[dict[str, Any], dict[str, Any], str]]] = {
    "pi0": [
        ({"action_dim": 3}, {}, r"cover 2 dims but the env acts in action_dim=3.*unnorm_key"),
        ({}, {"num_action_chunks": 7}, r"num_action_chunks=7 exceeds the model's chunk_size=6"),
    ],
    "openvla-oft": [
        ({"action_dim": 3}, {}, r"EnvSpec\.action_dim=3 .*action_dim=2.*action_dim=3\)"),
        ({}, {"num_action_chunks": 2}, r"num_action_chunks=2 .*num_action_chunks: 4"),
        ({"state_dim": 5}, {}, r"EnvSpec\.state_dim=5 .*proprio_dim=3"),
        ({}, {"value_type": "chunk_level"}, r"value_type='chunk_level'.*action_level"),
    ],
}
"""``(spec changes, actor.model changes, error)`` per family."""
OTHER_FAMILY = {
    "pi0": ("openvla", r"model_type='pi0' but model_type 'openvla' needs"),
    "openvla-oft": ("pi0", r"is not a pi0 config.*model_type.*openvla"),
}
"""The other policy pointed at this family's directory, and its error."""


@pytest.mark.parametrize("kind", KINDS)
def test_spec_and_config_mismatches_name_key_value_and_fix(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    path = model_dirs[kind]
    model_type = MODEL_TYPES[kind]

    def build(spec_kwargs: dict[str, Any], **cfg_kwargs: Any) -> None:
        cfg_kwargs.setdefault("num_action_chunks", CHUNKS)
        cfg = PolicyConfig(model_type=model_type, model_path=path, **cfg_kwargs)
        build_policy(
            cfg, tiny_env_spec(**{"state_dim": STATE_DIM, "action_dim": ACTION_DIM, **spec_kwargs})
        )

    for spec_kwargs, cfg_kwargs, message in MISMATCHES[kind]:
        with pytest.raises(ValueError, match=message):
            build(spec_kwargs, **cfg_kwargs)
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
    other, message = OTHER_FAMILY[kind]
    with pytest.raises(ValueError, match=message):
        cfg = PolicyConfig(model_type=other, model_path=path, num_action_chunks=CHUNKS)
        build_policy(cfg, tiny_env_spec(state_dim=STATE_DIM, action_dim=ACTION_DIM))
    build({})  # the matching spec and config build


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_value_head_values_are_zero_and_cannot_be_recomputed(
    kind: str, model_dirs: dict[str, Path]
) -> None:
    policy = _build(kind, model_dirs[kind], add_value_head=False)
    obs = random_observations(spec(), 3)
    assert torch.equal(policy.get_value(obs), torch.zeros(3, CHUNKS))
    out = policy.predict_action_batch(obs)
    with pytest.raises(ValueError, match="add_value_head"):
        policy.default_forward(out.forward_inputs, compute_values=True)


@pytest.mark.parametrize("kind", KINDS)
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
            model_type=MODEL_TYPES[kind],
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


CLI_CONFIG = {
    "pi0": {"model_type": "pi0", "chunk_size": 3},
    "openvla-oft": {
        "model_type": "openvla",
        "decode_mode": "parallel",
        "action_dim": 3,
        "num_action_chunks": 2,
        "proprio_dim": 2,
    },
}
"""``config.json`` entries the CLI call below must produce."""


@pytest.mark.parametrize("kind", KINDS)
def test_cli_writes_a_complete_directory(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny"
    assert (
        main(
            [
                "--kind",
                kind,
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
    assert f"wrote a tiny {kind} VLA" in capsys.readouterr().out
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
    assert {key: config[key] for key in CLI_CONFIG[kind]} == CLI_CONFIG[kind]
    policy = build_policy(
        PolicyConfig(model_type=MODEL_TYPES[kind], model_path=out, num_action_chunks=2),
        tiny_env_spec(
            state_dim=2, action_dim=3, instructions=("open the drawer", "pick up the cube")
        ),
    )
    assert sum(p.numel() for p in policy.parameters()) > 100_000
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    assert "--num-action-chunks" in capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS)
def test_cli_sft_steps_train_on_the_task_and_need_one(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--kind", kind, "--state-dim", "2", "--no-value-head"]
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


def test_wrist_image_is_a_second_image_the_actions_depend_on(tmp_path: Path) -> None:
    """pi0 takes the wrist camera as a second image; OpenVLA has no wrist input."""
    path = make_tiny_vla("pi0", tmp_path / "pi0", state_dim=STATE_DIM, wrist_image=True)
    wrist_spec = tiny_env_spec(state_dim=STATE_DIM, wrist_image=True)
    cfg = PolicyConfig(model_type="pi0", model_path=path, num_action_chunks=CHUNKS)
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
    with pytest.raises(ValueError, match="no wrist camera input"):
        make_tiny_vla("openvla-oft", tmp_path / "openvla_oft", wrist_image=True)
