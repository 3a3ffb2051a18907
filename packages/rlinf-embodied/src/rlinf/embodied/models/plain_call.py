"""``run_plain``: a module's forward without ``nn.Module.__call__``, where that changes nothing.

The rollout acts once per env step on a batch of one or a few observations.
There a small MLP's arithmetic is cheaper than calling its modules: each call
goes through ``nn.Module.__call__`` (two Python frames and the hook checks), and
``nn.Sequential`` iterates its children. Right after a simulator step, when the
caches are cold, that machinery cost the MLP policy's act 27-70 us per env step
(of ~2.1 ms) in three by-hand runs on the hot-path VM (one PickCube state env,
the act alone); in a whole rollout loop, together with the logprobs moved to
``complete()``, the saving read 12-17 us per step (two runs; see
``docs/embodied.md``).

``run_plain(module, x)`` runs plain layers as the functions their ``forward``
calls: ``nn.Linear`` as ``F.linear(x, weight, bias)``, the activations as their
functions. So it returns exactly ``module(x)`` (tested bit for bit).
``F.linear`` is one call into ATen, which runs ``addmm`` on the transposed
weight in C++; calling ``weight.t()`` and ``torch.addmm`` from Python (as an
earlier version did) is two calls with their argument parsing: right after a
simulator step ``F.linear`` made the PickCube MLP's act 6 us faster (176.5
against 182.6 us, medians of eight alternating blocks of 150 steps; 1.5 us
warm).
Anything else (another module type, a subclass, a module or a global hook,
JIT tracing) is called as a module, so hooks such as FSDP's still run. A
module class whose ``forward`` only runs its layers through ``run_plain`` may
set ``plain_forward = True`` (the action heads do): its ``forward`` is then
called directly too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

__all__ = ["run_plain"]


def _linear(layer: nn.Linear, x: Tensor) -> Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _tanh(_: nn.Module, x: Tensor) -> Tensor:
    return torch.tanh(x)


def _relu(_: nn.Module, x: Tensor) -> Tensor:
    return torch.relu(x)


def _silu(_: nn.Module, x: Tensor) -> Tensor:
    return F.silu(x)


def _gelu(layer: nn.GELU, x: Tensor) -> Tensor:
    return F.gelu(x, approximate=layer.approximate)


def _elu(layer: nn.ELU, x: Tensor) -> Tensor:
    return F.elu(x, layer.alpha)


_LAYERS: dict[type[nn.Module], Callable[[Any, Tensor], Tensor]] = {
    nn.Linear: _linear,
    nn.Tanh: _tanh,
    nn.ReLU: _relu,
    nn.SiLU: _silu,
    nn.GELU: _gelu,
    nn.ELU: _elu,
}


def _hooked(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _global_hooks() -> bool:
    return bool(
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    )


def run_plain(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)``, skipping the module calls of plain layers and ``nn.Sequential`` stacks.

    Args:
        module: Any module taking one tensor.
        x: Its input.

    Returns:
        Exactly what ``module(x)`` returns.
    """
    if _global_hooks() or torch._C._is_tracing():
        out: Tensor = module(x)
        return out
    return _run(module, x)


def _run(module: nn.Module, x: Tensor) -> Tensor:
    kind = type(module)
    if kind is nn.Sequential and not _hooked(module):
        for layer in module._modules.values():
            assert layer is not None  # (a Sequential holds no None entries)
            x = _run(layer, x)
        return x
    run = _LAYERS.get(kind)
    if run is not None and not _hooked(module):
        return run(module, x)
    if getattr(kind, "plain_forward", False) and not _hooked(module):
        out_: Tensor = module.forward(x)
        return out_
    out: Tensor = module(x)
    return out
