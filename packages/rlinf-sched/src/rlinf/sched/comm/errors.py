"""Errors of point-to-point communication between workers."""

from __future__ import annotations

__all__ = ["CommError", "CommTimeoutError", "PeerDiedError"]


class CommError(RuntimeError):
    """A send, recv or broadcast could not complete."""


class PeerDiedError(CommError):
    """The worker on the other side of a send or recv died (killed, crashed, out of memory)."""

    def __init__(self, op: str, group: str, rank: int, detail: str = "") -> None:
        super().__init__(
            f"{op} failed: peer {group}[rank {rank}] died" + (f" ({detail})" if detail else "")
        )
        self.op, self.group, self.rank, self.detail = op, group, rank, detail

    def __reduce__(self) -> tuple[type[PeerDiedError], tuple[str, str, int, str]]:
        # Picklable, so the error crosses Ray's process boundary intact.
        return (type(self), (self.op, self.group, self.rank, self.detail))


class CommTimeoutError(CommError, TimeoutError):
    """A send, recv or broadcast did not complete within its timeout."""
