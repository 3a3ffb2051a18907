"""The lifecycle both runners offer, so a main (or a tool) can drive either the same way.

The two training loops differ on purpose (embodied runs its phases in turn,
reasoning streams three stages), but their outside is one: build the runner
on launched groups, ``init_workers`` (optionally resuming), ``run``, save or
load checkpoints, ``close``; or use it as a context manager, which closes it.

Example::

    with EmbodiedRunner(cfg, actor=actor, rollout=rollout, env=env) as runner:
        runner.init_workers(resume_dir="auto")
        metrics = runner.run()
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

__all__ = ["Runner"]


@runtime_checkable
class Runner(Protocol):
    """One training run over launched worker groups (``EmbodiedRunner``, ``ReasoningRunner``)."""

    global_step: int

    def init_workers(self, resume_dir: str | Path | None = None) -> None:
        """Builds every worker's state; resumes from ``resume_dir`` (a path or ``"auto"``)."""

    def run(self) -> dict[str, float]:
        """Trains to the end of the run; returns the last step's metrics."""

    def save_checkpoint(self) -> Path:
        """Writes a complete checkpoint of the current step; returns its directory."""

    def load_checkpoint(self, path: str | Path) -> int:
        """Restores the run from a checkpoint directory; returns its step."""

    def close(self) -> None:
        """Releases what the runner owns (logger, channels); the groups are the caller's."""

    def __enter__(self) -> Runner:
        """Returns the runner."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Closes the runner."""
