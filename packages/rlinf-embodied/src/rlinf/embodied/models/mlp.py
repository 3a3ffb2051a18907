"""MLP policy for state observations (``model_type: mlp``).

``states [n, d]`` go through a tanh MLP (orthogonal init, gain sqrt(2)) to the
action head (orthogonal init, gain 0.01 * sqrt(2)): a Gaussian mean with a
state-independent ``log_std`` for continuous actions, logits for discrete ones.
A separate value MLP reads the same states.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.models.base import ActorCriticPolicy
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.registry import register_policy

__all__ = ["MLPPolicy"]


@register_policy("mlp")
class MLPPolicy(ActorCriticPolicy):
    """Actor and value MLPs over ``obs["states"]``.

    Args:
        cfg: The policy config (``hidden_dims``, ``activation``, ``init_log_std``...).
        spec: The env spec; needs ``state_dim``.

    Raises:
        ValueError: The env has no state observations.
    """

    obs_keys = ("states",)
    values_after_actions = True  # the value MLP reads the states directly

    def __init__(self, cfg: PolicyConfig, spec: EnvSpec) -> None:
        super().__init__(cfg, spec)
        assert spec.state_dim is not None  # checked by check_spec
        self._build_heads(spec.state_dim)

    @classmethod
    def check_spec(cls, cfg: PolicyConfig, spec: EnvSpec) -> None:
        """Requires state observations (``spec.state_dim``)."""
        super().check_spec(cfg, spec)
        if spec.state_dim is None or spec.state_dim < 1:
            raise ValueError(
                f"model_type 'mlp' reads obs['states'] but the env spec has "
                f"state_dim={spec.state_dim} (image-only observations); use model_type: cnn "
                "for image observations, or an env obs_mode that yields states (obs_mode: state)"
            )

    def _encode(self, inputs: Mapping[str, Tensor]) -> Tensor:
        states = inputs["states"]
        dtype = self.dtype
        return states if states.dtype == dtype else states.to(dtype)
