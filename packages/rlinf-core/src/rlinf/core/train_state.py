"""An actor's training state in a checkpoint, one layout for every stack.

Under ``global_step_N/actor/`` every actor writes:

- ``dcp/``: the model's and the optimizer's state through
  ``torch.distributed.checkpoint`` (each rank writes its own shards, in
  parallel; loading reshards, so a run may resume on another world size);
- ``extra_rank{r}.pt``: this rank's RNG states and what the stack adds (the
  step, the LR scheduler, a weight version, ...).

A model whose frozen parameters every worker loads from the same place (a
LoRA base) passes ``frozen_from_disk=True``: the checkpoint then holds only
its trainable parameters and buffers (the adapter), and loading leaves the
frozen ones as they are.

Both functions are collective over the actor's process group: every rank calls
them. torch is imported here (the ``rl`` extra of rlinf-core);
``torch.distributed.checkpoint`` (DTensor, sympy: ~3 s) only when called, so
that a driver importing an actor class does not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlinf.core.checkpoint import rng_state, set_rng_state

__all__ = ["load_train_state", "save_train_state"]


def _options(frozen_from_disk: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=frozen_from_disk, strict=not frozen_from_disk)


def save_train_state(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    *,
    frozen_from_disk: bool = False,
    process_group: Any = None,
) -> None:
    """Writes the model and optimizer shards and this rank's extras into ``folder``.

    Args:
        folder: The checkpoint's ``actor`` folder (created if missing).
        model: The (FSDP-wrapped) model.
        optimizer: Its optimizer.
        extra: Picklable per-rank state to keep beside them; the RNG states are added.
        frozen_from_disk: Leave the frozen parameters out (see the module docstring).
        process_group: The ranks that hold the model (default: all ranks of the
            default group); an online-scaling actor passes its base ranks' group.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    folder.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=_options(frozen_from_disk))
    dcp_save(
        {"model": model_state, "optim": optim_state},
        checkpoint_id=str(folder / "dcp"),
        process_group=process_group,
    )
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    torch.save({**extra, "rng": rng_state()}, folder / f"extra_rank{rank}.pt")


def load_train_state(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    frozen_from_disk: bool = False,
    process_group: Any = None,
) -> dict[str, Any]:
    """Restores what :func:`save_train_state` wrote and this rank's RNG states.

    A rank that has no extras file of its own (the run resumes on more ranks)
    takes rank 0's.

    Args:
        folder: The checkpoint's ``actor`` folder.
        model: The model to load into.
        optimizer: Its optimizer.
        frozen_from_disk: The value the checkpoint was saved with.
        process_group: The ranks that hold the model (see :func:`save_train_state`).

    Returns:
        This rank's extras (what the stack passed to :func:`save_train_state`).

    Raises:
        FileNotFoundError: If ``folder`` holds no sharded state.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    if not (folder / "dcp").is_dir():
        raise FileNotFoundError(f"no actor state in {str(folder)!r} (expected {folder / 'dcp'})")
    options = _options(frozen_from_disk)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    dcp_load(state, checkpoint_id=str(folder / "dcp"), process_group=process_group)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    extra_path = folder / f"extra_rank{rank}.pt"
    if not extra_path.is_file():
        extra_path = folder / "extra_rank0.pt"
    extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra
