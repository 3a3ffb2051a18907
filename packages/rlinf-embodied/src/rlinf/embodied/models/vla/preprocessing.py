"""Deterministic image preprocessing: uint8 ``[n, H, W, 3]`` to normalised ``[n, 3, S, S]`` floats.

Rollout ships raw uint8 images in ``forward_inputs`` (4x smaller than floats) and
the actor re-runs this same function, so both sides see bit-identical pixels. The
parameters live in ``preprocessor_config.json`` beside the weights, like a Hugging
Face image processor, but the transform itself is a few torch ops that run on the
model's device.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["PREPROCESSOR_FILE", "VLAImageProcessor", "read_model_json"]

PREPROCESSOR_FILE = "preprocessor_config.json"


def read_model_json(directory: str | Path, name: str, hint: str) -> tuple[Path, Any]:
    """``(path, parsed content)`` of the JSON file ``name`` in a VLA model directory.

    Raises:
        FileNotFoundError: The file is missing (the message names it and ends with ``hint``).
    """
    path = Path(directory) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; a VLA model directory needs {name} {hint}")
    return path, json.loads(path.read_text())


def _half() -> list[float]:
    return [0.5, 0.5, 0.5]


@dataclass(frozen=True)
class VLAImageProcessor:
    """How images become vision-tower inputs.

    Attributes:
        image_size: Side ``S`` the vision tower expects.
        image_mean: Per-channel mean subtracted after rescaling.
        image_std: Per-channel standard deviation divided after subtracting the mean.
        rescale_factor: Multiplier from uint8 to ``[0, 1]``.
        do_resize: Bilinearly resize other sizes to ``S`` (otherwise they are an error).
    """

    image_size: int = 32
    image_mean: list[float] = field(default_factory=_half)
    image_std: list[float] = field(default_factory=_half)
    rescale_factor: float = 1.0 / 255.0
    do_resize: bool = False

    def __call__(self, images: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Normalises a batch of images.

        Args:
            images: ``[n, H, W, 3]`` uint8.
            dtype: Output dtype.

        Returns:
            ``[n, 3, S, S]`` normalised pixels.

        Raises:
            ValueError: Wrong dtype/layout, or a size other than ``S`` without ``do_resize``.
        """
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"images must be uint8 [n, H, W, 3], got {images.dtype} {tuple(images.shape)}"
            )
        pixels = images.permute(0, 3, 1, 2).float() * self.rescale_factor
        if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            if not self.do_resize:
                raise ValueError(
                    f"images are {tuple(images.shape[1:3])} but the model expects "
                    f"{self.image_size}x{self.image_size}; set do_resize: true in "
                    f"{PREPROCESSOR_FILE} or feed images of that size"
                )
            pixels = F.interpolate(
                pixels, size=(self.image_size, self.image_size), mode="bilinear", antialias=False
            )
        mean = torch.tensor(self.image_mean, device=pixels.device).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std, device=pixels.device).view(1, 3, 1, 1)
        return ((pixels - mean) / std).to(dtype)

    def save(self, directory: str | Path) -> Path:
        """Writes ``preprocessor_config.json`` into ``directory`` and returns its path."""
        path = Path(directory) / PREPROCESSOR_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> VLAImageProcessor:
        """Reads ``preprocessor_config.json`` from a model directory.

        Raises:
            FileNotFoundError: The file is missing (the message names the directory).
            ValueError: The file has keys this processor does not know.
        """
        path, data = read_model_json(
            directory,
            PREPROCESSOR_FILE,
            "(write one with rlinf.embodied.models.vla.tiny or VLAImageProcessor.save)",
        )
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path} has unknown keys {unknown}; known keys: {sorted(known)}")
        return cls(**data)
