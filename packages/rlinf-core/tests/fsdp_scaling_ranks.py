"""One rank of the :mod:`rlinf.core.fsdp_scaling` check (run by test_fsdp_scaling.py).

Usage: ``python fsdp_scaling_ranks.py RANK PORT WORLD BASE OUT_JSON``.

``WORLD`` gloo ranks. A static model sharded over every rank and an
online-scaling pair (base parts on ranks ``0..BASE-1``, grown parts over every
rank, built once) train on the same data for three steps; each step the scaled one grows
(:func:`grow` base -> grown), trains, and shrinks back (:func:`shrink`). Rank 0
writes the largest differences (parameters, buffers, AdamW moments, step counts,
learning rates) between the static and the scaled state to ``OUT_JSON``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Linear(5, 7)  # 7 rows over 2, 3 or 4 ranks: uneven shards
        self.head = nn.Linear(7, 3)  # 3 rows over 4 ranks: one empty shard
        self.register_buffer("scale", torch.rand(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.body(x))) * self.scale
        return out


def parts(seed: int, mesh: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    from rlinf.core.fsdp_scaling import TrainParts

    model = Net(seed)
    fully_shard(model.body, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(
        [
            {"params": list(model.body.parameters()), "lr": 0.05, "name": "body"},
            {"params": list(model.head.parameters()), "lr": 0.02, "name": "head"},
        ],
        weight_decay=0.01,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return TrainParts(model, optimizer, scheduler)


def train(p: Any, rank: int, world: int, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(8, 5, generator=gen), torch.randn(8, 3, generator=gen)
    p.optimizer.zero_grad(set_to_none=True)
    loss = ((p.model(x[rank::world]) - y[rank::world]) ** 2).mean()
    loss.backward()
    p.optimizer.step()
    p.scheduler.step()


def full_state(p: Any) -> dict[str, torch.Tensor]:
    """Full parameters, buffers and AdamW state (a collective over the model's mesh)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in list(p.model.named_parameters()) + list(p.model.named_buffers()):
        out[name] = t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()
    names = {id(t): n for n, t in p.model.named_parameters()}
    for group in p.optimizer.param_groups:
        for param in group["params"]:
            for key, value in p.optimizer.state.get(param, {}).items():
                full = value.full_tensor() if hasattr(value, "full_tensor") else value
                out[f"{names[id(param)]}.{key}"] = full.detach().clone()
    return out


def diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    world, base_size = int(sys.argv[3]), int(sys.argv[4])
    out = sys.argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from rlinf.core.fsdp_scaling import grow, setup_scaling, shrink

    cpu = torch.device("cpu")
    refusals = {0: f"1..{world}", world + 1: f"1..{world}", 1.5: "an integer", True: "an integer"}
    for bad, why in refusals.items():  # refused on every rank before any collective
        try:
            setup_scaling(bad, cpu)  # type: ignore[arg-type]
        except ValueError as e:
            assert f"base_world_size={bad!r} must be" in str(e) and why in str(e), e
        else:
            raise AssertionError(f"setup_scaling({bad!r}) accepted over {world} ranks")
    meshes = setup_scaling(base_size, cpu)
    assert meshes.scaling and meshes.is_base == (rank < base_size)
    assert (meshes.base_group is None) == (rank >= base_size)
    if meshes.base_mesh is not None:
        assert meshes.base_mesh.size() == base_size
    assert meshes.world_mesh is not None and meshes.world_mesh.size() == world
    static = parts(0, meshes.world_mesh)
    base = parts(0, meshes.base_mesh) if meshes.is_base else None
    grown = parts(1, meshes.world_mesh)  # other initial weights: the move must overwrite them
    initial = full_state(static)
    report: dict[str, Any] = {"steps": []}
    for step in range(3):
        train(static, rank, world, step)
        up = grow(meshes, base, grown, cpu, extra={"step": step})
        assert up["extra"] == {"step": step}
        if step == 0:  # the base optimizer had not stepped: the grown one holds no state
            assert not grown.optimizer.state
        train(grown, rank, world, step)
        want = full_state(static)
        got_grown = full_state(grown)
        down = shrink(meshes, grown, base, cpu)
        assert down["extra"] is None
        got_base = full_state(base) if base is not None else None
        # Every rank's view: 0-d step counts, buffers and the small state are per rank.
        mine: dict[str, Any] = {"grown": diff(want, got_grown), "shrunk": 0.0, "lr": True}
        mine["sched"] = True
        if base is not None and got_base is not None:
            mine["shrunk"] = diff(want, got_base)
            mine["lr"] = [g["lr"] for g in base.optimizer.param_groups] == [
                g["lr"] for g in static.optimizer.param_groups
            ]
            mine["sched"] = base.scheduler.state_dict() == static.scheduler.state_dict()
        views: list[Any] = [None] * world
        dist.all_gather_object(views, mine)
        if rank == 0:
            report["steps"].append(
                {
                    "moved": diff(want, {k: initial.get(k, v) for k, v in want.items()}),
                    "grown": max(v["grown"] for v in views),
                    "shrunk": max(v["shrunk"] for v in views),
                    "lr": all(v["lr"] for v in views),
                    "sched": all(v["sched"] for v in views),
                    "up_bytes": up["bytes"],
                }
            )
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
