"""Embodied policies: the :class:`BasePolicy` interface, MLP, CNN and SAC policies, their registry.

Example::

    from rlinf.embodied.models import PolicyConfig, build_policy

    policy = build_policy(PolicyConfig(model_type="mlp", hidden_dims=[64, 64]), env_spec)
    out = policy.predict_action_batch({"states": states}, mode="train")
    stats = policy(out.forward_inputs, compute_entropy=True, compute_values=True)
"""

from rlinf.embodied.models.base import ActorCriticPolicy, BasePolicy
from rlinf.embodied.models.cnn import CNNPolicy, NatureCNNEncoder
from rlinf.embodied.models.config import PolicyConfig
from rlinf.embodied.models.heads import (
    ActionHead,
    CategoricalActionHead,
    GaussianActionHead,
    ValueHead,
)
from rlinf.embodied.models.mlp import MLPPolicy
from rlinf.embodied.models.registry import (
    available_policies,
    build_policy,
    get_policy_class,
    register_policy,
)
from rlinf.embodied.models.sac import SACPolicy

__all__ = [
    "ActionHead",
    "ActorCriticPolicy",
    "BasePolicy",
    "CNNPolicy",
    "CategoricalActionHead",
    "GaussianActionHead",
    "MLPPolicy",
    "NatureCNNEncoder",
    "PolicyConfig",
    "SACPolicy",
    "ValueHead",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
]
