"""The policy interface that rollout and actor workers are written against.

A policy maps one observation to a chunk of ``C`` actions. Rollout calls
:meth:`BasePolicy.predict_action_batch` (no grad) and ships the returned
:class:`~rlinf.core.protocols.embodied.PolicyOutput`; its ``forward_inputs``
hold everything needed to recompute the same statistics. The actor calls the
module (``policy(forward_inputs, compute_entropy=..., compute_values=...)``,
which runs :meth:`BasePolicy.default_forward` through ``nn.Module.__call__`` so
that FSDP hooks fire) to get logprobs, entropy and values with gradients.

Shapes (see :mod:`rlinf.core.protocols.embodied`): actions ``[n, C, A]``;
logprobs and entropy ``[n, C * A]`` (continuous, per dimension) or ``[n, C]``
(discrete); values ``[n, V]``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.heads import (
    ActionHead,
    CategoricalActionHead,
    GaussianActionHead,
    ValueHead,
    build_mlp,
)

__all__ = ["ActorCriticPolicy", "BasePolicy"]


class BasePolicy(nn.Module, ABC):
    """Interface of every embodied policy.

    Subclasses are registered with :func:`~rlinf.embodied.models.register_policy`
    and built by :func:`~rlinf.embodied.models.build_policy`; their constructor
    takes ``(cfg, spec)``. A policy implements :meth:`predict_action_batch` (the
    rollout's one call), :meth:`default_forward` (the actor's) and :meth:`get_value`.

    Args:
        cfg: The policy config.
        spec: What the env observes and how it acts.

    Raises:
        ValueError: The spec does not suit this policy (see :meth:`check_spec`).
    """

    supports_lora: ClassVar[bool] = False
    """Whether ``actor.model.lora`` applies to this policy (the VLAs)."""

    _modes: ClassVar[tuple[str, ...]] = ("train", "eval")
    """The ``mode`` values :meth:`predict_action_batch` accepts."""

    values_after_actions: ClassVar[bool] = False
    """Whether :meth:`get_value` costs about the value head alone (no shared forward to redo).

    A policy that sets it also accepts ``compute_values=False`` in
    :meth:`predict_action_batch` (``prev_values`` is then None). A rollout group
    then sends the action chunk first and computes the values with
    :meth:`get_value` while the env steps. The MLP policy sets it; a policy whose
    values share an expensive forward with the actions (a VLA) leaves it False.
    """

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__()
        self.check_spec(cfg, spec)
        self.cfg = cfg
        self.spec = spec

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Raises ``ValueError`` if ``spec`` cannot be served by this policy class.

        The base check covers the action space; subclasses add observation checks.

        Args:
            cfg: The policy config.
            spec: The env spec.
        """
        if spec.num_actions is not None:
            if spec.num_actions < 2:
                raise ValueError(
                    f"EnvSpec.num_actions={spec.num_actions}: a discrete action space needs at "
                    "least 2 actions (use num_actions=None for continuous actions)"
                )
            if spec.action_dim != 1:
                raise ValueError(
                    f"EnvSpec.action_dim={spec.action_dim} with num_actions={spec.num_actions}: "
                    "discrete actions are one index per sub-step, so action_dim must be 1"
                )
        elif spec.action_dim < 1:
            raise ValueError(
                f"EnvSpec.action_dim={spec.action_dim}: continuous actions need action_dim >= 1"
            )

    @property
    def num_action_chunks(self) -> int:
        """``C``: actions per call."""
        return self.cfg.num_action_chunks

    @property
    def value_dim(self) -> int:
        """``V``: values per step."""
        return self.cfg.value_dim

    @property
    def frozen_from_disk(self) -> bool:
        """Whether the frozen parameters come unchanged from ``model_path`` in every worker.

        True for a LoRA policy: its base weights never train and every actor and
        rollout worker loads them from the same directory, so weight syncs and
        checkpoints carry only the trainable tensors (and the buffers).
        """
        return False

    def frozen_parameter_names(self) -> set[str]:
        """State-dict names of the parameters that do not train (``requires_grad`` False)."""
        return {name for name, p in self.named_parameters() if not p.requires_grad}

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return _first_parameter(self).device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the parameters (``cfg.precision``)."""
        return _first_parameter(self).dtype

    def _check_mode(self, mode: str) -> None:
        if mode not in self._modes:
            raise ValueError(
                f"mode={mode!r} is not a mode of {type(self).__name__}; use one of "
                f"{list(self._modes)}"
            )

    def _zero_values(self, batch: int, device: torch.device) -> Tensor:
        """Float32 zeros ``[batch, V]``: the values of a policy without a value head."""
        return torch.zeros(batch, self.value_dim, device=device, dtype=torch.float32)

    def _check_values_requested(self, has_head: bool) -> None:
        """Raises ``ValueError`` unless ``cfg.add_value_head`` is set and the model has a head."""
        if not (self.cfg.add_value_head and has_head):
            raise ValueError(
                "values were requested but the policy has no value head; set "
                "actor.model.add_value_head: true (GAE needs it; a VLA's model must have one "
                "too) or do not compute values"
            )

    @staticmethod
    def _require_stored(forward_inputs: Mapping[str, Tensor], *keys: str) -> None:
        """Raises ``KeyError`` if ``forward_inputs`` lacks the stored entries ``keys``."""
        missing = [key for key in keys if key not in forward_inputs]
        if missing:
            raise KeyError(
                f"forward_inputs lacks {missing}; pass the forward_inputs returned by "
                "predict_action_batch"
            )

    @abstractmethod
    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """Acts on a batch of observations, without gradients.

        Args:
            obs: ``states`` [n, d] float32 and/or ``main_images`` [n, H, W, 3] uint8;
                other keys are ignored.
            mode: ``train`` samples; ``eval`` is deterministic (mean / argmax).
            generator: Random generator for sampling (the global one if None).
            compute_values: False: skip the values (``prev_values`` None); the
                caller gets them from :meth:`get_value` (see
                :attr:`values_after_actions`).

        Returns:
            Actions ``[n, C, A]``, ``prev_logprobs``, ``prev_values`` ``[n, V]`` and
            ``forward_inputs``, all on the policy's device.
        """

    @abstractmethod
    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Recomputes statistics of stored actions, with gradients.

        Args:
            forward_inputs: A (possibly re-batched) ``PolicyOutput.forward_inputs``.
            compute_logprobs: Return ``logprobs`` shaped like ``prev_logprobs``.
            compute_entropy: Return ``entropy`` shaped like ``logprobs``.
            compute_values: Return ``values`` ``[n, V]``.

        Returns:
            The requested entries, float32.
        """

    @abstractmethod
    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[n, V]`` (float32, no grad) of observations, e.g. final obs to bootstrap."""

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Supervised loss of expert action chunks (SFT / warm starts), with gradients.

        Args:
            obs: Observations, as for :meth:`predict_action_batch`.
            actions: ``[n, C, A]`` expert actions in env units.
            generator: Random generator, for losses that sample (flow matching).

        Returns:
            The scalar loss.

        Raises:
            NotImplementedError: The policy has no supervised loss.
        """
        raise NotImplementedError(
            f"model_type {self.cfg.model_type!r} ({type(self).__name__}) has no "
            "behaviour-cloning loss; implement behaviour_cloning_loss to SFT it"
        )

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Writes a model directory that ``actor.model.model_path`` can load.

        Raises:
            NotImplementedError: The policy is not loaded from a model directory.
        """
        raise NotImplementedError(
            f"model_type {self.cfg.model_type!r} is built from the config, not loaded from "
            "a model_path, so it has no model directory to write (its weights live in "
            "the run's checkpoints)"
        )

    def forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Same as :meth:`default_forward`; call the module itself so wrappers' hooks run."""
        return self.default_forward(
            forward_inputs,
            compute_logprobs=compute_logprobs,
            compute_entropy=compute_entropy,
            compute_values=compute_values,
        )


class ActorCriticPolicy(BasePolicy):
    """A policy made of an observation encoder, an actor MLP + action head and a value head.

    Subclasses set :attr:`obs_keys`, build their encoder, call :meth:`_build_heads`
    with the encoder's output width and implement :meth:`_encode`. Parameters of
    the value head live under ``value_head`` (optimizers give them ``value_lr``).
    """

    obs_keys: tuple[str, ...] = ()
    """Observation entries the policy reads (and stores in ``forward_inputs``)."""

    action_head: ActionHead
    actor_backbone: nn.Sequential
    value_head: ValueHead | None

    def _build_heads(self, in_dim: int) -> None:
        cfg, spec = self.cfg, self.spec
        self.actor_backbone, width = build_mlp(in_dim, cfg.hidden_dims, cfg.activation)
        if spec.num_actions is not None:
            self.action_head = CategoricalActionHead(width, cfg.num_action_chunks, spec.num_actions)
        else:
            self.action_head = GaussianActionHead(
                width, cfg.num_action_chunks, spec.action_dim, cfg.init_log_std
            )
        self.value_head = (
            ValueHead(in_dim, cfg.hidden_dims, cfg.value_dim, cfg.activation)
            if cfg.add_value_head
            else None
        )

    @abstractmethod
    def _encode(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Encodes validated inputs (on the policy's device) into ``[n, F]`` in ``self.dtype``."""

    def _expected_shape(self, key: str) -> tuple[int, ...] | None:
        if key == "states" and self.spec.state_dim is not None:
            return (self.spec.state_dim,)
        if key == "main_images" and self.spec.image_shape is not None:
            return tuple(self.spec.image_shape)
        return None

    def _select_inputs(self, obs: Mapping[str, Any]) -> dict[str, Tensor]:
        """Picks and checks the observation entries this policy reads (float32 states).

        The tensors stay on the device they came on; :meth:`_to_device` moves them.
        """
        inputs: dict[str, Tensor] = {}
        batch: int | None = None
        for key in self.obs_keys:
            if key not in obs:
                raise KeyError(
                    f"{type(self).__name__} reads obs[{key!r}] but it is missing "
                    f"(got keys {sorted(obs)}); the policy needs {list(self.obs_keys)}"
                )
            value = obs[key]
            if not isinstance(value, Tensor):
                raise TypeError(f"obs[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
            expected = self._expected_shape(key)
            if expected is not None and tuple(value.shape[1:]) != expected:
                raise ValueError(
                    f"obs[{key!r}] has shape {tuple(value.shape)}, expected [n, "
                    f"{', '.join(map(str, expected))}] from the env spec"
                )
            if key == "main_images":
                if value.dtype != torch.uint8:
                    raise ValueError(
                        f"obs['main_images'] must be uint8 [n, H, W, 3] (0-255), got {value.dtype}"
                    )
            elif value.dtype != torch.float32:
                value = value.float()
            if batch is not None and value.shape[0] != batch:
                raise ValueError(
                    f"obs entries disagree on the batch size: obs[{key!r}] has "
                    f"{value.shape[0]} rows, earlier entries have {batch}"
                )
            batch = int(value.shape[0])
            inputs[key] = value
        return inputs

    def _to_device(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        device = self.device
        return {key: value.to(device, non_blocking=True) for key, value in inputs.items()}

    def _features(self, obs: Mapping[str, Any]) -> Tensor:
        """Encoder features ``[n, F]`` of the entries of ``obs`` this policy reads."""
        return self._encode(self._to_device(self._select_inputs(obs)))

    def _values(self, features: Tensor) -> Tensor:
        if self.value_head is None:
            return self._zero_values(features.shape[0], features.device)
        values: Tensor = self.value_head(features)
        return values

    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """See :meth:`BasePolicy.predict_action_batch`.

        ``prev_values`` are zeros without a value head, and None with
        ``compute_values=False`` (see :attr:`BasePolicy.values_after_actions`).
        ``forward_inputs`` holds the observation entries read (on the device they came
        on, so CPU images are not copied back; states as float32, images as uint8) plus
        ``action`` (``[n, C, A]`` float32, or ``[n, C, 1]`` int64 indices for discrete
        actions).
        """
        self._check_mode(mode)
        with torch.no_grad():
            inputs = self._select_inputs(obs)
            features = self._encode(self._to_device(inputs))
            params = self.action_head(self.actor_backbone(features))
            actions, stored, logprobs = self.action_head.sample(
                params, deterministic=mode == "eval", generator=generator
            )
            values = self._values(features) if compute_values else None
        return PolicyOutput(
            actions=actions,
            prev_logprobs=logprobs,
            prev_values=values,
            forward_inputs={**inputs, "action": stored},
        )

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """See :meth:`BasePolicy.default_forward` (``forward_inputs`` must hold ``action``)."""
        if compute_values:
            self._check_values_requested(self.value_head is not None)
        features = self._features(forward_inputs)
        out: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            params = self.action_head(self.actor_backbone(features))
            if compute_logprobs:
                self._require_stored(forward_inputs, "action")
                action = forward_inputs["action"].to(params.device)
                out["logprobs"] = self.action_head.log_prob(params, action)
            if compute_entropy:
                out["entropy"] = self.action_head.entropy(params)
        if compute_values:
            out["values"] = self._values(features)
        return out

    def behaviour_cloning_loss(
        self,
        obs: Mapping[str, Tensor],
        actions: Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Mean negative log-likelihood of expert chunks (discrete: indices as floats).

        See :meth:`BasePolicy.behaviour_cloning_loss`; ``generator`` is unused.
        """
        params = self.action_head(self.actor_backbone(self._features(obs)))
        target = actions.to(params.device)
        target = target.round().long() if self.spec.discrete else target.float()
        return -self.action_head.log_prob(params, target).mean()

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Float32 values ``[n, V]`` without gradients (zeros without a value head)."""
        with torch.no_grad():
            return self._values(self._features(obs))


def _first_parameter(module: nn.Module) -> Tensor:
    """The module's first parameter.

    Raises:
        ValueError: The module has no parameters.
    """
    for param in module.parameters():
        return param
    raise ValueError(f"{type(module).__name__} has no parameters: it has no device or dtype")
