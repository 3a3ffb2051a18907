"""gymnasium backend (``env_type: gym``): any registered id, classic control or MuJoCo.

The ``n`` sub-envs are plain ``gymnasium.make`` instances stepped in a loop
(what ``SyncVectorEnv`` does, without its auto-reset), so that chunking, holding
and resetting follow :class:`~rlinf.embodied.envs.base.VectorEnv`. Observations
are flattened into ``states``; ``obs_mode: rgb`` adds ``main_images`` from
``render()`` (resized to ``image_size``, default 84x84; classic-control
envs render with pygame, MuJoCo envs with ``MUJOCO_GL``, default ``egl``). ``Discrete`` action
spaces take one index per sub-step; ``Box`` action spaces are clipped to their
bounds. Success is read from ``info["is_success"]`` or ``info["success"]`` where
the env reports it. gymnasium forbids stepping after a termination, so with
``ignore_terminations`` a terminated env is held until its truncation.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.envs.base import Obs, StepResult, VectorEnv, resize_images
from rlinf.embodied.envs.registry import import_simulator, register_env

__all__ = ["GymVectorEnv"]

_DEFAULT_IMAGE = (84, 84)


@register_env("gym")
class GymVectorEnv(VectorEnv):
    """``num_envs`` gymnasium envs of one id (see the module docstring)."""

    can_continue_after_termination = False

    def _setup(self) -> EnvSpec:
        cfg = self.cfg
        self._refuse_gpu("gym", cfg.env_id)
        os.environ.setdefault("MUJOCO_GL", "egl")
        gym = import_simulator("gymnasium", "mujoco", "gym")
        try:
            gym_spec = gym.spec(cfg.env_id)
        except gym.error.Error as exc:
            raise ValueError(f"env_id {cfg.env_id!r} is not a gymnasium id: {exc}") from exc
        max_steps = cfg.max_episode_steps or gym_spec.max_episode_steps
        if not max_steps:
            raise ValueError(
                f"gymnasium id {cfg.env_id!r} has no default episode limit; "
                "set env.max_episode_steps"
            )
        self._rgb = cfg.obs_mode == "rgb"
        self._image_size = cfg.image_size or _DEFAULT_IMAGE
        self._envs: list[Any] = []
        for i in range(self.num_envs):
            render = "rgb_array" if self._rgb or (cfg.video.enabled and i == 0) else None
            try:
                env = gym.make(
                    cfg.env_id,
                    max_episode_steps=max_steps,
                    render_mode=render,
                    disable_env_checker=True,
                    **cfg.env_kwargs,
                )
            except gym.error.DependencyNotInstalled as exc:
                self.close_all()
                extra = "mujoco" if "mujoco" in str(exc).lower() else "mujoco,video"
                raise ImportError(
                    f"gymnasium id {cfg.env_id!r} needs a simulator that is not installed "
                    f"({exc}); install it with: uv pip install 'rlinf-embodied[{extra}]'"
                ) from exc
            self._envs.append(env)

        first = self._envs[0]
        if first.render_mode is not None:
            self._check_render(first, gym.error.DependencyNotInstalled)
        obs_space, act_space = first.observation_space, first.action_space
        self._obs_space = obs_space
        self._box_obs = isinstance(obs_space, gym.spaces.Box)
        # 1-D Box observations go into their row as they are (numpy casts on assignment).
        self._flat_rows = self._box_obs and len(obs_space.shape) == 1
        self._flatten = gym.spaces.flatten
        state_dim = int(gym.spaces.flatdim(obs_space))
        self._states = np.zeros((self.num_envs, state_dim), dtype=np.float32)
        self._images: NDArray[Any] | None = None
        if self._rgb:
            self._images = np.zeros((self.num_envs, *self._image_size, 3), dtype=np.uint8)
        self._success_seen = False

        if isinstance(act_space, gym.spaces.Discrete):
            self._discrete_start = int(act_space.start)
            self._act_shape: tuple[int, ...] = ()
            self._act_dtype: Any = np.int64
            num_actions: int | None = int(act_space.n)
            action_dim = 1
            low = high = None
        elif isinstance(act_space, gym.spaces.Box):
            self._discrete_start = 0
            self._act_shape = tuple(act_space.shape)
            self._act_dtype = act_space.dtype
            num_actions = None
            action_dim = int(np.prod(act_space.shape))
            low = tuple(float(x) for x in np.asarray(act_space.low).reshape(-1))
            high = tuple(float(x) for x in np.asarray(act_space.high).reshape(-1))
        else:
            self.close_all()
            raise ValueError(
                f"gymnasium id {cfg.env_id!r} has a {type(act_space).__name__} action space; "
                "env_type 'gym' supports Discrete and Box actions"
            )
        image_shape = (self._image_size[0], self._image_size[1], 3) if self._rgb else None
        return EnvSpec(
            state_dim=state_dim,
            image_shape=image_shape,
            action_dim=action_dim,
            num_actions=num_actions,
            action_low=low,
            action_high=high,
            max_episode_steps=int(max_steps),
        )

    def _check_render(self, env: Any, missing: type[Exception]) -> None:
        """Fails now, not mid-rollout, if the env cannot render (e.g. pygame is missing)."""
        try:
            env.reset(seed=0)
            env.render()
        except missing as exc:
            self.close_all()
            raise ImportError(
                f"obs_mode 'rgb' and video need {self.cfg.env_id!r} to render, which needs a "
                f"package that is not installed ({exc}); classic-control envs render with "
                "pygame: uv pip install 'gymnasium[classic-control]'"
            ) from exc

    def _flat(self, raw: Any) -> NDArray[Any]:
        if self._box_obs:
            return np.asarray(raw, dtype=np.float32).reshape(-1)
        return np.asarray(self._flatten(self._obs_space, raw), dtype=np.float32)

    def _render(self, env_id: int) -> NDArray[Any]:
        frame = np.ascontiguousarray(self._envs[env_id].render(), dtype=np.uint8)
        return resize_images(torch.from_numpy(frame[None]), self._image_size)[0].numpy()

    def _current_obs(self) -> Obs:
        obs: Obs = {"states": torch.from_numpy(self._states)}
        if self._images is not None:
            obs["main_images"] = torch.from_numpy(self._images)
        return obs

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        for env_id, seed in zip(env_ids, seeds, strict=True):
            raw, _ = self._envs[env_id].reset(seed=int(seed))
            self._states[env_id] = self._flat(raw)
            if self._images is not None:
                self._images[env_id] = self._render(int(env_id))
        return {k: v[torch.from_numpy(env_ids)] for k, v in self._current_obs().items()}

    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        acts = actions.numpy()
        # Discrete: Python ints for the whole batch at once (per-env numpy scalars cost more).
        indices = (acts[:, 0] + self._discrete_start).tolist() if self._act_shape == () else []
        for env_id in np.flatnonzero(active).tolist():
            if indices:
                action: Any = indices[env_id]
            else:
                action = acts[env_id].reshape(self._act_shape).astype(self._act_dtype)
            raw, reward, term, trunc, info = self._envs[env_id].step(action)
            self._states[env_id] = raw if self._flat_rows else self._flat(raw)
            rewards[env_id] = float(reward)
            terminated[env_id] = bool(term)
            truncated[env_id] = bool(trunc)
            flag = info.get("is_success", info.get("success"))
            if flag is not None:
                self._success_seen = True
                success[env_id] = bool(flag)
            if self._images is not None:
                self._images[env_id] = self._render(int(env_id))
        return StepResult(
            obs=self._current_obs(),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            success=success if self._success_seen else None,
        )

    def _render_frame(self) -> NDArray[Any] | None:
        return np.ascontiguousarray(self._envs[0].render(), dtype=np.uint8)

    def _default_fps(self) -> float:
        return float(self._envs[0].metadata.get("render_fps") or 30)

    def close_all(self) -> None:
        """Closes every sub-env built so far."""
        for env in self._envs:
            env.close()
        self._envs = []

    def _close(self) -> None:
        self.close_all()
