"""Protocols of the worker roles that runners are written against.

A runner calls these methods on worker *groups* (each call fans out to every
rank and returns a future), so the protocols describe one rank's methods.
Embodied and reasoning workers implement them; neither stack imports the
other.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ActorWorker", "CheckpointableWorker", "OffloadableWorker", "RolloutWorker"]


@runtime_checkable
class OffloadableWorker(Protocol):
    """A worker that can free its device memory between phases (collocated mode)."""

    def offload(self) -> None:
        """Moves weights, optimizer state and buffers off the device."""

    def onload(self) -> None:
        """Moves them back before the next phase."""


@runtime_checkable
class CheckpointableWorker(Protocol):
    """A worker whose state is part of a checkpoint."""

    def save_checkpoint(self, path: str, step: int) -> None:
        """Writes this rank's state under ``path``."""

    def load_checkpoint(self, path: str) -> int:
        """Restores this rank's state from ``path``; returns the step it was saved at."""


@runtime_checkable
class RolloutWorker(Protocol):
    """Produces experience with the current policy weights."""

    def sync_model_from_actor(self) -> int:
        """Receives the actor's weights; returns the new weight version."""


@runtime_checkable
class ActorWorker(Protocol):
    """Trains the policy on experience it receives through a channel."""

    def sync_model_to_rollout(self) -> int:
        """Sends the current weights to the rollout group; returns their version."""

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Computes advantages for the received batch; returns ``rollout/*`` metrics."""

    def run_training(self) -> dict[str, Any]:
        """Runs the update epochs on the received batch; returns ``train/*`` metrics."""
