"""What ``decode="restricted"`` costs a channel ``get``, against the default ``"pickle"`` (info).

Two handles of one channel, one per decode mode, take the same item from
their own key in interleaved blocks (``interleave`` in ``conftest.py``); the
item is put, untimed, before each round. A round is one ``get`` in this
process: the native take plus decoding, which is where the modes differ
(restricted decoding resolves each global through the allowlist, checks the
rebuild arguments and guards decoded tensors against pickle's BUILD). Two
payloads: a typical small message (a dict of eight float32 tensors of 4 KiB
and five scalars) and one 16 MiB tensor (zero copy in both modes, so decoding
is a small part of it). Informational rows: no target.
"""

import uuid
from typing import Any

import numpy as np
import pytest
import torch
from chbench.payloads import KiB, MiB

from rlinf.core.channel import Channel

US = 1e6
MODES = ("pickle", "restricted")


def typical_message() -> dict[str, Any]:
    """Eight 4 KiB float32 tensors and five scalars, as a rollout step might send."""
    tensors = {f"t{i}": torch.randn(4 * KiB // 4) for i in range(8)}
    return {
        **tensors,
        "step": 12,
        "reward": 0.5,
        "done": False,
        "env": "env-3",
        "lr": np.float32(3e-4),
    }


PAYLOADS = {
    "typical": ("dict of 8 x 4 KiB float32 tensors + 5 scalars", typical_message),
    "16MiB": ("one 16 MiB float32 tensor", lambda: torch.ones(16 * MiB // 4)),
}


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_restricted_vs_pickle_decoding(namespace, interleave, record_ratio, payload):
    label, make = PAYLOADS[payload]
    item = make()
    name = f"decode-{uuid.uuid4().hex[:6]}"
    writer = Channel.create(name, namespace=namespace, capacity_bytes=256 << 20)
    readers = {mode: Channel.connect(name, namespace=namespace, decode=mode) for mode in MODES}
    big = payload == "16MiB"
    try:
        stats = interleave(
            {mode: (lambda r=r, m=mode: r.get(key=m, timeout=30)) for mode, r in readers.items()},
            setup={mode: (lambda m=mode: writer.put(item, key=m, timeout=30)) for mode in MODES},
            blocks=8,
            rounds=25 if big else 300,
            warmup_rounds=5 if big else 300,
        )
    finally:
        writer.close()
        readers.clear()
    record_ratio(
        f"channel get, decode='restricted' vs 'pickle', {label}",
        stats["restricted"].median * US,
        stats["pickle"].median * US,
        unit="us",
        baseline_name="decode='pickle'",
        target=None,  # the price of the option, measured, not a goal
        floor=None,
        higher_is_better=False,
    )
