"""``run_plain`` returns exactly ``module(x)``, and hooks still run; ``draw`` equals ``sample``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from rlinf.embodied.models import ActionHead, CategoricalActionHead, GaussianActionHead
from rlinf.embodied.models.heads import build_mlp
from rlinf.embodied.models.plain_call import run_plain

ACTIVATIONS = ["tanh", "relu", "elu", "gelu", "silu"]


pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("rows", [1, 7])
def test_mlp_stacks_are_bit_identical(activation: Any, rows: int) -> None:
    torch.manual_seed(0)
    stack, _ = build_mlp(11, [64, 64, 32], activation)
    x = torch.randn(rows, 11)
    with torch.no_grad():
        assert torch.equal(run_plain(stack, x), stack(x))
    # With autograd on, the same values and gradients flow.
    plain_out, module_out = run_plain(stack, x), stack(x)
    assert torch.equal(plain_out, module_out)
    (plain_grad,) = torch.autograd.grad(plain_out.sum(), [stack[0].weight])
    (module_grad,) = torch.autograd.grad(module_out.sum(), [stack[0].weight])
    assert torch.equal(plain_grad, module_grad)


@pytest.mark.parametrize(
    "layer",
    [nn.Linear(5, 4, bias=False), nn.Linear(5, 4), nn.GELU(approximate="tanh"), nn.ELU(0.3)],
    ids=["linear without bias", "linear", "gelu tanh", "elu alpha"],
)
def test_layers_and_3d_inputs(layer: nn.Module) -> None:
    x = torch.randn(2, 3, 5) if isinstance(layer, nn.Linear) else torch.randn(2, 3, 4)
    assert torch.equal(run_plain(layer, x), layer(x))
    assert torch.equal(run_plain(layer, x[0]), layer(x[0]))


def test_bf16_layers() -> None:
    torch.manual_seed(0)
    stack, _ = build_mlp(9, [32, 16], "tanh")
    stack = stack.to(torch.bfloat16)
    x = torch.randn(3, 9, dtype=torch.bfloat16)
    assert torch.equal(run_plain(stack, x), stack(x))


def test_a_hooked_layer_is_called_as_a_module() -> None:
    stack = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    calls: list[str] = []

    def double(_: nn.Module, __: Any, out: torch.Tensor) -> torch.Tensor:
        calls.append("hook")
        return out * 2

    handle = stack[1].register_forward_hook(double)
    x = torch.randn(3, 4)
    assert torch.equal(run_plain(stack, x), stack(x))
    assert calls == ["hook", "hook"]  # once through run_plain, once through stack(x)
    handle.remove()

    pre = stack.register_forward_pre_hook(lambda _, args: calls.append("stack pre"))
    run_plain(stack, x)
    assert calls[-1] == "stack pre"
    pre.remove()


def test_global_hooks_and_other_modules_fall_back() -> None:
    stack = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    seen: list[type[nn.Module]] = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, _, __: seen.append(type(module))
    )
    try:
        x = torch.randn(3, 4)
        assert torch.equal(run_plain(stack, x), stack(x))
        assert seen.count(nn.Linear) == 4  # both runs called every module
    finally:
        handle.remove()

    class ScaledLinear(nn.Linear):  # a subclass may change forward: called as a module
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 3

    layer = ScaledLinear(4, 2)
    assert torch.equal(run_plain(layer, x), layer(x))
    assert torch.equal(run_plain(nn.Sequential(layer), x), layer(x))


def _gaussian() -> ActionHead:
    return GaussianActionHead(8, num_chunks=2, action_dim=3, init_log_std=-0.5)


def _categorical() -> ActionHead:
    return CategoricalActionHead(8, num_chunks=3, num_actions=4)


@pytest.mark.parametrize("make_head", [_gaussian, _categorical], ids=["gaussian", "categorical"])
def test_draw_equals_sample(make_head: Callable[[], ActionHead]) -> None:
    torch.manual_seed(0)
    head = make_head()
    features = torch.randn(5, 8)
    params = head(features)
    layer = head.mean if isinstance(head, GaussianActionHead) else head.logits
    assert torch.equal(params.flatten(1), layer(features))
    for deterministic in (False, True):
        expected = head.sample(params, deterministic, torch.Generator().manual_seed(3))
        actions, rest = head.draw(params, deterministic, torch.Generator().manual_seed(3))
        stored, logprobs = rest()
        for got, want in zip((actions, stored, logprobs), expected, strict=True):
            assert torch.equal(got, want)
        assert stored.data_ptr() != actions.data_ptr() or stored.dtype != actions.dtype
