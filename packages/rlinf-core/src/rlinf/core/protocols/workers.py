"""Protocols of the worker roles that runners are written against.

A runner calls these methods on worker *groups* (each call fans out to every
rank and returns a future), so the protocols describe one rank's methods.
Embodied and reasoning workers implement them; neither stack imports the
other. A runner checks the classes it launches with :func:`check_implements`,
so a custom worker class (say, a reward worker with your own scoring) that
misses a method or renames an argument fails at launch with the method named,
not in the middle of a step.

Config arguments are typed ``Any`` here: each stack's config model lives in
that stack.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlinf.core.channel import Channel
    from rlinf.core.protocols.embodied import EnvSpec
    from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult

__all__ = [
    "CheckpointableWorker",
    "EmbodiedActorWorker",
    "EmbodiedEnvWorker",
    "EmbodiedPolicyEnvWorker",
    "EmbodiedRolloutWorker",
    "OffPolicyEmbodiedActorWorker",
    "OffloadableWorker",
    "ReasoningActorWorker",
    "ReasoningRewardWorker",
    "ReasoningRolloutWorker",
    "check_implements",
]


# ----------------------------------------------------------------- shared roles


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


# -------------------------------------------------------------- embodied roles


@runtime_checkable
class EmbodiedEnvWorker(CheckpointableWorker, Protocol):
    """Steps vectorised simulators and ships trajectories to the actor."""

    def init_worker(self, cfg: Any, actor_world_size: int) -> EnvSpec:
        """Builds this rank's envs; returns their observation/action spec."""

    def interact(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        actor_channel: Channel,
        step: int = 0,
    ) -> dict[str, Any]:
        """Runs one rollout epoch: observations out, actions in, trajectories to the actor.

        ``step``: the global step (seeds the sampling of a policy in the env process).
        Returns ``env_steps`` and ``episodes`` (per-metric lists), and optionally
        ``env_time`` (seconds stepping envs, for the runner's pipeline advice).
        """

    def evaluate(
        self, obs_channel: Channel, action_channel: Channel, step: int = 0
    ) -> dict[str, list[float]]:
        """Runs the eval episodes; returns per-episode metric lists."""


@runtime_checkable
class EmbodiedPolicyEnvWorker(EmbodiedEnvWorker, Protocol):
    """An env worker that can also run the policy itself (``rollout.in_env_process``).

    ``interact`` and ``evaluate`` then act in this process, sampling from the
    global step's seed.
    """

    def init_policy(self, cfg: Any, spec: EnvSpec, actor_group: str) -> None:
        """Builds the policy for ``spec`` in this process."""

    def sync_model_from_actor(self) -> int:
        """Receives the actor's weights; returns the new weight version."""

    def interact(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        actor_channel: Channel,
        step: int = 0,
    ) -> dict[str, Any]:
        """As :meth:`EmbodiedEnvWorker.interact`; also returns ``infer_time``."""

    def evaluate(
        self, obs_channel: Channel, action_channel: Channel, step: int = 0
    ) -> dict[str, list[float]]:
        """As :meth:`EmbodiedEnvWorker.evaluate`."""


@runtime_checkable
class EmbodiedRolloutWorker(Protocol):
    """Answers observations with actions from the current policy weights."""

    def init_worker(
        self,
        cfg: Any,
        spec: EnvSpec,
        actor_group: str,
        env_world_size: int,
        offload: bool = False,
    ) -> None:
        """Builds the policy for ``spec``."""

    def sync_model_from_actor(self) -> int:
        """Receives the actor's weights; returns the new weight version."""

    def generate(
        self,
        obs_channel: Channel,
        action_channel: Channel,
        step: int,
        mode: str = "train",
    ) -> dict[str, Any]:
        """Serves one rollout (or eval) epoch; returns ``rollout/*`` metrics."""


class _EmbodiedTrainerWorker(CheckpointableWorker, Protocol):
    """What the on- and off-policy embodied actors share: init and the weight sync."""

    def init_worker(
        self,
        cfg: Any,
        spec: EnvSpec,
        rollout_group: str,
        rollout_world_size: int,
        env_world_size: int,
        offload: bool = False,
    ) -> None:
        """Builds the model, optimizers, and the process group or (SAC) the replay buffer."""

    def sync_model_to_rollout(self) -> int:
        """Sends the current weights to the rollout group; returns their version."""


@runtime_checkable
class EmbodiedActorWorker(_EmbodiedTrainerWorker, Protocol):
    """Trains the policy on the trajectories it receives through a channel."""

    def recv_rollout_batch(self, actor_channel: Channel) -> dict[str, int]:
        """Collects this rank's share of the step's trajectories."""

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Computes advantages for the received batch; returns ``rollout/*`` metrics."""

    def run_training(self) -> dict[str, float]:
        """Runs the update epochs on the received batch; returns ``actor/*`` metrics."""


@runtime_checkable
class OffPolicyEmbodiedActorWorker(_EmbodiedTrainerWorker, Protocol):
    """Trains off-policy (SAC) from a replay buffer fed by trajectories from a channel.

    The async runner calls :meth:`train_step` while env and rollout keep running;
    the actor moves whatever trajectories have arrived into its buffer first.
    """

    def ingest(self, actor_channel: Channel) -> int:
        """Moves every trajectory waiting in the channel into the buffer; returns rows added."""

    def train_step(self, actor_channel: Channel) -> dict[str, float]:
        """Ingests, waits for enough env steps, runs one step of updates; returns metrics."""


# ------------------------------------------------------------- reasoning roles


@runtime_checkable
class ReasoningRolloutWorker(Protocol):
    """Samples ``G`` responses per prompt group with one weight version."""

    def init_worker(self) -> dict[str, Any]:
        """Loads the tokenizer and engine; returns a summary."""

    def sync_model_from_actor(self, actor_group: str) -> dict[str, Any]:
        """Receives the actor's weights (in buckets); returns the version and timings."""

    def generate(self, requests: Channel, results: Channel, step: int) -> dict[str, Any]:
        """Answers the step's requests group by group; returns ``rollout/*`` metrics."""

    def generate_eval(self, requests: list[RolloutRequest], sampling: Any) -> list[RolloutResult]:
        """Answers held-out prompts with the eval sampling parameters."""


@runtime_checkable
class ReasoningRewardWorker(Protocol):
    """Scores prompt groups and forwards them to the actor."""

    def init_worker(self) -> dict[str, Any]:
        """Loads the tokenizer and starts the scoring pool."""

    def compute_rewards(self, inputs: Channel, outputs: Channel) -> dict[str, Any]:
        """Fills in ``rewards`` for each group on ``inputs`` and puts it on ``outputs``."""

    def evaluate(self, results: list[RolloutResult]) -> list[tuple[list[float], list[bool]]]:
        """Scores eval results; returns ``(rewards, correct)`` per group."""


@runtime_checkable
class ReasoningActorWorker(OffloadableWorker, CheckpointableWorker, Protocol):
    """Trains an LLM policy on scored prompt groups."""

    def init_worker(self, total_steps: int) -> dict[str, Any]:
        """Builds the FSDP model, optimizer and scheduler."""

    def sync_model_to_rollout(
        self, rollout_group: str, rollout_world_size: int, version: int
    ) -> dict[str, Any]:
        """Sends the weights to the rollout group in buckets."""

    def run_training(self, channel: Channel, step: int) -> dict[str, Any]:
        """Trains on the step's groups as they arrive; returns ``actor/*`` metrics."""


# ----------------------------------------------------------------------- check


def _protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    methods: dict[str, inspect.Signature] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                methods[name] = inspect.signature(value)
    return methods


def check_implements(cls: type, protocol: type) -> None:
    """Checks that ``cls`` has every method of ``protocol``, callable as the runner calls it.

    Runners pass every argument positionally (a group call forwards them to each
    rank), so each method must accept the protocol's arguments, optional ones
    included, as positional arguments: extra parameters need defaults,
    ``*args`` accepts anything, keyword-only parameters without defaults fail.
    Names may differ. Static and class methods are allowed; properties and
    plain attributes are not.

    Args:
        cls: The worker class (not an instance).
        protocol: One of the role protocols in this module.

    Raises:
        TypeError: Naming every missing or incompatible method, the expected
            signature and the fix.
    """
    problems: list[str] = []
    for name, wanted in _protocol_methods(protocol).items():
        expected = f"{name}{wanted}"
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            problems.append(f"missing method {expected}")
            continue
        if isinstance(raw, property) or not callable(getattr(cls, name)):
            problems.append(f"{name} is a {type(raw).__name__}, not a method; expected {expected}")
            continue
        bound_to_class = isinstance(raw, staticmethod | classmethod)
        impl = getattr(cls, name)  # unwraps static/class methods
        try:
            have = inspect.signature(impl)
        except (TypeError, ValueError):  # builtins without a signature: trust them
            continue
        n_args = len(wanted.parameters) - 1  # the protocol's arguments after self
        placeholders = [object()] * (n_args if bound_to_class else n_args + 1)
        try:
            have.bind(*placeholders)
        except TypeError as exc:
            problems.append(
                f"{name}{have} cannot be called as the runner calls it ({exc}); expected {expected}"
            )
    if problems:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} does not implement {protocol.__name__}: "
            + "; ".join(problems)
            + f". Implement these methods (see rlinf.core.protocols.{protocol.__name__}), "
            "or subclass the stack's default worker and override only what you change."
        )
