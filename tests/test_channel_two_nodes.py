"""Two "nodes" on one machine: children forced onto the agent path reach a
channel homed in the parent through the parent's agent.

The child processes get ``RLINF_CHANNEL_AGENT`` set, so every
``Channel.connect`` in them goes through the agent, exactly as a process on
another node would; payload bytes never touch their shared memory. Each test
runs over every transport: TCP, and, where the extension was built with the
``ucx`` feature (``UCX_COMPILED``), UCX restricted by ``UCX_TLS`` to its
``tcp`` and to its shared-memory (``sm``) transports.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlinf.core.channel import (
    AGENT_ENV,
    TRANSPORT_ENV,
    UCX_COMPILED,
    Channel,
    ChannelAgent,
    ucx_unavailable_reason,
)

CTX = mp.get_context("spawn")
REPO = Path(__file__).resolve().parents[1]
# Bound of waits that must succeed long before it (spawned children import numpy
# and the channel first: seconds on 2 busy cores); no pass depends on speed.
WAIT_S = 120.0


_UCX_MISSING = ucx_unavailable_reason()
_NO_UCX = pytest.mark.skipif(
    _UCX_MISSING is not None,
    reason=f"UCX is not usable here (docs/channel.md): {_UCX_MISSING}",
)


@pytest.fixture(
    params=[
        "tcp",
        pytest.param("ucx-tcp", marks=_NO_UCX),
        pytest.param("ucx-sm", marks=_NO_UCX),
    ]
)
def transport(request: pytest.FixtureRequest) -> str:
    """The path under test: ``tcp``, or ``ucx-<UCX_TLS>``."""
    return str(request.param)


def _remote_env(agent: ChannelAgent, transport: str) -> dict[str, str]:
    # The agent address forces every Channel.connect in the child through the agent.
    env = {AGENT_ENV: agent.address, TRANSPORT_ENV: transport.split("-")[0]}
    if transport.startswith("ucx-"):
        env["UCX_TLS"] = transport.removeprefix("ucx-")
    return env


def _run_with_env(env: dict[str, str], target, *args) -> mp.Process:  # type: ignore[no-untyped-def]
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # Spawned children copy the parent's sys.path; the repo root lets them
    # import this module (as `tests.test_channel_two_nodes`) for `target`.
    sys.path.insert(0, str(REPO))
    try:
        proc = CTX.Process(target=target, args=args, daemon=True)
        proc.start()
    finally:
        sys.path.remove(str(REPO))
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return proc


def _echo_node(name: str, n: int, transport: str) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    assert ch.address is not None, "the child must be on the agent path"
    assert ch.transport == transport.split("-")[0]
    for _ in range(n):
        item = ch.get(key="to_child", timeout=WAIT_S)
        arr = item["data"]
        arr += 1  # received arrays are writable
        ch.put(
            {"seq": item["seq"], "data": arr, "sum": float(arr.sum())},
            key="to_parent",
            timeout=WAIT_S,
        )
    batch = ch.get_batch(3, key="weighted", timeout=WAIT_S)
    ch.put([x["w"] for x in batch], key="to_parent", timeout=WAIT_S)


def test_remote_node_roundtrips_arrays_in_order(agent: ChannelAgent, transport: str) -> None:
    name = f"two_nodes_{uuid.uuid4().hex[:8]}"
    home = Channel.create(name, maxsize=4)
    child = _run_with_env(_remote_env(agent, transport), _echo_node, name, 50, transport)
    try:
        rng = np.random.default_rng(0)
        sent = []
        for seq in range(50):
            data = rng.random(rng.integers(1, 200_000))
            sent.append(data)
            home.put({"seq": seq, "data": data}, key="to_child", timeout=WAIT_S)
            reply = home.get(key="to_parent", timeout=WAIT_S)
            assert reply["seq"] == seq
            np.testing.assert_array_equal(reply["data"], data + 1)
            assert reply["sum"] == pytest.approx(float((data + 1).sum()))
        for w in (1, 2, 3):
            home.put({"w": w}, key="weighted", weight=w)
        assert home.get(key="to_parent", timeout=WAIT_S) == [1, 2]
        child.join(WAIT_S)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()


def _stream_forever(name: str, key: int, done: Any) -> None:
    ch = Channel.connect(name, timeout=WAIT_S)
    payload = np.zeros(1 << 20, dtype=np.int64)  # 8 MiB
    seq = 0
    while True:
        payload.fill(seq)
        ch.put({"seq": seq, "payload": payload}, key=key, timeout=WAIT_S)
        done.value = seq
        seq += 1


def _check_whole(item: dict[str, object]) -> int:
    payload, seq = item["payload"], item["seq"]
    assert isinstance(payload, np.ndarray) and isinstance(seq, int)
    assert (payload == seq).all(), "torn item"
    return seq


def test_remote_producer_killed_mid_transfer_leaves_no_torn_item(
    agent: ChannelAgent, transport: str
) -> None:
    name = f"two_nodes_kill_{uuid.uuid4().hex[:8]}"
    home = Channel.create(name, maxsize=2)
    rng = np.random.default_rng(1)
    in_flight = {}  # round -> seq of the put that was in flight when its producer died
    for round_ in range(5):
        # Each round streams under its own key, so the in-flight item of a killed
        # producer, whenever the agent publishes it, is never read as the next
        # round's.
        # A plain shared int: the child is SIGKILLed at a random point, and a locked
        # Value's lock held by it then hangs this read (it did, in CI).
        done = CTX.RawValue("q", -1)
        child = _run_with_env(_remote_env(agent, transport), _stream_forever, name, round_, done)
        received = []
        try:
            received.append(_check_whole(home.get(key=round_, timeout=WAIT_S)))
            time.sleep(float(rng.uniform(0, 0.05)))
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(WAIT_S)
            last_done = done.value
            # Every put that returned before the kill arrives whole and in order.
            while received[-1] < last_done:
                item = home.get(key=round_, timeout=WAIT_S)
                received.append(_check_whole(item))
                del item
            # The one in flight may be here already, come later, or never come.
            try:
                item = home.get_nowait(key=round_)
            except asyncio.QueueEmpty:
                pass
            else:
                received.append(_check_whole(item))
                del item
        finally:
            if child.is_alive():
                child.kill()
        assert received == list(range(len(received))), "in order, nothing lost"
        assert last_done <= received[-1] <= last_done + 1
        in_flight[round_] = received[-1] + 1
    # The agent withdrew the dead peers' reservations and freed their blocks.
    deadline = time.monotonic() + WAIT_S
    while home.stats()["writing_blocks"] and time.monotonic() < deadline:
        time.sleep(0.05)
    # An in-flight item published after its round was checked: whole, the next seq.
    for round_, seq in in_flight.items():
        try:
            item = home.get_nowait(key=round_)
        except asyncio.QueueEmpty:
            continue
        assert _check_whole(item) == seq, "only the in-flight put can come late"
        del item
        assert home.qsize(round_) == 0, "only the in-flight put can come late"
    stats = home.stats()
    assert stats["writing_blocks"] == 0 and stats["leased_blocks"] == 0, stats


def test_unreachable_agent_names_the_address() -> None:
    with pytest.raises(OSError, match=r"cannot reach the channel agent at 127\.0\.0\.1:1"):
        Channel.connect("nothing", address="127.0.0.1:1")


def test_transport_variable_is_validated(
    agent: ChannelAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"two_nodes_env_{uuid.uuid4().hex[:8]}"
    home = Channel.create(name)
    monkeypatch.setenv(TRANSPORT_ENV, "rdma")
    with pytest.raises(ValueError, match=r"RLINF_CHANNEL_TRANSPORT=\"rdma\".*auto, tcp, ucx"):
        Channel.connect(name, address=agent.address)
    monkeypatch.setenv(TRANSPORT_ENV, "tcp")
    assert Channel.connect(name, address=agent.address).transport == "tcp"
    monkeypatch.setenv(TRANSPORT_ENV, "auto")
    # auto takes UCX only on hosts with an RDMA device (docs/channel.md).
    rdma = Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir())
    expected = "ucx" if _UCX_MISSING is None and rdma else "tcp"
    assert Channel.connect(name, address=agent.address).transport == expected
    monkeypatch.setenv(TRANSPORT_ENV, "ucx")
    if _UCX_MISSING is None:
        assert Channel.connect(name, address=agent.address).transport == "ucx"
    else:
        match = "libucp" if UCX_COMPILED else "no UCX support"
        with pytest.raises(OSError, match=match):
            Channel.connect(name, address=agent.address)
    assert home.transport == "shm"


_MISSING_LIBUCP_CHILD = """
import os, sys
from rlinf.core.channel import TRANSPORT_ENV, Channel, ChannelAgent, ucx_unavailable_reason
reason = ucx_unavailable_reason()
assert reason is not None and "libucp" in reason and "apt-get install libucx0" in reason, reason
agent = ChannelAgent("127.0.0.1:0")
home = Channel.create(sys.argv[1])
os.environ[TRANSPORT_ENV] = "auto"
remote = Channel.connect(sys.argv[1], address=agent.address)
assert remote.transport == "tcp", remote.transport
remote.put(b"x" * 1000)
assert home.get() == b"x" * 1000
os.environ[TRANSPORT_ENV] = "ucx"
try:
    Channel.connect(sys.argv[1], address=agent.address)
except OSError as e:
    print("UCX-ERROR:", e)
else:
    raise AssertionError("ucx connected without libucp")
agent.stop()
"""


@pytest.mark.skipif(not UCX_COMPILED, reason="the extension was built without UCX")
def test_without_libucp_the_extension_runs_over_tcp_and_ucx_names_the_fix() -> None:
    # UCX's runtime library really is missing for the child: the loader is
    # pointed at a path that does not exist.
    env = dict(os.environ, RLINF_UCX_LIBRARY="/nonexistent/rlinf/libucp.so.0")
    env.pop(TRANSPORT_ENV, None)
    name = f"two_nodes_nolib_{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", _MISSING_LIBUCP_CHILD, name],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("UCX-ERROR:"))
    for part in (TRANSPORT_ENV, "/nonexistent/rlinf/libucp.so.0", "apt-get install libucx0"):
        assert part in line, line
