"""Messages that cross channels in the embodied pipeline (env <-> rollout -> actor).

Shape letters used throughout:

* ``n``: environments in one message (one pipeline stage of one env rank).
* ``C``: sub-steps per action chunk (``actor.model.num_action_chunks``).
* ``A``: action dimension (1 for a discrete action index).
* ``T``: chunk steps per rollout epoch; ``T + 1`` rows for quantities that
  also exist at the final state (dones and values: row 0 is the all-false
  bootstrap row, the last value row is the value of the final state).
* ``V``: values per step (``C`` for action-level value heads, 1 for chunk-level).

Every tensor is on the CPU when it enters a channel (call ``.to_cpu()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["EnvOutput", "EnvSpec", "PolicyOutput", "RolloutBatch", "Trajectory"]

Obs = dict[str, "torch.Tensor"]
"""Observation dict: ``states`` [n, d] float32 and/or ``main_images`` [n, H, W, 3] uint8;
envs with a wrist camera add ``wrist_images`` [n, H', W', 3] uint8; language-conditioned
envs add ``task_ids`` [n] int64, indices into ``EnvSpec.instructions``."""


def _to_cpu(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class EnvSpec:
    """What a policy needs to know about an env's observations and actions.

    Attributes:
        state_dim: Length of ``obs["states"]`` rows, or None if the env has no state obs.
        image_shape: ``(H, W, 3)`` of ``obs["main_images"]``, or None without images.
        action_dim: ``A``: dimensions of one continuous action, 1 for discrete.
        num_actions: Number of discrete actions, or None for continuous actions.
        action_low: Per-dimension lower bounds of continuous actions (or None).
        action_high: Per-dimension upper bounds of continuous actions (or None).
        max_episode_steps: Episode length limit in env sub-steps.
        instructions: The env's task instructions (its whole vocabulary of tasks), or
            None for an env without language. Observations then carry ``task_ids``
            [n] int64 indices into this tuple instead of strings, so the observation
            stays a dict of tensors (zero-copy through channels) and a policy
            tokenizes each instruction once.
        wrist_image_shape: ``(H, W, 3)`` of ``obs["wrist_images"]`` (a camera on the
            robot's hand), or None without one.
    """

    state_dim: int | None
    image_shape: tuple[int, int, int] | None
    action_dim: int
    num_actions: int | None = None
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    max_episode_steps: int = 0
    instructions: tuple[str, ...] | None = None
    wrist_image_shape: tuple[int, int, int] | None = None

    @property
    def discrete(self) -> bool:
        """Whether actions are indices in ``range(num_actions)``."""
        return self.num_actions is not None

    def task_descriptions(self, task_ids: torch.Tensor) -> list[str]:
        """The instruction of each env, from an ``obs["task_ids"]`` tensor.

        Raises:
            ValueError: The env has no instructions, or an id is out of range.
        """
        if self.instructions is None:
            raise ValueError("this env has no instructions (EnvSpec.instructions is None)")
        ids = [int(i) for i in task_ids.reshape(-1).tolist()]
        bad = [i for i in ids if not 0 <= i < len(self.instructions)]
        if bad:
            raise ValueError(
                f"task_ids {bad[:5]} are outside [0, {len(self.instructions)}): the env "
                "has that many instructions"
            )
        return [self.instructions[i] for i in ids]


@dataclass
class EnvOutput:
    """What an env rank sends to rollout after a reset or a chunk step.

    Attributes:
        obs: Observation after the chunk (post-reset for envs that auto-reset).
        final_obs: The true last observation of envs that auto-reset during the
            chunk (rows of other envs are copies of ``obs``); None if none did.
        rewards: [n, C] float32 per sub-step rewards; None after a reset.
        terminations: [n, C] bool.
        truncations: [n, C] bool.
        stage_id: Pipeline stage this batch belongs to.
    """

    obs: Obs
    terminations: torch.Tensor
    truncations: torch.Tensor
    rewards: torch.Tensor | None = None
    final_obs: Obs | None = None
    stage_id: int = 0

    @property
    def dones(self) -> torch.Tensor:
        """[n, C] bool: terminated or truncated."""
        return self.terminations | self.truncations

    @property
    def num_envs(self) -> int:
        """Number of environments ``n`` in this message."""
        return int(self.terminations.shape[0])

    def to_cpu(self) -> EnvOutput:
        """A copy whose tensors are on the CPU."""
        return replace(self, **{f.name: _to_cpu(getattr(self, f.name)) for f in fields(self)})


@dataclass
class PolicyOutput:
    """What rollout sends back to an env rank: an action chunk and its statistics.

    Attributes:
        actions: [n, C, A] env actions (float; discrete actions hold the index).
        prev_logprobs: [n, C * A] (continuous, per dimension) or [n, C]
            (discrete) log-probabilities of the sampled actions.
        prev_values: [n, V] value estimates of the observation acted on.
        forward_inputs: Everything the policy needs to recompute logprobs,
            entropy and values at training time (dict of [n, ...] tensors).
        bootstrap_values: [n, 1] value of ``final_obs`` for envs that
            auto-reset (zeros elsewhere); None when there was no final obs.
        version: Weight version the rollout sampled with.
    """

    actions: torch.Tensor
    prev_logprobs: torch.Tensor | None = None
    prev_values: torch.Tensor | None = None
    forward_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    bootstrap_values: torch.Tensor | None = None
    version: int = 0

    def to_cpu(self) -> PolicyOutput:
        """A copy whose tensors are on the CPU."""
        return replace(self, **{f.name: _to_cpu(getattr(self, f.name)) for f in fields(self)})


@dataclass
class Trajectory:
    """One rollout epoch of one env stage, stacked along a leading time dim.

    Attributes:
        actions: [T, n, C * A].
        prev_logprobs: [T, n, L] as in :class:`PolicyOutput`.
        prev_values: [T + 1, n, V] (the last row: value of the final state).
        rewards: [T, n, C] float32, bootstrap-adjusted on truncation.
        dones: [T + 1, n, C] bool (row 0 all false).
        terminations: [T + 1, n, C] bool.
        truncations: [T + 1, n, C] bool.
        forward_inputs: dict of [T, n, ...] tensors.
        versions: [T] weight version per chunk step.
        group_ids: [n] GRPO group of each env (envs of a group share a seed).
        alive: Optional [T, n, C] bool: True where the sub-step advanced a live
            episode (False for the sub-steps of a chunk after its episode ended,
            and for envs held after their episode ended without auto-reset).
            None means every sub-step is alive.
    """

    actions: torch.Tensor
    prev_logprobs: torch.Tensor
    prev_values: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    terminations: torch.Tensor
    truncations: torch.Tensor
    forward_inputs: dict[str, torch.Tensor]
    versions: torch.Tensor
    group_ids: torch.Tensor
    alive: torch.Tensor | None = None

    @property
    def num_envs(self) -> int:
        """Number of environments ``n``."""
        return int(self.rewards.shape[1])

    def to_cpu(self) -> Trajectory:
        """A copy whose tensors are on the CPU."""
        return replace(self, **{f.name: _to_cpu(getattr(self, f.name)) for f in fields(self)})


@dataclass
class RolloutBatch:
    """The actor's view: trajectories concatenated along the env dim, plus advantages.

    Same fields and shapes as :class:`Trajectory` with ``B`` envs instead of
    ``n``; ``advantages`` and ``returns`` ([T, B, C] or [T, B, 1]) and
    ``loss_mask`` ([T, B, C] bool) are filled by the actor.
    """

    trajectory: Trajectory
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
