"""CNN policy for RGB observations (``model_type: cnn``).

``main_images [n, H, W, 3]`` uint8 are scaled to [0, 1], viewed channels-first
and encoded by a Nature-DQN conv stack (8x8/4, 4x4/2, 3x3/1, ReLU) and a
linear layer; when the env also has ``states`` they are concatenated to the
image features. Actor MLP, action head and value head sit on that shared
feature (the encoder is trained by both losses). Any image of at least 36x36
pixels works (64, 84, 128...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models.base import ActorCriticPolicy
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.heads import orthogonal_init
from rlinf.embodied.models.registry import register_policy

__all__ = ["CNNPolicy", "NatureCNNEncoder"]

_CONV_LAYERS = ((8, 4), (4, 2), (3, 1))
"""(kernel, stride) of the Nature-DQN conv layers, in order."""


def _conv_output_size(size: int, layers: Sequence[tuple[int, int]]) -> int:
    for kernel, stride in layers:
        size = (size - kernel) // stride + 1 if size >= kernel else 0
    return size


def _min_image_size(layers: Sequence[tuple[int, int]]) -> int:
    size = 1
    for kernel, stride in reversed(layers):
        size = (size - 1) * stride + kernel
    return size


class NatureCNNEncoder(nn.Module):
    """Conv encoder of ``[n, H, W, C]`` uint8 images into ``[n, feature_dim]`` features.

    Args:
        image_shape: ``(H, W, C)``.
        channels: Output channels of each conv layer (1 to 3 layers).
        feature_dim: Width of the final linear layer.

    Raises:
        ValueError: The image is too small for the conv stack.
    """

    def __init__(
        self, image_shape: tuple[int, int, int], channels: Sequence[int], feature_dim: int
    ) -> None:
        super().__init__()
        height, width, in_channels = image_shape
        layers = _CONV_LAYERS[: len(channels)]
        out_h, out_w = _conv_output_size(height, layers), _conv_output_size(width, layers)
        if out_h < 1 or out_w < 1:
            need = _min_image_size(layers)
            raise ValueError(
                f"image_shape={tuple(image_shape)} is too small for the {len(layers)}-layer "
                f"conv encoder (needs at least {need}x{need}); use larger camera images or "
                "fewer cnn_channels"
            )
        convs: list[nn.Module] = []
        for out_channels, (kernel, stride) in zip(channels, layers, strict=True):
            convs += [nn.Conv2d(in_channels, out_channels, kernel, stride), nn.ReLU()]
            in_channels = out_channels
        self.convs = nn.Sequential(*convs, nn.Flatten())
        self.fc = nn.Linear(in_channels * out_h * out_w, feature_dim)
        self.apply(orthogonal_init(math.sqrt(2.0)))
        self.feature_dim = feature_dim

    def forward(self, images: Tensor) -> Tensor:
        """Encodes uint8 ``[n, H, W, C]`` images (in the parameters' dtype)."""
        x = images.permute(0, 3, 1, 2).to(self.fc.weight.dtype) / 255.0
        return torch.relu(self.fc(self.convs(x)))


@register_policy("cnn")
class CNNPolicy(ActorCriticPolicy):
    """Actor and value heads over conv features of ``obs["main_images"]`` (+ ``states``).

    Args:
        cfg: The policy config (``cnn_channels``, ``cnn_feature_dim``, ``hidden_dims``...).
        spec: The env spec; needs ``image_shape``; uses ``state_dim`` when set.

    Raises:
        ValueError: The env has no image observations, or they are too small.
    """

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        assert spec.image_shape is not None  # checked by check_spec
        self.use_states = spec.state_dim is not None and spec.state_dim > 0
        self.obs_keys = ("main_images", "states") if self.use_states else ("main_images",)
        self.encoder = NatureCNNEncoder(spec.image_shape, cfg.cnn_channels, cfg.cnn_feature_dim)
        state_dim = spec.state_dim if self.use_states and spec.state_dim is not None else 0
        self._build_heads(cfg.cnn_feature_dim + state_dim)

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires image observations (``spec.image_shape``)."""
        super().check_spec(cfg, spec)
        if spec.image_shape is None:
            raise ValueError(
                "model_type 'cnn' reads obs['main_images'] but the env spec has "
                "image_shape=None (state-only observations); use model_type: mlp for state "
                "observations, or an env obs_mode that renders camera images (obs_mode: rgb)"
            )
        if len(spec.image_shape) != 3:
            raise ValueError(
                f"EnvSpec.image_shape={spec.image_shape} must be (H, W, C), e.g. (64, 64, 3)"
            )

    def _encode(self, inputs: Mapping[str, Tensor]) -> Tensor:
        features: Tensor = self.encoder(inputs["main_images"])
        if not self.use_states:
            return features
        return torch.cat([features, inputs["states"].to(features.dtype)], dim=-1)
