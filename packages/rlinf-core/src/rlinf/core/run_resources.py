"""What a runner's driver holds for one run: the channels between its groups and its metric logger.

Both runners keep one :class:`RunResources`. Channels are created by name and
remembered so that a failure can close them (waking every worker blocked on
them) and a second ``init_workers`` or ``close`` can remove them; the metric
logger is created on first use, with the run's config recorded beside the
metrics. ``close()`` is idempotent.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel

from rlinf.core.channel import Channel
from rlinf.core.closing import ClosesOnExit
from rlinf.core.config.schema import LoggerConfig
from rlinf.core.metrics import MetricLogger

__all__ = ["RunResources"]


class RunResources(ClosesOnExit):
    """Channels and the metric logger of one run.

    Args:
        logger_cfg: ``runner.logger``.
        run_config: The run's config (recorded by the metric backends).
    """

    def __init__(self, logger_cfg: LoggerConfig, run_config: BaseModel) -> None:
        self._logger_cfg = logger_cfg
        self._run_config = run_config
        self._logger: MetricLogger | None = None
        self.channels: dict[str, Channel] = {}
        """The run's channels by the short name they were created under."""

    def channel(self, short_name: str, full_name: str, **options: Any) -> Channel:
        """Creates the channel ``full_name`` (see :meth:`Channel.create`) and keeps it.

        Args:
            short_name: The key in :attr:`channels`.
            full_name: The channel's name (unique per run).
            **options: Sizes for :meth:`Channel.create`.

        Returns:
            The channel.
        """
        channel = Channel.create(full_name, **options)
        self.channels[short_name] = channel
        return channel

    def close_channels(self) -> None:
        """Closes every channel: whoever waits on one is woken with ``ChannelClosed``."""
        for channel in self.channels.values():
            with contextlib.suppress(Exception):  # already closed
                channel.close()

    def drop_channels(self) -> None:
        """Closes and removes every channel."""
        self.close_channels()
        for channel in self.channels.values():
            channel.unlink()
        self.channels = {}

    @property
    def logger(self) -> MetricLogger:
        """The run's metric logger (created on first use)."""
        if self._logger is None:
            self._logger = MetricLogger.from_config(
                self._logger_cfg, run_config=self._run_config.model_dump(mode="json")
            )
        return self._logger

    def close(self) -> None:
        """Closes the logger (flushing it) and removes the channels; idempotent."""
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        self.drop_channels()
