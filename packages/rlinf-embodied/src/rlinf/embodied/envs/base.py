"""The vectorized env interface: full reset, chunk steps, auto-reset, seeds and metrics.

A backend (gymnasium, ManiSkill, robosuite, ...) subclasses :class:`VectorEnv`
and implements four hooks: :meth:`VectorEnv._setup` (build the simulators,
return the :class:`EnvSpec`), :meth:`VectorEnv._reset_envs` (seeded reset of
some envs), :meth:`VectorEnv._step_envs` (one sub-step) and
:meth:`VectorEnv._close`. Everything else lives here, once for every backend.

Semantics of :meth:`VectorEnv.chunk_step` (``C`` sub-steps per call):

* Sub-steps run without any reset inside the chunk. An env whose episode ends
  at sub-step ``k`` is *held* for the rest of the chunk: it is not stepped any
  more, its observation stays the final one and its rewards are 0 (the
  reference kept stepping it and leaked the post-episode rewards into the
  return; that is fixed here). Which sub-steps advanced a live episode is in
  :attr:`VectorEnv.last_alive_mask`.
* Termination and truncation flags are reported in the chunk's last column
  only (the other columns are False), which is where the auto-reset, the
  ``final_obs`` and a truncation bootstrap happen.
* With ``auto_reset`` the finished envs are reset after the chunk: ``obs``
  holds their new first observation and ``final_obs`` the last observation of
  the finished episode (rows of other envs are copies of ``obs``). Without
  ``auto_reset`` a finished env stays held until the next :meth:`reset`, and
  its flags are repeated in the last column of every later chunk.
* ``ignore_terminations``: terminations are never reported, episodes end by
  truncation (``max_episode_steps``). Simulators that can go on after a
  termination (ManiSkill, robosuite: success does not stop the physics) keep
  being stepped; gymnasium envs, whose API forbids stepping after a
  termination, are held until the truncation.
* Metrics: one row per episode that finished in the chunk (auto-reset or not),
  each finished episode reported exactly once.

Seeds: ``num_envs / group_size`` group seeds are drawn from ``(seed,
seed_offset, epoch)``; consecutive ``group_size`` envs share one. A full
:meth:`VectorEnv.reset` starts episode 0 of every env from its group seed, so
repeated resets replay the same episodes (deterministic eval) until
:meth:`VectorEnv.update_reset_seeds` advances the epoch (new starts; call it
after every training epoch). The ``k``-th auto-reset episode of an env is
seeded from ``(group seed, k)``, so envs of a group keep sharing starts.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.closing import ClosesOnExit
from rlinf.core.protocols.embodied import EnvOutput, EnvSpec
from rlinf.embodied.envs.config import EnvConfig
from rlinf.embodied.envs.video import VideoRecorder

__all__ = ["METRIC_KEYS", "Obs", "StepResult", "VectorEnv", "resize_images"]

Obs = dict[str, torch.Tensor]
"""``states`` [n, d] float32 and/or ``main_images`` [n, H, W, 3] uint8, on the CPU."""

METRIC_KEYS = ("return", "episode_len", "reward", "success_once", "success_at_end")
"""Episode metric names; the ``success_*`` ones only for envs that define success."""

_SEED_MOD = 2**31


@dataclass
class StepResult:
    """What a backend returns for one sub-step of all ``n`` envs.

    Rows of envs that were not stepped (``active`` False) are ignored, so a
    backend may leave anything there.

    Attributes:
        obs: Observation dict of [n, ...] CPU tensors.
        rewards: [n] float rewards (unscaled).
        terminated: [n] bool: the episode ended in a terminal state.
        truncated: [n] bool: the simulator itself truncated (usually all False; the
            ``max_episode_steps`` horizon is applied by :class:`VectorEnv`).
        success: [n] bool task success, or None if the env has no notion of success.
    """

    obs: Obs
    rewards: NDArray[Any]
    terminated: NDArray[Any]
    truncated: NDArray[Any]
    success: NDArray[Any] | None = None


_NO_EPISODES = torch.zeros(0)
"""The metric of no finished episode (shared: nothing writes into an empty tensor)."""


class VectorEnv(abc.ABC, ClosesOnExit):
    """``num_envs`` environments stepped together in action chunks.

    Args:
        cfg: The env config.
        num_envs: Envs to build (default ``cfg.num_envs``); a multiple of ``group_size``.
        seed_offset: Makes this instance's seeds differ from other instances' with the
            same config (``rank * stages + stage``).
        stage_id: Pipeline stage written into every :class:`EnvOutput`.

    Attributes:
        num_envs: ``n``.
        group_size: Consecutive envs that share reset seeds.
        spec: Observation and action description for the policy.
        auto_reset: Whether finished envs are reset after each chunk.
        ignore_terminations: Whether terminations are suppressed.
        last_alive_mask: [n, C] bool of the last chunk: True where the sub-step
            advanced a live episode (False after the episode's end).
    """

    env_type: ClassVar[str] = ""
    can_continue_after_termination: ClassVar[bool] = True
    """Whether the simulator may be stepped after it reported a termination."""
    default_instructions: ClassVar[dict[str, str]] = {}
    """``env_id`` -> the instruction used when ``instruction`` is null."""

    def __init__(
        self,
        cfg: EnvConfig,
        *,
        num_envs: int | None = None,
        seed_offset: int = 0,
        stage_id: int = 0,
    ) -> None:
        n = cfg.num_envs if num_envs is None else int(num_envs)
        if n < 1 or n % cfg.group_size != 0:
            raise ValueError(
                f"num_envs={n} must be a positive multiple of group_size={cfg.group_size} "
                "(envs of one group share a reset seed); pass another num_envs or change "
                "env.group_size"
            )
        if seed_offset < 0:
            raise ValueError(f"seed_offset={seed_offset} must be >= 0 (use rank * stages + stage)")
        self.cfg = cfg
        self.num_envs = n
        self.group_size = cfg.group_size
        self.auto_reset = cfg.auto_reset
        self.ignore_terminations = cfg.ignore_terminations
        self.seed_offset = seed_offset
        self.stage_id = stage_id
        self.reward_scale = float(cfg.reward_scale)
        self.defines_success = False
        """Whether the backend reports success; set by the backend (or on its first report)."""

        self._seed_root = cfg.seed
        self._epoch = 0
        self._group_seeds = self._draw_group_seeds()
        self._episode_index = np.zeros(n, dtype=np.int64)
        self._elapsed = np.zeros(n, dtype=np.int64)
        self._return = np.zeros(n, dtype=np.float64)
        self._success_once = np.zeros(n, dtype=bool)
        self._success_now = np.zeros(n, dtype=bool)
        self._done = np.zeros(n, dtype=bool)
        self._frozen = np.zeros(n, dtype=bool)
        self._final_term = np.zeros(n, dtype=bool)
        self._final_trunc = np.zeros(n, dtype=bool)
        self._vec_obs: Obs | None = None
        self._action_bounds: tuple[NDArray[Any], NDArray[Any]] | None = None
        self._closed = False
        self.last_alive_mask = torch.zeros((n, 0), dtype=torch.bool)

        self._task_ids: torch.Tensor | None = None  # set when one instruction serves all envs
        self.spec: EnvSpec = self._with_instruction(self._setup())
        if self.spec.max_episode_steps < 1:
            raise ValueError(
                f"{type(self).__name__} resolved max_episode_steps="
                f"{self.spec.max_episode_steps}; set env.max_episode_steps to a positive int"
            )
        self._video: VideoRecorder | None = None
        if cfg.video.enabled:
            fps = cfg.video.fps or self._default_fps()
            name = f"{self.env_type}_{cfg.env_id}_seed{cfg.seed}_offset{seed_offset}"
            self._video = VideoRecorder(cfg.video.dir / name.replace("/", "_"), fps)

    def _with_instruction(self, spec: EnvSpec) -> EnvSpec:
        """Adds the config's (or the task's) one instruction to a spec that has none."""
        instruction = self.cfg.instruction or self.default_instructions.get(self.cfg.env_id)
        if spec.instructions is not None:
            if self.cfg.instruction is not None:
                raise ValueError(
                    f"env.instruction={self.cfg.instruction!r}: env_type "
                    f"{self.env_type!r} draws its own instructions per episode; remove the key"
                )
            return spec
        if instruction is None:
            return spec
        self._task_ids = torch.zeros(self.num_envs, dtype=torch.int64)
        return replace(spec, instructions=(instruction,))

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _setup(self) -> EnvSpec:
        """Builds the simulators for ``self.num_envs`` envs and describes them."""

    @abc.abstractmethod
    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        """Resets the envs ``env_ids`` with one seed each.

        Returns:
            Their first observations, rows in the order of ``env_ids``.
        """

    @abc.abstractmethod
    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        """Steps (at least) the envs where ``active`` is True by one sub-step.

        Args:
            actions: [n, A] float32 (continuous, clipped) or int64 (discrete) CPU tensor.
            active: [n] bool; inactive envs must not be stepped unless the simulator
                can only step all envs together (then their results are ignored).
        """

    @abc.abstractmethod
    def _close(self) -> None:
        """Releases the simulators."""

    def _render_frame(self) -> NDArray[Any] | None:
        """An [H, W, 3] uint8 frame of env 0 for videos, or None if it cannot render."""
        return None

    def _default_fps(self) -> float:
        """Video frame rate when ``video.fps`` is null."""
        return 30.0

    def _refuse_gpu(self, env_type: str, why: str) -> None:
        """Raises for ``sim_backend: gpu`` in a CPU-only simulator (``why`` says where it runs)."""
        if self.cfg.sim_backend == "gpu":
            raise ValueError(
                f"sim_backend='gpu' is not available for env_type {env_type!r} ({why}); "
                "set sim_backend to 'auto' or 'cpu'"
            )

    # ------------------------------------------------------------------ seeds

    @property
    def num_groups(self) -> int:
        """Groups of envs that share reset seeds: ``num_envs // group_size``."""
        return self.num_envs // self.group_size

    @property
    def group_ids(self) -> torch.Tensor:
        """[n] int64: the group (within this env instance) of each env."""
        return torch.arange(self.num_envs, dtype=torch.int64) // self.group_size

    @property
    def reset_seeds(self) -> NDArray[Any]:
        """[n] seeds that the next full :meth:`reset` uses (group seeds repeated)."""
        return np.repeat(self._group_seeds, self.group_size)

    def _draw_group_seeds(self) -> NDArray[Any]:
        seq = np.random.SeedSequence([self._seed_root, self.seed_offset, self._epoch])
        return seq.generate_state(self.num_groups, dtype=np.uint32).astype(np.int64) % _SEED_MOD

    def _env_seeds(self, env_ids: NDArray[Any]) -> NDArray[Any]:
        seeds: NDArray[Any] = self._group_seeds[env_ids // self.group_size].copy()
        for i, env in enumerate(env_ids):
            k = int(self._episode_index[env])
            if k > 0:
                seq = np.random.SeedSequence([int(seeds[i]), k])
                seeds[i] = int(seq.generate_state(1, dtype=np.uint32)[0]) % _SEED_MOD
        return seeds

    def update_reset_seeds(self) -> None:
        """Draws new group seeds (the next epoch's starts); takes effect at the next reset."""
        self._epoch += 1
        self._group_seeds = self._draw_group_seeds()

    # ------------------------------------------------------------------ reset / step

    def reset(self, seed: int | None = None) -> EnvOutput:
        """Resets every env to the start of a new episode.

        Args:
            seed: If given, restarts the seed stream from this base seed (epoch 0), so
                two resets with the same seed produce identical episodes. If None, the
                current group seeds are used (see :meth:`update_reset_seeds`).

        Returns:
            The first observations; flags are [n, 1] all False and ``rewards`` is None.
        """
        self._check_open()
        if seed is not None:
            if seed < 0:
                raise ValueError(f"reset(seed={seed}): the seed must be >= 0")
            self._seed_root = int(seed)
            self._epoch = 0
            self._group_seeds = self._draw_group_seeds()
        self._flush_unfinished_video()
        env_ids = np.arange(self.num_envs)
        self._episode_index[:] = 0
        obs = self._checked_obs(self._reset_envs(env_ids, self._env_seeds(env_ids)))
        self._clear_episodes(env_ids)
        self._vec_obs = obs
        self._record_frame(obs)
        flags = torch.zeros((self.num_envs, 1), dtype=torch.bool)
        return EnvOutput(
            obs=obs, terminations=flags, truncations=flags.clone(), stage_id=self.stage_id
        )

    def chunk_step(self, actions: torch.Tensor) -> tuple[EnvOutput, dict[str, torch.Tensor]]:
        """Runs one action chunk of ``C`` sub-steps (see the module docstring).

        Args:
            actions: [n, C, A]. Discrete envs take float indices in ``[0, num_actions)``
                with ``A == 1``; continuous actions are clipped to the action bounds.

        Returns:
            The :class:`EnvOutput` after the chunk (rewards [n, C], flags [n, C] set in
            the last column) and the metrics of the episodes that finished in it: a dict
            of 1-D float32 tensors with one entry per finished episode (``return``,
            ``episode_len``, ``reward`` = return / length, and ``success_once`` /
            ``success_at_end`` if the env defines success).
        """
        self._check_open()
        if self._vec_obs is None:
            raise RuntimeError("chunk_step() before reset(): call env.reset() first")
        acts = self._prepare_actions(actions)
        n, num_sub = self.num_envs, int(acts.shape[1])
        max_steps = self.spec.max_episode_steps
        rewards = np.zeros((n, num_sub), dtype=np.float32)
        alive = np.zeros((n, num_sub), dtype=bool)
        # The entries are the last output's tensors until a sub-step writes them:
        # handed-out tensors are never written in place (copy on first write).
        obs = dict(self._vec_obs)
        owned: set[str] = set()
        finished: list[tuple[int, float, int, bool, bool]] = []
        env0_was_done = bool(self._done[0])

        # (np.count_nonzero instead of .any()/.all(): several times cheaper on a few envs)
        for c in range(num_sub):
            if np.count_nonzero(self._done) == n:
                break
            live = ~self._done
            stepping = live & ~self._frozen if np.count_nonzero(self._frozen) else live
            term, trunc = self._sub_step(acts[:, c], stepping, rewards[:, c], obs, owned)
            alive[:, c] = live  # (numpy's mask assignment is ~10x slower)
            self._elapsed += live  # (+1 where live, without a masked gather)
            if self.ignore_terminations:
                if not self.can_continue_after_termination:
                    self._frozen |= term
                term[:] = False
            trunc = live & (trunc | (self._elapsed >= max_steps))
            ended = term | trunc
            if np.count_nonzero(ended):
                finished.extend(self._end_episodes(ended, term, trunc))
            if stepping[0]:
                self._record_frame(obs)

        terminations = np.zeros((n, num_sub), dtype=bool)
        truncations = np.zeros((n, num_sub), dtype=bool)
        terminations[:, -1] = self._final_term
        truncations[:, -1] = self._final_trunc
        if self._video is not None and self._done[0] and not env0_was_done:
            self._video.flush()

        final_obs: Obs | None = None
        if self.auto_reset and np.count_nonzero(self._done):
            final_obs = self._reset_done_envs(obs)

        self._vec_obs = obs
        self.last_alive_mask = torch.from_numpy(alive)
        out = EnvOutput(
            obs=obs,
            terminations=torch.from_numpy(terminations),
            truncations=torch.from_numpy(truncations),
            rewards=torch.from_numpy(rewards),
            final_obs=final_obs,
            stage_id=self.stage_id,
        )
        return out, self._metrics(finished)

    def _sub_step(
        self,
        actions: torch.Tensor,
        stepping: NDArray[Any],
        rewards: NDArray[Any],
        obs: Obs,
        owned: set[str],
    ) -> tuple[NDArray[Any], NDArray[Any]]:
        """Steps the envs in ``stepping`` once and records what they return.

        Writes their rewards into ``rewards`` (a column view of the chunk's
        rewards), their observations into ``obs`` (copy on first write, see
        :meth:`_write_obs`) and their success into the episode state.

        Returns:
            ``(terminated, truncated)`` as the envs report them: [n] bools,
            false for the envs that did not step.
        """
        n = self.num_envs
        term = np.zeros(n, dtype=bool)
        trunc = np.zeros(n, dtype=bool)
        stepped = np.count_nonzero(stepping)
        if not stepped:
            return term, trunc
        res = self._step_envs(actions, stepping)
        # Every env stepping (the common case): whole-array slices, no gathers.
        idx: NDArray[Any] | slice = slice(None) if stepped == n else np.flatnonzero(stepping)
        r = np.asarray(res.rewards, dtype=np.float64)[idx] * self.reward_scale
        rewards[idx] = r
        self._return[idx] += r
        self._write_obs(obs, owned, res.obs, idx)
        if res.success is not None:
            self.defines_success = True
            success = np.asarray(res.success, dtype=bool)[idx]
            self._success_now[idx] = success
            self._success_once[idx] |= success
        term[idx] = np.asarray(res.terminated, dtype=bool)[idx]
        trunc[idx] = np.asarray(res.truncated, dtype=bool)[idx]
        return term, trunc

    def _end_episodes(
        self, ended: NDArray[Any], term: NDArray[Any], trunc: NDArray[Any]
    ) -> list[tuple[int, float, int, bool, bool]]:
        """Marks the ``ended`` envs done; returns a row for :meth:`_metrics` per episode."""
        self._done |= ended
        self._final_term |= term
        self._final_trunc |= trunc
        return [
            (
                int(env),
                float(self._return[env]),
                int(self._elapsed[env]),
                bool(self._success_once[env]),
                bool(self._success_now[env]),
            )
            for env in np.flatnonzero(ended)
        ]

    def _reset_done_envs(self, obs: Obs) -> Obs:
        """Auto-reset: starts new episodes in the done envs, their rows of ``obs`` replaced.

        Returns:
            The observations before the reset (the done envs' final observations);
            ``obs`` gets copies with the reset rows written in.
        """
        final_obs = dict(obs)  # never written: the reset rows go into copies
        env_ids = np.flatnonzero(self._done)
        self._episode_index[env_ids] += 1
        new = self._checked_obs(self._reset_envs(env_ids, self._env_seeds(env_ids)))
        rows = torch.from_numpy(env_ids)
        for key, value in final_obs.items():
            obs[key] = value.clone()
            obs[key][rows] = new[key]
        self._clear_episodes(env_ids)
        if env_ids[0] == 0:  # env 0 starts a new episode (and a new video)
            self._record_frame(obs)
        return final_obs

    def running_metrics(self) -> dict[str, torch.Tensor]:
        """Metrics of every env's current (or held, finished) episode: [n] float32 each.

        Useful without ``auto_reset``, where an epoch can end with unfinished episodes.
        """
        rows = [
            (
                i,
                float(self._return[i]),
                int(self._elapsed[i]),
                bool(self._success_once[i]),
                bool(self._success_now[i]),
            )
            for i in range(self.num_envs)
        ]
        return self._metrics(rows)

    def flush_video(self) -> None:
        """Writes the frames recorded so far (e.g. at the end of a rollout epoch)."""
        if self._video is not None:
            self._video.flush()

    def _flush_unfinished_video(self) -> None:
        # An episode of env 0 cut short by a full reset or close(); a lone start frame
        # (no step taken since) is dropped rather than written as a one-frame video.
        if self._video is not None:
            if self._video.num_frames > 1:
                self._video.flush()
            else:
                self._video.clear()

    @property
    def video_files(self) -> list[str]:
        """Paths of the videos written so far."""
        return [] if self._video is None else [str(p) for p in self._video.written]

    def close(self) -> None:
        """Writes pending video frames and releases the simulators (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_unfinished_video()
        finally:
            self._close()

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def _prepare_actions(self, actions: torch.Tensor) -> torch.Tensor:
        a = torch.as_tensor(actions)
        n, dim = self.num_envs, self.spec.action_dim
        if a.dim() != 3 or a.shape[0] != n or a.shape[2] != dim or a.shape[1] < 1:
            raise ValueError(
                f"actions must be [num_envs={n}, C, action_dim={dim}] with C >= 1, "
                f"got shape {tuple(a.shape)}"
            )
        # numpy for the checks: on a few envs each torch op costs several times more.
        if a.dtype == torch.float32:
            arr = a.numpy(force=True)  # (one call: detach, to the CPU; a view when it can)
        else:
            arr = a.detach().to("cpu", torch.float32).numpy()
        # One reduction: a float64 sum of float32 values is finite iff every value is.
        if not math.isfinite(np.add.reduce(arr, axis=None, dtype=np.float64)):
            raise ValueError("actions contain NaN or inf; check the policy's outputs")
        if self.spec.num_actions is not None:
            idx = np.rint(arr).astype(np.int64)
            if ((idx < 0) | (idx >= self.spec.num_actions)).any():
                raise ValueError(
                    f"discrete actions must be indices in [0, {self.spec.num_actions}), got "
                    f"values in [{int(idx.min())}, {int(idx.max())}]"
                )
            return torch.from_numpy(idx)
        if self.spec.action_low is not None and self.spec.action_high is not None:
            if self._action_bounds is None:  # built once: this runs every chunk step
                self._action_bounds = (
                    np.asarray(self.spec.action_low, dtype=np.float32),
                    np.asarray(self.spec.action_high, dtype=np.float32),
                )
            low, high = self._action_bounds
            arr = np.minimum(np.maximum(arr, low), high)  # np.clip costs ~10x more here
        return torch.from_numpy(arr)

    def _write_obs(
        self, obs: Obs, owned: set[str], stepped: Obs, idx: NDArray[Any] | slice
    ) -> None:
        """Writes the stepped envs' rows of ``stepped`` into ``obs`` (copy on first write).

        Args:
            obs: The chunk's observation entries; replaced by copies before any write.
            owned: Keys of ``obs`` already copied in this chunk (updated).
            stepped: The backend's observations of this sub-step.
            idx: The stepped rows (a full slice when every env stepped).
        """
        for key, value in obs.items():
            if key == "task_ids" and self._task_ids is not None:
                continue  # constant: not reported by the backend
            if isinstance(idx, slice):  # every row is new: one copy, nothing to clone
                obs[key] = stepped[key].to(
                    value.dtype, memory_format=torch.contiguous_format, copy=True
                )
            else:
                if key not in owned:
                    value = obs[key] = value.clone()
                rows = torch.from_numpy(idx)
                value[rows] = stepped[key][rows].to(value.dtype)
            owned.add(key)

    def _checked_obs(self, obs: Obs) -> Obs:
        if self._task_ids is not None:  # one instruction for every env
            rows = len(next(iter(obs.values())))
            obs = {**obs, "task_ids": self._task_ids[:rows]}
        out: Obs = {}
        for key, value in obs.items():
            t = torch.as_tensor(value).detach().cpu()
            if key in ("main_images", "wrist_images"):
                t = t.to(torch.uint8)
            elif t.is_floating_point() or t.dtype == torch.bool or key == "states":
                t = t.to(torch.float32)
            out[key] = t.clone(memory_format=torch.contiguous_format)  # never a backend buffer
        return out

    def _clear_episodes(self, env_ids: NDArray[Any]) -> None:
        self._elapsed[env_ids] = 0
        self._return[env_ids] = 0.0
        self._success_once[env_ids] = False
        self._success_now[env_ids] = False
        self._done[env_ids] = False
        self._frozen[env_ids] = False
        self._final_term[env_ids] = False
        self._final_trunc[env_ids] = False

    def _record_frame(self, obs: Obs) -> None:
        if self._video is None:
            return
        if "main_images" in obs:
            frame: NDArray[Any] | None = obs["main_images"][0].numpy()
        else:
            frame = self._render_frame()
        if frame is not None:
            self._video.add_frame(frame)

    def _metrics(self, rows: list[tuple[int, float, int, bool, bool]]) -> dict[str, torch.Tensor]:
        if not rows:  # most chunk steps end no episode
            keys = ["return", "episode_len", "reward"]
            keys += ["success_once", "success_at_end"] if self.defines_success else []
            return dict.fromkeys(keys, _NO_EPISODES)
        returns = torch.tensor([r[1] for r in rows], dtype=torch.float32)
        lengths = torch.tensor([r[2] for r in rows], dtype=torch.float32)
        out = {
            "return": returns,
            "episode_len": lengths,
            "reward": returns / lengths.clamp(min=1.0),
        }
        if self.defines_success:
            out["success_once"] = torch.tensor([r[3] for r in rows], dtype=torch.float32)
            out["success_at_end"] = torch.tensor([r[4] for r in rows], dtype=torch.float32)
        return out


def resize_images(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Resizes [n, H, W, 3] uint8 images to ``size`` (H, W) with antialiased bilinear filtering.

    Args:
        images: [n, H, W, 3] uint8 tensor.
        size: Target ``(H, W)``.

    Returns:
        [n, size[0], size[1], 3] uint8 tensor (the input itself if already that size).
    """
    if tuple(images.shape[1:3]) == tuple(size):
        return images
    x = images.permute(0, 3, 1, 2).to(torch.float32)
    x = torch.nn.functional.interpolate(
        x, size=size, mode="bilinear", align_corners=False, antialias=True
    )
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
