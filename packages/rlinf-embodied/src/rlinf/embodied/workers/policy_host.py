"""``PolicyHost``: the policy a process acts with, its weights and one act step.

Two workers hold a policy for acting: the rollout worker (a policy server for
env ranks in other processes) and, with ``rollout.in_env_process``, the env
worker itself (no rollout group, no hand-offs). Both build it, load the
actor's weight syncs and act through this class, so the two modes sample the
same actions from the same seeds.

:class:`InProcessPolicy` stands in for the observation and action channels of
an env rank whose policy lives in its own process: sending an observation
acts at once, and the receive calls return the action chunk and then (train
mode) the full :class:`~rlinf.core.protocols.embodied.PolicyOutput`, in the
order the channels would deliver them.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import torch

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.core.seeding import derive_seed
from rlinf.core.weight_sync import WeightBucket, receive_weights
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.models import BasePolicy, build_policy
from rlinf.embodied.workers.common import LastObs, ObsMessage, merge_observations
from rlinf.sched import Worker

__all__ = ["InProcessPolicy", "PolicyHost", "sampling_generator"]


def sampling_generator(
    cfg: EmbodiedConfig, step: int, rank: int, mode: str, device: torch.device
) -> torch.Generator:
    """The generator one serving call samples with (seeded by step, serving rank and mode)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(cfg.runner.seed, step, rank, mode))
    return generator


class PolicyHost:
    """A policy built for ``spec``, kept in sync with the actor, acting on observation messages.

    Args:
        cfg: The run config.
        spec: The train env's spec.
        rank: The serving rank (seeds the initial weights, which the first sync replaces).
        device: Where the policy runs.
        offloaded: Keep the policy on the CPU until the owner moves it to ``device``
            (a collocated rollout that onloads it for each rollout).
    """

    def __init__(
        self,
        cfg: EmbodiedConfig,
        spec: EnvSpec,
        rank: int,
        device: torch.device,
        offloaded: bool = False,
    ) -> None:
        torch.manual_seed(derive_seed(cfg.actor.seed, "rollout", rank) % 2**31)
        policy = build_policy(cfg.actor.model, spec)
        self.frozen_names = policy.frozen_parameter_names()  # before freezing the rest
        policy.requires_grad_(False)
        policy.eval()
        self.policy: BasePolicy = policy.to("cpu" if offloaded else device)
        self.device = device
        self.version = -1
        self.last_sync: dict[str, int] = {}
        self.infer_time = 0.0
        """Seconds spent inside the policy since the last :meth:`take_infer_time`."""

    def load_sync(self, receive: Callable[[], WeightBucket]) -> int:
        """Receives one weight sync (all its buckets, from ``receive``) and loads it.

        Returns:
            The new weight version.

        Raises:
            RuntimeError: The sync left out trainable weights or sent unknown ones.
        """
        state: dict[str, torch.Tensor] = {}
        version, _, _ = receive_weights(receive, lambda b: state.update(b.tensors))
        if self.policy.frozen_from_disk:  # LoRA: the frozen base is model_path's
            _load_trainable(self.policy, state, self.frozen_names, int(version))
        else:
            self.policy.load_state_dict(state, strict=True)  # names every missing or extra weight
        self.version = int(version)
        self.last_sync = {
            "tensors": len(state),
            "bytes": sum(t.numel() * t.element_size() for t in state.values()),
        }
        return self.version

    def sync_from_actor(self, worker: Worker, actor_group: str, timeout: float) -> int:
        """Receives one weight sync that actor rank 0 broadcasts to ``worker``'s group.

        Args:
            worker: The worker holding this policy (its group receives the broadcast).
            actor_group: Name of the actor group.
            timeout: Seconds to wait for each bucket.

        Returns:
            The new weight version.
        """
        groups: list[tuple[str, int | list[int]]] = [
            (actor_group, 0),
            (worker.group_name, list(range(worker.world_size))),
        ]

        def receive() -> WeightBucket:
            bucket: WeightBucket = worker.broadcast(
                None, groups, src=(actor_group, 0), timeout=timeout
            )
            return bucket

        with worker.worker_timer("sync_weights"):
            return self.load_sync(receive)

    @property
    def values_after_actions(self) -> bool:
        """Whether :meth:`act` may leave the values to :meth:`add_values`.

        The policy's :attr:`~rlinf.embodied.models.BasePolicy.values_after_actions`.
        """
        return self.policy.values_after_actions

    def act(
        self,
        messages: list[ObsMessage],
        mode: str,
        generator: torch.Generator,
        *,
        values: bool = True,
    ) -> PolicyOutput:
        """Acts on a batch of observation messages (one ``predict_action_batch`` call).

        Args:
            messages: The batch, in order (their rows are concatenated).
            mode: ``train`` samples; ``eval`` takes the deterministic action.
            generator: The sampling generator.
            values: False (train mode, only where :attr:`values_after_actions`):
                skip the values; :meth:`add_values` completes the output.

        Returns:
            On the CPU: in train mode the full :class:`PolicyOutput` (values, and
            ``bootstrap_values = V(final_obs)`` where the batch came with final
            observations) stamped with the weight version; in eval mode only the
            action chunk ``[n, C, A]``. With ``values=False``, the output without
            values, its action chunk on the CPU and the rest on the policy's device.
        """
        obs, final_obs = merge_observations(messages)
        started = time.perf_counter()
        if not values:
            output = self.policy.predict_action_batch(
                obs, mode, generator=generator, compute_values=False
            )
            output.actions = output.actions.cpu()
            self.infer_time += time.perf_counter() - started
            return output
        output = self.policy.predict_action_batch(obs, mode, generator=generator)
        if mode == "eval":
            self.infer_time += time.perf_counter() - started
            return PolicyOutput(actions=output.actions.cpu())
        return self._stamp(output, final_obs, started)

    def add_values(self, output: PolicyOutput, messages: list[ObsMessage]) -> PolicyOutput:
        """Completes an output of ``act(..., values=False)`` on the same ``messages``.

        Returns:
            The full :class:`PolicyOutput`, as :meth:`act` returns it in train mode.
        """
        obs, final_obs = merge_observations(messages)
        started = time.perf_counter()
        output.prev_values = self.policy.get_value(obs)
        return self._stamp(output, final_obs, started)

    def values_only(self, messages: list[ObsMessage]) -> PolicyOutput:
        """The values a trajectory needs of a stream's last observation (see :class:`LastObs`).

        Args:
            messages: The batch of last-observation messages, in order.

        Returns:
            A :class:`PolicyOutput` on the CPU with ``prev_values``, ``bootstrap_values``
            (where the batch came with final observations) and the weight version; its
            action chunk is empty (``[n, 0]``) and it has no logprobs or inputs.
        """
        obs, final_obs = merge_observations(messages)
        started = time.perf_counter()
        values = self.policy.get_value(obs)
        output = PolicyOutput(actions=torch.empty(values.shape[0], 0), prev_values=values)
        return self._stamp(output, final_obs, started)

    def _stamp(
        self, result: PolicyOutput, final_obs: dict[str, torch.Tensor] | None, started: float
    ) -> PolicyOutput:
        """Adds ``V(final_obs)`` and the weight version, moves to the CPU, counts the time."""
        if final_obs is not None:
            with torch.no_grad():
                result.bootstrap_values = self.policy.get_value(final_obs)[:, :1]
        result.version = self.version
        if self.device.type != "cpu":
            result = result.to_cpu()
        self.infer_time += time.perf_counter() - started
        return result

    def take_infer_time(self) -> float:
        """Seconds inside the policy since the last call (then restarts the count)."""
        seconds, self.infer_time = self.infer_time, 0.0
        return seconds


class InProcessPolicy:
    """The :class:`~rlinf.embodied.workers.common.PolicyLink` of a policy in this process.

    ``send_obs(key, message)`` acts on it at once; ``recv_actions(key)`` then
    returns the action chunk and, in train mode, ``recv_output(key)`` the full
    policy output, in the order a rollout worker's channel delivers them. A
    :class:`~rlinf.embodied.workers.common.LastObs` gets one answer, its
    values-only output (``recv_output``). ``send_obs(key, None)`` (a stream's
    end) does nothing.

    Args:
        host: The policy.
        mode: ``train`` or ``eval``.
        generator: The sampling generator of this rollout (see :func:`sampling_generator`).
    """

    def __init__(self, host: PolicyHost, mode: str, generator: torch.Generator) -> None:
        self.host, self.mode, self.generator = host, mode, generator
        self._pending: defaultdict[str, deque[Any]] = defaultdict(deque)

    def send_obs(self, key: str, item: ObsMessage | LastObs | None) -> None:
        """Acts on an observation message of stream ``key`` (``None``: the stream ends)."""
        if item is None:
            return
        if isinstance(item, LastObs):
            self._pending[key].append(self.host.values_only([item.message]))
            return
        output = self.host.act([item], self.mode, self.generator)
        self._pending[key].append(output.actions)
        if self.mode == "train":
            self._pending[key].append(output)

    def recv_actions(self, key: str) -> torch.Tensor:
        """The action chunk of the last observation sent on stream ``key``."""
        actions: torch.Tensor = self._next(key)
        return actions

    def recv_output(self, key: str) -> PolicyOutput:
        """The full policy output (train mode) of the last observation sent on ``key``."""
        output: PolicyOutput = self._next(key)
        return output

    def _next(self, key: str) -> Any:
        pending = self._pending[key]
        if not pending:
            raise RuntimeError(
                f"stream {key!r}: nothing to receive before send_obs(): no observation to act on"
            )
        return pending.popleft()


def _load_trainable(
    policy: BasePolicy, state: dict[str, torch.Tensor], frozen: set[str], version: int
) -> None:
    """Loads a sync that left out the ``frozen`` parameters; anything else missing raises."""
    result = policy.load_state_dict(state, strict=False)
    missing = set(result.missing_keys) - frozen
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"weight sync of version {version}: the actor did not send the trainable "
            f"weights {sorted(missing)[:5]} and sent unknown ones "
            f"{sorted(result.unexpected_keys)[:5]}; actor and rollout must build the same "
            "policy (same actor.model config and model_path)"
        )
