"""Pickle protocol 5 with out-of-band buffers for numpy arrays and torch tensors.

``dumps`` turns any picklable object into a small header (the pickle stream)
plus a list of raw byte buffers: every numpy array and CPU torch tensor found
anywhere inside dicts, lists, tuples or dataclasses travels out of band, so
the channel copies its bytes exactly once, into shared memory. ``loads``
rebuilds the object with those buffers; arrays and tensors come back as
zero-copy views of whatever buffer objects are passed (for the channel:
writable views of the shared block).

Torch is never imported here: tensors are recognised only if the caller has
imported torch already. Non-contiguous tensors are made contiguous; tensors
on an accelerator are staged through host memory and moved back to the same
device on load when that device exists there (CPU otherwise).
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["dumps", "loads"]


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _reduce_tensor(obj)
        return NotImplemented


def _reduce_tensor(tensor: Any) -> tuple[Any, tuple[Any, ...]]:
    device = str(tensor.device)
    flat = tensor.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    data = pickle.PickleBuffer(flat.view(_uint8()).numpy()) if flat.numel() else None
    return _rebuild_tensor, (data, tensor.dtype, tuple(tensor.shape), tensor.requires_grad, device)


def _uint8() -> Any:
    import torch

    return torch.uint8


def _rebuild_tensor(
    data: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool, device: str
) -> Any:
    import torch

    if data is None:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)
    if device != "cpu" and _device_available(torch, device):
        tensor = tensor.to(device)
    if requires_grad and tensor.is_floating_point():
        tensor.requires_grad_(True)
    return tensor


def _device_available(torch: Any, device: str) -> bool:
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            return bool(torch.cuda.is_available()) and (dev.index or 0) < torch.cuda.device_count()
    except (RuntimeError, ValueError):
        return False
    return False


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
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise TypeError(
            f"cannot send an object of type {type(obj).__name__} through a channel: {err}. "
            "Items must be picklable (module-level classes and functions, no open files or locks)."
        ) from err
    return stream.getvalue(), [_raw(b) for b in buffers]


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
