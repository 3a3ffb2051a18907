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

What travels on a stream is only what the other side reads, since every
tensor costs serialization time on the env's critical path:

* env -> rollout: an :data:`ObsMessage` ``(obs, final_obs)`` (rewards and done
  flags stay with the env rank, which builds the trajectory); a train stream's
  last observation comes as :class:`LastObs`, since only its values are read;
* rollout -> env: the action chunk ``[n, C, A]``, then (train mode only) the
  full :class:`PolicyOutput` (values, logprobs, forward inputs, bootstrap
  values). A :class:`LastObs` gets the values-only output alone (no action chunk).

An env rank talks to its policy through a :class:`PolicyLink`: the two
channels of a rollout group (:class:`ChannelLink`), or the policy in its own
process (:class:`~rlinf.embodied.workers.policy_host.InProcessPolicy`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from rlinf.core.channel import Channel
from rlinf.core.protocols.embodied import EnvOutput, EnvSpec, Obs, PolicyOutput, Trajectory
from rlinf.embodied.config import EmbodiedConfig, EnvSplitConfig, import_plugins

__all__ = [
    "ChannelLink",
    "LastObs",
    "ObsMessage",
    "PolicyLink",
    "actor_pieces",
    "chunk_steps",
    "concat_env_outputs",
    "concat_trajectories",
    "merge_observations",
    "message_rows",
    "obs_message",
    "serving_env_ranks",
    "setup_process",
    "split_policy_output",
    "split_rows",
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


ObsMessage = tuple[Obs, Obs | None]
"""``(obs, final_obs)``: what an env rank sends the rollout (see the module docstring)."""


@dataclass(frozen=True)
class LastObs:
    """A train stream's last observation message: the env acts on it no more.

    The policy serving it returns only the values (``prev_values``, and
    ``bootstrap_values`` of its ``final_obs``) that close the trajectory's
    ``T + 1`` value rows, with an empty action chunk: no action is sampled for
    it, which saves one policy call per stream and rollout.
    """

    message: ObsMessage


class PolicyLink(Protocol):
    """How an env rank's streams reach the policy: observations out, actions back."""

    def send_obs(self, key: str, item: ObsMessage | LastObs | None) -> None:
        """Sends stream ``key``'s next observation (``None``: the stream ends)."""

    def recv_actions(self, key: str) -> torch.Tensor:
        """The action chunk ``[n, C, A]`` of the last observation sent on ``key``."""

    def recv_output(self, key: str) -> PolicyOutput:
        """The full policy output (train mode; values only for a :class:`LastObs`)."""


class ChannelLink:
    """The :class:`PolicyLink` over a rollout group's observation and action channels.

    Args:
        obs_channel: Env -> rollout observations (keys ``"rank.stage"``).
        action_channel: Rollout -> env action chunks and policy outputs (same keys).
        timeout: Seconds each put and get may wait.
    """

    def __init__(self, obs_channel: Channel, action_channel: Channel, timeout: float) -> None:
        self.obs_channel, self.action_channel, self.timeout = obs_channel, action_channel, timeout

    def send_obs(self, key: str, item: ObsMessage | LastObs | None) -> None:
        """Puts ``item`` on the observation channel under ``key``."""
        self.obs_channel.put(item, key=key, timeout=self.timeout)

    def recv_actions(self, key: str) -> torch.Tensor:
        """Gets the next action chunk of ``key``."""
        actions: torch.Tensor = self.action_channel.get(key=key, timeout=self.timeout)
        return actions

    def recv_output(self, key: str) -> PolicyOutput:
        """Gets the next policy output of ``key``."""
        output: PolicyOutput = self.action_channel.get(key=key, timeout=self.timeout)
        return output


def obs_message(output: EnvOutput) -> ObsMessage:
    """The part of an env output the rollout reads, on the CPU."""
    final_obs = output.final_obs
    return _on_cpu(output.obs), None if final_obs is None else _on_cpu(final_obs)


def _on_cpu(obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # ``.cpu()`` on a CPU tensor is a no-op that still costs a dispatch, per step.
    return {k: v if v.is_cpu else v.cpu() for k, v in obs.items()}


def _cat_obs(parts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    keys = list(parts[0])
    return {k: torch.cat([p[k] for p in parts], dim=0) for k in keys}


def concat_env_outputs(outputs: Sequence[EnvOutput]) -> EnvOutput:
    """Concatenates env outputs of several stages of one rank along the env dim.

    ``final_obs`` is None when no output has one (rows of outputs without one
    copy their ``obs``); ``rewards`` None when any is (after a reset).
    """
    if len(outputs) == 1:
        return outputs[0]
    rewards = [o.rewards for o in outputs if o.rewards is not None]
    final_obs = None
    if any(o.final_obs is not None for o in outputs):
        final_obs = _cat_obs([o.obs if o.final_obs is None else o.final_obs for o in outputs])
    return EnvOutput(
        obs=_cat_obs([o.obs for o in outputs]),
        terminations=torch.cat([o.terminations for o in outputs]),
        truncations=torch.cat([o.truncations for o in outputs]),
        rewards=torch.cat(rewards) if len(rewards) == len(outputs) else None,
        final_obs=final_obs,
        stage_id=outputs[0].stage_id,
    )


def merge_observations(messages: Sequence[ObsMessage]) -> tuple[Obs, Obs | None]:
    """Concatenates the observations (and final observations) of several env ranks.

    Args:
        messages: Observation messages of the same stage from different env ranks.

    Returns:
        ``(obs, final_obs)``: dicts of [sum n, ...] tensors; ``final_obs`` is None
        when no message has one (rows of messages without one copy their ``obs``).
    """
    if len(messages) == 1:  # one env rank per rollout rank: nothing to copy
        obs, final_obs = messages[0]
        return dict(obs), final_obs
    obs = _cat_obs([m[0] for m in messages])
    if all(m[1] is None for m in messages):
        return obs, None
    return obs, _cat_obs([m[1] if m[1] is not None else m[0] for m in messages])


def message_rows(message: ObsMessage) -> int:
    """Envs ``n`` in an observation message."""
    return int(next(iter(message[0].values())).shape[0])


def split_rows(tensor: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """Splits ``tensor`` along dim 0 into consecutive parts of ``sizes`` (views)."""
    if len(sizes) == 1:
        return [tensor]
    return list(torch.split(tensor, list(sizes), dim=0))


def _narrow(value: Any, start: int, length: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.narrow(0, start, length)
    if isinstance(value, dict):
        return {k: _narrow(v, start, length) for k, v in value.items()}
    return value


def split_policy_output(output: PolicyOutput, sizes: Sequence[int]) -> list[PolicyOutput]:
    """Splits a policy output along the env dim into consecutive parts of ``sizes``."""
    if len(sizes) == 1:
        return [output]
    names = [f.name for f in fields(output) if f.name != "version"]
    parts, start = [], 0
    for size in sizes:
        parts.append(
            replace(output, **{n: _narrow(getattr(output, n), start, size) for n in names})
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
        kwargs[name] = None if any(v is None for v in values) else torch.cat(values, dim=1)
    kwargs["forward_inputs"] = {
        k: torch.cat([t.forward_inputs[k] for t in trajs], dim=1) for k in trajs[0].forward_inputs
    }
    kwargs["versions"] = trajs[0].versions.clone()
    kwargs["group_ids"] = torch.cat([t.group_ids for t in trajs], dim=0)
    return Trajectory(**kwargs)
