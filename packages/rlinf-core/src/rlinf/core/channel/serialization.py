"""Pickle protocol 5 with out-of-band buffers for numpy arrays and torch tensors.

``dumps`` turns any picklable object into a small header (the pickle stream)
plus a list of raw byte buffers: every numpy array and CPU torch tensor found
anywhere inside dicts, lists, tuples or dataclasses travels out of band, so
the channel copies its bytes exactly once, into shared memory. ``loads``
rebuilds the object with those buffers; arrays and tensors come back as
zero-copy views of whatever buffer objects are passed (for the channel:
writable views of the shared block).

Speed matters here (it is on every put and get): each thread reuses one
pickler, and arrays and tensors are reduced through the pickler's
``dispatch_table`` (a C-level type lookup, no Python call per object).
Torch is never imported here: tensors are handled once the caller has
imported torch. Non-contiguous arrays and tensors are made contiguous;
tensors on an accelerator are staged through host memory and moved back to
the same device on load when that device exists there (CPU otherwise). A
large top-level ``bytes`` item also travels out of band (one copy on each
side instead of two).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["dumps", "loads"]

_RAW_BYTES_MIN = 64 << 10
"""Top-level ``bytes`` items at least this large travel out of band."""


# ----- reducers -----------------------------------------------------------------------


def _reduce_ndarray(a: np.ndarray[Any, Any]) -> tuple[Any, ...]:
    if not (a.dtype.hasobject or a.dtype.fields is not None):
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            a = np.ascontiguousarray(a)
        order = "C" if a.flags.c_contiguous else "F"
        try:
            buf = pickle.PickleBuffer(a)  # type: ignore[arg-type]
        except (ValueError, BufferError, TypeError):
            pass  # dtypes the buffer protocol cannot express (datetime64, ...)
        else:
            return _rebuild_ndarray, (buf, a.dtype.str, a.shape, order)
    reduced: tuple[Any, ...] = a.__reduce_ex__(5)  # type: ignore[assignment]
    return reduced  # numpy's own


def _rebuild_ndarray(
    buf: Any, dtype: str, shape: tuple[int, ...], order: str
) -> np.ndarray[Any, Any]:
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)  # type: ignore[call-overload,no-any-return]


def _reduce_tensor(t: Any) -> tuple[Any, ...]:
    device = "cpu" if t.device.type == "cpu" else str(t.device)
    data = t.detach()
    if device != "cpu":
        data = data.cpu()
    if not data.is_contiguous():
        data = data.contiguous()
    if data.numel() == 0:
        buf = None
    else:
        try:
            buf = pickle.PickleBuffer(data.numpy())
        except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16, ...)
            buf = pickle.PickleBuffer(data.reshape(-1).view(_torch().uint8).numpy())
    return _rebuild_tensor, (buf, t.dtype, tuple(t.shape), t.requires_grad, device)


def _rebuild_tensor(
    buf: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool, device: str
) -> Any:
    torch = _torch()
    if buf is None:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)
    if device != "cpu" and _device_available(torch, device):
        tensor = tensor.to(device)
    if requires_grad and tensor.is_floating_point():
        tensor.requires_grad_(True)
    return tensor


def _torch() -> Any:
    import torch

    return torch


def _device_available(torch: Any, device: str) -> bool:
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            return bool(torch.cuda.is_available()) and (dev.index or 0) < torch.cuda.device_count()
    except (RuntimeError, ValueError):
        return False
    return False


class _OutOfBandBytes:
    """Pickles as ``bytes(<out-of-band buffer>)``."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: object) -> tuple[Any, ...]:
        return bytes, (pickle.PickleBuffer(self.data),)


# ----- picklers -----------------------------------------------------------------------


def _dispatch_table(with_torch: bool) -> dict[type, Callable[[Any], Any]]:
    table: dict[type, Callable[[Any], Any]] = {
        **copyreg.dispatch_table,
        np.ndarray: _reduce_ndarray,
    }
    if with_torch:
        torch = _torch()
        table[torch.Tensor] = _reduce_tensor
        table[torch.nn.Parameter] = _reduce_tensor
    return table


class _NumpyPickler(pickle.Pickler):
    dispatch_table = _dispatch_table(with_torch=False)


_TorchPickler: type[pickle.Pickler] | None = None


def _pickler_class() -> type[pickle.Pickler]:
    global _TorchPickler
    if "torch" not in sys.modules:
        return _NumpyPickler
    if _TorchPickler is None:
        _TorchPickler = type(
            "_TorchPickler", (pickle.Pickler,), {"dispatch_table": _dispatch_table(True)}
        )
    return _TorchPickler


class _Reusable(threading.local):
    """One pickler per thread and pickler class, reset between uses."""

    def __init__(self) -> None:
        self.cls: type[pickle.Pickler] | None = None
        self.busy = False

    def setup(self, cls: type[pickle.Pickler]) -> None:
        self.cls = cls
        self.stream = io.BytesIO()
        self.buffers: list[pickle.PickleBuffer] = []
        self.pickler = cls(self.stream, protocol=5, buffer_callback=self.buffers.append)


_reusable = _Reusable()
# Types whose pickle has no buffers and needs no custom reducer.
_PLAIN_SCALARS = frozenset({bytes, str, int, float, bool, type(None)})


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Serialises ``obj`` into a pickle header and out-of-band byte buffers.

    Args:
        obj: Any picklable object.

    Returns:
        ``(header, buffers)``: the pickle stream and one C-contiguous byte
        ``memoryview`` per array or tensor, in the order ``loads`` needs them.

    Raises:
        TypeError: If ``obj`` (or something inside it) cannot be pickled; the
            message names the type.
    """
    kind = type(obj)
    if kind is bytes and len(obj) >= _RAW_BYTES_MIN:
        obj = _OutOfBandBytes(obj)
    elif kind in _PLAIN_SCALARS:  # nothing out of band: skip the pickler's setup and reset
        return pickle.dumps(obj, protocol=5), []
    cls = _pickler_class()
    state = _reusable
    if state.busy:  # re-entered from inside a __reduce__: use a fresh pickler
        return _dumps_fresh(obj, cls)
    if state.cls is not cls:
        state.setup(cls)
    state.busy = True
    try:
        state.pickler.dump(obj)
        header = state.stream.getvalue()
        buffers = [_raw(b) for b in state.buffers]
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        state.setup(cls)  # the pickler may be half-way through an object
        raise _unpicklable(obj, err) from err
    finally:
        state.busy = False
        if state.cls is cls:
            state.stream.seek(0)
            state.stream.truncate()
            state.buffers.clear()
            state.pickler.clear_memo()
    return header, buffers


def _dumps_fresh(obj: Any, cls: type[pickle.Pickler]) -> tuple[bytes, list[memoryview]]:
    stream, buffers = io.BytesIO(), []  # type: ignore[var-annotated]
    try:
        cls(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise _unpicklable(obj, err) from err
    return stream.getvalue(), [_raw(b) for b in buffers]


def _unpicklable(obj: Any, err: Exception) -> TypeError:
    return TypeError(
        f"cannot send an object of type {type(obj).__name__} through a channel: {err}. "
        "Items must be picklable (module-level classes and functions, no open files or locks)."
    )


def _raw(buffer: pickle.PickleBuffer) -> memoryview:
    try:
        return buffer.raw()
    except BufferError:
        # Contiguous in neither C nor Fortran order: copy once.
        return memoryview(bytes(memoryview(buffer))).cast("B")


def loads(header: Any, buffers: Sequence[Any] = ()) -> Any:
    """Rebuilds an object from ``dumps`` output.

    Args:
        header: The pickle stream (bytes or any buffer object).
        buffers: The out-of-band buffers; arrays and tensors become views of them.

    Returns:
        The reconstructed object.
    """
    return pickle.loads(header, buffers=buffers)
