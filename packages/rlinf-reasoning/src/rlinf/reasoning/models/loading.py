"""Loading local Hugging Face causal LMs, with errors that name the path.

Nothing is downloaded: ``model_path`` must be a directory written by
``save_pretrained`` (``config.json`` plus weights). A missing path fails with
:class:`FileNotFoundError` before transformers would try the model hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

__all__ = ["checkpoint_weight_names", "load_causal_lm", "resolve_device", "resolve_dtype"]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Parses a dtype name (``"float32"``, ``"bf16"``, ``"fp16"``...) or passes a torch dtype.

    Args:
        dtype: A name or a floating ``torch.dtype``.

    Returns:
        The torch dtype.

    Raises:
        ValueError: For an unknown name or a non-floating dtype.
    """
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        key = dtype.lower().removeprefix("torch.")
        if key not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
        resolved = _DTYPES[key]
    if not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating type, got {resolved}")
    return resolved


def checkpoint_weight_names(model_path: str | Path) -> frozenset[str]:
    """Names of every tensor in a ``save_pretrained`` directory's safetensors.

    Reads the index (``model.safetensors.index.json``) when there is one, else
    each ``*.safetensors`` file's header; no tensor data is loaded.

    Args:
        model_path: The model directory.

    Returns:
        The Hugging Face tensor names.
    """
    path = Path(model_path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return frozenset(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return frozenset(names)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Returns ``device`` as a ``torch.device``; ``None`` means CUDA if available, else CPU.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or ``None``.

    Returns:
        The device. A bare ``"cuda"`` becomes the current CUDA device index.

    Raises:
        RuntimeError: If a CUDA device is requested on a machine without one.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {str(device)!r} requested but CUDA is not available")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def load_causal_lm(
    model_path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
) -> PreTrainedModel:
    """Loads a causal LM from a local directory, in eval mode, on ``device``.

    Args:
        model_path: Directory written by ``save_pretrained``.
        dtype: Parameter dtype (see :func:`resolve_dtype`).
        device: Target device (see :func:`resolve_device`).

    Returns:
        The model, with ``requires_grad`` left as loaded.

    Raises:
        FileNotFoundError: If ``model_path`` does not exist or has no ``config.json``.
    """
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist; pass a local directory written by "
            "save_pretrained (models are never downloaded)"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model path {str(path)!r} has no config.json; it is not a save_pretrained directory"
        )
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    # transformers' stubs type .to()/.eval() loosely; work on an Any handle.
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch_dtype, local_files_only=True
    )
    loaded.to(torch_device)
    loaded.eval()
    model: PreTrainedModel = loaded
    return model
