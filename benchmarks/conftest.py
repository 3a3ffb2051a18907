"""Shared fixtures of the benchmark tiers.

``chbench`` (beside this file) is put on ``sys.path``; spawned children
inherit it. Ratios that tests report are printed at the end of the pytest
run, so CI logs show them even when every test passes.
"""

import os
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chbench.harness import bench_namespace

_REPORTED: list[str] = []


@pytest.fixture(scope="session")
def namespace() -> Iterator[str]:
    """A fresh channel namespace; fails the session if a segment is left in /dev/shm."""
    with bench_namespace() as ns:
        yield ns


@pytest.fixture(scope="session")
def report() -> Callable[[str], None]:
    """Prints a line now and again in the terminal summary."""

    def add(line: str) -> None:
        print(line)
        _REPORTED.append(line)

    return add


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _REPORTED:
        terminalreporter.write_sep("-", "channel benchmark ratios (ours vs baselines)")
        for line in _REPORTED:
            terminalreporter.write_line(line)
