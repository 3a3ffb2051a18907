"""Embodied worker roles: env, rollout and actor (see each module).

* :class:`EnvWorker`: ``pipeline_stage_num`` vectorized envs per rank, chunk steps,
  trajectories in the T+1 convention.
* :class:`MultiStepRolloutWorker`: the policy server (sampling for training,
  deterministic actions for eval, bootstrap values of final observations).
* :class:`EmbodiedFSDPActor`: FSDP2 training with PPO or GRPO.
* :class:`EmbodiedSACActor`: off-policy SAC from a replay buffer (async runner).

The classes are imported on first access, so a worker process only imports
what its own role needs (an env worker never imports FSDP).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlinf.embodied.workers.actor_worker import EmbodiedFSDPActor
    from rlinf.embodied.workers.env_worker import EnvWorker
    from rlinf.embodied.workers.rollout_worker import MultiStepRolloutWorker
    from rlinf.embodied.workers.sac_actor_worker import EmbodiedSACActor
    from rlinf.embodied.workers.trajectory import TrajectoryBuilder

__all__ = [
    "EmbodiedFSDPActor",
    "EmbodiedSACActor",
    "EnvWorker",
    "MultiStepRolloutWorker",
    "TrajectoryBuilder",
]

_MODULES = {
    "EmbodiedFSDPActor": "rlinf.embodied.workers.actor_worker",
    "EmbodiedSACActor": "rlinf.embodied.workers.sac_actor_worker",
    "EnvWorker": "rlinf.embodied.workers.env_worker",
    "MultiStepRolloutWorker": "rlinf.embodied.workers.rollout_worker",
    "TrajectoryBuilder": "rlinf.embodied.workers.trajectory",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
