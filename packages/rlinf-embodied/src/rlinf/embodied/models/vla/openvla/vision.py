"""OpenVLA's vision side: timm-named ViTs (DINOv2 + SigLIP), fused backbone, image processor.

Why a small ViT whose parameter names *are* timm's, instead of transformers'
``Dinov2WithRegistersModel``/``SiglipVisionModel`` plus a key mapping: the
checkpoint keys (``vision_backbone.featurizer.blocks.N.attn.qkv.weight``, ...) then
load with no renaming at all, so ``from_pretrained`` reports missing/unexpected
keys against the real names and ``save_pretrained`` writes them back; timm's fused
``qkv`` stays one tensor (no chunk/concat on every load and save); and the two
timm details that matter here are explicit: the DINOv2-with-registers layout
(``pos_embed`` covers the patches only; ``cls_token`` already includes its
position, registers have none: timm's ``no_embed_class``) and features taken from
the *second-to-last* block, without the final norm and without prefix tokens
(``get_intermediate_layers(n={depth - 2})``). A test checks these modules
against the stock transformers classes with the weights mapped over.

Images: the fused processor normalises each image twice (DINOv2 with ImageNet
mean/std, SigLIP with 0.5/0.5) and stacks them as 6 channels; the backbone
splits them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import initialization as init

from rlinf.embodied.models.vla.openvla.configuration import ViTSpec
from rlinf.embodied.models.vla.statistics import read_model_json

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "OpenVLAImageProcessor",
    "TimmViT",
    "VisionBackbone",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_LN_EPS = 1e-6
PREPROCESSOR_FILE = "preprocessor_config.json"


def _activation(name: str | None) -> nn.Module:
    if name in (None, "gelu"):
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    return _QuickGELU()


class _QuickGELU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """timm ``Mlp``: ``fc1`` -> activation -> ``fc2``."""

    def __init__(self, dim: int, hidden: int, act: str | None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = _activation(act)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., dim]`` -> ``[..., dim]``."""
        out: Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class Attention(nn.Module):
    """timm ``Attention``: fused ``qkv`` ``[3D, D]`` and ``proj``."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"ViT width {dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """Full (bidirectional) self-attention over ``[B, N, D]``."""
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, dim // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        result: Tensor = self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))
        return result


class LayerScale(nn.Module):
    """DINOv2 LayerScale; the HF port calls timm's ``gamma`` ``scale_factor``."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init_value = init
        self.scale_factor = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        """``x * scale_factor``."""
        return x * self.scale_factor


class Block(nn.Module):
    """timm pre-norm transformer block (LayerScale only for DINOv2)."""

    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        dim = spec.hidden_size
        self.norm1 = nn.LayerNorm(dim, eps=_LN_EPS)
        self.attn = Attention(dim, spec.num_heads)
        self.ls1: nn.Module = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=_LN_EPS)
        self.mlp = Mlp(dim, spec.mlp_hidden, spec.act)
        self.ls2: nn.Module = nn.Identity()
        if spec.family == "dinov2":
            self.ls1 = LayerScale(dim, spec.layer_scale_init)
            self.ls2 = LayerScale(dim, spec.layer_scale_init)

    def forward(self, x: Tensor) -> Tensor:
        """One block over ``[B, N, D]``."""
        x = x + self.ls1(self.attn(self.norm1(x)))
        out: Tensor = x + self.ls2(self.mlp(self.norm2(x)))
        return out


class PatchEmbed(nn.Module):
    """timm ``PatchEmbed``: a strided ``proj`` conv, flattened to ``[B, N, D]``."""

    def __init__(self, patch_size: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixels: Tensor) -> Tensor:
        """``[B, 3, S, S]`` -> ``[B, N, D]``."""
        out: Tensor = self.proj(pixels).flatten(2).transpose(1, 2)
        return out


class AttentionPoolLatent(nn.Module):
    """timm's SigLIP ``attn_pool`` head (kept for its checkpoint keys; OpenVLA never runs it)."""

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str | None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.mlp = Mlp(dim, mlp_hidden, act)

    def forward(self, x: Tensor) -> Tensor:
        """Pools ``[B, N, D]`` into ``[B, D]`` (timm's ``AttentionPoolLatent``)."""
        batch, tokens, dim = x.shape
        head = dim // self.num_heads
        q = self.q(self.latent.expand(batch, -1, -1)).reshape(batch, 1, self.num_heads, head)
        kv = self.kv(x).reshape(batch, tokens, 2, self.num_heads, head).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kv[0], kv[1])
        pooled = self.proj(out.transpose(1, 2).reshape(batch, 1, dim))
        pooled = pooled + self.mlp(self.norm(pooled))
        result: Tensor = pooled[:, 0]
        return result


class TimmViT(nn.Module):
    """A timm ``VisionTransformer`` restricted to what OpenVLA's towers use, under timm's names.

    Args:
        spec: The tower's shape (``dinov2``: class token, registers, LayerScale;
            ``siglip``: no prefix tokens, ``attn_pool`` head).
    """

    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.spec = spec
        dim = spec.hidden_size
        self.num_prefix_tokens = 0
        if spec.family == "dinov2":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.num_prefix_tokens = 1
            if spec.num_registers:
                self.reg_token = nn.Parameter(torch.zeros(1, spec.num_registers, dim))
                self.num_prefix_tokens += spec.num_registers
        elif spec.family != "siglip":
            raise ValueError(f"vision tower family {spec.family!r} is not 'dinov2' or 'siglip'")
        self.pos_embed = nn.Parameter(torch.randn(1, spec.num_patches, dim) * 0.02)
        self.patch_embed = PatchEmbed(spec.patch_size, dim)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(dim, eps=_LN_EPS)
        if spec.family == "siglip":
            self.attn_pool = AttentionPoolLatent(dim, spec.num_heads, spec.mlp_hidden, spec.act)

    @property
    def feature_layer(self) -> int:
        """Index of the block whose output OpenVLA reads: the second-to-last."""
        return max(len(self.blocks) - 2, 0)

    def tokens(self, pixels: Tensor) -> Tensor:
        """Patch embeddings plus positions, with the prefix tokens in front: ``[B, T, D]``."""
        x = self.patch_embed(pixels) + self.pos_embed
        prefix = []
        if self.spec.family == "dinov2":
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
            if self.spec.num_registers:
                prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        return torch.cat([*prefix, x], dim=1)

    def forward(self, pixels: Tensor) -> Tensor:
        """Patch features ``[B, N, D]`` of the second-to-last block (no norm, no prefix tokens)."""
        x = self.tokens(pixels)
        for block in self.blocks[: self.feature_layer + 1]:
            x = block(x)
        return x[:, self.num_prefix_tokens :]


class VisionBackbone(nn.Module):
    """OpenVLA's ``vision_backbone``: ``featurizer`` (+ ``fused_featurizer``), widths concatenated.

    Args:
        specs: One spec (single tower) or two (fused: DINOv2 then SigLIP).
    """

    def __init__(self, specs: Sequence[ViTSpec]) -> None:
        super().__init__()
        self.featurizer = TimmViT(specs[0])
        self.fused_featurizer = TimmViT(specs[1]) if len(specs) > 1 else None

    @property
    def embed_dim(self) -> int:
        """Feature width (1024 + 1152 = 2176 for openvla-7b)."""
        dim = self.featurizer.spec.hidden_size
        if self.fused_featurizer is not None:
            dim += self.fused_featurizer.spec.hidden_size
        return dim

    @property
    def num_patches(self) -> int:
        """Patch tokens per image."""
        return self.featurizer.spec.num_patches

    def forward(self, pixel_values: Tensor) -> Tensor:
        """``[B, 3, S, S]`` (``[B, 6, S, S]`` fused) normalised pixels -> ``[B, N, embed_dim]``."""
        if self.fused_featurizer is None:
            out: Tensor = self.featurizer(pixel_values)
            return out
        first, second = torch.split(pixel_values, [3, 3], dim=1)
        return torch.cat([self.featurizer(first), self.fused_featurizer(second)], dim=2)


def _default_sizes() -> list[list[int]]:
    return [[3, 224, 224], [3, 224, 224]]


def _default_means() -> list[list[float]]:
    return [list(IMAGENET_MEAN), [0.5, 0.5, 0.5]]


def _default_stds() -> list[list[float]]:
    return [list(IMAGENET_STD), [0.5, 0.5, 0.5]]


@dataclass(frozen=True)
class OpenVLAImageProcessor:
    """The fields of the prismatic port's ``preprocessor_config.json`` that the transform uses.

    Attributes:
        input_sizes: ``[3, S, S]`` per tower.
        means: Per-tower channel means (after scaling to ``[0, 1]``).
        stds: Per-tower channel standard deviations.
        image_resize_strategy: Only ``resize-naive`` (plain resize to ``S x S``).
        interpolations: Per-tower resize filter (``bicubic`` or ``bilinear``).
        use_fused_vision_backbone: Two towers: output 6 channels.
    """

    input_sizes: list[list[int]] = field(default_factory=_default_sizes)
    means: list[list[float]] = field(default_factory=_default_means)
    stds: list[list[float]] = field(default_factory=_default_stds)
    image_resize_strategy: str = "resize-naive"
    interpolations: list[str] = field(default_factory=lambda: ["bicubic", "bicubic"])
    use_fused_vision_backbone: bool = True

    @property
    def image_size(self) -> int:
        """The side ``S`` every tower takes."""
        return int(self.input_sizes[0][-1])

    @property
    def num_towers(self) -> int:
        """1, or 2 when fused."""
        return 2 if self.use_fused_vision_backbone else 1

    def __call__(self, images: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """uint8 ``[n, H, W, 3]`` -> ``[n, 3 * towers, S, S]`` normalised pixels.

        Other sizes are resized (``resize-naive``; bicubic with antialiasing, a float
        approximation of PIL's uint8 resize) and clamped to ``[0, 1]``.

        Raises:
            ValueError: Wrong dtype or layout.
        """
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"images must be uint8 [n, H, W, 3], got {images.dtype} {tuple(images.shape)}"
            )
        pixels = images.permute(0, 3, 1, 2).float() / 255.0
        outputs = []
        for tower in range(self.num_towers):
            size = int(self.input_sizes[tower][-1])
            resized = pixels
            if tuple(pixels.shape[-2:]) != (size, size):
                mode = self.interpolations[tower]
                resized = F.interpolate(
                    pixels, size=(size, size), mode=mode, antialias=True, align_corners=False
                ).clamp(0.0, 1.0)
            mean = torch.tensor(self.means[tower], device=pixels.device).view(1, 3, 1, 1)
            std = torch.tensor(self.stds[tower], device=pixels.device).view(1, 3, 1, 1)
            outputs.append((resized - mean) / std)
        return torch.cat(outputs, dim=1).to(dtype)

    def to_json(self) -> dict[str, Any]:
        """The ``preprocessor_config.json`` content (prismatic field names)."""
        return {
            "image_processor_type": "PrismaticImageProcessor",
            "input_sizes": self.input_sizes,
            "means": self.means,
            "stds": self.stds,
            "image_resize_strategy": self.image_resize_strategy,
            "interpolations": self.interpolations,
            "use_fused_vision_backbone": self.use_fused_vision_backbone,
        }

    def save(self, directory: str | Path) -> Path:
        """Writes ``preprocessor_config.json`` into ``directory``."""
        import json

        path = Path(directory) / PREPROCESSOR_FILE
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> OpenVLAImageProcessor:
        """Reads ``preprocessor_config.json`` (the prismatic port's format).

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: An unsupported resize strategy or interpolation, or missing fields.
        """
        path, data = read_model_json(directory, PREPROCESSOR_FILE, "(OpenVLA image processor)")
        missing = [key for key in ("input_sizes", "means", "stds") if key not in data]
        if missing:
            raise ValueError(
                f"{path} lacks {missing}; an OpenVLA preprocessor_config.json has input_sizes, "
                "means and stds per vision tower"
            )
        strategy = data.get("image_resize_strategy", "resize-naive")
        if strategy != "resize-naive":
            raise ValueError(
                f"{path}: image_resize_strategy={strategy!r} is not supported; only "
                "'resize-naive' (openvla-7b's) is"
            )
        fused = bool(data.get("use_fused_vision_backbone", len(data["input_sizes"]) > 1))
        towers = 2 if fused else 1
        interpolations = list(data.get("interpolations", ["bicubic"] * towers))
        bad = [mode for mode in interpolations if mode not in ("bicubic", "bilinear")]
        if bad:
            raise ValueError(f"{path}: interpolations {bad} are not 'bicubic' or 'bilinear'")
        return cls(
            input_sizes=[list(map(int, s)) for s in data["input_sizes"]],
            means=[list(map(float, m)) for m in data["means"]],
            stds=[list(map(float, s)) for s in data["stds"]],
            image_resize_strategy=strategy,
            interpolations=interpolations,
            use_fused_vision_backbone=fused,
        )


def init_vit_parameters(module: nn.Module) -> None:
    """Initialises the timm-only parameters of a :mod:`.vision` module (``_init_weights`` hook).

    Uses ``transformers.initialization``, which skips tensors already loaded from a
    checkpoint. Other modules are left to the caller.
    """
    if isinstance(module, LayerScale):
        init.constant_(module.scale_factor, module.init_value)
    elif isinstance(module, TimmViT):
        init.normal_(module.pos_embed, std=0.02)
        for name in ("cls_token", "reg_token"):
            param = getattr(module, name, None)
            if isinstance(param, nn.Parameter):
                init.normal_(param, std=1e-6 if name == "cls_token" else 0.02)
    elif isinstance(module, AttentionPoolLatent):
        init.normal_(module.latent, std=module.latent.shape[-1] ** -0.5)
