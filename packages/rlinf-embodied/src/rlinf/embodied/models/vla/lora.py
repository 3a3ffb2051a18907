"""LoRA for pi0 and openvla: adapters on the backbones, trainable heads, save and reload.

What: :func:`apply_lora` wraps a loaded ``PI0ForConditionalGeneration`` or
``OpenVLAModel`` in a ``peft`` :class:`~peft.PeftModel`, either with
fresh adapters (``actor.model.lora`` without ``path``) or with a saved adapter
loaded trainable (``lora.path``). PEFT freezes every non-adapter weight; the
model's value head (OpenVLA's ``value_head``) is set trainable again, since it is
small, task-specific and has no pretrained counterpart worth keeping frozen. pi0
adapts only its VLM (``scope="model.vlm"``) and keeps its RL heads outside the
wrapped model; its policy re-enables the action expert itself.

Why this shape:

* The whole model is wrapped (not only its backbones), so adapter names in the
  saved ``adapter_model.safetensors`` are relative to the model, exactly as PEFT
  writes them for any ``PreTrainedModel``. PEFT injects the adapter layers in
  place, so the wrapped model (``PeftModel.get_base_model()``) is the same object,
  keeps its type and methods and the policy keeps calling it directly; the
  ``PeftModel`` itself is only needed for saving.
* Fresh adapters use ``init_lora_weights="gaussian"``: ``B`` starts at zero (so a
  fresh adapter is an exact identity and rollout behaviour is unchanged at
  step 0), ``A`` is drawn with std ``1 / r`` independent of layer width. That is
  the initialisation RLinf uses, so LoRA learning rates tuned there carry over.
* Nothing is ever merged: merging in bf16 and unmerging drifts the weights (an
  RLinf bug class), so rollout and actor both run the unmerged adapter.
  :func:`merged_copy` is an offline export helper only.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

import torch
from peft import LoraConfig, PeftConfig, PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import PreTrainedModel

from rlinf.embodied.models.config import LoRAConfig

__all__ = [
    "ADAPTER_DIR",
    "HEADS_FILE",
    "apply_lora",
    "base_state_dict",
    "count_parameters",
    "head_state_dict",
    "load_head_state_dict",
    "lora_candidate_modules",
    "merged_copy",
]

ADAPTER_DIR = "adapter"
"""Subdirectory of a saved policy directory that holds the adapter (``lora.path``)."""

HEADS_FILE = "trainable_heads.safetensors"
"""File in the adapter directory with the trainable non-adapter tensors (the heads)."""

_TRAINABLE_HEADS = ("value_head",)
"""Submodules that stay trainable under LoRA when the model has them."""

_LORA_INIT: Literal["gaussian"] = "gaussian"
"""PEFT ``init_lora_weights`` of fresh adapters (``B = 0``, ``A ~ N(0, 1/r^2)``)."""

_LORA_LEAF_TYPES = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d)


def lora_candidate_modules(model: nn.Module) -> list[str]:
    """The distinct last name parts of the modules LoRA could adapt (linear, embedding, conv).

    Args:
        model: The model (unwrapped).

    Returns:
        Sorted suffixes, e.g. ``["down_proj", "fc1", ..., "v_proj"]``.
    """
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if name and isinstance(module, _LORA_LEAF_TYPES)
        }
    )


def _matches(name: str, suffix: str) -> bool:
    """PEFT's rule for a list entry: the full name, or the name ending in ``.suffix``."""
    return name == suffix or name.endswith("." + suffix)


def _scoped_pattern(scope: str, suffixes: list[str]) -> str:
    """PEFT's regex form of ``target_modules``: the suffixes, under ``scope`` only."""
    return rf"^{re.escape(scope)}\..*\.({'|'.join(re.escape(s) for s in suffixes)})$"


def _check_targets(model: nn.Module, targets: list[str], scope: str | None = None) -> None:
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, _LORA_LEAF_TYPES) and (scope is None or name.startswith(scope + "."))
    ]
    unmatched = [target for target in targets if not any(_matches(n, target) for n in names)]
    if unmatched:
        raise ValueError(
            f"actor.model.lora.target_modules={targets}: {unmatched} match no linear, "
            f"embedding or conv module of this {type(model).__name__}; use suffixes among "
            f"{lora_candidate_modules(model)} (or null for the default SigLIP + Llama list)"
        )


def _check_saved_adapter(path: Path, cfg: LoRAConfig) -> None:
    if not (path / "adapter_config.json").is_file():
        raise ValueError(
            f"actor.model.lora.path={str(path)!r} has no adapter_config.json; point it at the "
            f"'{ADAPTER_DIR}' directory written by the policy's save_pretrained, or set it to "
            "null for fresh adapters"
        )
    saved = PeftConfig.from_pretrained(str(path))
    if not isinstance(saved, LoraConfig):
        raise ValueError(
            f"actor.model.lora.path={str(path)!r} holds a {saved.peft_type} adapter, not LoRA; "
            "point it at a LoRA adapter directory"
        )
    if saved.r != cfg.rank:
        raise ValueError(
            f"actor.model.lora.rank={cfg.rank} but the adapter at actor.model.lora.path="
            f"{str(path)!r} has rank {saved.r}; set actor.model.lora.rank: {saved.r}"
        )
    if float(saved.lora_alpha) != cfg.lora_alpha:
        raise ValueError(
            f"actor.model.lora.alpha={cfg.alpha} (effective {cfg.lora_alpha}) but the adapter "
            f"at actor.model.lora.path={str(path)!r} has lora_alpha {saved.lora_alpha}; set "
            f"actor.model.lora.alpha: {saved.lora_alpha}"
        )


@contextmanager
def _quiet_peft() -> Iterator[None]:
    """Hides transformers' deprecation notice that PEFT's wrapper triggers on every build."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        yield


def _heads(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` of each trainable head (``value_head``) ``model`` has."""
    for head in _TRAINABLE_HEADS:
        module = getattr(model, head, None)
        if isinstance(module, nn.Module):
            yield head, module


def apply_lora(model: PreTrainedModel, cfg: LoRAConfig, *, scope: str | None = None) -> PeftModel:
    """Adds LoRA adapters to ``model`` in place and returns the PEFT wrapper.

    Every weight except the adapters and the heads (``value_head``) ends up frozen.
    With ``cfg.path`` the saved adapter is loaded trainable, and so are the head
    tensors saved beside it (:data:`HEADS_FILE`), if any.

    Args:
        model: A loaded VLA model (not yet wrapped).
        cfg: The ``actor.model.lora`` section.
        scope: Adapt only modules under this name prefix (pi0: ``model.vlm``, the VLM
            part); None: anywhere in the model.

    Returns:
        The ``PeftModel``; ``.get_base_model()`` is ``model`` itself, now with adapters.

    Raises:
        ValueError: A target suffix matches no module, or ``cfg.path`` is not a LoRA
            adapter directory of the configured rank and alpha.
    """
    if cfg.path is None:
        targets = cfg.modules
        _check_targets(model, targets, scope)
        lora_config = LoraConfig(
            r=cfg.rank,
            # PEFT annotates lora_alpha as int but only divides by r: a float is fine
            lora_alpha=cast(int, cfg.lora_alpha),
            lora_dropout=cfg.dropout,
            target_modules=targets if scope is None else _scoped_pattern(scope, targets),
            init_lora_weights=_LORA_INIT,
            bias="none",
        )
        with _quiet_peft():
            peft_model = PeftModel(model, lora_config)
    else:
        path = Path(cfg.path)
        _check_saved_adapter(path, cfg)
        with _quiet_peft():
            peft_model = PeftModel.from_pretrained(model, str(path), is_trainable=True)
        if (path / HEADS_FILE).is_file():
            load_head_state_dict(model, load_file(str(path / HEADS_FILE)))
    for _, head in _heads(model):
        head.requires_grad_(True)
    return peft_model


def count_parameters(parameters: Iterable[nn.Parameter], *, trainable: bool = True) -> int:
    """Counts the elements of the (trainable or frozen) parameters.

    Args:
        parameters: E.g. ``policy.parameters()``.
        trainable: Count those with ``requires_grad`` (True) or without (False).

    Returns:
        The number of scalar parameters.
    """
    return sum(p.numel() for p in parameters if p.requires_grad == trainable)


def head_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The tensors of the trainable heads, keyed relative to ``model`` (detached, contiguous).

    Args:
        model: The (adapted) model.
    """
    return {
        f"{head}.{key}": value.detach().contiguous()
        for head, module in _heads(model)
        for key, value in module.state_dict().items()
    }


def load_head_state_dict(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Loads :func:`head_state_dict` output into ``model``'s heads (every key must fit).

    Args:
        model: The (adapted) model.
        tensors: Head tensors keyed ``<head>.<name>``.

    Raises:
        ValueError: The keys differ from this model's heads.
    """
    expected = head_state_dict(model)
    if set(tensors) != set(expected):
        raise ValueError(
            f"{HEADS_FILE} holds {sorted(tensors)} but this model's trainable heads are "
            f"{sorted(expected)}; the adapter was saved from a model with other heads "
            "(e.g. add_value_head differs): use the matching base model"
        )
    for head, module in _heads(model):
        prefix = head + "."
        module.load_state_dict(
            {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, strict=True
        )


def base_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state dict as it was before adapters were injected (no LoRA tensors).

    Keys of adapted layers lose their ``.base_layer`` part and the adapter tensors
    are dropped, so the result loads into the plain model class (``save_pretrained``).

    Args:
        model: The adapted model (``PeftModel.get_base_model()``).

    Returns:
        The plain state dict, sharing storage with ``model``.
    """
    adapted = [name for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]
    state = model.state_dict()
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        owner = next((n for n in adapted if key.startswith(n + ".")), None)
        if owner is None:
            out[key] = value
            continue
        rest = key[len(owner) + 1 :]
        if rest.startswith("base_layer."):
            out[f"{owner}.{rest[len('base_layer.') :]}"] = value
    return out


def merged_copy(peft_model: PeftModel) -> nn.Module:
    """An adapter-free copy of the model with ``W + (alpha / r) B A`` folded in (export only).

    The live model is untouched; never use this on the rollout/actor hot path.

    Args:
        peft_model: What :func:`apply_lora` returned.

    Returns:
        A plain model of the original class.
    """
    clone = copy.deepcopy(peft_model)
    with torch.no_grad():
        merged: nn.Module = clone.merge_and_unload()
    if hasattr(merged, "peft_config"):
        del merged.peft_config
    return merged
