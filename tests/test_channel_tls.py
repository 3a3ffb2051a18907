"""Channel agent connections encrypted with TLS (``RLINF_CHANNEL_TLS=1``).

A child process that asks for TLS puts a numpy array through the agent of
this process and the parent gets it back bit for bit; the child's handle
reports ``tcp+tls``, so the test fails if the variable were ignored. A TLS
client with a wrong secret gets ``ChannelAuthError`` (the challenge-response
runs inside TLS). Asking for UCX together with TLS, or giving the variable a
value it does not take, raises ``ValueError`` naming the variables. Skipped
when the extension was built without the ``tls`` cargo feature.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from rlinf.core.channel import (
    CHANNEL_SECRET_ENV,
    TLS_COMPILED,
    TLS_ENV,
    TRANSPORT_ENV,
    Channel,
    ChannelAgent,
)

pytestmark = pytest.mark.skipif(
    not TLS_COMPILED, reason="the extension was built without the `tls` cargo feature"
)

WAIT_S = 60.0  # bound of waits that succeed long before it; no pass depends on speed
SHAPE = (512, 1024)  # 2 MiB of float32: many TLS records


def _array(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE, dtype=np.float32)


_TLS_PRODUCER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from rlinf.core.channel import Channel, ChannelAuthError

    address, name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        ch = Channel.connect(name, address=address, timeout=30)
    except ChannelAuthError as err:
        print("AUTH-ERROR", err)
        sys.exit(0)
    print("TRANSPORT", ch.transport)
    array = np.random.default_rng(seed).standard_normal((512, 1024), dtype=np.float32)
    ch.put({"seed": seed, "array": array})
    print("PUT")
    """
)


def _run_producer(agent: ChannelAgent, name: str, seed: int, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _TLS_PRODUCER, agent.address, name, str(seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_tls_client_puts_an_array_the_parent_gets_exactly(agent: ChannelAgent) -> None:
    name = f"tls{uuid.uuid4().hex[:8]}"
    consumer = Channel.create(name)
    try:
        out = _run_producer(agent, name, seed=7, env={**os.environ, TLS_ENV: "1"})
        assert "TRANSPORT tcp+tls" in out and "PUT" in out, out
        item = consumer.get(timeout=WAIT_S)
        assert item["seed"] == 7
        want = _array(7)
        assert item["array"].dtype == want.dtype and item["array"].shape == want.shape
        assert item["array"].tobytes() == want.tobytes()
    finally:
        consumer.close()


def test_a_wrong_secret_over_tls_is_an_auth_error(agent: ChannelAgent) -> None:
    name = f"tls{uuid.uuid4().hex[:8]}"
    consumer = Channel.create(name)
    try:
        env = {**os.environ, TLS_ENV: "1", CHANNEL_SECRET_ENV: secrets.token_hex(32)}
        out = _run_producer(agent, name, seed=1, env=env)
        assert "AUTH-ERROR" in out and CHANNEL_SECRET_ENV in out, out
        with pytest.raises(TimeoutError):
            consumer.get(timeout=0.5)
    finally:
        consumer.close()


def test_ucx_with_tls_names_both_variables(
    agent: ChannelAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_ENV, "1")
    monkeypatch.setenv(TRANSPORT_ENV, "ucx")
    with pytest.raises(ValueError, match=f"{TRANSPORT_ENV}=ucx and {TLS_ENV}=1") as err:
        Channel.connect(f"tls{uuid.uuid4().hex[:8]}", address=agent.address)
    assert "outside the TLS stream" in str(err.value)


def test_an_invalid_tls_value_names_the_variable(
    agent: ChannelAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_ENV, "maybe")
    with pytest.raises(ValueError, match=f'{TLS_ENV}="maybe"'):
        Channel.connect(f"tls{uuid.uuid4().hex[:8]}", address=agent.address)
