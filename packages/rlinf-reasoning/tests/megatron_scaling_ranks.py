"""One rank of the Megatron online-scaling check (run by test_online_scaling.py, no Ray).

Usage: ``python megatron_scaling_ranks.py RANK PORT TASK_DIR OUT_DIR PORT2 TP [STEPS]``.

The ``2 * TP`` processes first train a static two-replica :class:`MegatronActor`
(tensor parallel size ``TP``, DP = 2) for ``STEPS`` steps, then (a fresh
process group on ``PORT2``) one with online scaling from one base replica
(``TP`` base ranks): each step it grows to two replicas, trains on the same
groups (replica ``r`` takes ``groups[r::2]``) and shrinks back; before each
scale-up the extra replica fills its idle parameters and AdamW state with noise
(:func:`online_scaling_ranks.scramble`), which the scale-up must overwrite.
Rank 0 writes the weights and AdamW state of both after every step to
``OUT_DIR/step{k}.pt``, and the first rank of the extra replica its own grown
ones to ``OUT_DIR/step{k}.replica1.pt``; the test compares them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU (gloo) path, on GPU machines too

import torch
from online_scaling_ranks import _groups, _ListChannel, scaling_config, scramble


def _optim_state(actor: Any) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: {k: v.detach().clone() for k, v in actor.optimizer.state[p].items()}
        for name, p in actor.model.named_parameters()
        if p in actor.optimizer.state
    }


def _actor(rank: int, world: int, port: str, cfg: Any, steps: int, base: int | None) -> Any:
    from rlinf.reasoning.workers import MegatronActor

    os.environ.update(
        GROUP_NAME="MegatronScaling",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
    )
    actor = MegatronActor(cfg, base_world_size=base)
    actor.init_worker(steps)
    return actor


def main() -> None:
    rank, port, task, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    port2, tp = sys.argv[5], int(sys.argv[6])
    steps = int(sys.argv[7]) if len(sys.argv) > 7 else 2
    world, replica = 2 * tp, rank // tp  # Megatron's order: TP ranks are consecutive
    torch.set_num_threads(1)
    import rlinf.sched.worker.worker as worker_module

    worker_module.install_resolver = lambda *a, **k: None  # type: ignore[assignment]  # no Ray
    cfg = scaling_config(
        task,
        # every replica keeps its reference model: KL works grown
        {"kl_beta": 0.1, "kl_penalty": "k3"},
        training_backend="megatron",
        model={"tensor_model_parallel_size": tp},
    )
    results: list[dict[str, Any]] = [{} for _ in range(steps)]
    static = _actor(rank, world, port, cfg, steps, None)
    vocab = static.built.arch.vocab_size
    for step in range(steps):
        static.run_training(_ListChannel(_groups(step, 4, vocab)[replica::2]), step)
        results[step]["static"] = dict(static.full_weights())
        results[step]["static_optim"] = _optim_state(static)
        results[step]["static_sched"] = static.scheduler.state_dict()
    static.teardown()

    scaled = _actor(rank, world, port2, cfg, steps, tp)
    assert scaled.base_world_size == tp and scaled.checkpoint_world_size == world
    for step in range(steps):
        if replica == 1:  # a stale replica: scale_up must replace it with replica 0's state
            scramble(scaled.model, scaled.optimizer, seed=1000 * step + rank)
            scaled.version = 99
        up = scaled.scale_up()
        assert up["world_size"] == world and scaled.dp_size == 2
        scaled.run_training(_ListChannel(_groups(step, 4, vocab)[replica::2]), step)
        results[step]["grown"] = dict(scaled.full_weights())
        results[step]["grown_optim"] = _optim_state(scaled)
        down = scaled.scale_down()
        assert down["world_size"] == tp
        if replica == 0:
            assert scaled.dp_size == 1
        else:  # the extra replica trains only while grown, and says so
            try:
                scaled.run_training(_ListChannel([]), step)
            except RuntimeError as err:
                assert f"extra actor rank {rank}" in str(err), err
            else:
                raise AssertionError("run_training on the extra rank outside a training phase")
        results[step]["scaled"] = dict(scaled.full_weights())
        results[step]["scaled_optim"] = _optim_state(scaled)
        results[step]["scaled_sched"] = scaled.scheduler.state_dict()
        results[step]["optim_steps"] = scaled._optim_steps
        assert scaled.version == 0  # replica 0's counters reached rank 1
        results[step]["timings"] = (up["seconds"], down["seconds"])
    if rank in (0, tp):  # the first rank of each replica
        suffix = ".replica1" if rank else ""
        for step, result in enumerate(results):
            torch.save(result, out / f"step{step}{suffix}.pt")
    scaled.teardown()


if __name__ == "__main__":
    main()
