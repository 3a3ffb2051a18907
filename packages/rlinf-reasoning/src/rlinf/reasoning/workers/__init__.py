"""Worker processes of a reasoning run: rollout, reward and the actors (FSDP, Megatron).

* :class:`RolloutWorker`: wraps a rollout engine; prompt groups in, generated groups out.
* :class:`RewardWorker`: wraps the math verifier pool; fills in rewards, group by group.
* :class:`ToolWorker`: runs the tool calls of agentic rollouts (the ``tool`` component).
* :class:`FSDPActor`: FSDP2 GRPO training, logprob recomputation, bucketed weight sync,
  checkpoints and offload/onload.
* :class:`MegatronActor`: the same GRPO step on Megatron-core tensor-parallel shards
  (``actor.training_backend: megatron``; needs the ``megatron`` extra).

Each class is a :class:`rlinf.sched.Worker`, launched with
``Cls.create_group(cfg).launch(cluster, ...)``. The names are imported lazily, so a
reward process does not pay for the model stack the actor and rollout import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlinf.reasoning.workers.actor import FSDPActor
    from rlinf.reasoning.workers.batch import (
        PackedBatch,
        Sample,
        group_key,
        pack_samples,
        pad_rows,
        response_logprobs,
    )
    from rlinf.reasoning.workers.common import WeightBucket, load_tokenizer
    from rlinf.reasoning.workers.megatron_actor import MegatronActor
    from rlinf.reasoning.workers.reward import RewardWorker
    from rlinf.reasoning.workers.rollout import RolloutWorker
    from rlinf.reasoning.workers.tool import ToolWorker

__all__ = [
    "FSDPActor",
    "MegatronActor",
    "PackedBatch",
    "RewardWorker",
    "RolloutWorker",
    "Sample",
    "ToolWorker",
    "WeightBucket",
    "group_key",
    "load_tokenizer",
    "pack_samples",
    "pad_rows",
    "response_logprobs",
]

_WHERE = {
    "FSDPActor": "actor",
    "MegatronActor": "megatron_actor",
    "PackedBatch": "batch",
    "Sample": "batch",
    "group_key": "batch",
    "pack_samples": "batch",
    "pad_rows": "batch",
    "response_logprobs": "batch",
    "WeightBucket": "common",
    "load_tokenizer": "common",
    "RewardWorker": "reward",
    "RolloutWorker": "rollout",
    "ToolWorker": "tool",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
