"""Vectorized simulators for embodied RL, stepped in action chunks.

Build one with :func:`make_env` from an :class:`EnvConfig`; ``env_type`` picks
the backend (``gym``, ``maniskill``, ``robosuite`` or one registered with
:func:`register_env`). Simulators are imported only when an env of their type
is built; a missing one raises an ImportError that names the extra to install.
See :mod:`rlinf.embodied.envs.base` for the chunk, reset, seed and metric
semantics.

Example::

    import torch
    from rlinf.embodied.envs import EnvConfig, make_env

    cfg = EnvConfig(env_type="gym", env_id="CartPole-v1", num_envs=4, auto_reset=True)
    env = make_env(cfg)
    out = env.reset()
    out, metrics = env.chunk_step(torch.zeros(4, 8, 1))  # 8 sub-steps of action 0
"""

from rlinf.embodied.envs.base import METRIC_KEYS, Obs, StepResult, VectorEnv, resize_images
from rlinf.embodied.envs.config import EnvConfig, VideoConfig
from rlinf.embodied.envs.registry import available_envs, make_env, register_env
from rlinf.embodied.envs.video import VideoRecorder

__all__ = [
    "METRIC_KEYS",
    "EnvConfig",
    "Obs",
    "StepResult",
    "VectorEnv",
    "VideoConfig",
    "VideoRecorder",
    "available_envs",
    "make_env",
    "register_env",
    "resize_images",
]
