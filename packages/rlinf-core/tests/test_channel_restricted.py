"""``decode="restricted"``: tensors, arrays and plain data decode; nothing else runs.

Every test goes through real channels in shared memory: a writer handle puts
(with the ordinary encoder, which pickles whatever it is given), a reader
handle made with ``decode="restricted"`` takes. A refused item is taken from
the channel and dropped (so it cannot block its key) and raises
``pickle.UnpicklingError`` naming what was refused; nothing of it runs (the
tests plant items whose unpickling would create a file, and check it does
not exist afterwards).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf.core.channel import Channel, ChannelNotFound
from rlinf.core.channel.channel import DECODE_MODES
from rlinf.core.channel.serialization import _rebuild_tensor, _reduce_ndarray

WAIT_S = 60.0


@dataclasses.dataclass
class Point:
    """A plain dataclass: accepted when named in ``allowed_classes``."""

    x: float
    label: str
    data: torch.Tensor


class Arbitrary:
    """Any class the reader did not allow."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Arbitrary) and other.value == self.value


class Planted:
    """Pickles as ``reduce``: unpickling calls what ``reduce`` names (the writer runs nothing)."""

    def __init__(self, *reduce: Any) -> None:
        self.reduce = reduce

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduce


@pytest.fixture
def writer(channel_name: str) -> Iterator[Channel]:
    channel = Channel.create(channel_name, capacity_bytes=64 << 20)
    yield channel
    channel.close()


@pytest.fixture
def reader(writer: Channel) -> Channel:
    return Channel.connect(writer.name, decode="restricted")


def leased(channel: Channel) -> int:
    gc.collect()
    return channel.stats()["leased_blocks"]


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape, got.requires_grad) == (
            want.dtype,
            want.shape,
            want.requires_grad,
        )
        assert torch.equal(got.detach(), want.detach())
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, Point):
        assert (got.x, got.label) == (want.x, want.label)
        assert_same(got.data, want.data)
    else:
        assert got == want


# ----- what decodes -----------------------------------------------------------------------


def test_restricted_handle_decodes_tensors_arrays_scalars_and_containers(
    writer: Channel, reader: Channel
) -> None:
    item = {
        "obs": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "mask": np.array([True, False]),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "text": np.array(["ab", "c"]),
        "act": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "bf16": torch.full((3, 2), 1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "empty_bf16": torch.zeros(2, 0, dtype=torch.bfloat16),
        "grad": torch.ones(3, requires_grad=True),
        "param": torch.nn.Parameter(torch.ones(2)),
        "scalars": [1, -(1 << 80), 2.5, True, None, 1 - 2j, "text", b"raw", bytearray(b"ba")],
        "numpy_scalars": (np.float32(1.5), np.int64(-3), np.uint8(7), np.bool_(True)),
        "more_numpy_scalars": (np.float64(0.25), np.longlong(4), np.datetime64("2024-01-02")),
        "nested": {"a": [({"b": (1, [2, {3}])}, frozenset({4}))], "idx": slice(1, None, 2)},
        "ordered": collections.OrderedDict(b=1, a=torch.zeros(2)),
        "dtypes": [torch.float32, torch.bfloat16, torch.int64, ...],
    }
    writer.put(item)
    got = reader.get(timeout=WAIT_S)
    # A Parameter arrives as a plain tensor that requires grad, as with decode="pickle".
    assert type(got["param"]) is torch.Tensor and got["param"].requires_grad
    assert_same(got, {**item, "param": got["param"]})
    assert type(got["ordered"]) is collections.OrderedDict
    assert type(got["numpy_scalars"][0]) is np.float32
    assert type(got["more_numpy_scalars"][1]) is np.longlong
    # Arrays and tensors are still writable views of the channel's memory (no copy).
    assert got["obs"].flags.writeable and not got["obs"].flags.owndata
    assert got["obs"].base is not None
    got["act"][0, 0] = 99.0
    # What the decoder put on the objects while it ran is gone.
    assert "__setstate__" not in vars(got["act"])
    assert "__setstate__" not in vars(got["ordered"])


def test_decoded_items_free_their_memory_without_the_garbage_collector(
    writer: Channel, reader: Channel
) -> None:
    """No reference cycle keeps a decoded item's views of the channel alive, nor a refused one's."""
    item = {"t": torch.ones(1024), "a": np.ones(1024), "o": collections.OrderedDict(x=1)}
    baseline = leased(writer)
    gc.disable()
    try:
        for _ in range(3):
            writer.put(item)
            got = reader.get(timeout=WAIT_S)
            assert got["t"].sum() == 1024
            del got
            assert writer.stats()["leased_blocks"] == baseline
            writer.put({"t": torch.ones(1024), "bad": Arbitrary(1)})
            with pytest.raises(pickle.UnpicklingError):
                reader.get(timeout=WAIT_S)
            assert writer.stats()["leased_blocks"] == baseline
    finally:
        gc.enable()


def test_restricted_handle_decodes_top_level_values(writer: Channel, reader: Channel) -> None:
    values: list[Any] = [
        torch.arange(5),
        np.zeros((2, 2), np.float64),
        b"x" * (1 << 20),  # a large top-level bytes item travels out of band
        b"",
        "str",
        7,
        0.5,
        None,
        (1, 2),
        [torch.zeros(3)],
    ]
    for value in values:
        writer.put(value)
    for value in values:
        assert_same(reader.get(timeout=WAIT_S), value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_restricted_handle_decodes_cuda_tensors_to_the_same_device(
    writer: Channel, reader: Channel
) -> None:
    item = {"x": torch.arange(6.0, device="cuda").reshape(2, 3), "e": torch.zeros(0, device="cuda")}
    writer.put(item)
    got = reader.get(timeout=WAIT_S)
    assert got["x"].device == item["x"].device and torch.equal(got["x"], item["x"])
    assert got["e"].device == item["e"].device and got["e"].shape == (0,)
    assert "__setstate__" not in vars(got["x"])


def test_allowed_dataclass_decodes_when_named(writer: Channel, channel_name: str) -> None:
    by_object = Channel.connect(channel_name, decode="restricted", allowed_classes=[Point])
    path = f"{Point.__module__}:{Point.__qualname__}"
    by_name = Channel.connect(channel_name, decode="restricted", allowed_classes=[path])
    assert by_object.allowed_classes == by_name.allowed_classes == (path,)
    point = Point(1.5, "p", torch.arange(4.0))
    for handle in (by_object, by_name):
        writer.put({"points": [point, point]})
        got = handle.get(timeout=WAIT_S)["points"]
        assert_same(got[0], point)
        assert got[0] is got[1]  # pickle's memo: the same object twice
    # Without it the same item is refused, naming the class and the way to allow it.
    writer.put(point)
    with pytest.raises(pickle.UnpicklingError, match=r"Point.*allowed_classes"):
        Channel.connect(channel_name, decode="restricted").get(timeout=WAIT_S)


def test_every_get_path_decodes_restricted(writer: Channel, reader: Channel) -> None:
    item = {"t": torch.ones(2, 2), "a": np.ones(3, np.uint8), "n": 3}
    for _ in range(4):
        writer.put(item, weight=1)
    assert_same(reader.get_nowait(), item)
    assert_same(reader.get_batch(2, timeout=WAIT_S), [item, item])

    async def take() -> list[Any]:
        return [await reader.aget(timeout=WAIT_S)]

    assert_same(asyncio.run(take()), [item])
    writer.put(item, weight=1)
    writer.put(item, weight=1)
    assert_same(asyncio.run(reader.aget_batch(2, timeout=WAIT_S)), [item, item])


def test_default_handle_still_decodes_arbitrary_classes(writer: Channel) -> None:
    assert writer.decode == "pickle" and writer.allowed_classes == ()
    item = {"obj": Arbitrary(3), "objects": np.array([1, "a"], dtype=object)}
    writer.put(item)
    got = writer.get(timeout=WAIT_S)
    assert got["obj"] == Arbitrary(3)
    assert got["objects"].tolist() == [1, "a"]


# ----- what is refused ---------------------------------------------------------------------


def file_creating_items(path: Path) -> dict[str, Any]:
    """Items whose unpickling (by plain pickle) creates ``path``."""
    return {
        "open": Planted(open, (str(path), "w")),
        "os.system": Planted(os.system, (f"touch {path}",)),
        "builtins.eval": Planted(eval, (f"open({str(path)!r}, 'w').close()",)),
        "builtins.exec": Planted(exec, (f"open({str(path)!r}, 'w').close()",)),
        # A bound method pickles as getattr(path, "touch"); the stream then calls it.
        "Path.touch": Planted(path.touch, ()),
        "nested": {"ok": torch.zeros(2), "bad": [Planted(os.system, (f"touch {path}",))]},
    }


KINDS = ["open", "os.system", "builtins.eval", "builtins.exec", "Path.touch", "nested"]


@pytest.mark.parametrize("kind", KINDS)
def test_plain_pickle_of_a_planted_item_creates_the_file(
    writer: Channel, tmp_path: Path, kind: str
) -> None:
    """The positive control: each planted item does what the restricted handle refuses."""
    path = tmp_path / "created"
    writer.put(file_creating_items(path)[kind])
    got = writer.get(timeout=WAIT_S)
    if kind == "open":
        got.close()
    assert path.exists()


@pytest.mark.parametrize(
    ("kind", "refused"),
    [
        ("open", "io.open"),
        ("os.system", "posix.system"),
        ("builtins.eval", "builtins.eval"),
        ("builtins.exec", "builtins.exec"),
        ("Path.touch", "builtins.getattr"),
        ("nested", "posix.system"),
    ],
)
def test_item_that_would_create_a_file_is_refused_and_dropped(
    writer: Channel, reader: Channel, tmp_path: Path, kind: str, refused: str
) -> None:
    path = tmp_path / "created"
    writer.put(file_creating_items(path)[kind])
    writer.put("next")
    before = leased(writer)
    with pytest.raises(pickle.UnpicklingError) as info:
        reader.get(timeout=WAIT_S)
    message = str(info.value)
    assert f"refused the global {refused}." in message
    assert "allowed_classes=" in message and "decode='pickle'" in message
    del info
    assert not path.exists()
    # The refused item was taken and its memory went back; the next one is intact.
    assert leased(writer) <= before
    assert reader.get(timeout=WAIT_S) == "next"
    assert reader.qsize() == 0


@pytest.mark.parametrize(
    ("item", "refused"),
    [
        (Arbitrary(1), f"{__name__}.Arbitrary"),
        ({"deep": [(Arbitrary(1),)]}, f"{__name__}.Arbitrary"),
        (np.array([1, "a"], dtype=object), "numpy.core.multiarray._reconstruct"),
        (np.zeros(2, dtype=[("a", "i4"), ("b", "O")]), "numpy."),
        (np.dtype("float32"), "numpy.dtype"),
        (os.system, "posix.system"),
        (eval, "builtins.eval"),
        (getattr, "builtins.getattr"),
        (collections.Counter(a=1), "collections.Counter"),
    ],
    ids=[
        "class",
        "nested-class",
        "numpy-object-array",
        "numpy-structured-object-array",
        "numpy-dtype",
        "os.system",
        "eval",
        "getattr",
        "Counter",
    ],
)
def test_refused_globals_name_themselves(
    writer: Channel, reader: Channel, item: Any, refused: str
) -> None:
    writer.put(item)
    with pytest.raises(pickle.UnpicklingError, match="restricted decoding refused") as info:
        reader.get(timeout=WAIT_S)
    assert f"refused the global {refused}" in str(info.value)
    assert reader.qsize() == 0


@pytest.mark.parametrize(
    ("reduce", "refused"),
    [
        # bytes(n) allocates n bytes: a few bytes of stream could ask for a TB.
        ((bytes, (1 << 40,)), "bytes(int)"),
        # An "empty" tensor of a large shape: torch.empty would allocate it.
        ((_rebuild_tensor, (None, torch.float32, (1 << 40,), False, "cpu")), "without data"),
        # BUILD on a decoded tensor: Tensor.__setstate__ would resize it or point
        # it at another tensor's memory.
        (
            (
                _rebuild_tensor,
                (None, torch.float32, (0,), False, "cpu"),
                (torch.zeros(4), 0, (1 << 30,), (1,)),
            ),
            "BUILD",
        ),
        ((collections.OrderedDict, (), {"keys": "shadowed"}), "BUILD"),
        # OrderedDict(iterable) would iterate a tensor: one object per element.
        ((collections.OrderedDict, (torch.zeros(4, 2),)), "OrderedDict() with arguments"),
        # No numpy.dtype can be made, so a BUILD of a decoded array fails.
        ((*_reduce_ndarray(np.arange(2.0)), (1, (1,), "<f8", False, b"\0" * 8)), "TypeError"),
        # numpy.dtype.__setstate__ can mark a float dtype as holding objects.
        ((np.dtype, ("f8", False, True), (3, "<", None, None, None, -1, -1, 63)), "numpy.dtype"),
        ((_rebuild_tensor, (None, "float32", (0,), False, "cpu")), "dtype 'float32'"),
    ],
    ids=[
        "bytes-of-int",
        "tensor-without-data",
        "tensor-build",
        "ordereddict-build",
        "ordereddict-of-iterable",
        "ndarray-build",
        "np-dtype",
        "tensor-dtype-str",
    ],
)
def test_allowed_globals_with_hostile_arguments_are_refused(
    writer: Channel, reader: Channel, reduce: tuple[Any, ...], refused: str
) -> None:
    writer.put({"ok": torch.ones(2), "planted": Planted(*reduce)})
    with pytest.raises(
        pickle.UnpicklingError, match=r"restricted decoding (refused|failed)"
    ) as info:
        reader.get(timeout=WAIT_S)
    assert refused in str(info.value)


def test_refused_item_in_a_batch_drops_the_batch(writer: Channel, reader: Channel) -> None:
    writer.put("first", weight=1)
    writer.put(Arbitrary(2), weight=1)
    writer.put("after", weight=1)
    with pytest.raises(pickle.UnpicklingError) as info:
        reader.get_batch(2, timeout=WAIT_S)
    assert "item 1 of a batch of 2" in "\n".join(info.value.__notes__)
    assert reader.get_nowait() == "after"


def test_aget_and_get_nowait_refuse_too(writer: Channel, reader: Channel) -> None:
    writer.put(Arbitrary(1))
    with pytest.raises(pickle.UnpicklingError, match="Arbitrary"):
        reader.get_nowait()
    writer.put(Arbitrary(1))
    with pytest.raises(pickle.UnpicklingError, match="Arbitrary"):
        asyncio.run(reader.aget(timeout=WAIT_S))
    writer.put(Arbitrary(1), weight=1)
    with pytest.raises(pickle.UnpicklingError, match="Arbitrary"):
        asyncio.run(reader.aget_batch(1, timeout=WAIT_S))
    assert reader.qsize() == 0


# ----- the option ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["Pickle", "safe", "", None, 1])
def test_bad_decode_values_are_rejected(channel_name: str, bad: Any) -> None:
    expected = rf"decode must be one of 'pickle', 'restricted', got {re.escape(repr(bad))}$"
    with pytest.raises(ValueError, match=expected):
        Channel.create(channel_name, capacity_bytes=1 << 20, decode=bad)
    with pytest.raises(ChannelNotFound):  # the refused create made nothing
        Channel.connect(channel_name)
    writer = Channel.create(channel_name, capacity_bytes=1 << 20)
    with pytest.raises(ValueError, match=expected):
        Channel.connect(channel_name, decode=bad)
    writer.close()


@pytest.mark.parametrize(
    ("allowed", "fragment"),
    [
        ("mod:Cls", "not one string"),
        (["no_colon"], "not a 'module:qualname' string"),
        (["no_such_module_xyz:Cls"], "cannot be imported"),
        ([f"{__name__}:NoSuchClass"], "cannot be imported"),
        ([3], "is not a class or function"),
    ],
)
def test_bad_allowed_classes_are_rejected(channel_name: str, allowed: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        Channel.create(
            channel_name, capacity_bytes=1 << 20, decode="restricted", allowed_classes=allowed
        )
    assert "allowed_classes" in str(info.value)


def test_local_class_cannot_be_allowed(channel_name: str) -> None:
    class Local:
        pass

    with pytest.raises(ValueError, match="define it at module level"):
        Channel.create(channel_name, decode="restricted", allowed_classes=[Local])


def test_allowed_classes_need_restricted_mode(channel_name: str) -> None:
    with pytest.raises(ValueError, match="allowed_classes applies to decode='restricted' only"):
        Channel.create(channel_name, capacity_bytes=1 << 20, allowed_classes=[Point])


def test_restricted_handle_pickles_with_its_mode(writer: Channel, channel_name: str) -> None:
    restricted = Channel.connect(channel_name, decode="restricted", allowed_classes=[Point])
    assert "decode='restricted'" in repr(restricted)
    twin = pickle.loads(pickle.dumps(restricted))
    assert twin.decode == "restricted"
    assert twin.allowed_classes == (f"{Point.__module__}:{Point.__qualname__}",)
    writer.put(Point(1.0, "a", torch.zeros(1)))
    assert twin.get(timeout=WAIT_S).label == "a"
    writer.put(Arbitrary(1))
    with pytest.raises(pickle.UnpicklingError, match="Arbitrary"):
        twin.get(timeout=WAIT_S)
    # A default handle still pickles as before (and decodes anything).
    default = pickle.loads(pickle.dumps(writer))
    assert default.decode == "pickle"


def test_create_exist_ok_keeps_the_mode(writer: Channel, channel_name: str) -> None:
    again = Channel.create(channel_name, exist_ok=True, decode="restricted")
    assert again.decode == "restricted"
    writer.put(Arbitrary(1))
    with pytest.raises(pickle.UnpicklingError):
        again.get(timeout=WAIT_S)


def test_decode_modes_constant() -> None:
    assert DECODE_MODES == ("pickle", "restricted")
