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
side instead of two). Numpy scalars (``np.float32(1.5)``, ``np.int64(3)``, ...)
travel as their dtype string and bytes.

``loads`` is plain ``pickle.loads``: it runs whatever the stream names, so it
is for trusted peers only. :class:`RestrictedLoader` decodes the same streams
but accepts only tensors, numpy arrays and scalars and plain containers (plus
classes the caller names); anything else raises ``pickle.UnpicklingError``
before any of it runs.
"""

from __future__ import annotations

import collections
import copyreg
import functools
import importlib
import io
import pickle
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["RestrictedLoader", "dumps", "loads"]

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


def _reduce_np_scalar(x: np.generic) -> tuple[Any, ...]:
    return _rebuild_np_scalar, (x.dtype.str, x.tobytes())


def _reduce_np_scalar_by_char(x: np.generic) -> tuple[Any, ...]:
    return _rebuild_np_scalar, (x.dtype.char, x.tobytes())


def _rebuild_np_scalar(dtype: str, data: bytes) -> Any:
    return np.frombuffer(data, dtype=dtype)[0]


def _np_scalar_reducers() -> dict[type, Callable[[Any], Any]]:
    """Reducers of the numpy scalar types of numbers, bools and datetimes.

    Each travels as its dtype string (``"<f4"``, ``"<M8[s]"``), or as its
    type code where another type has the same string (``longlong`` is
    ``"<i8"`` as ``int64`` is), so it comes back as the same type. Strings,
    bytes, voids and objects keep numpy's own pickle.
    """
    reducers: dict[type, Callable[[Any], Any]] = {}
    for t in set(np.sctypeDict.values()):
        dt = np.dtype(t)
        if dt.kind not in "biufcmM":
            continue
        if np.dtype(dt.str).type is t:
            reducers[t] = _reduce_np_scalar
        elif np.dtype(dt.char).type is t:
            reducers[t] = _reduce_np_scalar_by_char
    return reducers


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
        **_np_scalar_reducers(),
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


# ----- restricted decoding --------------------------------------------------------------

_SERIALIZATION = __name__

_NUMPY_HINT = (
    " (numpy arrays travel as raw buffers only with plain numeric, bool or string dtypes: "
    "arrays of object, structured or datetime dtypes, numpy.dtype objects and string "
    "scalars use numpy's own pickle, which restricted decoding refuses; send "
    "str(dtype) or plain arrays instead)"
)


def _refuse(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"restricted decoding refused {what}")


def _check_shape(shape: Any) -> tuple[int, ...]:
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        raise _refuse(f"an array or tensor shape {shape!r}: not a tuple of ints >= 0")
    return shape


@functools.lru_cache(maxsize=256)
def _plain_dtype(dtype: str) -> bool:
    """Whether ``dtype`` (a dtype string) holds no objects, fields or subarrays."""
    dt = np.dtype(dtype)
    return not dt.hasobject and dt.fields is None and dt.subdtype is None


def _checked_rebuild_ndarray(buf: Any, dtype: Any, shape: Any, order: Any) -> Any:
    """``_rebuild_ndarray`` for untrusted streams: plain dtypes given as strings only.

    ``np.frombuffer`` takes a buffer-protocol object only and ``reshape``
    checks the shape against the buffer's length: the array is at most the
    bytes of the stream.
    """
    if type(dtype) is not str or not _plain_dtype(dtype):
        raise _refuse(
            f"a numpy array of dtype {dtype!r}: only plain dtypes, as strings "
            "(no object, structured or subarray dtypes)"
        )
    if order != "C" and order != "F":
        raise _refuse(f"a numpy array with order {order!r}")
    return _rebuild_ndarray(buf, dtype, shape, order)


def _checked_rebuild_np_scalar(dtype: Any, data: Any) -> Any:
    """``_rebuild_np_scalar`` for untrusted streams: numbers, bools and datetimes only."""
    if type(dtype) is not str or type(data) is not bytes:
        raise _refuse(f"a numpy scalar built from ({type(dtype).__name__}, {type(data).__name__})")
    dt = np.dtype(dtype)
    if dt.kind not in "biufcmM" or dt.fields is not None or dt.subdtype is not None:
        raise _refuse(f"a numpy scalar of dtype {dtype!r}: only numbers, bools and datetimes")
    if len(data) != dt.itemsize:
        raise _refuse(f"a numpy scalar of dtype {dtype!r} from {len(data)} bytes")
    return _rebuild_np_scalar(dtype, data)


def _checked_bytes(data: Any) -> bytes:
    """``bytes`` for untrusted streams: from a buffer only (``bytes(10**12)`` allocates)."""
    try:
        return bytes(memoryview(data))
    except TypeError:
        raise _refuse(f"bytes({type(data).__name__}): only bytes from a buffer") from None


def _refuse_build(state: object) -> None:
    """Stands in for ``__setstate__`` on objects the loader made, while it runs."""
    raise _refuse(
        "a BUILD (__setstate__) of a tensor or OrderedDict it decoded: our encoder never "
        "emits one, and Tensor.__setstate__ would resize or re-point the tensor"
    )


_torch_dtypes: dict[str, Any] = {}
"""``torch.<name>`` for the names already found to be torch dtypes."""


def _torch_dtype(name: str) -> Any:
    """``torch.<name>`` if it is a ``torch.dtype``, else None (imports torch if needed)."""
    found = _torch_dtypes.get(name)
    if found is not None:
        return found
    try:
        torch = _torch()
    except ImportError:
        return None
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        return None
    _torch_dtypes[name] = value
    return value


_BASE_ALLOWED: dict[tuple[str, str], Any] = {
    # Our own rebuild functions (what dumps emits for arrays, tensors, numpy
    # scalars), with their arguments checked. A str names a method of the
    # load's _Guard (it records what it made).
    (_SERIALIZATION, "_rebuild_ndarray"): _checked_rebuild_ndarray,
    (_SERIALIZATION, "_rebuild_tensor"): "rebuild_tensor",
    (_SERIALIZATION, "_rebuild_np_scalar"): _checked_rebuild_np_scalar,
    # What protocol 5 names by global for plain values: a large top-level bytes
    # item (sent out of band), complex numbers, slices, Ellipsis. Dicts, lists,
    # tuples, str, int, float, bool, None, small bytes, bytearray, set and
    # frozenset have opcodes of their own and need no global.
    ("builtins", "bytes"): _checked_bytes,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "Ellipsis"): Ellipsis,
    ("collections", "OrderedDict"): "ordered_dict",
}


class _Guard:
    """Makes the tensors and OrderedDicts of one load, shielded from BUILD until it ends.

    Not the unpickler itself: the unpickler's memo and stack hold what
    ``find_class`` returns, and a method bound to the unpickler would make a
    reference cycle that keeps every decoded object (views of the channel's
    memory) alive until the garbage collector runs.
    """

    def __init__(self) -> None:
        self.objects: list[Any] = []  # with _refuse_build as __setstate__ until release()

    def _guard(self, obj: Any) -> Any:
        obj.__setstate__ = _refuse_build  # the instance attribute shadows the class's method
        self.objects.append(obj)
        return obj

    def release(self) -> None:
        """Removes the guards: the objects are as ``loads`` would return them."""
        for obj in self.objects:
            del obj.__setstate__
        self.objects.clear()

    def ordered_dict(self, *args: Any) -> Any:
        """``OrderedDict()``: its items follow (SETITEMS), as pickle writes it.

        ``OrderedDict(iterable)`` is refused: iterating a decoded tensor would
        make one object per element, far more memory than the stream's bytes.
        """
        if args:
            raise _refuse(f"OrderedDict() with arguments ({len(args)} given)")
        return self._guard(collections.OrderedDict())

    def rebuild_tensor(
        self, buf: Any, dtype: Any, shape: Any, requires_grad: Any, device: Any
    ) -> Any:
        """``_rebuild_tensor`` for untrusted streams.

        Data comes from a buffer (``torch.frombuffer``, then ``reshape``
        checks the shape against its length); a tensor without data must be
        empty (``torch.empty`` of any other shape allocates it).
        """
        torch = _torch()
        if (
            not isinstance(dtype, torch.dtype)
            or type(requires_grad) is not bool
            or type(device) is not str
        ):
            raise _refuse(
                f"a tensor with dtype {dtype!r}, requires_grad {requires_grad!r} "
                f"and device {device!r}"
            )
        if buf is None and 0 not in _check_shape(shape):
            raise _refuse(f"a tensor of shape {shape} without data")
        tensor = _rebuild_tensor(buf, dtype, shape, requires_grad, device)
        tensor.__setstate__ = _refuse_build
        self.objects.append(tensor)
        return tensor


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves globals from the allowlist only."""

    def __init__(
        self, header: Any, buffers: Iterable[Any], extra: dict[tuple[str, str], Any], guard: _Guard
    ) -> None:
        super().__init__(io.BytesIO(header), buffers=buffers)
        self._extra = extra
        self._guard = guard

    def find_class(self, module: str, name: str, /) -> Any:
        found = _BASE_ALLOWED.get((module, name))
        if found is not None:
            return getattr(self._guard, found) if type(found) is str else found
        if module == "torch":
            dtype = _torch_dtype(name)
            if dtype is not None:
                return dtype
        found = self._extra.get((module, name))
        if found is not None:
            return found
        hint = _NUMPY_HINT if module == "numpy" or module.startswith("numpy.") else ""
        raise pickle.UnpicklingError(
            f"restricted decoding refused the global {module}.{name}{hint}. A channel with "
            "decode='restricted' accepts torch tensors, numpy arrays and scalars and plain "
            "containers (dict, list, tuple, set, str, bytes, numbers) only. To accept "
            f"{module}.{name}, pass it in allowed_classes= to Channel.create or "
            "Channel.connect (only a class or function that is safe to call with "
            "untrusted arguments), or use decode='pickle' where every peer is trusted."
        )


class RestrictedLoader:
    """Decodes ``dumps`` output from untrusted peers: tensors, arrays and plain data only.

    ``pickle.loads`` calls whatever the stream names, so a peer that can put
    an item can run code in the reader. This loader resolves only the
    globals our encoder emits for tensors, numpy arrays and numpy scalars
    (with their arguments checked), the builtins protocol 5 names for plain
    values (large ``bytes``, ``complex``, ``slice``, ``Ellipsis``),
    ``collections.OrderedDict``, torch dtypes, and the classes and functions
    given in ``allowed_classes``, matched exactly by module and qualified
    name. Anything else raises ``pickle.UnpicklingError`` naming the global
    before it is imported or called. Numpy's own pickle of arrays (object,
    structured and datetime dtypes) and of ``numpy.dtype`` is refused:
    ``numpy.dtype.__setstate__`` can mark a plain dtype as holding objects.

    Tensors and OrderedDicts the loader built cannot be rebuilt by the stream
    (pickle's BUILD): ``Tensor.__setstate__`` can resize a tensor or point it
    at another one's memory. Instances of the allowed classes are rebuilt as
    pickle does (their ``__setstate__`` or ``__dict__``): allow only classes
    that are safe to construct from untrusted data.

    Thread-safe; one loader serves any number of ``loads`` calls.

    Args:
        allowed_classes: Extra classes or functions to accept, as the objects
            themselves or as ``"module:qualname"`` strings (imported here).
            Each must be importable under its ``__module__`` and
            ``__qualname__``.

    Raises:
        ValueError: If an entry cannot be imported by its name, or is not
            the object importing that name gives.
    """

    def __init__(self, allowed_classes: Iterable[Any] = ()) -> None:
        if isinstance(allowed_classes, str | bytes):
            raise ValueError(
                "allowed_classes must be a sequence of classes, functions or "
                f"'module:qualname' strings, not one string: got {allowed_classes!r}"
            )
        extra: dict[tuple[str, str], Any] = {}
        paths: list[str] = []
        for entry in allowed_classes:
            obj, module, qualname = _resolve_allowed(entry)
            if (module, qualname) not in extra:
                extra[(module, qualname)] = obj
                paths.append(f"{module}:{qualname}")
        self._extra = extra
        self._paths = tuple(paths)

    @property
    def allowed_classes(self) -> tuple[str, ...]:
        """The extra classes and functions, as ``"module:qualname"`` strings."""
        return self._paths

    def loads(self, header: Any, buffers: Sequence[Any] = ()) -> Any:
        """Rebuilds an object from ``dumps`` output, refusing anything not allowed.

        Args:
            header: The pickle stream (bytes or any buffer object).
            buffers: The out-of-band buffers; arrays and tensors become views of them.

        Returns:
            The reconstructed object.

        Raises:
            pickle.UnpicklingError: If the stream names a global not allowed,
                gives an allowed one bad arguments, or is malformed. The
                message says what was refused and how to allow a class. No
                object of a refused stream is returned or kept.
        """
        guard = _Guard()
        unpickler = _RestrictedUnpickler(header, buffers, self._extra, guard)
        del header, buffers
        failure: str | None = None
        try:
            result = unpickler.load()
        except pickle.UnpicklingError as err:
            failure = str(err)
        except Exception as err:
            failure = f"restricted decoding failed: {type(err).__name__}: {err}"
        finally:
            guard.release()
        if failure is not None:
            # Raised outside the except clause, so that the exception keeps no
            # frame holding the stream's objects (views of the channel's memory).
            del unpickler
            raise pickle.UnpicklingError(failure)
        return result


def _resolve_allowed(entry: Any) -> tuple[Any, str, str]:
    """An ``allowed_classes`` entry as (object, module, qualname); ValueError if unusable."""
    if isinstance(entry, str):
        module, sep, qualname = entry.partition(":")
        if not (sep and module and qualname):
            raise ValueError(
                f"allowed_classes entry {entry!r} is not a 'module:qualname' string "
                "(e.g. 'mypkg.messages:Rollout')"
            )
        return _import_path(module, qualname, entry), module, qualname
    owner = getattr(entry, "__module__", None)
    name = getattr(entry, "__qualname__", None)
    if not (isinstance(owner, str) and isinstance(name, str)):
        raise ValueError(
            f"allowed_classes entry {entry!r} is not a class or function "
            "(it has no __module__ and __qualname__)"
        )
    path = f"{owner}:{name}"
    if "<locals>" in name or _import_path(owner, name, path) is not entry:
        raise ValueError(
            f"allowed_classes entry {entry!r} cannot be imported as {path} "
            "(pickle names it so): define it at module level"
        )
    return entry, owner, name


def _import_path(module: str, qualname: str, entry: str) -> Any:
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"allowed_classes entry {entry!r} cannot be imported: {err}") from err
    return obj
