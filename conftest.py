"""Repo-wide pytest fixtures: one channel namespace per session, a leak check, rank processes.

A channel made by ``Channel.create`` lives until the creating process ends
(or releases it), not until its handle is dropped. For the pytest process
"ends" means "the test is over": each test's channels are released after it
(``release_created_channels``), so they are removed (not reported as leaks)
and their memory does not pile up over the session.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_NAMESPACE_ENV = "RLINF_CHANNEL_NAMESPACE"
_SECRET_ENV = "RLINF_CHANNEL_SECRET"
_NAMESPACE = f"pytest{os.getpid()}"
_SHM = Path("/dev/shm")
_names = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def channel_namespace() -> Iterator[str]:
    """Gives the session its own channel namespace (child processes inherit it)."""
    previous = os.environ.get(_NAMESPACE_ENV)
    os.environ[_NAMESPACE_ENV] = _NAMESPACE
    yield _NAMESPACE
    if previous is None:
        os.environ.pop(_NAMESPACE_ENV, None)
    else:
        os.environ[_NAMESPACE_ENV] = previous


@pytest.fixture(scope="session", autouse=True)
def channel_secret() -> Iterator[str]:
    """Gives the session one channel secret (``RLINF_CHANNEL_SECRET``; children inherit it).

    Agents and remote connections of the test process and of the processes it
    spawns then authenticate each other, as the processes of one run do.
    """
    previous = os.environ.get(_SECRET_ENV)
    os.environ[_SECRET_ENV] = secret = secrets.token_hex(32)
    yield secret
    if previous is None:
        os.environ.pop(_SECRET_ENV, None)
    else:
        os.environ[_SECRET_ENV] = previous


def _release_created_channels() -> None:
    """What the end of the creating process does: gives up the channels this process created."""
    channel = sys.modules.get("rlinf.core.channel")
    if channel is not None:  # not imported: no channel was created
        channel.release_created_channels()


@pytest.fixture(autouse=True)
def release_channels_after_test() -> Iterator[None]:
    """Gives up the channels the test created once it and its other fixtures are done.

    Autouse fixtures are set up first and torn down last, so the test's own
    fixtures have dropped their handles by then; handles still held elsewhere
    (module fixtures) keep their channels until they are dropped.
    """
    yield
    _release_created_channels()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the run if a segment of this session's namespace outlived its tests.

    Runs after the last test's fixtures and arguments are released (a fixture
    teardown would still see the last test's channels), and after giving up
    the channels this process created, which is what its exit would do.
    """
    gc.collect()
    _release_created_channels()
    leaked = sorted(p.name for p in _SHM.glob(f"rlinf.{_NAMESPACE}.*"))
    if not leaked:
        return
    for path in leaked:
        (_SHM / path).unlink(missing_ok=True)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"LEAKED CHANNEL SEGMENTS in {_SHM} (now removed): {', '.join(leaked)}"
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("!", message, red=True, bold=True)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def channel_name(request: pytest.FixtureRequest) -> str:
    """A channel name no other test of the session uses."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:60]
    return f"{stem}.{next(_names)}"


def _run_ranks(script: Path, *args: str, ranks: int = 2, timeout: float = 240) -> list[str]:
    """Runs ``python script RANK PORT *args`` for each rank and checks every one exits 0.

    ``PORT`` is a free local port for the ranks' rendezvous. On a timeout every
    rank is killed and ``subprocess.TimeoutExpired`` propagates.

    Returns:
        Each rank's output (stdout and stderr), in rank order.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(ranks)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    return logs


@pytest.fixture
def run_ranks() -> Callable[..., list[str]]:
    """Runs a ranks script once per rank (:func:`_run_ranks`): ``run_ranks(script, *args)``."""
    return _run_ranks
