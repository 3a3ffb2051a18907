"""SAC policy for state observations (``model_type: sac_mlp``).

Why: soft actor-critic needs a reparameterisable, bounded stochastic actor and
twin Q critics; the PPO policies have neither. This module holds both:

* actor: ``states -> MLP -> (mean, log_std)``, ``log_std`` squashed into
  ``[-5, 2]``; actions ``a = tanh(u) * scale + bias`` with ``u ~ N(mean, std)``,
  so they always lie inside the env's ``[action_low, action_high]``; the
  log-density includes the tanh/scale correction.
* critics ``q1``, ``q2``: ``[states, action] -> MLP -> 1``.

The rollout serves :meth:`SACPolicy.predict_action_batch` in three modes:
``train`` samples, ``eval`` takes ``tanh(mean)``, ``random`` draws uniformly in
the action bounds (the warm-up before learning starts). SAC's critics bootstrap
from the stored next observation inside the loss, so :meth:`SACPolicy.get_value`
returns zeros and the trajectory builder adds no value bootstrap to rewards.
Only continuous, bounded actions and ``num_action_chunks: 1`` are supported.

Cost: three MLPs of ``hidden_dims``; the rollout runs only the actor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from rlinf.core.protocols.embodied import EnvSpec, PolicyOutput
from rlinf.embodied.models.base import BasePolicy
from rlinf.embodied.models.config import Activation, PolicyConfig
from rlinf.embodied.models.heads import build_mlp, gaussian_log_prob
from rlinf.embodied.models.registry import register_policy

__all__ = ["SACPolicy"]

_LOG_STD_MIN = -5.0
"""Smallest ``log_std`` of the actor's Gaussian."""
_LOG_STD_MAX = 2.0
"""Largest ``log_std`` of the actor's Gaussian."""


def _torch_default_init(_: nn.Module) -> None:
    """Keeps PyTorch's default Linear init (what reference SAC implementations use)."""


def _mlp(in_dim: int, hidden: Sequence[int], activation: Activation, out_dim: int) -> nn.Sequential:
    body, width = build_mlp(in_dim, hidden, activation, init=_torch_default_init)
    return nn.Sequential(*body, nn.Linear(width, out_dim))


@register_policy("sac_mlp")
class SACPolicy(BasePolicy):
    """Tanh-squashed Gaussian actor and twin Q critics over ``obs["states"]``.

    Args:
        cfg: The policy config (``hidden_dims``, ``activation``).
        spec: The env spec: state observations, bounded continuous actions.

    Raises:
        ValueError: Discrete or unbounded actions, no state observations, or
            ``num_action_chunks`` != 1.
    """

    _modes = ("train", "eval", "random")

    action_scale: Tensor
    action_bias: Tensor

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        assert spec.state_dim is not None and spec.action_low is not None  # check_spec
        assert spec.action_high is not None
        a, s, hidden = spec.action_dim, spec.state_dim, list(cfg.hidden_dims)
        self.actor_backbone, width = build_mlp(s, hidden, cfg.activation, init=_torch_default_init)
        self.mean_head = nn.Linear(width, a)
        self.log_std_head = nn.Linear(width, a)
        self.q1 = _mlp(s + a, hidden, cfg.activation, 1)
        self.q2 = _mlp(s + a, hidden, cfg.activation, 1)
        low = torch.tensor(spec.action_low, dtype=torch.float32)
        high = torch.tensor(spec.action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires states, bounded continuous actions and one action per chunk."""
        super().check_spec(cfg, spec)
        if spec.num_actions is not None:
            raise ValueError(
                f"model_type 'sac_mlp' needs continuous actions but the env has "
                f"{spec.num_actions} discrete actions; use a continuous env (e.g. Pendulum-v1) "
                "or PPO (algorithm.loss_type: actor_critic, model_type: mlp)"
            )
        if spec.action_low is None or spec.action_high is None:
            raise ValueError(
                "model_type 'sac_mlp' squashes actions into the env's bounds but the env spec "
                "has no action_low/action_high; use an env with a bounded Box action space"
            )
        if spec.state_dim is None or spec.state_dim < 1:
            raise ValueError(
                f"model_type 'sac_mlp' reads obs['states'] but the env spec has "
                f"state_dim={spec.state_dim}; use an env obs_mode that yields states"
            )
        if cfg.num_action_chunks != 1:
            raise ValueError(
                f"actor.model.num_action_chunks={cfg.num_action_chunks}: model_type 'sac_mlp' "
                "learns one action per step; set actor.model.num_action_chunks: 1"
            )

    # ------------------------------------------------------------------ actor

    def _states(self, obs: Mapping[str, Tensor]) -> Tensor:
        if "states" not in obs:
            raise KeyError(f"SACPolicy reads obs['states'] but got keys {sorted(obs)}")
        return obs["states"].to(self.device, self.dtype)

    def _gaussian(self, states: Tensor) -> tuple[Tensor, Tensor]:
        features = self.actor_backbone(states)
        mean = self.mean_head(features)
        log_std = torch.tanh(self.log_std_head(features))
        log_std = _LOG_STD_MIN + 0.5 * (_LOG_STD_MAX - _LOG_STD_MIN) * (log_std + 1.0)
        return mean, log_std

    def _squash(self, u: Tensor) -> Tensor:
        return torch.tanh(u) * self.action_scale + self.action_bias

    def _log_prob(self, u: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
        """Per-dimension log-density of ``tanh(u) * scale + bias``."""
        y = torch.tanh(u)
        jacobian = self.action_scale * (1.0 - y.pow(2)) + 1e-6
        return gaussian_log_prob(u, mean, log_std) - torch.log(jacobian)

    def sample(
        self, states: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterised actions and their log-probabilities (with gradients).

        Args:
            states: ``[n, state_dim]``.
            generator: Random generator for the noise (the global one if None).

        Returns:
            ``(actions [n, A] in env units, logprobs [n] summed over dimensions)``.
        """
        mean, log_std = self._gaussian(states)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise
        return self._squash(u), self._log_prob(u, mean, log_std).sum(dim=-1)

    def q_values(self, states: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Both critics on ``(states, actions)``: ``([n], [n])``."""
        x = torch.cat([states, actions.to(states.dtype)], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def actor_parameters(self) -> list[nn.Parameter]:
        """Parameters of the actor (backbone, mean and log-std heads)."""
        return [
            *self.actor_backbone.parameters(),
            *self.mean_head.parameters(),
            *self.log_std_head.parameters(),
        ]

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters of the twin critics."""
        return [*self.q1.parameters(), *self.q2.parameters()]

    # ------------------------------------------------------------------ BasePolicy

    @torch.no_grad()
    def predict_action_batch(
        self,
        obs: Mapping[str, Tensor],
        mode: str = "train",
        *,
        generator: torch.Generator | None = None,
        compute_values: bool = True,
    ) -> PolicyOutput:
        """See :meth:`BasePolicy.predict_action_batch`; ``mode`` may also be ``random``.

        ``train`` samples, ``eval`` is ``tanh(mean)``, ``random`` is uniform in the
        bounds. ``prev_logprobs`` ``[n, A]`` and ``prev_values`` are zeros (SAC does
        not use them); ``forward_inputs`` is ``{"states"}``.
        """
        self._check_mode(mode)
        states = self._states(obs)
        n, a = states.shape[0], self.spec.action_dim
        if mode == "random":
            u = torch.rand((n, a), generator=generator, device=states.device, dtype=states.dtype)
            actions = (2.0 * u - 1.0) * self.action_scale + self.action_bias
        elif mode == "eval":
            mean, _ = self._gaussian(states)
            actions = self._squash(mean)
        else:
            actions, _ = self.sample(states, generator)
        return PolicyOutput(
            actions=actions.float().reshape(n, 1, a),
            prev_logprobs=torch.zeros(n, a, device=states.device),
            prev_values=self._zero_values(n, states.device) if compute_values else None,
            forward_inputs={"states": states.float()},
        )

    def default_forward(
        self,
        forward_inputs: Mapping[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = False,
        compute_values: bool = False,
    ) -> dict[str, Tensor]:
        """Statistics of fresh reparameterised samples (SAC has no stored-action ratio).

        Returns:
            ``logprobs`` ``[n, A]`` per dimension, ``entropy`` ``[n, A]`` (``-logprobs``,
            a one-sample estimate) and ``values`` ``[n, V]`` (``min(Q1, Q2)`` of the sample).
        """
        states = self._states(forward_inputs)
        mean, log_std = self._gaussian(states)
        u = mean + log_std.exp() * torch.randn_like(mean)
        logprobs = self._log_prob(u, mean, log_std)
        out: dict[str, Tensor] = {}
        if compute_logprobs:
            out["logprobs"] = logprobs.float()
        if compute_entropy:
            out["entropy"] = -logprobs.float()
        if compute_values:
            q1, q2 = self.q_values(states, self._squash(u))
            out["values"] = torch.minimum(q1, q2).float().unsqueeze(-1).expand(-1, self.value_dim)
        return out

    def get_value(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Zeros ``[n, V]``: SAC bootstraps from the stored next observation in its loss."""
        states = self._states(obs)
        return self._zero_values(states.shape[0], states.device)
