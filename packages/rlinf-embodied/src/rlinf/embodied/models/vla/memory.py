"""How much GPU memory a full-size VLA needs per GPU, before launching (``vla-memory``).

The parameter counts come from the real architectures built on the meta device
(no memory is allocated): pi0 (``PI0Config()``, 3.5 B) and OpenVLA-7B
(``OpenVLAConfig()``, 7.5 B). The byte counts follow what the FSDP actor and the
rollout hold:

* **actor** (FSDP over ``actor_gpus`` ranks, everything sharded evenly): every
  parameter in ``precision`` (bf16: 2 bytes, fp32: 4), plus for each trainable
  parameter its gradient and AdamW's two moments in the same dtype (AdamW keeps
  its state in the parameters' dtype);
* **rollout** (one full copy per rollout GPU): every parameter in ``precision``;
* **collocated** (actor and rollout on the same GPU): their sum; with
  ``actor.enable_offload`` / ``rollout.enable_offload`` the idle side's state
  waits in host memory, so the peak is the larger of the two.

With LoRA (``actor.model.lora``) the frozen base weights stay, but only the
adapters (``rank * (in + out)`` per adapted linear layer), the heads and, for
pi0, the action expert (LoRA goes on the VLM only) carry gradients and optimizer
state. Activations, the KV cache, CUDA context and allocator fragmentation come
on top and depend on batch sizes: leave a few GB of headroom. These are
computed figures, not measurements: no GPU run of a full-size VLA has been made
here (unchecked).

Command line::

    uv run vla-memory --model pi0 --gpus 1 4 --lora-rank 32
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from rlinf.embodied.models.config import DEFAULT_LORA_TARGET_MODULES

__all__ = ["MODELS", "MemoryEstimate", "ParameterCounts", "count_parameters", "estimate", "main"]

ModelName = Literal["pi0", "openvla"]
MODELS: tuple[ModelName, ...] = ("pi0", "openvla")

_UNUSED = ("model.dit.embed_tokens.",)
_GIB = 1024**3


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of a full-size model.

    Attributes:
        total: Every parameter.
        trained_with_lora: Parameters that still train under LoRA (pi0: the expert
            and its projections; OpenVLA: none besides the heads), adapters excluded.
        adapter: LoRA adapter parameters at the given rank.
        unused: Parameters no forward reads (pi0's expert vocabulary embedding, kept for
            the checkpoint layout): stored, never given gradients or optimizer state.
    """

    total: int
    trained_with_lora: int
    adapter: int
    unused: int = 0


def _build_meta(model: ModelName) -> nn.Module:
    with torch.device("meta"):
        if model == "pi0":
            from transformers import PI0Config, PI0ForConditionalGeneration

            return PI0ForConditionalGeneration(PI0Config())
        from rlinf.embodied.models.vla.openvla.configuration import OpenVLAConfig
        from rlinf.embodied.models.vla.openvla.modeling import OpenVLAModel

        return OpenVLAModel(OpenVLAConfig(add_value_head=False))


def _pi0_scope() -> str:
    from rlinf.embodied.models.vla.pi0.policy import LORA_SCOPE

    return LORA_SCOPE + "."


def _lora_suffixes(model: ModelName) -> tuple[str, ...]:
    if model == "pi0":
        return DEFAULT_LORA_TARGET_MODULES
    from rlinf.embodied.models.vla.openvla.policy import LORA_TARGET_MODULES

    return tuple(LORA_TARGET_MODULES)


def count_parameters(model: ModelName, lora_rank: int) -> ParameterCounts:
    """Counts the full-size model's parameters on the meta device.

    Args:
        model: ``pi0`` or ``openvla``.
        lora_rank: The adapters' rank ``r``.

    Returns:
        The counts.
    """
    module = _build_meta(model)
    total = sum(p.numel() for p in module.parameters())
    suffixes = _lora_suffixes(model)
    adapter = 0
    for name, layer in module.named_modules():
        if not isinstance(layer, nn.Linear) or name.rsplit(".", 1)[-1] not in suffixes:
            continue
        if model == "pi0" and not name.startswith(_pi0_scope()):
            continue
        adapter += lora_rank * (layer.in_features + layer.out_features)
    unused = sum(p.numel() for n, p in module.named_parameters() if n.startswith(_UNUSED))
    trained = 0
    if model == "pi0":
        trained = sum(
            p.numel()
            for n, p in module.named_parameters()
            if not n.startswith((_pi0_scope(), *_UNUSED))
        )
    return ParameterCounts(total=total, trained_with_lora=trained, adapter=adapter, unused=unused)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one setting.

    Attributes:
        actor: Actor state per actor GPU.
        rollout: Rollout weights per rollout GPU.
        collocated: Actor plus rollout on one GPU, without offload.
        collocated_offload: The same with offload (the larger of the two).
    """

    actor: int
    rollout: int
    collocated: int
    collocated_offload: int


def estimate(
    counts: ParameterCounts, *, lora: bool, actor_gpus: int, precision: str = "bf16"
) -> MemoryEstimate:
    """Per-GPU bytes for one setting (see the module docstring for the model).

    Args:
        counts: The model's counts.
        lora: Train with LoRA adapters instead of every weight.
        actor_gpus: FSDP ranks the actor's state is sharded over.
        precision: ``bf16`` or ``fp32`` (``actor.model.precision``).

    Raises:
        ValueError: A bad precision or GPU count.
    """
    if precision not in ("bf16", "fp32") or actor_gpus < 1:
        raise ValueError(f"precision={precision!r} (bf16|fp32), actor_gpus={actor_gpus} (>= 1)")
    size = 2 if precision == "bf16" else 4
    weights = (counts.total + (counts.adapter if lora else 0)) * size
    trainable = counts.trained_with_lora + counts.adapter if lora else counts.total - counts.unused
    actor = (weights + 3 * trainable * size) // actor_gpus
    rollout = weights
    return MemoryEstimate(actor, rollout, actor + rollout, max(actor, rollout))


def table(model: ModelName, gpus: Sequence[int], lora_rank: int, precision: str) -> str:
    """A Markdown table of :func:`estimate` for full fine-tuning and LoRA at each GPU count."""
    counts = count_parameters(model, lora_rank)
    rows = [
        f"{model}: {counts.total / 1e9:.2f} B parameters ({precision}); LoRA rank {lora_rank}: "
        f"{counts.adapter / 1e6:.1f} M adapter parameters"
        + (
            f", plus the {counts.trained_with_lora / 1e6:.0f} M of the action expert"
            if counts.trained_with_lora
            else ""
        ),
        "",
        "| training | actor GPUs | actor / GPU | rollout / GPU | collocated "
        "| collocated + offload |",
        "|---|---|---|---|---|---|",
    ]
    for lora in (False, True):
        for n in gpus:
            e = estimate(counts, lora=lora, actor_gpus=n, precision=precision)
            cells = [e.actor, e.rollout, e.collocated, e.collocated_offload]
            label = f"LoRA r={lora_rank}" if lora else "full"
            rows.append(
                f"| {label} | {n} | " + " | ".join(f"{c / _GIB:.1f} GiB" for c in cells) + " |"
            )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the per-GPU memory table of each requested model; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="vla-memory",
        description="GPU memory per GPU of full-size pi0 / OpenVLA-7B by placement, computed "
        "from the architectures on the meta device (weights, gradients, AdamW state; "
        "activations excluded). Computed, not measured.",
    )
    parser.add_argument("--model", choices=MODELS, action="append", help="default: both")
    parser.add_argument(
        "--gpus", type=int, nargs="+", default=[1, 2, 4, 8], help="actor GPU counts"
    )
    parser.add_argument("--lora-rank", type=int, default=32, help="adapter rank (default 32)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args(argv)
    if args.lora_rank < 1 or any(n < 1 for n in args.gpus):
        print("vla-memory: --lora-rank and --gpus must be >= 1", file=sys.stderr)
        return 2
    for model in args.model or MODELS:
        print(table(model, args.gpus, args.lora_rank, args.precision))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
