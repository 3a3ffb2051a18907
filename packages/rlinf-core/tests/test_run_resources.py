"""A runner's per-run channels and metric logger (RunResources)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from rlinf.core.channel import Channel, ChannelClosed, ChannelNotFound
from rlinf.core.config.schema import CoreConfig
from rlinf.core.run_resources import RunResources


def test_channels_are_closed_then_removed_and_the_logger_closes_once(tmp_path: Path) -> None:
    cfg = CoreConfig()
    cfg.runner.logger.log_path = tmp_path
    name = f"res-{uuid.uuid4().hex[:8]}"
    with RunResources(cfg.runner.logger, cfg) as res:
        channel = res.channel("q", name, max_items=8)
        assert res.channels == {"q": channel}
        woken: list[BaseException] = []

        def blocked_get() -> None:
            try:
                channel.get(timeout=30)
            except BaseException as exc:
                woken.append(exc)

        waiter = threading.Thread(target=blocked_get)
        waiter.start()
        res.close_channels()  # what a runner does when a worker fails
        waiter.join(timeout=10)
        assert not waiter.is_alive() and isinstance(woken[0], ChannelClosed)
        res.logger.log({"x": 1.0}, step=1)
        assert res.logger is res.logger  # made once
    assert res.channels == {}
    with pytest.raises(ChannelNotFound):
        Channel.connect(name, timeout=0.1)
    assert list((tmp_path / "default" / "tensorboard").iterdir())  # the logger wrote
    res.close()  # idempotent
