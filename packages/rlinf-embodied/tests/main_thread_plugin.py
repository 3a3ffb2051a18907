"""Plugin of ``test_env_and_rollout_workers_run_on_their_main_thread`` (test_runner_e2e.py).

A CartPole and an MLP policy that raise when run off their process's main thread,
registered at import as ``main_thread_cartpole`` and ``main_thread_mlp``. Not a
test module, so collecting the tests does not register them in the driver.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from rlinf.embodied.envs import available_envs, register_env
from rlinf.embodied.envs.gym_env import GymVectorEnv
from rlinf.embodied.models import available_policies, register_policy
from rlinf.embodied.models.mlp import MLPPolicy


def _refuse_off_the_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"{what} ran on {threading.current_thread().name}, not the main thread")


class MainThreadCartPole(GymVectorEnv):
    """CartPole that refuses a step off its process's main thread."""

    def _step_envs(self, actions: torch.Tensor, active: Any) -> Any:
        _refuse_off_the_main_thread("MainThreadCartPole's step")
        return super()._step_envs(actions, active)


class MainThreadMLP(MLPPolicy):
    """The MLP policy, refusing to act off its process's main thread."""

    def predict_action_batch(self, *args: Any, **kwargs: Any) -> Any:
        _refuse_off_the_main_thread("MainThreadMLP's act")
        return super().predict_action_batch(*args, **kwargs)


if "main_thread_cartpole" not in available_envs():
    register_env("main_thread_cartpole")(MainThreadCartPole)
if "main_thread_mlp" not in available_policies():
    register_policy("main_thread_mlp")(MainThreadMLP)
