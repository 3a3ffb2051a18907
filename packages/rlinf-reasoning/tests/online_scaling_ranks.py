"""One rank of the online-scaling exactness check (run by test_online_scaling.py, no Ray).

Usage: ``python online_scaling_ranks.py RANK PORT TASK_DIR OUT_DIR [STEPS]``.

Both processes build two actors over the same two ranks (gloo): a static
two-rank :class:`FSDPActor` and an online-scaling one with one base rank. Each
step, rank ``r`` trains both on the same prompt groups (``groups[r::2]``); the
scaling actor grows to two ranks first and shrinks back after; before each
scale-up every rank fills its idle shard of the grown model and AdamW state
with noise (:func:`scramble`), which the scale-up must overwrite. Rank 0 writes
the full weights and AdamW state of both (after every step) to
``OUT_DIR/step{k}.pt``; the test compares them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _groups(step: int, count: int, vocab: int) -> list[Any]:
    from rlinf.core.protocols.reasoning import RolloutResult

    gen = torch.Generator().manual_seed(100 + step)
    out = []
    for i in range(count):
        prompt = torch.randint(4, vocab, (5,), generator=gen).tolist()
        lengths = torch.randint(2, 7, (4,), generator=gen).tolist()
        responses = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths]
        out.append(
            RolloutResult(
                prompt_ids=prompt,
                answers=["0"],
                response_ids=responses,
                rollout_logprobs=[[-1.0] * n for n in lengths],
                is_end=[True] * 4,
                version=step,
                index=step * count + i,
                rewards=[float((i + k) % 2) for k in range(4)],
            )
        )
    return out


class _ListChannel:
    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)

    def get(self, timeout: float | None = None) -> Any:
        return self.items.pop(0)


def _local_view(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a ``DTensor`` (a view: writing it writes the tensor), or itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def scramble(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """Fills an idle copy's parameters and AdamW state (this rank's shards) with noise.

    Every parameter gets random moments and a step count of 7, also where the
    optimizer has no state yet: a scale-up must overwrite all of it (or clear
    it, when the base has not stepped), else the grown step differs.
    """
    gen = torch.Generator().manual_seed(seed)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return torch.rand(t.shape, generator=gen, dtype=t.dtype)

    with torch.no_grad():
        for p in model.parameters():
            local = _local_view(p)
            local.add_(noise(local) - 0.5)
            state = optimizer.state[p]
            state["step"] = torch.tensor(7.0)
            for key in ("exp_avg", "exp_avg_sq"):
                if key not in state:
                    state[key] = torch.zeros_like(p)
                moment = _local_view(state[key])
                moment.copy_(noise(moment))


def _optim_state(actor: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = get_optimizer_state_dict(actor.model, actor.optimizer, options=full)
    return state


def scaling_config(task: Path, algorithm: dict[str, Any] | None = None, **actor: Any) -> Any:
    """The check's config: one base rank of two, a tiny batch (``actor`` keys added)."""
    from rlinf.core.config import validate_config
    from rlinf.reasoning.config import ReasoningConfig

    return validate_config(
        {
            "cluster": {"component_placement": {"actor": 0, "rollout": 1, "reward": 1}},
            "runner": {
                "val_before_train": False,
                "online_scaling": True,
                "step_timeout_s": 120,
                "logger": {"logger_backends": []},
            },
            "data": {"train_files": [str(task / "train.jsonl")], "max_prompt_length": 16},
            "algorithm": {
                "group_size": 4,
                "rollout_batch_size": 4,
                "n_minibatches": 2,
                "sampling_params": {"max_new_tokens": 8},
                **(algorithm or {}),
            },
            "actor": {
                "model_path": str(task / "model"),
                "micro_batch_size": 4,
                "optim": {"lr": 1e-2, "clip_grad": 1.0},
                **actor,
            },
        },
        ReasoningConfig,
    )


def main() -> None:
    rank, port, task, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    os.environ.update(
        GROUP_NAME="ScalingCheck",
        RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
    )
    import rlinf.sched.worker.worker as worker_module

    worker_module.install_resolver = lambda *a, **k: None  # type: ignore[assignment]  # no Ray
    from rlinf.reasoning.workers import FSDPActor

    cfg = scaling_config(task)
    static = FSDPActor(cfg)
    static.init_worker(steps)
    scaled = FSDPActor(cfg, base_world_size=1)
    scaled.init_worker(steps)
    vocab = int(static.model.config.vocab_size)
    timings = []
    for step in range(steps):
        groups = _groups(step, 4, vocab)
        mine = groups[rank::2]
        static.run_training(_ListChannel(mine), step)
        # The idle grown copy must not matter: scale_up replaces all of it.
        idle = scaled._grown_parts
        scramble(idle.model, idle.optimizer, seed=1000 * step + rank)
        up = scaled.scale_up()
        scaled.run_training(_ListChannel(mine), step)
        grown = dict(scaled.full_weights())  # collective over both ranks
        grown_optim = _optim_state(scaled)
        down = scaled.scale_down()
        timings.append((up["seconds"], down["seconds"]))
        ref = dict(static.full_weights())
        ref_optim = _optim_state(static)
        if rank == 0:
            torch.save(
                {
                    "static": ref,
                    "grown": grown,
                    "scaled": dict(scaled.full_weights()),
                    "static_optim": ref_optim,
                    "grown_optim": grown_optim,
                    "scaled_optim": _optim_state(scaled),
                    "static_lr": static.optimizer.param_groups[0]["lr"],
                    "scaled_lr": scaled.optimizer.param_groups[0]["lr"],
                    "static_sched": static.scheduler.state_dict(),
                    "scaled_sched": scaled.scheduler.state_dict(),
                    "optim_steps": (static._optim_steps, scaled._optim_steps),
                    "timings": timings,
                },
                out / f"step{step}.pt",
            )
        else:
            assert not scaled.holds_state and not hasattr(scaled, "model")
    time.sleep(0.1)
    static.teardown()


if __name__ == "__main__":
    main()
