"""Running megatron-core 0.16.1 on the CPU (gloo): the four patches it needs, in one place.

What: :func:`apply_cpu_shims` makes Megatron's tensor- and pipeline-parallel code
run in a process without CUDA (CPU tests and CPU-only machines). It does
nothing when ``torch.cuda.is_available()``: on GPUs Megatron's own paths run
unchanged. It is idempotent and logs once.

Why: megatron-core assumes a GPU in a few places, each of which raises "Found
no NVIDIA driver" on a CPU-only machine. Measured by running ``GPTModel``
forward/backward at TP=2 and the pipeline schedule at PP=2 on gloo, these are
all that fail (the local, non-transformer-engine layer spec):

1. ``torch.cuda.current_device`` returns ``torch.device("cpu")``. Megatron
   allocates with ``device=torch.cuda.current_device()`` throughout:
   ``tensor_parallel.mappings`` (TP all-gathers), ``tensor_parallel.layers``
   (parameters without ``use_cpu_initialization``), ``utils:GlobalMemoryBuffer
   .get_tensor`` (the attention matmul buffer, so no separate buffer shim is
   needed), ``pipeline_parallel.p2p_communication`` (PP send/receive buffers),
   ``distributed.param_and_grad_buffer`` (the DDP grad buffers).
2. ``tensor_parallel.random:CudaRNGStatesTracker`` becomes
   :class:`CpuRNGStatesTracker` (the tracker is rebuilt). The tracker keeps the
   named RNG states that ``model_parallel_cuda_manual_seed`` seeds and that the
   attention dropout forks; Megatron's reads and writes CUDA generator states.
   Here the states are CPU generator states, forked on torch's default CPU
   generator, which is what a CPU process draws from.
3. Literal ``device="cuda"`` / ``Tensor.cuda()`` calls run on the CPU: three
   functions are wrapped in :class:`_CudaToCpu`, a ``TorchFunctionMode`` that
   rewrites a ``cuda`` ``device=`` argument to ``cpu`` and makes ``.cuda()``
   the identity while they run: ``pipeline_parallel.schedules:
   forward_backward_no_pipelining`` and ``forward_backward_pipelining_without
   _interleaving`` (their token counter), ``fusions.fused_softmax:
   get_default_causal_mask`` (the causal mask when the caller passes none) and
   ``models.common.language_module.language_module:LanguageModule.
   setup_embeddings_and_output_layer`` (tied embeddings across PP stages).
   The interleaved (virtual pipeline) schedule is not wrapped: it is untested.
4. ``torch.cuda.synchronize`` is a no-op: ``pipeline_parallel.
   p2p_communication`` calls it after ``batch_isend_irecv`` (``batch_p2p_sync``);
   without CUDA there is nothing to wait for.

Still unavailable on the CPU (not shimmed): the distributed optimizer,
Megatron's grad clipping, sequence parallelism (torch's RMSNorm refuses it) and
the transformer-engine layer specs.

Cost: patches 1, 2 and 4 cost nothing per call. Patch 3 sends every torch call
made inside the wrapped functions through a Python ``__torch_function__``
(microseconds per op): a whole forward/backward step when the schedule is
used, acceptable for the small models a CPU runs. Shims must be applied before
``get_forward_backward_func`` is called (it looks the schedules up at call
time) and before anyone imports a wrapped function by name.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from megatron.core.tensor_parallel import random as mrandom
from torch.overrides import TorchFunctionMode

__all__ = ["CpuRNGStatesTracker", "apply_cpu_shims", "cpu_shims_active"]

_log = logging.getLogger(__name__)
_APPLIED = False
_MARK = "__rlinf_cpu_shim__"
_F = TypeVar("_F", bound=Callable[..., Any])


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` arguments to the CPU and makes ``Tensor.cuda`` the identity."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": torch.device("cpu")}
        return func(*args, **kwargs)


def _on_cpu(fn: _F) -> _F:
    """``fn`` run under :class:`_CudaToCpu` (marked, so it is never wrapped twice)."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _CudaToCpu():
            return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper  # type: ignore[return-value]


def _cpu_device() -> torch.device:
    """Stands in for ``torch.cuda.current_device`` in a process without CUDA."""
    return torch.device("cpu")


def _no_sync(device: Any = None) -> None:
    """Stands in for ``torch.cuda.synchronize`` in a process without CUDA."""


class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):  # type: ignore[misc]
    """Megatron's RNG state tracker on torch's CPU generator (same names, same seeds).

    ``add(name, seed)`` stores the state of a CPU generator seeded with ``seed``;
    ``fork(name)`` swaps it into the default CPU generator for the block and
    stores the advanced state back.
    """

    def add(self, name: str, seed: int) -> None:
        """Tracks a new CPU RNG state ``name`` seeded with ``seed`` (each name and seed once)."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise RuntimeError(f"seed {seed} already exists")
        if name in self.states_:
            raise RuntimeError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        """Runs the block on RNG state ``name``, then restores the previous CPU state."""
        if name not in self.states_:
            raise RuntimeError(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def cpu_shims_active() -> bool:
    """Whether :func:`apply_cpu_shims` has patched this process."""
    return _APPLIED


def apply_cpu_shims() -> bool:
    """Patches megatron-core for the CPU when this process has no CUDA (once; idempotent).

    Returns:
        True if the shims are active (no CUDA), False on a CUDA machine, where
        nothing is patched.
    """
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.pipeline_parallel import schedules

    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]  # 1
    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker  # 2
    mrandom.initialize_rng_tracker(force_reset=True)
    for name in (
        "forward_backward_no_pipelining",
        "forward_backward_pipelining_without_interleaving",
    ):
        setattr(schedules, name, _on_cpu(getattr(schedules, name)))  # 3
    fused_softmax.get_default_causal_mask = _on_cpu(fused_softmax.get_default_causal_mask)
    LanguageModule.setup_embeddings_and_output_layer = _on_cpu(
        LanguageModule.setup_embeddings_and_output_layer
    )
    torch.cuda.synchronize = _no_sync  # 4
    _APPLIED = True
    _log.info("megatron-core CPU shims applied (no CUDA in this process)")
    return True
