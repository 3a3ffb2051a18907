"""OpenVLA checkpoint layout: timm key names round trip, the towers against stock transformers
ViTs, and the openvla-7b key list rebuilt on the meta device."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor
from transformers import (
    AutoModel,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from rlinf.embodied.models.vla.openvla.configuration import OpenVLAConfig
from rlinf.embodied.models.vla.openvla.modeling import OpenVLAModel, parameter_layout
from rlinf.embodied.models.vla.openvla.tiny import make_tiny_openvla
from rlinf.embodied.models.vla.openvla.vision import TimmViT

pytestmark = pytest.mark.usefixtures("vla_offline")

LAYOUT_FILE = (
    Path(__file__).resolve().parents[1]
    / "src/rlinf/embodied/models/vla/layouts/openvla_7b_keys.json"
)


def timm_vit_keys(prefix: str, depth: int, *, dinov2: bool) -> set[str]:
    """The documented timm key names of one tower (written out by hand, not from the model)."""
    keys = {
        f"{prefix}.pos_embed",
        f"{prefix}.patch_embed.proj.weight",
        f"{prefix}.patch_embed.proj.bias",
    }
    keys |= {f"{prefix}.norm.weight", f"{prefix}.norm.bias"}
    if dinov2:
        keys |= {f"{prefix}.cls_token", f"{prefix}.reg_token"}
    else:
        pool = ["q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2"]
        keys |= {f"{prefix}.attn_pool.latent"}
        keys |= {f"{prefix}.attn_pool.{m}.{p}" for m in pool for p in ("weight", "bias")}
    mods = ["norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"]
    for n in range(depth):
        keys |= {f"{prefix}.blocks.{n}.{m}.{p}" for m in mods for p in ("weight", "bias")}
        if dinov2:
            keys |= {
                f"{prefix}.blocks.{n}.ls1.scale_factor",
                f"{prefix}.blocks.{n}.ls2.scale_factor",
            }
    return keys


def llama_keys(layers: int) -> set[str]:
    keys = {
        "language_model.model.embed_tokens.weight",
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
    }
    mods = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    mods += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    mods += ["input_layernorm", "post_attention_layernorm"]
    for n in range(layers):
        keys |= {f"language_model.model.layers.{n}.{m}.weight" for m in mods}
    return keys


def linear_keys(prefix: str, names: list[str]) -> set[str]:
    return {f"{prefix}.{n}.{p}" for n in names for p in ("weight", "bias")}


@pytest.mark.parametrize("fused", [True, False])
def test_tiny_checkpoint_uses_the_real_key_names_and_reloads_bit_identical(
    fused: bool, tmp_path: Path
) -> None:
    path = make_tiny_openvla(tmp_path / "m", use_fused=fused, state_dim=2, action_dim=3)
    saved = load_file(str(path / "model.safetensors"))
    expected = timm_vit_keys("vision_backbone.featurizer", 2, dinov2=True) | llama_keys(2)
    if fused:
        expected |= timm_vit_keys("vision_backbone.fused_featurizer", 2, dinov2=False)
    expected |= linear_keys("projector", ["fc1", "fc2", "fc3"] if fused else ["fc1", "fc2"])
    expected |= linear_keys("proprio_projector", ["fc1", "fc2"])
    value_keys = {k for k in saved if k.startswith("value_head.")}
    assert value_keys  # make_tiny_openvla adds a value head by default
    assert set(saved) - value_keys == expected
    # shapes of the timm-specific tensors (DINOv2 pos_embed covers the patches only)
    patches = (32 // 8) ** 2
    assert saved["vision_backbone.featurizer.pos_embed"].shape == (1, patches, 32)
    assert saved["vision_backbone.featurizer.cls_token"].shape == (1, 1, 32)
    assert saved["vision_backbone.featurizer.reg_token"].shape == (1, 4, 32)
    assert saved["vision_backbone.featurizer.blocks.0.attn.qkv.weight"].shape == (96, 32)
    width = 32 + (48 if fused else 0)
    assert saved["projector.fc1.weight"].shape == ((4 * width, width) if fused else (64, width))

    model, info = AutoModel.from_pretrained(str(path), output_loading_info=True)
    assert isinstance(model, OpenVLAModel)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    state = model.state_dict()
    assert set(state) == set(saved)
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    assert json.loads((path / "config.json").read_text())["model_type"] == "openvla"


def _dinov2_as_transformers(vit: TimmViT) -> Dinov2WithRegistersModel:
    spec = vit.spec
    model = Dinov2WithRegistersModel(
        Dinov2WithRegistersConfig(
            hidden_size=spec.hidden_size,
            num_hidden_layers=spec.depth,
            num_attention_heads=spec.num_heads,
            mlp_ratio=spec.mlp_hidden // spec.hidden_size,
            image_size=spec.image_size,
            patch_size=spec.patch_size,
            num_register_tokens=spec.num_registers,
            layer_norm_eps=1e-6,
            hidden_act="gelu",
        )
    )
    src = vit.state_dict()
    dim = spec.hidden_size
    out: dict[str, Tensor] = {
        # timm folds the class position into cls_token; transformers adds position 0 to it
        "embeddings.cls_token": src["cls_token"],
        "embeddings.register_tokens": src["reg_token"],
        "embeddings.position_embeddings": torch.cat(
            [torch.zeros(1, 1, dim), src["pos_embed"]], dim=1
        ),
        "embeddings.patch_embeddings.projection.weight": src["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": src["patch_embed.proj.bias"],
        "embeddings.mask_token": torch.zeros(1, dim),
        "layernorm.weight": src["norm.weight"],
        "layernorm.bias": src["norm.bias"],
    }
    for n in range(spec.depth):
        b, h = f"blocks.{n}.", f"encoder.layer.{n}."
        for part in ("weight", "bias"):
            q, k, v = src[b + f"attn.qkv.{part}"].chunk(3, dim=0)
            out |= {
                h + f"attention.q_proj.{part}": q,
                h + f"attention.k_proj.{part}": k,
                h + f"attention.v_proj.{part}": v,
                h + f"attention.o_proj.{part}": src[b + f"attn.proj.{part}"],
                h + f"norm1.{part}": src[b + f"norm1.{part}"],
                h + f"norm2.{part}": src[b + f"norm2.{part}"],
                h + f"mlp.fc1.{part}": src[b + f"mlp.fc1.{part}"],
                h + f"mlp.fc2.{part}": src[b + f"mlp.fc2.{part}"],
            }
        out[h + "layer_scale1.lambda1"] = src[b + "ls1.scale_factor"]
        out[h + "layer_scale2.lambda1"] = src[b + "ls2.scale_factor"]
    model.load_state_dict(out, strict=True)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _siglip_as_transformers(vit: TimmViT) -> SiglipVisionModel:
    spec = vit.spec
    model = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=spec.hidden_size,
            intermediate_size=spec.mlp_hidden,
            num_hidden_layers=spec.depth,
            num_attention_heads=spec.num_heads,
            image_size=spec.image_size,
            patch_size=spec.patch_size,
            hidden_act="gelu",
            layer_norm_eps=1e-6,
            vision_use_head=False,
        )
    )
    src = vit.state_dict()
    out: dict[str, Tensor] = {
        "embeddings.patch_embedding.weight": src["patch_embed.proj.weight"],
        "embeddings.patch_embedding.bias": src["patch_embed.proj.bias"],
        "embeddings.position_embedding.weight": src["pos_embed"][0],
        "post_layernorm.weight": src["norm.weight"],
        "post_layernorm.bias": src["norm.bias"],
    }
    for n in range(spec.depth):
        b, h = f"blocks.{n}.", f"encoder.layers.{n}."
        for part in ("weight", "bias"):
            q, k, v = src[b + f"attn.qkv.{part}"].chunk(3, dim=0)
            out |= {
                h + f"self_attn.q_proj.{part}": q,
                h + f"self_attn.k_proj.{part}": k,
                h + f"self_attn.v_proj.{part}": v,
                h + f"self_attn.out_proj.{part}": src[b + f"attn.proj.{part}"],
                h + f"layer_norm1.{part}": src[b + f"norm1.{part}"],
                h + f"layer_norm2.{part}": src[b + f"norm2.{part}"],
                h + f"mlp.fc1.{part}": src[b + f"mlp.fc1.{part}"],
                h + f"mlp.fc2.{part}": src[b + f"mlp.fc2.{part}"],
            }
    missing, unexpected = model.load_state_dict(out, strict=False)
    assert not unexpected and set(missing) <= {"embeddings.position_ids"}
    model.eval()  # type: ignore[no-untyped-call]
    return model


def test_timm_towers_match_stock_transformers_vits_second_to_last_block(tmp_path: Path) -> None:
    """Our timm-named towers == Dinov2WithRegistersModel / SiglipVisionModel with qkv chunked."""
    config = OpenVLAConfig.from_pretrained(str(make_tiny_openvla(tmp_path / "m")))
    config.vision_configs = [
        {"hidden_size": 32, "depth": 3, "num_heads": 2, "mlp_hidden": 128, "patch_size": 8},
        {"hidden_size": 48, "depth": 3, "num_heads": 2, "mlp_hidden": 96, "patch_size": 8},
    ]
    torch.manual_seed(0)
    model = OpenVLAModel(config)
    model.eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for param in model.vision_backbone.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    dino, siglip = model.vision_backbone.featurizer, model.vision_backbone.fused_featurizer
    assert siglip is not None
    pixels = torch.randn(2, 6, 32, 32)
    with torch.no_grad():
        ours = model.vision_backbone(pixels)
        hf_dino = _dinov2_as_transformers(dino)(pixels[:, :3], output_hidden_states=True)
        hf_siglip = _siglip_as_transformers(siglip)(pixels[:, 3:], output_hidden_states=True)
    # hidden_states[0] is the embedding output, [i + 1] block i's: block depth-2 is [-2]
    expected_dino = hf_dino.hidden_states[-2][:, 1 + 4 :]  # drop cls + 4 registers
    expected_siglip = hf_siglip.hidden_states[-2]
    assert ours.shape == (2, 16, 32 + 48)
    torch.testing.assert_close(ours[..., :32], expected_dino, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[..., 32:], expected_siglip, atol=1e-5, rtol=1e-5)
    # the last block is not used (OpenVLA reads the second-to-last)
    assert not torch.allclose(ours[..., :32], hf_dino.hidden_states[-1][:, 5:], atol=1e-3)


def test_openvla_7b_layout_rebuilt_on_meta_equals_the_checked_in_list() -> None:
    checked_in = json.loads(LAYOUT_FILE.read_text())
    assert "NOT read from a downloaded checkpoint" in checked_in["_note"]
    layout = parameter_layout(OpenVLAConfig())
    assert layout == checked_in["tensors"]
    total = sum(math.prod(shape) for shape in layout.values())
    assert total == checked_in["num_parameters"]
    assert 7.4e9 < total < 7.7e9
    assert layout["vision_backbone.featurizer.pos_embed"] == [1, 256, 1024]
    assert layout["vision_backbone.featurizer.reg_token"] == [1, 4, 1024]
    assert layout["vision_backbone.fused_featurizer.pos_embed"] == [1, 256, 1152]
    assert layout["vision_backbone.fused_featurizer.blocks.26.mlp.fc1.weight"] == [4304, 1152]
    assert layout["projector.fc1.weight"] == [8704, 2176]
    assert layout["projector.fc2.weight"] == [4096, 8704]
    assert layout["projector.fc3.weight"] == [4096, 4096]
    assert layout["language_model.model.embed_tokens.weight"] == [32064, 4096]
    assert layout["language_model.lm_head.weight"] == [32064, 4096]
    assert layout["language_model.model.layers.31.mlp.gate_proj.weight"] == [11008, 4096]
    expected = timm_vit_keys("vision_backbone.featurizer", 24, dinov2=True)
    expected |= timm_vit_keys("vision_backbone.fused_featurizer", 27, dinov2=False)
    expected |= llama_keys(32) | linear_keys("projector", ["fc1", "fc2", "fc3"])
    assert set(layout) == expected
