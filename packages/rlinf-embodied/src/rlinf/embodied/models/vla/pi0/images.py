"""pi0's image preprocessing, in torch: resize with padding to the tower's size, scale to [-1, 1].

openpi and lerobot feed pi0 square images: each camera frame is resized,
keeping its aspect ratio, so that its longer side is the SigLIP tower's size,
then padded to a square with black, and scaled from ``[0, 255]`` to ``[-1, 1]``.
The parameters can come from a Hugging Face ``preprocessor_config.json``
(``size``/``pad_size``, ``image_mean``, ``image_std``, ``rescale_factor``,
``do_resize``, ``do_pad``, ``do_normalize``); keys that do not change these
numbers (the processor class, resampling names, ``image_seq_length`` ...) are
ignored, so a downloaded processor config loads as is. The transform runs on
the policy's device, and the rollout and the actor run the same ops on the same
uint8 frames, so both see bit-identical pixels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Pi0ImageProcessor", "resize_with_pad"]


def resize_with_pad(pixels: Tensor, size: int, pad_value: float) -> Tensor:
    """Resizes ``[n, 3, H, W]`` floats to ``[n, 3, size, size]``, keeping the aspect ratio.

    The longer side becomes ``size`` (bilinear, no antialiasing, as openpi's torch
    port); the shorter side is padded symmetrically with ``pad_value``.

    Args:
        pixels: Float images.
        size: Output side.
        pad_value: Fill of the padding (black in the input's scale).

    Returns:
        Square images.
    """
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    if (height, width) == (size, size):
        return pixels
    scale = size / max(height, width)
    new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
    resized = F.interpolate(pixels, size=(new_h, new_w), mode="bilinear", align_corners=False)
    pad_h, pad_w = size - new_h, size - new_w
    top, left = pad_h // 2, pad_w // 2
    return F.pad(resized, (left, pad_w - left, top, pad_h - top), value=pad_value)


def _side(data: dict[str, Any], path: Path) -> int | None:
    """The square side a HF processor config asks for (``size`` or ``pad_size``), if any."""
    for key in ("pad_size", "size"):
        value = data.get(key)
        if isinstance(value, int):
            return value
        if isinstance(value, dict):
            sides = {
                int(v)
                for k, v in value.items()
                if k in ("height", "width", "max_height", "max_width", "shortest_edge")
            }
            if len(sides) > 1:
                raise ValueError(f"{path}: {key}={value} is not square; pi0 takes square images")
            if sides:
                return sides.pop()
    return None


@dataclass(frozen=True)
class Pi0ImageProcessor:
    """How camera frames become pi0's ``pixel_values``.

    Attributes:
        image_size: The SigLIP tower's side (``vision_config.image_size``).
        image_mean: Per-channel mean after rescaling (0.5: output in [-1, 1]).
        image_std: Per-channel std after subtracting the mean.
        rescale_factor: uint8 to ``[0, 1]``.
        do_resize: Resize (with padding) frames of another size; else they are an error.
    """

    image_size: int
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1.0 / 255.0
    do_resize: bool = True
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_directory(cls, directory: str | Path, image_size: int) -> Pi0ImageProcessor:
        """Reads ``preprocessor_config.json`` when the directory has one, else pi0's defaults.

        Args:
            directory: The checkpoint directory.
            image_size: The tower's side; the file's size must agree with it.

        Raises:
            ValueError: The file's size disagrees with the tower, or is not square.
        """
        path = Path(directory) / "preprocessor_config.json"
        if not path.is_file():
            return cls(image_size=image_size)
        data = json.loads(path.read_text())
        side = _side(data, path)
        if side is not None and side != image_size:
            raise ValueError(
                f"{path}: size {side} disagrees with the model's vision_config.image_size="
                f"{image_size}; fix the processor config or the model config"
            )
        mean = tuple(data.get("image_mean", (0.5, 0.5, 0.5)))
        std = tuple(data.get("image_std", (0.5, 0.5, 0.5)))
        if not data.get("do_normalize", True):
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"{path}: image_mean and image_std need 3 entries, got {mean}, {std}")
        used = {
            "size",
            "pad_size",
            "image_mean",
            "image_std",
            "rescale_factor",
            "do_resize",
            "do_normalize",
        }
        return cls(
            image_size=image_size,
            image_mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            image_std=(float(std[0]), float(std[1]), float(std[2])),
            rescale_factor=float(data.get("rescale_factor", 1.0 / 255.0)),
            do_resize=bool(data.get("do_resize", True)),
            ignored_keys=tuple(sorted(set(data) - used)),
        )

    def save(self, directory: str | Path) -> Path:
        """Writes a Hugging Face-style ``preprocessor_config.json`` (PI0ImageProcessor's keys)."""
        path = Path(directory) / "preprocessor_config.json"
        payload = {
            "image_processor_type": "PI0ImageProcessor",
            "size": {"max_height": self.image_size, "max_width": self.image_size},
            "pad_size": {"height": self.image_size, "width": self.image_size},
            "do_resize": self.do_resize,
            "do_pad": True,
            "do_rescale": True,
            "rescale_factor": self.rescale_factor,
            "do_normalize": True,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
        }
        path.write_text(json.dumps(payload, indent=2) + "\n")
        return path

    def __call__(self, images: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """uint8 ``[n, H, W, 3]`` frames to normalised ``[n, 3, S, S]`` pixels.

        Raises:
            ValueError: Wrong dtype or layout, or another size without ``do_resize``.
        """
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"camera frames must be uint8 [n, H, W, 3], got {images.dtype} "
                f"{tuple(images.shape)}"
            )
        pixels = images.permute(0, 3, 1, 2).float() * self.rescale_factor
        mean = torch.tensor(self.image_mean, device=pixels.device).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std, device=pixels.device).view(1, 3, 1, 1)
        normalized = (pixels - mean) / std
        if tuple(normalized.shape[-2:]) != (self.image_size, self.image_size):
            if not self.do_resize:
                raise ValueError(
                    f"frames are {tuple(images.shape[1:3])} but the model takes "
                    f"{self.image_size}x{self.image_size} and do_resize is false in "
                    "preprocessor_config.json; render at that size or set do_resize: true"
                )
            black = float(((0.0 - mean) / std).flatten()[0])
            normalized = resize_with_pad(normalized, self.image_size, black)
        return normalized.to(dtype)
