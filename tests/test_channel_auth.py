"""Channel agents serve only peers that hold the run's secret.

Tried as an outsider would: a process that knows an agent's address but not
the secret (a wrong one, or none) cannot connect, and the pickled item it
wanted to plant (one whose unpickling creates a file) never reaches the
run's consumer. A raw socket that speaks the frame protocol without the
handshake, or with a bogus proof, gets no reply to any operation (open,
reserve, put, take, qsize, UCX hello...): the agent closes it. A positive
control speaks the same handshake with the right secret (Python's ``hmac``,
independently of the Rust client) and gets its open served, so the negative
cases fail for the right reason. The agent logs refusals once per peer,
caps live connections and drops silent ones; the scheduler's node agents
listen on the node's cluster address and use the directory's secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import ray

from rlinf.core.channel import CHANNEL_SECRET_ENV, Channel, ChannelAgent

MAGIC = b"RLINFAU1"
AGENT_LABEL = b"rlinf-channel agent"
CLIENT_LABEL = b"rlinf-channel client"
WAIT_S = 60.0  # bound of waits that succeed long before it; no pass depends on speed

# One request frame per operation, as the Rust client encodes them (op code, then
# fields; the agent must not serve any of them before authentication).
_OPEN = (
    bytes([1])
    + struct.pack("<I", 2)
    + b"ns"
    + struct.pack("<I", 1)
    + b"c"
    + bytes([1])
    + struct.pack("<IIIQI", 4, 16, 16, 1 << 20, 0)
)
OPERATIONS = {
    "open": _OPEN,
    "lane": bytes([2]) + struct.pack("<II", 0, 1) + b"k",
    "reserve": bytes([3]) + struct.pack("<IIQqqB", 0, 0, 64, 1, 0, 1),
    "publish": bytes([4]) + struct.pack("<Q", 1),
    "take": bytes([5]) + struct.pack("<IIqqB", 0, 0, 0, 0, 1),
    "qsize": bytes([7]) + struct.pack("<II", 0, 0),
    "ucx_hello": bytes([13]),
    "one_sided_write": bytes([0xF0]) + struct.pack("<QQQ", 1, 0, 8) + b"\x00" * 8,
}


def _frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _closed_without_reply(sock: socket.socket) -> bool:
    """True if the peer closes the connection without sending a byte."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _address(agent: ChannelAgent) -> tuple[str, int]:
    host, port = agent.address.rsplit(":", 1)
    return host, int(port)


def _handshake(sock: socket.socket, secret: bytes | None) -> int:
    """Speaks the client side; ``secret=None`` sends a random proof. Returns the verdict byte."""
    client_nonce = secrets.token_bytes(32)
    sock.sendall(MAGIC + client_nonce)
    challenge = _recv_exact(sock, 8 + 32 + 32)
    assert challenge[:8] == MAGIC, challenge[:8]
    agent_nonce = challenge[8:40]
    if secret is None:
        proof = secrets.token_bytes(32)
    else:
        want = hmac.new(secret, AGENT_LABEL + client_nonce + agent_nonce, hashlib.sha256)
        assert hmac.compare_digest(want.digest(), challenge[40:]), "the agent's proof is wrong"
        proof = hmac.new(secret, CLIENT_LABEL + agent_nonce + client_nonce, hashlib.sha256).digest()
    sock.sendall(proof)
    return _recv_exact(sock, 1)[0]


def test_the_right_secret_is_served_by_the_raw_protocol(agent: ChannelAgent) -> None:
    """Positive control: the handshake below, with the session's secret, gets an open served."""
    secret = os.environ[CHANNEL_SECRET_ENV].encode()
    name = f"auth{uuid.uuid4().hex[:8]}"
    open_frame = (
        bytes([1])
        + struct.pack("<I", len(os.environ["RLINF_CHANNEL_NAMESPACE"]))
        + os.environ["RLINF_CHANNEL_NAMESPACE"].encode()
        + struct.pack("<I", len(name))
        + name.encode()
        + bytes([1])
        + struct.pack("<IIIQI", 4, 16, 16, 1 << 20, 0)
    )
    with socket.create_connection(_address(agent), timeout=WAIT_S) as sock:
        assert _handshake(sock, secret) == 0
        sock.sendall(_frame(open_frame))
        (length,) = struct.unpack("<I", _recv_exact(sock, 4))
        reply = _recv_exact(sock, length)
        assert reply[0] == 0, reply  # OK status: the agent created the channel for the peer


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_no_operation_is_served_without_the_handshake(agent: ChannelAgent, operation: str) -> None:
    with socket.create_connection(_address(agent), timeout=WAIT_S) as sock:
        sock.sendall(_frame(OPERATIONS[operation]))
        assert _closed_without_reply(sock)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_no_operation_is_served_after_a_bogus_proof(agent: ChannelAgent, operation: str) -> None:
    with socket.create_connection(_address(agent), timeout=WAIT_S) as sock:
        assert _handshake(sock, None) == 1  # refused
        try:
            sock.sendall(_frame(OPERATIONS[operation]))
        except (BrokenPipeError, ConnectionResetError):
            return  # already closed
        assert _closed_without_reply(sock)


_OUTSIDER = textwrap.dedent(
    """
    import os, sys
    from rlinf.core.channel import Channel, ChannelAuthError

    class Payload:
        def __reduce__(self):
            return (open, (sys.argv[3], "w"))

    try:
        ch = Channel.connect(sys.argv[2], address=sys.argv[1], timeout=30)
        ch.put(Payload())
    except ChannelAuthError as err:
        print("AUTH-ERROR", err)
        sys.exit(0)
    print("CONNECTED")
    sys.exit(1)
    """
)


@pytest.mark.parametrize("outsider_secret", ["wrong", "none"])
def test_an_outsider_cannot_plant_a_pickle(
    agent: ChannelAgent, tmp_path: Path, outsider_secret: str
) -> None:
    name = f"victim{uuid.uuid4().hex[:8]}"
    consumer = Channel.create(name)
    marker = tmp_path / "pwned"
    env = dict(os.environ)
    if outsider_secret == "wrong":
        env[CHANNEL_SECRET_ENV] = secrets.token_hex(32)
    else:
        env.pop(CHANNEL_SECRET_ENV)
    done = subprocess.run(
        [sys.executable, "-c", _OUTSIDER, agent.address, name, str(marker)],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "AUTH-ERROR" in done.stdout and CHANNEL_SECRET_ENV in done.stdout, done.stdout
    with pytest.raises(TimeoutError):
        consumer.get(timeout=0.5)
    assert not marker.exists()
    consumer.close()


_LOGGING_AGENT = textwrap.dedent(
    """
    import sys, time
    from rlinf.core.channel import ChannelAgent

    agent = ChannelAgent("127.0.0.1:0")
    print(agent.address, flush=True)
    sys.stdin.readline()
    agent.stop()
    """
)


def test_refusals_are_logged_once_per_peer() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOGGING_AGENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        host, port = proc.stdout.readline().strip().rsplit(":", 1)
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
                assert _handshake(sock, None) == 1
        proc.stdin.write("\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    refusals = [line for line in err.splitlines() if "refused a connection from 127.0.0.1" in line]
    assert len(refusals) == 1, err
    assert "wrong channel secret" in refusals[0]
    assert os.environ[CHANNEL_SECRET_ENV] not in err  # the secret is never printed


def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    # A handshake timeout far beyond the test, so the silent ones stay counted.
    agent = ChannelAgent("127.0.0.1:0", max_connections=2, handshake_timeout=WAIT_S * 10)
    silent: list[socket.socket] = []
    try:
        silent = [socket.create_connection(_address(agent), timeout=WAIT_S) for _ in range(2)]
        deadline = time.monotonic() + WAIT_S
        closed_at_once = False
        while not closed_at_once and time.monotonic() < deadline:
            with socket.create_connection(_address(agent), timeout=WAIT_S) as third:
                # Either the cap closes it, or the agent accepted it before a silent
                # one; retry until two are counted (any connection beyond them closes).
                third.settimeout(0.3)
                try:
                    closed_at_once = third.recv(1) == b""
                except TimeoutError:
                    closed_at_once = False
                except ConnectionResetError:
                    closed_at_once = True
        assert closed_at_once, "a connection beyond max_connections=2 stayed open"
    finally:
        for sock in silent:
            sock.close()
        agent.stop()


def test_a_silent_connection_is_dropped_after_the_handshake_timeout() -> None:
    agent = ChannelAgent("127.0.0.1:0", handshake_timeout=0.5)
    try:
        with socket.create_connection(_address(agent), timeout=WAIT_S) as silent:
            # No greeting within 0.5 s: dropped (without the timeout, recv would wait
            # WAIT_S and raise TimeoutError).
            assert _closed_without_reply(silent)
    finally:
        agent.stop()


def test_bad_agent_options_name_the_argument() -> None:
    with pytest.raises(ValueError, match="max_connections must be at least 1"):
        ChannelAgent("127.0.0.1:0", max_connections=0)
    with pytest.raises(ValueError, match="handshake_timeout"):
        ChannelAgent("127.0.0.1:0", handshake_timeout=0)


def test_scheduler_agents_listen_on_the_cluster_address_with_the_directorys_secret() -> None:
    from rlinf.sched import Cluster
    from rlinf.sched.comm.directory import get_directory

    assert not ray.is_initialized()
    with Cluster(num_nodes=1, num_cpus=1):
        directory = get_directory()
        node = ray.get_runtime_context().get_node_id()
        advertised = ray.get(directory.agent_address.remote(node), timeout=WAIT_S)
        handle = ray.get(directory.agent_handle.remote(node), timeout=WAIT_S)
        bound = ray.get(handle.bound_address.remote(), timeout=WAIT_S)
        node_ip = ray.util.get_node_ip_address()
        assert bound.rsplit(":", 1)[0] == node_ip != "0.0.0.0", bound
        assert advertised == f"{node_ip}:{bound.rsplit(':', 1)[1]}"
        # This process took the directory's secret: it authenticates to that agent.
        secret = ray.get(directory.channel_secret.remote(), timeout=WAIT_S)
        assert os.environ[CHANNEL_SECRET_ENV] == secret
        host, port = advertised.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            assert _handshake(sock, secret.encode()) == 0
