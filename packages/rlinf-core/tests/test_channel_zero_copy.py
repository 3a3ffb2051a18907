"""A ``get`` returns memory inside the channel's shared-memory segment (no copy).

Behaviour only: where the returned data lives, not how fast it arrives (the
benchmark tier, ``uv run pytest benchmarks``, compares the time of a 64 MiB
and a 1 MiB get).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rlinf.core import _native
from rlinf.core.channel import Channel

MiB = 1 << 20
WAIT_S = 30.0


def segment_mappings(segment: str) -> list[tuple[int, int]]:
    """Address ranges at which /dev/shm/<segment> is mapped in this process."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(f"/dev/shm/{segment}"):
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def inside(address: int, nbytes: int, ranges: list[tuple[int, int]]) -> bool:
    return any(lo <= address and address + nbytes <= hi for lo, hi in ranges)


@pytest.fixture
def ch(channel_name: str) -> Iterator[Channel]:
    channel = Channel.create(channel_name, capacity_bytes=512 * MiB)
    yield channel
    channel.close()


@pytest.fixture
def mapped(ch: Channel, channel_name: str) -> list[tuple[int, int]]:
    ranges = segment_mappings(_native.segment_name(ch.namespace, channel_name))
    assert ranges, "the channel's segment is not mapped in this process"
    return ranges


@pytest.mark.parametrize("size", [MiB, 64 * MiB], ids=["1MiB", "64MiB"])
def test_get_of_queued_arrays_returns_views_inside_the_segment(
    ch: Channel, mapped: list[tuple[int, int]], size: int
) -> None:
    queued = 3
    for i in range(queued):
        ch.put(np.full(size // 4, float(i), dtype=np.float32), timeout=WAIT_S)
    got = [ch.get(timeout=WAIT_S) for _ in range(queued)]
    for i, arr in enumerate(got):
        assert arr.nbytes == size and arr.dtype == np.float32
        assert arr.flags.writeable and not arr.flags.owndata
        assert inside(arr.ctypes.data, arr.nbytes, mapped), (
            "get returned memory outside the channel"
        )
        assert arr[0] == arr[-1] == float(i)
    starts = sorted(arr.ctypes.data for arr in got)
    assert all(b - a >= size for a, b in itertools.pairwise(starts)), "arrays overlap"
    del got, arr


def test_get_of_a_tensor_returns_storage_inside_the_segment(
    ch: Channel, mapped: list[tuple[int, int]]
) -> None:
    ch.put(torch.arange(MiB, dtype=torch.int32), timeout=WAIT_S)
    got = ch.get(timeout=WAIT_S)
    nbytes = got.numel() * got.element_size()
    assert inside(got.data_ptr(), nbytes, mapped), "get returned memory outside the channel"
    assert int(got[-1]) == MiB - 1
    del got
