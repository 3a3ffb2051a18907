"""robosuite backend (``env_type: robosuite``): ``Lift`` with a Panda arm, and friends.

``n`` robosuite envs run in this process (MuJoCo physics on the CPU).
robosuite 1.5.2 only works with ``mujoco==3.3.7``; another version fails at
build time with an error that names the extra to reinstall.

* ``obs_mode: state``: no cameras; ``states`` is the concatenation of the
  ``*-state`` observables (``robot0_proprio-state`` then ``object-state``).
* ``obs_mode: rgb``: adds ``main_images`` from the first of ``camera_names``
  (``agentview``) at ``image_size`` (default 84x84), flipped upright; a second
  camera (``env_kwargs: {camera_names: [agentview, robot0_eye_in_hand]}``)
  gives ``wrist_images`` the same way.
* Success is ``env._check_success()``; it also terminates the episode (as in
  LIBERO). robosuite's own horizon is disabled (``ignore_done``); the episode
  limit is ``max_episode_steps`` (default 200).
* Seeds: each reset reseeds the env's random generator (robot initial noise and
  object placement), so equal seeds give equal starts in every env. All envs
  are built with the same seed, so per-build randomisation (e.g. the cube's size
  in Lift) is equal across the envs of one instance.
* Extra constructor arguments (``robots``, ``controller_configs``,
  ``reward_shaping``, ``camera_names``, ...) go in ``env_kwargs``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.envs.base import Obs, StepResult, VectorEnv, resize_images
from rlinf.embodied.envs.registry import import_simulator, register_env

__all__ = ["RobosuiteVectorEnv"]

_MUJOCO_VERSION = "3.3.7"
_DEFAULT_IMAGE = (84, 84)
_DEFAULT_MAX_STEPS = 200
_VIDEO_SIZE = 128


def _reseed(env: Any, seed: int) -> None:
    """Points the env's and its placement samplers' random generator at a fresh seed."""
    rng = np.random.default_rng(seed)
    env.rng = rng
    pending = [getattr(env, "placement_initializer", None)]
    while pending:
        sampler = pending.pop()
        if sampler is None:
            continue
        if hasattr(sampler, "rng"):
            sampler.rng = rng
        pending.extend(getattr(sampler, "samplers", {}).values())


@register_env("robosuite")
class RobosuiteVectorEnv(VectorEnv):
    """``num_envs`` in-process robosuite envs (see the module docstring)."""

    default_instructions: ClassVar[dict[str, str]] = {
        "Lift": "lift the cube",
        "Door": "open the door",
    }

    def _setup(self) -> EnvSpec:
        cfg = self.cfg
        self._refuse_gpu("robosuite", "MuJoCo runs on the CPU")
        os.environ.setdefault("MUJOCO_GL", "egl")
        mujoco = import_simulator("mujoco", "robosuite", "robosuite")
        if mujoco.__version__ != _MUJOCO_VERSION:
            raise ImportError(
                f"robosuite 1.5.2 needs mujoco=={_MUJOCO_VERSION}, found mujoco "
                f"{mujoco.__version__}; reinstall with: uv pip install 'rlinf-embodied[robosuite]'"
            )
        suite = import_simulator("robosuite", "robosuite", "robosuite")

        self._rgb = cfg.obs_mode == "rgb"
        self._image_size = cfg.image_size or _DEFAULT_IMAGE
        max_steps = cfg.max_episode_steps or _DEFAULT_MAX_STEPS
        h, w = self._image_size
        build_seed = int(
            np.random.SeedSequence([cfg.seed, self.seed_offset]).generate_state(1)[0] % 2**31
        )
        kwargs: dict[str, Any] = {
            "robots": "Panda",
            "has_renderer": False,
            "has_offscreen_renderer": self._rgb,
            "use_camera_obs": self._rgb,
            "use_object_obs": True,
            "camera_names": "agentview",
            "camera_heights": h,
            "camera_widths": w,
            "hard_reset": False,
            "ignore_done": True,
            "horizon": max_steps,
            "seed": build_seed,
        }
        kwargs.update(cfg.env_kwargs)
        cameras = kwargs["camera_names"]
        cameras = [cameras] if isinstance(cameras, str) else [str(c) for c in cameras]
        if not 1 <= len(cameras) <= 2:
            raise ValueError(
                f"env_kwargs.camera_names={cameras}: give one camera (main_images) or two "
                "(main_images, wrist_images), e.g. [agentview, robot0_eye_in_hand]"
            )
        self._camera = cameras[0]
        self._wrist_camera = cameras[1] if self._rgb and len(cameras) == 2 else None
        self._envs: list[Any] = []
        try:
            for i in range(self.num_envs):
                video = cfg.video.enabled and i == 0
                extra = {"has_offscreen_renderer": True} if video else {}
                self._envs.append(suite.make(cfg.env_id, **{**kwargs, **extra}))
        except Exception:
            self._close()
            raise
        self._control_freq = float(kwargs.get("control_freq", 20))
        self.defines_success = True

        first = self._envs[0].observation_spec()
        self._state_keys = [k for k in first if k.endswith("-state")]
        if not self._state_keys:
            self._close()
            raise RuntimeError(
                f"robosuite env {cfg.env_id!r} has no '*-state' observables; "
                "keep env_kwargs.use_object_obs true"
            )
        state_dim = sum(int(np.size(first[k])) for k in self._state_keys)
        self._states = np.zeros((self.num_envs, state_dim), dtype=np.float32)
        self._images: NDArray[Any] | None = None
        self._wrist_images: NDArray[Any] | None = None
        if self._rgb:
            self._images = np.zeros((self.num_envs, h, w, 3), dtype=np.uint8)
        if self._wrist_camera is not None:
            self._wrist_images = np.zeros((self.num_envs, h, w, 3), dtype=np.uint8)
        low, high = self._envs[0].action_spec
        return EnvSpec(
            state_dim=state_dim,
            image_shape=(h, w, 3) if self._rgb else None,
            action_dim=int(np.size(low)),
            action_low=tuple(float(x) for x in np.asarray(low).reshape(-1)),
            action_high=tuple(float(x) for x in np.asarray(high).reshape(-1)),
            max_episode_steps=int(max_steps),
            wrist_image_shape=(h, w, 3) if self._wrist_images is not None else None,
        )

    def _store(self, env_id: int, raw: dict[str, Any]) -> None:
        self._states[env_id] = np.concatenate(
            [np.asarray(raw[k], dtype=np.float32).reshape(-1) for k in self._state_keys]
        )
        if self._images is not None:
            self._images[env_id] = self._upright(raw, self._camera)
        if self._wrist_images is not None and self._wrist_camera is not None:
            self._wrist_images[env_id] = self._upright(raw, self._wrist_camera)

    def _upright(self, raw: dict[str, Any], camera: str) -> NDArray[Any]:
        image = np.ascontiguousarray(np.asarray(raw[f"{camera}_image"])[::-1])
        resized: NDArray[Any] = resize_images(torch.from_numpy(image[None]), self._image_size)[
            0
        ].numpy()
        return resized

    def _current_obs(self) -> Obs:
        obs: Obs = {"states": torch.from_numpy(self._states)}
        if self._images is not None:
            obs["main_images"] = torch.from_numpy(self._images)
        if self._wrist_images is not None:
            obs["wrist_images"] = torch.from_numpy(self._wrist_images)
        return obs

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        for env_id, seed in zip(env_ids, seeds, strict=True):
            env = self._envs[env_id]
            _reseed(env, int(seed))
            self._store(int(env_id), env.reset())
        rows = torch.from_numpy(env_ids)
        return {k: v[rows] for k, v in self._current_obs().items()}

    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        success = np.zeros(n, dtype=bool)
        acts = actions.numpy().astype(np.float64)
        for env_id in np.flatnonzero(active):
            env = self._envs[env_id]
            raw, reward, _, _ = env.step(acts[env_id])
            self._store(int(env_id), raw)
            rewards[env_id] = float(reward)
            success[env_id] = bool(env._check_success())
        return StepResult(
            obs=self._current_obs(),
            rewards=rewards,
            terminated=success.copy(),
            truncated=np.zeros(n, dtype=bool),
            success=success,
        )

    def _render_frame(self) -> NDArray[Any] | None:
        frame = self._envs[0].sim.render(
            camera_name=self._camera, width=_VIDEO_SIZE, height=_VIDEO_SIZE
        )
        return np.ascontiguousarray(np.asarray(frame, dtype=np.uint8)[::-1])

    def _default_fps(self) -> float:
        return self._control_freq

    def _close(self) -> None:
        for env in getattr(self, "_envs", []):
            env.close()
        self._envs = []
