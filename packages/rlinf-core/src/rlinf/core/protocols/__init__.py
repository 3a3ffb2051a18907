"""Typed edges between worker roles: message dataclasses and worker protocols.

Both stacks meet here: runners are written against these protocols, and the
dataclasses are what crosses channels (see each module for shapes).
"""

from rlinf.core.protocols.embodied import (
    EnvOutput,
    EnvSpec,
    PolicyOutput,
    RolloutBatch,
    Trajectory,
)
from rlinf.core.protocols.workers import (
    ActorWorker,
    CheckpointableWorker,
    OffloadableWorker,
    RolloutWorker,
)

__all__ = [
    "ActorWorker",
    "CheckpointableWorker",
    "EnvOutput",
    "EnvSpec",
    "OffloadableWorker",
    "PolicyOutput",
    "RolloutBatch",
    "RolloutWorker",
    "Trajectory",
]

# Reasoning messages (one prompt group per channel item).
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult

__all__ += ["RolloutRequest", "RolloutResult"]
