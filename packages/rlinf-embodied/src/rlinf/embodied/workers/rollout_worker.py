"""``MultiStepRolloutWorker``: a stateless policy server for the env ranks it serves.

:meth:`MultiStepRolloutWorker.generate` loops over pipeline stages: for stage
``s`` it takes the next observation message of every served env rank's
stage-``s`` stream (key ``"env_rank.s"``), acts on them in one batch, and sends
each env rank its slice of the action chunk. In train mode it then sends each
env rank its slice of the full :class:`~rlinf.core.protocols.embodied.PolicyOutput`
(values; ``bootstrap_values = V(final_obs)`` when the observation came with a
``final_obs`` of envs that auto-reset). A stream's last train observation comes as a
:class:`~rlinf.embodied.workers.common.LastObs`: it gets only its values. A
stream ends when its env rank sends ``None``; ``generate`` returns when all
have ended, so the same loop serves training rollouts and eval.

Weights arrive from actor rank 0 by broadcast (:meth:`sync_model_from_actor`)
together with their version, which stamps every output.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf.core.channel import Channel
from rlinf.core.dist import select_device
from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.workers.common import (
    LastObs,
    ObsMessage,
    message_rows,
    serving_env_ranks,
    setup_process,
    split_policy_output,
    split_rows,
    stream_key,
)
from rlinf.embodied.workers.policy_host import PolicyHost, sampling_generator
from rlinf.sched import Worker

__all__ = ["MultiStepRolloutWorker"]


class MultiStepRolloutWorker(Worker):
    """Rollout rank: runs the policy for its env ranks' streams.

    Args:
        cfg: The run config.
    """

    max_concurrent_calls = 1
    """Calls run on the main thread, one at a time (see :class:`~rlinf.sched.Worker`),
    as the env ranks' (:class:`~rlinf.embodied.workers.EnvWorker`). The runners send a
    rollout rank one call at a time. On the main thread, Ray's signal checks do not
    take the GIL from the rollout loop (``benchmarks/notes/embodied_hot_path.md``)."""

    def __init__(self, cfg: EmbodiedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        setup_process(cfg)
        self.host: PolicyHost | None = None
        self.device = select_device()
        self._actor_group = ""
        self._env_ranks: list[int] = []
        self._offload = False

    def init_worker(
        self,
        cfg: EmbodiedConfig,
        spec: EnvSpec,
        actor_group: str,
        env_world_size: int,
        offload: bool = False,
    ) -> None:
        """(Re)builds the policy for ``spec``; weights come with the first sync.

        Args:
            cfg: The run config (the runner's).
            spec: The train env's spec.
            actor_group: Name of the actor group (rank 0 sends the weights).
            env_world_size: Env ranks; this rank serves ``e`` with ``e % world_size == rank``.
            offload: Collocated with the actor: hold the device lock while serving and
                keep the policy off the GPU between rollouts.
        """
        self.cfg = cfg
        self._actor_group = actor_group
        setup_process(cfg)  # plugin modules of this config
        self._env_ranks = serving_env_ranks(self.rank, env_world_size, self.world_size)
        self._offload = offload
        # Its own init (not the actor's): until the first sync the weights differ.
        self.host = PolicyHost(cfg, spec, self.rank, self.device, offloaded=offload)

    def _require_host(self) -> PolicyHost:
        if self.host is None:
            raise RuntimeError("init_worker() must run before this call")
        return self.host

    @property
    def version(self) -> int:
        """The weight version of the last sync (-1 before the first)."""
        return -1 if self.host is None else self.host.version

    # ------------------------------------------------------------------ weights

    def sync_model_from_actor(self) -> int:
        """Receives the actor's weights (broadcast from actor rank 0); returns their version."""
        timeout = self.cfg.runner.channel_timeout_s
        return self._require_host().sync_from_actor(self, self._actor_group, timeout)

    def get_last_sync(self) -> dict[str, int]:
        """``{"tensors", "bytes"}`` the last weight sync delivered (empty before the first)."""
        return {} if self.host is None else dict(self.host.last_sync)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's current state dict as CPU tensors (for checks and tests)."""
        policy = self._require_host().policy
        return {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}

    # ------------------------------------------------------------------ offload

    def offload(self) -> None:
        """Moves the policy to the CPU (a no-op when its device is the CPU)."""
        if self.host is not None and self.device.type == "cuda":
            self.host.policy.to("cpu")
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Moves the policy back to its device."""
        if self.host is not None and self.device.type == "cuda":
            self.host.policy.to(self.device)

    # ------------------------------------------------------------------ serving

    def generate(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        step: int,
        mode: str = "train",
    ) -> dict[str, Any]:
        """Serves the streams of its env ranks until every one has ended.

        Args:
            obs_channel: Env -> rollout observations.
            action_channel: Rollout -> env action chunks (and, in train mode, policy outputs).
            step: Global step (seeds the sampling, so resumed runs sample alike).
            mode: ``train`` samples actions; ``eval`` takes the deterministic action.

        Returns:
            ``{"calls": policy calls, "infer_time": seconds inside the policy}``.
        """
        host = self._require_host()
        timeout = self.cfg.runner.channel_timeout_s
        stages = self.cfg.rollout.pipeline_stage_num
        phase = self.device_phase(
            lock=self._offload, offload=self._offload, timeout=self.cfg.runner.step_timeout_s
        )
        with phase:
            generator = sampling_generator(self.cfg, step, self.rank, mode, self.device)
            active = {s: list(self._env_ranks) for s in range(stages)}
            calls = 0
            host.take_infer_time()
            # (no autograd here: inference mode skips its per-op bookkeeping, see EnvWorker)
            with self.worker_timer(f"generate_{mode}"), torch.inference_mode():
                while any(active.values()):
                    for s in range(stages):
                        ranks = active[s]
                        if not ranks:
                            continue
                        live: list[tuple[int, ObsMessage | LastObs]] = []
                        for e in list(ranks):
                            item = obs_channel.get(key=stream_key(e, s), timeout=timeout)
                            if item is None:
                                ranks.remove(e)
                            else:
                                live.append((e, item))
                        if not live:
                            continue
                        keys = [stream_key(e, s) for e, _ in live]
                        self._act([m for _, m in live], keys, action_channel, mode, generator)
                        calls += 1
        return {"calls": calls, "infer_time": host.take_infer_time()}

    def _act(
        self,
        items: list[ObsMessage | LastObs],
        keys: list[str],
        action_channel: Channel,
        mode: str,
        generator: torch.Generator,
    ) -> None:
        """Acts on the batch, sends the actions, then (train) the full outputs.

        A batch of :class:`LastObs` only gets its values (no action is sampled);
        in a batch that mixes them with observations to act on, they get no action
        chunk, only the full output. Where the policy allows it
        (``values_after_actions``), the values are computed after the actions are
        sent, while the env ranks step.
        """
        timeout = self.cfg.runner.channel_timeout_s
        host = self._require_host()
        last = [isinstance(item, LastObs) for item in items]
        messages = [item.message if isinstance(item, LastObs) else item for item in items]
        sizes = [message_rows(m) for m in messages]
        if all(last):
            outputs = split_policy_output(host.values_only(messages), sizes)
            for key, out in zip(keys, outputs, strict=True):
                action_channel.put(out, key=key, timeout=timeout)
            return
        values_later = mode == "train" and host.values_after_actions
        output = host.act(messages, mode, generator, values=not values_later)
        for key, part, is_last in zip(keys, split_rows(output.actions, sizes), last, strict=True):
            if not is_last:
                action_channel.put(part, key=key, timeout=timeout)
        if mode == "eval":  # env ranks only need the actions
            return
        if values_later:
            output = host.add_values(output, messages)
        for key, out in zip(keys, split_policy_output(output, sizes), strict=True):
            action_channel.put(out, key=key, timeout=timeout)
