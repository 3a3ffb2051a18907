"""Typed edges between worker roles: message dataclasses and worker protocols.

Both stacks meet here: runners are written against these protocols, and the
dataclasses are what crosses channels (see each module for shapes). Both
runners offer the :class:`Runner` lifecycle.
"""

from rlinf.core.protocols.embodied import (
    EnvOutput,
    EnvSpec,
    PolicyOutput,
    RolloutBatch,
    Trajectory,
)
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult
from rlinf.core.protocols.runner import Runner
from rlinf.core.protocols.workers import (
    CheckpointableWorker,
    EmbodiedActorWorker,
    EmbodiedEnvWorker,
    EmbodiedPolicyEnvWorker,
    EmbodiedRolloutWorker,
    OffloadableWorker,
    OffPolicyEmbodiedActorWorker,
    ReasoningActorWorker,
    ReasoningRewardWorker,
    ReasoningRolloutWorker,
    check_implements,
)

__all__ = [
    "CheckpointableWorker",
    "EmbodiedActorWorker",
    "EmbodiedEnvWorker",
    "EmbodiedPolicyEnvWorker",
    "EmbodiedRolloutWorker",
    "EnvOutput",
    "EnvSpec",
    "OffPolicyEmbodiedActorWorker",
    "OffloadableWorker",
    "PolicyOutput",
    "ReasoningActorWorker",
    "ReasoningRewardWorker",
    "ReasoningRolloutWorker",
    "RolloutBatch",
    "RolloutRequest",
    "RolloutResult",
    "Runner",
    "Trajectory",
    "check_implements",
]
