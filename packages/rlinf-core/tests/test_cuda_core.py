"""The shared actor mechanisms on a CUDA device: NCCL group, FSDP2 step, DCP state, weight sync.

Skipped without a GPU (CI has none). Run on a GPU machine with
``uv run pytest packages/rlinf-core/tests/test_cuda_core.py``. One process, a
world of one rank: it checks the CUDA code paths of :mod:`rlinf.core.dist`,
:mod:`rlinf.core.train_state` and :mod:`rlinf.core.weight_sync`, not
multi-GPU collectives.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def nccl_world() -> Iterator[torch.device]:
    import torch.distributed as dist

    from rlinf.core.dist import init_process_group, select_device

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    device = select_device()
    assert device.type == "cuda"
    assert init_process_group("auto", device, timeout_s=120) == "nccl"
    yield device
    dist.destroy_process_group()


def _sharded_mlp(device: torch.device, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    model.to(device)
    fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from rlinf.core.dist import full_tensor

    return {n: full_tensor(p).detach().cpu().clone() for n, p in model.named_parameters()}


def test_step_skip_save_load_and_sync_on_cuda(nccl_world: torch.device, tmp_path: Path) -> None:
    from rlinf.core.dist import clip_and_step, full_tensor
    from rlinf.core.train_state import load_train_state, save_train_state
    from rlinf.core.weight_sync import receive_weights, send_weights

    device = nccl_world
    model, optimizer = _sharded_mlp(device, seed=0)
    x = torch.randn(64, 8, device=device)
    for _ in range(3):
        model(x).pow(2).mean().backward()
        norms, stepped = clip_and_step(optimizer, max_norm=1.0)
        optimizer.zero_grad(set_to_none=True)
        assert stepped and all(v > 0 for v in norms.values())
    before = _full(model)
    # A non-finite gradient: the step is skipped, the weights stay.
    (model(x).sum() * float("nan")).backward()
    _, stepped = clip_and_step(optimizer, max_norm=1.0)
    optimizer.zero_grad(set_to_none=True)
    assert not stepped
    assert all(torch.equal(before[n], t) for n, t in _full(model).items())

    save_train_state(tmp_path / "actor", model, optimizer, {"step": 3})
    fresh, fresh_optimizer = _sharded_mlp(device, seed=1)
    assert not torch.equal(_full(fresh)["0.weight"], before["0.weight"])
    assert load_train_state(tmp_path / "actor", fresh, fresh_optimizer) == {"step": 3}
    assert all(torch.equal(before[n], t) for n, t in _full(fresh).items())
    # The restored optimizer takes the same next step as the original.
    for m, opt in ((model, optimizer), (fresh, fresh_optimizer)):
        m(x).pow(2).mean().backward()
        clip_and_step(opt, max_norm=1.0)
        opt.zero_grad(set_to_none=True)
    for name, tensor in _full(fresh).items():
        torch.testing.assert_close(tensor, _full(model)[name], rtol=0, atol=0)

    # Weight sync: CUDA shards gathered, staged through host memory, received whole.
    wire: deque = deque()
    send_weights(list(model.named_parameters()), 4, 1 << 10, wire.append, gather=full_tensor)
    received: dict[str, torch.Tensor] = {}
    version, buckets, names = receive_weights(wire.popleft, lambda b: received.update(b.tensors))
    assert version == 4 and buckets > 1 and names == set(before)
    assert all(t.device.type == "cpu" for t in received.values())
    for name, tensor in _full(model).items():
        assert torch.equal(received[name], tensor)
