"""LR schedules (warm-up, constant, linear, cosine) and optimizer-state moves."""

from __future__ import annotations

import itertools
import math

import pytest

from rlinf.core.optim import lr_lambda, move_optimizer_state


def test_warmup_then_constant() -> None:
    f = lr_lambda("constant", warmup_steps=4, total_steps=10)
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(1000) == 1.0


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_endpoints_and_monotonic(kind: str) -> None:
    f = lr_lambda(kind, warmup_steps=2, total_steps=12, min_lr_ratio=0.1)  # type: ignore[arg-type]
    assert f(0) == 0.5 and f(1) == 1.0
    assert f(2) == pytest.approx(1.0)  # decay starts at the peak
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)  # floor, held after the end
    values = [f(s) for s in range(2, 13)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_midpoints() -> None:
    linear = lr_lambda("linear", warmup_steps=0, total_steps=10)
    cosine = lr_lambda("cosine", warmup_steps=0, total_steps=10, min_lr_ratio=0.2)
    assert linear(5) == pytest.approx(0.5)
    assert cosine(5) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 2)))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="lr_scheduler='step'"):
        lr_lambda("step", 0, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"min_lr_ratio=1\.5"):
        lr_lambda("cosine", 0, 10, min_lr_ratio=1.5)


def test_lambdalr_follows_the_schedule() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda("linear", 2, 6))
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_move_optimizer_state_keeps_step_counters() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(3)
    opt.step()
    state = opt.state[param]
    before = {k: v.clone() for k, v in state.items()}
    move_optimizer_state(opt, torch.device("meta"))  # a second device without a GPU
    assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu" and torch.equal(state["step"], before["step"])
