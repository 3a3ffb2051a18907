"""The shared weight-sync protocol: bucket plan, send/receive order, completeness."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from rlinf.core.weight_sync import (
    WeightBucket,
    check_complete,
    plan_buckets,
    receive_weights,
    send_weights,
)


def _named() -> list[tuple[str, torch.Tensor]]:
    # 4 KiB, 4 KiB, 16 KiB (larger than the cap: a bucket of its own), 1 KiB
    sizes = {"a": 1024, "b": 1024, "big": 4096, "c": 256}
    return [(name, torch.full((n,), float(i))) for i, (name, n) in enumerate(sizes.items())]


def test_buckets_keep_order_and_bound_their_size() -> None:
    plan = plan_buckets(_named(), cap_bytes=8192)
    assert [[n for n, _ in bucket] for bucket in plan] == [["a", "b"], ["big"], ["c"]]
    assert plan_buckets([], cap_bytes=1) == [[]]  # an empty model still sends one bucket


def test_what_is_sent_is_received_in_order_with_its_version() -> None:
    wire: deque[WeightBucket] = deque()
    gathered: list[str] = []

    def gather(t: torch.Tensor) -> torch.Tensor:
        gathered.append(str(t.shape))
        return t * 1

    buckets, nbytes = send_weights(_named(), 7, 8192, wire.append, gather=gather)
    assert (buckets, nbytes) == (3, (1024 + 1024 + 4096 + 256) * 4)
    assert len(gathered) == 4  # every tensor went through the (collective) gather
    loaded: dict[str, torch.Tensor] = {}
    version, received_buckets, names = receive_weights(
        wire.popleft, lambda b: loaded.update(b.tensors)
    )
    assert (version, received_buckets, names) == (7, 3, {"a", "b", "big", "c"})
    for name, tensor in _named():
        assert torch.equal(loaded[name], tensor)
    assert not wire


def test_a_non_source_rank_gathers_but_sends_nothing() -> None:
    calls: list[int] = []
    buckets, _ = send_weights(_named(), 1, 8192, None, gather=lambda t: calls.append(1) or t)
    assert buckets == 3 and len(calls) == 4


def test_out_of_order_buckets_and_missing_weights_are_named() -> None:
    t = torch.zeros(1)
    wire = deque([WeightBucket(3, 0, 2, [("a", t)]), WeightBucket(4, 1, 2, [("b", t)])])
    with pytest.raises(RuntimeError, match="expected bucket 1 of version 3, got bucket 1 of"):
        receive_weights(wire.popleft, lambda b: None)
    with pytest.raises(RuntimeError, match=r"weight sync v5: the actor sent no value for \['x'\]"):
        check_complete(["a", "x"], {"a"}, 5, "check the model paths")
    check_complete(["a"], {"a", "extra"}, 5, "")
