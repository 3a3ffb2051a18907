"""Fixtures shared by the top-level tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlinf.core.channel import ChannelAgent


@pytest.fixture
def agent() -> Iterator[ChannelAgent]:
    """A channel agent on loopback for this test (the session's secret; stopped after)."""
    a = ChannelAgent("127.0.0.1:0")
    try:
        yield a
    finally:
        a.stop()
