"""ManiSkill 3 backend (``env_type: maniskill``): ``PickCube-v1``, ``PushCube-v1``, ...

With a GPU (``sim_backend`` ``auto`` or ``gpu`` and CUDA available) the ``n``
envs are one natively batched ManiSkill env on the PhysX GPU sim (unchecked:
the tests run the CPU sim only, where they also exercise the state copy). ManiSkill's
CPU sim holds one env per scene, so on the CPU the ``n`` envs are ``n``
single-env ManiSkill envs in this process.

Observations: ``obs_mode: state`` gives ManiSkill's flat state as ``states``;
``obs_mode: rgb`` gives ``main_images`` from the base camera (rendered at
``image_size``, default 128x128; ``env_kwargs.camera`` picks another camera)
plus ``states`` flattened from the ``agent`` and ``extra`` entries;
``env_kwargs.wrist_camera`` names a second camera for ``wrist_images`` (e.g.
``hand_camera`` with ``robot_uids: panda_wristcam``).

Success is ``info["success"]``; terminations are ManiSkill's (success or
failure). The episode limit is applied by
:class:`~rlinf.embodied.envs.base.VectorEnv`: the task's registered limit
unless ``max_episode_steps`` is set. Actions are clipped to the controller's
bounds; ``control_mode`` and other constructor arguments go in ``env_kwargs``.

Seeds: each reset seeds the episode. On the batched GPU env, envs of a group
share a start by copying the simulator state: the first env reset with a seed
samples the start, and every env reset with the same seed later (same group,
same episode index) is set to that state. Tasks that keep per-episode data
outside the simulator state are not covered by that copy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.embodied.envs.base import Obs, StepResult, VectorEnv, resize_images
from rlinf.embodied.envs.registry import import_simulator, register_env

__all__ = ["ManiSkillVectorEnv"]

_DEFAULT_IMAGE = (128, 128)
_VIDEO_SIZE = 256
_STATE_CACHE = 4  # cached start states per env


def _flatten_state(tree: Any, k: int) -> list[torch.Tensor]:
    """The leaves of a ManiSkill obs (sub)dict as [k, -1] float32 tensors, in dict order."""
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _flatten_state(value, k)]
    return [torch.as_tensor(tree).reshape(k, -1).to(torch.float32)]


def _index_state(tree: Any, rows: torch.Tensor) -> Any:
    if isinstance(tree, dict):
        return {key: _index_state(value, rows) for key, value in tree.items()}
    return tree[rows]


def _flat_numpy(value: Any) -> NDArray[Any]:
    """A reward or flag batch (tensor on any device, or array) as a flat numpy array."""
    if isinstance(value, torch.Tensor):
        return value.numpy(force=True).reshape(-1)  # one call: detach, to CPU, view
    return np.asarray(value).reshape(-1)


def _cat_states(trees: list[Any]) -> Any:
    if isinstance(trees[0], dict):
        return {key: _cat_states([t[key] for t in trees]) for key in trees[0]}
    return torch.cat(trees, dim=0)


class _Batch:
    """One ManiSkill env holding ``k`` parallel scenes (``k == 1`` on the CPU sim).

    Every call into the env after its construction runs under
    ``torch.inference_mode()``: ManiSkill's step is mostly small torch ops, and
    nothing the env returns needs autograd. ManiSkill keeps tensors it
    creates in a step (poses, controller targets); they become inference
    tensors, which may only be written in place inside inference mode, so no
    call may bypass this class. What the env returns is read (or copied) by
    the caller, never written in place.
    """

    def __init__(self, env: Any, k: int, share_by_state: bool) -> None:
        self.env = env
        self.k = k
        self.device = env.unwrapped.device
        self.share_by_state = share_by_state
        self.seeds = np.zeros(k, dtype=np.int64)
        self._cache: OrderedDict[int, Any] = OrderedDict()

    @torch.inference_mode()
    def reset(self, local_ids: NDArray[Any], seeds: NDArray[Any]) -> Any:
        """Resets scenes ``local_ids``; returns the raw obs of all ``k`` scenes."""
        self.seeds[local_ids] = seeds
        if not self.share_by_state:
            idx = torch.as_tensor(local_ids, device=self.device)
            seed = [int(s) for s in self.seeds] if self.k > 1 else int(seeds[0])
            obs, _ = self.env.reset(seed=seed, options={"env_idx": idx})
            return obs
        # Sample a start for each seed not seen yet (first env with that seed), cache
        # its simulator state, then set every env to the cached state of its seed.
        fresh: dict[int, int] = {}
        for env_id, seed in zip(local_ids, seeds, strict=True):
            if int(seed) not in self._cache and int(seed) not in fresh:
                fresh[int(seed)] = int(env_id)
        if fresh:
            sample_ids = torch.as_tensor(list(fresh.values()), device=self.device)
            self.env.reset(seed=[int(s) for s in self.seeds], options={"env_idx": sample_ids})
            state = self.env.unwrapped.get_state_dict()
            for j, seed in enumerate(fresh):
                self._cache[seed] = _index_state(state, sample_ids[j : j + 1])
        while len(self._cache) > _STATE_CACHE * self.k:
            self._cache.popitem(last=False)
        starts = _cat_states([self._cache[int(s)] for s in seeds])
        idx = torch.as_tensor(local_ids, device=self.device)
        obs, _ = self.env.reset(
            options={"env_idx": idx, "reset_to_env_states": {"env_states": starts}}
        )
        return obs

    @torch.inference_mode()
    def step(self, actions: torch.Tensor) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        return self.env.step(actions.to(self.device))  # type: ignore[no-any-return]

    @torch.inference_mode()
    def first_obs(self) -> Any:
        """The raw obs the env was built with (or of a reset with seed 0, if it kept none)."""
        raw = getattr(self.env.unwrapped, "_init_raw_obs", None)
        if raw is None:
            raw, _ = self.env.reset(seed=0)
        return raw

    @torch.inference_mode()
    def render(self) -> Any:
        return self.env.render()

    @torch.inference_mode()
    def close(self) -> None:
        self.env.close()


@register_env("maniskill")
class ManiSkillVectorEnv(VectorEnv):
    """ManiSkill 3 tasks, batched on the GPU sim or one env per scene on the CPU sim."""

    default_instructions: ClassVar[dict[str, str]] = {
        "PickCube-v1": "pick up the cube and move it to the goal",
        "PushCube-v1": "push the cube to the goal",
    }

    def _setup(self) -> EnvSpec:
        cfg = self.cfg
        import_simulator("mani_skill.envs", "maniskill", "maniskill")
        from mani_skill.utils import assets  # type: ignore[import-untyped]
        from mani_skill.utils.registration import REGISTERED_ENVS  # type: ignore[import-untyped]

        if cfg.env_id not in REGISTERED_ENVS:
            raise ValueError(
                f"env_id {cfg.env_id!r} is not a registered ManiSkill task; "
                "e.g. PickCube-v1, PushCube-v1"
            )
        ms_spec = REGISTERED_ENVS[cfg.env_id]
        missing = [
            a
            for a in ms_spec.asset_download_ids or []
            if a not in assets.DATA_GROUPS and not assets.is_data_source_downloaded(a)
        ]
        if missing:
            raise RuntimeError(
                f"ManiSkill task {cfg.env_id!r} needs assets that are not downloaded: "
                f"{', '.join(missing)}; fetch them where a network is available with "
                "`python -m mani_skill.utils.download_asset <id>` and copy ~/.maniskill over"
            )
        max_steps = cfg.max_episode_steps or ms_spec.max_episode_steps
        if not max_steps:
            raise ValueError(
                f"ManiSkill task {cfg.env_id!r} has no default episode limit; "
                "set env.max_episode_steps"
            )

        self._gpu = self._use_gpu()
        self._rgb = cfg.obs_mode == "rgb"
        self._image_size = cfg.image_size or _DEFAULT_IMAGE
        renders = self._rgb or cfg.video.enabled
        render_backend = ("gpu" if self._gpu else "cpu") if renders else "none"
        kwargs: dict[str, Any] = {
            "obs_mode": cfg.obs_mode,
            "sim_backend": "physx_cuda" if self._gpu else "physx_cpu",
            "render_backend": render_backend,
        }
        if self._rgb:
            h, w = self._image_size
            kwargs["sensor_configs"] = {"width": w, "height": h}
        user = dict(cfg.env_kwargs)
        if "sensor_configs" in user and "sensor_configs" in kwargs:
            kwargs["sensor_configs"] = {**kwargs["sensor_configs"], **user.pop("sensor_configs")}
        self._camera = str(user.pop("camera", "base_camera"))
        wrist = user.pop("wrist_camera", None)
        self._wrist_camera = None if wrist is None else str(wrist)
        if self._wrist_camera is not None and not self._rgb:
            raise ValueError(
                f"env_kwargs.wrist_camera={self._wrist_camera!r} needs obs_mode: rgb (got "
                f"{cfg.obs_mode!r})"
            )
        kwargs.update(user)

        def build(k: int, video: bool) -> Any:
            extra: dict[str, Any] = {"num_envs": k}
            if video:
                extra["render_mode"] = "rgb_array"
                extra.setdefault(
                    "human_render_camera_configs", {"width": _VIDEO_SIZE, "height": _VIDEO_SIZE}
                )
            return ms_spec.make(**{**kwargs, **extra})

        self._batches: list[_Batch] = []
        try:
            if self._gpu:
                env = build(self.num_envs, cfg.video.enabled)
                self._batches.append(_Batch(env, self.num_envs, share_by_state=True))
            else:
                for i in range(self.num_envs):
                    env = build(1, cfg.video.enabled and i == 0)
                    self._batches.append(_Batch(env, 1, share_by_state=False))
        except Exception:
            self._close()
            raise
        self._k = self._batches[0].k
        self.defines_success = True
        self._control_freq = float(getattr(self._batches[0].env.unwrapped, "control_freq", 20))

        act_space = self._batches[0].env.unwrapped.single_action_space
        raw = self._batches[0].first_obs()
        first = self._convert(raw, self._k)
        self._last: Obs = {
            k: v[:1].repeat(self.num_envs, *([1] * (v.dim() - 1))) for k, v in first.items()
        }
        images, wrist = first.get("main_images"), first.get("wrist_images")
        return EnvSpec(
            state_dim=int(first["states"].shape[1]) if "states" in first else None,
            image_shape=tuple(images.shape[1:]) if images is not None else None,  # type: ignore[arg-type]
            action_dim=int(np.prod(act_space.shape)),
            action_low=tuple(float(x) for x in np.asarray(act_space.low).reshape(-1)),
            action_high=tuple(float(x) for x in np.asarray(act_space.high).reshape(-1)),
            max_episode_steps=int(max_steps),
            wrist_image_shape=tuple(wrist.shape[1:]) if wrist is not None else None,  # type: ignore[arg-type]
        )

    def _use_gpu(self) -> bool:
        backend = self.cfg.sim_backend
        if backend == "cpu":
            return False
        if torch.cuda.is_available():
            return True
        if backend == "gpu":
            raise RuntimeError(
                "sim_backend='gpu' but CUDA is not available (torch.cuda.is_available() is "
                "False); set sim_backend to 'auto' or 'cpu'"
            )
        return False

    def _convert(self, raw: Any, k: int) -> Obs:
        """ManiSkill's obs of ``k`` scenes as our obs dict (CPU tensors)."""
        if not isinstance(raw, dict):
            states = torch.as_tensor(raw).reshape(k, -1)
            if states.dtype != torch.float32:  # (each no-op call still costs, per step)
                states = states.float()
            return {"states": states if states.is_cpu else states.cpu()}
        parts = [
            p.cpu() for key in ("agent", "extra") if key in raw for p in _flatten_state(raw[key], k)
        ]
        obs: Obs = {}
        if parts:
            obs["states"] = torch.cat(parts, dim=1)
        if self._rgb:
            sensors = raw.get("sensor_data", {})
            obs["main_images"] = self._camera_images(sensors, self._camera, "camera")
            if self._wrist_camera is not None:
                obs["wrist_images"] = self._camera_images(
                    sensors, self._wrist_camera, "wrist_camera"
                )
        return obs

    def _camera_images(self, sensors: dict[str, Any], camera: str, key: str) -> torch.Tensor:
        if camera not in sensors or "rgb" not in sensors[camera]:
            raise RuntimeError(
                f"ManiSkill task {self.cfg.env_id!r} has no rgb image from camera {camera!r} "
                f"(cameras: {sorted(sensors)}); set env_kwargs.{key}"
            )
        images = torch.as_tensor(sensors[camera]["rgb"]).cpu().to(torch.uint8)
        return resize_images(images[..., :3], self._image_size)

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        for b, batch in enumerate(self._batches):
            lo = b * self._k
            mask = (env_ids >= lo) & (env_ids < lo + self._k)
            if not mask.any():
                continue
            raw = batch.reset(env_ids[mask] - lo, seeds[mask])
            obs = self._convert(raw, self._k)
            for key, value in obs.items():
                self._last[key][lo : lo + self._k] = value
        rows = torch.from_numpy(env_ids)
        return {key: value[rows] for key, value in self._last.items()}

    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        if len(self._batches) == 1:  # every env in one batch: the GPU sim, or one CPU env
            return self._step_one_batch(actions)
        return self._step_batches(actions, active)

    def _step_batches(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        """Steps each batch holding an active env; gathers their rows into ``n``-row outputs."""
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        for b, batch in enumerate(self._batches):
            lo, hi = b * self._k, (b + 1) * self._k
            if not active[lo:hi].any():
                continue  # only possible for one-scene CPU batches
            raw, reward, term, trunc, info = batch.step(actions[lo:hi])
            obs = self._convert(raw, self._k)
            for key, value in obs.items():
                self._last[key][lo:hi] = value
            rewards[lo:hi] = _flat_numpy(reward)
            terminated[lo:hi] = _flat_numpy(term)
            truncated[lo:hi] = _flat_numpy(trunc)
            if "success" in info:
                success[lo:hi] = _flat_numpy(info["success"])
        return StepResult(
            obs=self._last,
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            success=success,
        )

    def _step_one_batch(self, actions: torch.Tensor) -> StepResult:
        """:meth:`_step_batches` when one batch holds every env: its outputs as they come.

        The same values (tested), without gathering rows into preallocated arrays;
        the caller steps only if some env is active, and a batch steps as a whole.
        The obs may be views of the simulator's tensors: ``chunk_step`` copies them.
        """
        raw, reward, term, trunc, info = self._batches[0].step(actions)
        success = info.get("success")
        return StepResult(
            obs=self._convert(raw, self._k),
            rewards=_flat_numpy(reward),
            terminated=_flat_numpy(term),
            truncated=_flat_numpy(trunc),
            success=np.zeros(self.num_envs, dtype=bool)
            if success is None
            else _flat_numpy(success),
        )

    def _render_frame(self) -> NDArray[Any] | None:
        frame = self._batches[0].render()
        if frame is None:
            return None
        return (
            torch.as_tensor(frame).reshape(-1, *frame.shape[-3:])[0].cpu().to(torch.uint8).numpy()
        )

    def _default_fps(self) -> float:
        return self._control_freq

    def _close(self) -> None:
        for batch in getattr(self, "_batches", []):
            batch.close()
        self._batches = []
