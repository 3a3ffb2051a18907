"""Repo-wide pytest fixtures: one channel namespace per session, and a leak check."""

from __future__ import annotations

import gc
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

_NAMESPACE_ENV = "RLINF_CHANNEL_NAMESPACE"
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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the run if a segment of this session's namespace outlived its tests.

    Runs after the last test's fixtures and arguments are released (a fixture
    teardown would still see the last test's channels).
    """
    gc.collect()
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
