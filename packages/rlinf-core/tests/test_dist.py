"""rlinf.core.dist and rlinf.core.seeding: the one device, process-group, clip and seed rules."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlinf.core.dist import clip_and_step, full_tensor, init_process_group, select_device
from rlinf.core.seeding import derive_seed


def test_select_device_is_the_cpu_without_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert select_device() == torch.device("cpu")


def test_a_cpu_slot_on_a_gpu_node_stays_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA cannot run here: torch's answer is stubbed to show the rule for each case.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert select_device() == torch.device("cpu"), "no device given by the scheduler"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert select_device() == torch.device("cuda", 0), "its one visible GPU"


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_process_group_backend_and_timeout(single_rank: None) -> None:
    assert init_process_group("auto", torch.device("cpu"), 7.0) == "gloo"
    backend = dist.GroupMember.WORLD._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
    assert backend.options._timeout.total_seconds() == 7.0
    # Already joined: a second call changes nothing.
    assert init_process_group("auto", torch.device("cpu"), 99.0) == "gloo"
    assert backend.options._timeout.total_seconds() == 7.0


def _two_groups(
    wrap: Callable[[torch.nn.Module], object] | None = None,
) -> tuple[torch.nn.Linear, torch.nn.Linear, torch.optim.Optimizer]:
    """Actor and critic (seeded) with gradients, in two named param groups; ``wrap`` each first."""
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)
    for module in (actor, critic):
        if wrap is not None:
            wrap(module)
    optimizer = torch.optim.SGD(
        [
            {"params": actor.parameters(), "name": "actor"},
            {"params": critic.parameters(), "name": "critic"},
        ],
        lr=0.1,
    )
    x = torch.ones(4, 3)
    (actor(x).sum() * 10 + critic(x).sum()).backward()
    return actor, critic, optimizer


def test_clip_and_step_reports_each_group_and_clips() -> None:
    actor, critic, optimizer = _two_groups()

    def norm(module: torch.nn.Module) -> float:
        return float(torch.cat([p.grad.flatten() for p in module.parameters()]).norm())

    want = {"actor/grad_norm": norm(actor), "critic/grad_norm": norm(critic)}
    before = actor.weight.detach().clone()
    norms, stepped = clip_and_step(optimizer, max_norm=1.0)
    assert stepped and norms == pytest.approx(want)
    assert want["actor/grad_norm"] > 1.0, "the actor's gradient was large enough to clip"
    clipped = torch.cat([p.grad.flatten() for p in actor.parameters()]).norm()
    assert float(clipped) == pytest.approx(1.0, rel=1e-5)
    assert not torch.equal(actor.weight, before), "the optimizer stepped"


def test_a_non_finite_norm_skips_the_step() -> None:
    actor, critic, optimizer = _two_groups()
    assert critic.bias.grad is not None
    critic.bias.grad[0] = math.nan
    before = [p.detach().clone() for p in (*actor.parameters(), *critic.parameters())]
    norms, stepped = clip_and_step(optimizer, max_norm=None)
    assert not stepped and math.isnan(norms["critic/grad_norm"])
    assert math.isfinite(norms["actor/grad_norm"])
    after = [*actor.parameters(), *critic.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True)), "nothing moved"


def test_a_group_without_gradients_reports_zero_and_default_names() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert clip_and_step(optimizer, max_norm=1.0) == ({"actor/grad_norm": 0.0}, True)
    assert full_tensor(3.5) == 3.5


def test_fsdp_sharded_gradients_take_one_all_reduce_and_clip_like_torch(
    single_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    init_process_group("gloo", torch.device("cpu"), 30.0)
    want, _ = clip_and_step(_two_groups()[2], max_norm=1.0)  # torch's clip on plain tensors
    mesh = init_device_mesh("cpu", (1,))
    # the same seeded modules and gradients, as FSDP2 DTensor shards
    actor, critic, optimizer = _two_groups(wrap=lambda m: fully_shard(m, mesh=mesh))
    reduces: list[torch.Tensor] = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduces.append(tensor.detach().clone())
        return real_all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counting_all_reduce)
    norms, stepped = clip_and_step(optimizer, max_norm=1.0)
    assert stepped and norms == pytest.approx(want, rel=1e-6)
    assert len(reduces) == 1 and reduces[0].numel() == 2, "one all-reduce for both groups"
    for module in (actor, critic):  # both norms were above the bound (8 and more)
        grads = [full_tensor(p.grad).flatten() for p in module.parameters()]
        assert float(torch.cat(grads).norm()) == pytest.approx(1.0, rel=1e-5)


def test_derive_seed_is_stable_across_processes_and_separates_streams() -> None:
    code = "from rlinf.core.seeding import derive_seed; print(derive_seed(7, 'rollout', 3, 0))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert int(other) == derive_seed(7, "rollout", 3, 0)
    seeds = {derive_seed(7, "rollout", step, rank, 0) for step in range(50) for rank in range(8)}
    assert len(seeds) == 400, "no two (step, rank) streams share a seed"
    assert derive_seed(7, "rollout", 1) != derive_seed(7, "shuffle", 1)
    assert all(0 <= s < 2**63 for s in seeds)
