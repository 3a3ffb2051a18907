"""rlinf.core.fsdp_scaling: moving a training state between FSDP2 layouts is exact.

``W`` processes (gloo, no Ray) run ``fsdp_scaling_ranks.py``: a model grown from
``B`` base ranks onto all ``W`` for each training step and shrunk back after
holds the same parameters, buffers, AdamW state, learning rates and schedule as
a static ``W``-rank model trained on the same data. Cases: 1 -> 2, 2 -> 4
(a gather and a scatter over the base subgroup) and 1 -> 3 (uneven dim-0
chunks on every tensor).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

RANKS_SCRIPT = Path(__file__).with_name("fsdp_scaling_ranks.py")


@pytest.mark.parametrize(("base", "world"), [(1, 2), (2, 4), (1, 3)], ids=["1to2", "2to4", "1to3"])
def test_grown_and_shrunk_state_equals_a_static_model(
    tmp_path: Path, base: int, world: int, run_ranks: Callable[..., list[str]]
) -> None:
    out = tmp_path / "report.json"
    run_ranks(RANKS_SCRIPT, str(world), str(base), str(out), ranks=world, timeout=120)
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 3
    for step in steps:
        assert step["moved"] > 1e-3  # training changed the state: the checks have teeth
        assert step["grown"] <= 1e-6
        assert step["shrunk"] <= 1e-6
        assert step["lr"] and step["sched"]
        assert step["up_bytes"] > 0


def test_setup_scaling_checks_the_base_world_size_and_creates_nothing_without_scaling() -> None:
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    from rlinf.core.fsdp_scaling import setup_scaling

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"base_world_size=2 must be in 1\.\.1"):
            setup_scaling(2, torch.device("cpu"))
        meshes = setup_scaling(None, torch.device("cpu"))
        assert not meshes.scaling and meshes.is_base
        assert meshes.base_group is None and meshes.world_mesh is None
    finally:
        dist.destroy_process_group()


def test_base_ranks_defaults_to_every_rank_and_refuses_what_is_not_a_rank_count() -> None:
    pytest.importorskip("torch")
    from rlinf.core.fsdp_scaling import base_ranks

    assert base_ranks(None, 3) == 3 and base_ranks(1, 3) == 1
    for bad in (0, 4, True, 1.5):
        with pytest.raises(ValueError, match="base_world_size="):
            base_ranks(bad, 3)  # type: ignore[arg-type]
