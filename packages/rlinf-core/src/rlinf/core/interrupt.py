"""Ctrl-C in a training program: one line that says where the run stands, exit 130.

The example mains catch ``KeyboardInterrupt`` around the run, print
:func:`interrupted_message`, shut everything down inside
:func:`interrupts_ignored` (so a second Ctrl-C cannot cut the clean-up short
and leave processes or shared memory behind) and exit with
:data:`EXIT_INTERRUPTED`, the shell's code for a SIGINT.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlinf.core.checkpoint import find_latest_checkpoint

__all__ = ["EXIT_INTERRUPTED", "interrupted_message", "interrupts_ignored"]

EXIT_INTERRUPTED = 130
"""Exit status of a program ended by Ctrl-C (128 + SIGINT)."""


def interrupted_message(
    step: int | None, total_steps: int | None, checkpoint_root: Path | None
) -> str:
    """The one line printed when Ctrl-C ends a run.

    Args:
        step: Training steps done, or None when training had not started.
        total_steps: Steps the run was to take, if known.
        checkpoint_root: The run's ``checkpoints`` folder, if known.

    Returns:
        E.g. ``interrupted (Ctrl-C) at step 12 of 100; newest checkpoint:
        logs/x/checkpoints/global_step_10 (resume with runner.resume_dir=auto)``.
    """
    if step is None:
        where = "before training started"
    else:
        where = f"at step {step}" + (f" of {total_steps}" if total_steps is not None else "")
    latest = None if checkpoint_root is None else find_latest_checkpoint(checkpoint_root)
    if latest is not None:
        saved = f"newest checkpoint: {latest} (resume with runner.resume_dir=auto)"
    elif checkpoint_root is not None:
        saved = f"no checkpoint saved in {checkpoint_root} (set runner.save_interval)"
    else:
        saved = "no checkpoint saved"
    return f"interrupted (Ctrl-C) {where}; {saved}"


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ignores SIGINT inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
