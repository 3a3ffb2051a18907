"""Helpers shared by the embodied workers: stream keys, routing, batching, seeds.

Routing (all deterministic):

* Env rank ``e`` owns ``S`` pipeline stages; the stream of stage ``s`` is keyed
  ``"e.s"`` in the observation channel (env -> rollout) and in the action
  channel (rollout -> env). Rollout rank ``r`` serves env ranks ``e`` with
  ``e % Wr == r`` and batches their stage-``s`` observations into one call.
* Every (env rank, stage) trajectory is cut along the env dim into
  ``lcm(Wa, We * S) / (We * S)`` pieces; piece ``g`` (numbered env rank, then
  stage, then piece) goes to actor rank ``g // (lcm / Wa)`` under key ``str(rank)``
  of the actor channel, and actors order what they get by ``g``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import torch

from rlinf.core.protocols.embodied import EnvOutput, EnvSpec, PolicyOutput, Trajectory
from rlinf.embodied.config import EmbodiedConfig, EnvSplitConfig, import_plugins

__all__ = [
    "actor_pieces",
    "chunk_steps",
    "concat_trajectories",
    "merge_env_outputs",
    "serving_env_ranks",
    "setup_process",
    "split_policy_output",
    "split_trajectory",
    "stream_key",
]


def setup_process(cfg: EmbodiedConfig) -> None:
    """Per-process setup of a worker: one torch thread, plugin modules imported.

    Args:
        cfg: The run config (``runner.plugin_modules`` are imported).
    """
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import_plugins(cfg.runner.plugin_modules)


def stream_key(env_rank: int, stage: int) -> str:
    """Channel key of the stream of one (env rank, pipeline stage)."""
    return f"{env_rank}.{stage}"


def serving_env_ranks(rollout_rank: int, env_world_size: int, rollout_world_size: int) -> list[int]:
    """Env ranks whose streams rollout rank ``rollout_rank`` serves."""
    return [e for e in range(env_world_size) if e % rollout_world_size == rollout_rank]


def actor_pieces(actor_world_size: int, env_world_size: int, stages: int) -> tuple[int, int]:
    """``(pieces per stage trajectory, pieces per actor rank)`` of the env -> actor routing."""
    total = math.lcm(actor_world_size, env_world_size * stages)
    return total // (env_world_size * stages), total // actor_world_size


def chunk_steps(split: EnvSplitConfig, spec: EnvSpec, num_action_chunks: int) -> int:
    """Chunk steps ``T`` of one rollout of ``split`` (sub-steps / C).

    Raises:
        ValueError: The rollout length is not a multiple of the chunk length.
    """
    steps = split.max_steps_per_rollout_epoch or spec.max_episode_steps
    if steps % num_action_chunks != 0:
        raise ValueError(
            f"env max_steps_per_rollout_epoch (resolved {steps}) is not divisible by "
            f"actor.model.num_action_chunks ({num_action_chunks}); set "
            "env.<split>.max_steps_per_rollout_epoch to a multiple of it"
        )
    return steps // num_action_chunks


def _cat_obs(parts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    keys = list(parts[0])
    return {k: torch.cat([p[k] for p in parts], dim=0) for k in keys}


def merge_env_outputs(
    outputs: Sequence[EnvOutput],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """Concatenates the observations (and final observations) of several env outputs.

    Args:
        outputs: Env outputs of the same stage from different env ranks.

    Returns:
        ``(obs, final_obs)``: dicts of [sum n, ...] tensors; ``final_obs`` is None
        when no output has one (rows of outputs without one copy their ``obs``).
    """
    obs = _cat_obs([o.obs for o in outputs])
    if all(o.final_obs is None for o in outputs):
        return obs, None
    finals = [o.final_obs if o.final_obs is not None else o.obs for o in outputs]
    return obs, _cat_obs(finals)


def _narrow(value: Any, start: int, length: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.narrow(0, start, length)
    if isinstance(value, dict):
        return {k: _narrow(v, start, length) for k, v in value.items()}
    return value


def split_policy_output(output: PolicyOutput, sizes: Sequence[int]) -> list[PolicyOutput]:
    """Splits a policy output along the env dim into consecutive parts of ``sizes``."""
    parts = []
    start = 0
    for size in sizes:
        parts.append(
            replace(
                output,
                **{
                    f.name: _narrow(getattr(output, f.name), start, size)
                    for f in fields(output)
                    if f.name != "version"
                },
            )
        )
        start += size
    return parts


_ENV_DIM_1 = (
    "actions",
    "prev_logprobs",
    "prev_values",
    "rewards",
    "dones",
    "terminations",
    "truncations",
    "alive",
)


def split_trajectory(traj: Trajectory, num: int) -> list[Trajectory]:
    """Cuts a trajectory along the env dim into ``num`` equal, contiguous pieces.

    Raises:
        ValueError: ``num`` does not divide the number of envs.
    """
    n = traj.num_envs
    if n % num != 0:
        raise ValueError(f"cannot split {n} envs into {num} equal pieces")
    size = n // num
    pieces = []
    for i in range(num):
        kwargs: dict[str, Any] = {}
        for name in _ENV_DIM_1:
            value = getattr(traj, name)
            kwargs[name] = None if value is None else value.narrow(1, i * size, size).contiguous()
        kwargs["forward_inputs"] = {
            k: v.narrow(1, i * size, size).contiguous() for k, v in traj.forward_inputs.items()
        }
        kwargs["versions"] = traj.versions.clone()
        kwargs["group_ids"] = traj.group_ids.narrow(0, i * size, size).contiguous()
        pieces.append(Trajectory(**kwargs))
    return pieces


def concat_trajectories(trajs: Sequence[Trajectory]) -> Trajectory:
    """Concatenates trajectories along the env dim (into fresh memory)."""
    kwargs: dict[str, Any] = {}
    for name in _ENV_DIM_1:
        values = [getattr(t, name) for t in trajs]
        if any(v is None for v in values):
            kwargs[name] = None
        else:
            kwargs[name] = torch.cat(values, dim=1)
    kwargs["forward_inputs"] = {
        k: torch.cat([t.forward_inputs[k] for t in trajs], dim=1) for k in trajs[0].forward_inputs
    }
    kwargs["versions"] = trajs[0].versions.clone()
    kwargs["group_ids"] = torch.cat([t.group_ids for t in trajs], dim=0)
    return Trajectory(**kwargs)
