"""Config of one vectorized env (``env.train`` / ``env.eval`` in the YAML tree).

Every error names the key, the value given and how to fix it; unknown keys are
errors (the models derive from :class:`rlinf.core.config.RLinfModel`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlinf.core.config import RLinfModel

__all__ = ["EnvConfig", "VideoConfig"]

ObsMode = Literal["state", "rgb"]
SimBackend = Literal["auto", "cpu", "gpu"]


class VideoConfig(RLinfModel):
    """Video recording of env 0 (``env.<split>.video``)."""

    enabled: bool = Field(False, description="Record env 0 and write one video per episode.")
    dir: Path = Field(Path("videos"), description="Folder the videos are written under.")
    fps: float | None = Field(
        None, gt=0, description="Frames per second; null takes the env's own rate (else 30)."
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class EnvConfig(RLinfModel):
    """What :func:`rlinf.embodied.envs.make_env` builds.

    Attributes:
        env_type: Registry key: ``gym``, ``maniskill``, ``robosuite``, ``lang_reach`` or a
            registered name.
        env_id: Simulator task: a gymnasium id (``CartPole-v1``), a ManiSkill task
            (``PickCube-v1``) or a robosuite environment (``Lift``).
        num_envs: Environments of one env worker rank (one pipeline stage).
        group_size: Consecutive envs that share a reset seed (a GRPO group).
        max_episode_steps: Truncation horizon in env sub-steps; null takes the task's default.
        auto_reset: Reset finished envs after the chunk they finished in.
        ignore_terminations: Never report terminations; episodes end by truncation only.
        obs_mode: ``state`` (``obs["states"]``) or ``rgb`` (``obs["main_images"]``, plus
            ``obs["states"]`` where the simulator has a proprioceptive state).
        image_size: ``[H, W]`` (or one int for square images) of ``main_images``; null takes
            the backend's default (ManiSkill 128, robosuite 84, gymnasium 84).
        sim_backend: ``auto`` (GPU if CUDA is available, for simulators that have one),
            ``cpu`` or ``gpu``.
        seed: Base seed; reset seeds derive from it, the env rank's seed offset and an
            epoch counter.
        reward_scale: Multiplies every reward (metrics report scaled rewards too).
        video: Video recording of env 0.
        env_kwargs: Extra keyword arguments for the simulator's constructor.
        instruction: The task instruction a language-conditioned policy (a VLA) reads;
            null takes the task's own where the backend defines one (ManiSkill and
            robosuite tasks, see ``default_instructions``), else the env has none.
            Envs that draw their own instructions (``lang_reach``) reject it.
    """

    env_type: str = Field(
        ..., min_length=1, description="gym, maniskill, robosuite, lang_reach, ..."
    )
    env_id: str = Field(..., min_length=1, description="Task id inside the simulator.")
    num_envs: int = Field(1, ge=1, description="Envs per env worker rank (per stage).")
    group_size: int = Field(1, ge=1, description="Consecutive envs sharing a reset seed.")
    max_episode_steps: int | None = Field(
        None, ge=1, description="Truncation horizon in sub-steps; null: the task's default."
    )
    auto_reset: bool = Field(False, description="Reset finished envs after each chunk.")
    ignore_terminations: bool = Field(False, description="End episodes only by truncation.")
    obs_mode: ObsMode = Field("state", description="state or rgb.")
    image_size: tuple[int, int] | None = Field(
        None, description="[H, W] of main_images (an int means square); null: backend default."
    )
    sim_backend: SimBackend = Field("auto", description="auto, cpu or gpu.")
    seed: int = Field(0, ge=0, description="Base seed of the reset seeds.")
    reward_scale: float = Field(1.0, description="Multiplies every reward.")
    video: VideoConfig = Field(default_factory=VideoConfig)  # type: ignore[arg-type]
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra simulator constructor arguments."
    )
    instruction: str | None = Field(
        None, min_length=1, description="Task instruction for VLAs; null: the task's own."
    )

    @field_validator("image_size", mode="before")
    @classmethod
    def _square_from_int(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @field_validator("image_size")
    @classmethod
    def _positive_image_size(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and min(value) < 1:
            raise ValueError(
                f"image_size={list(value)} must be positive [H, W], e.g. [84, 84] "
                "(or null for the backend's default)"
            )
        return value

    @field_validator("reward_scale")
    @classmethod
    def _finite_scale(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward_scale={value} must be a finite number, e.g. 1.0")
        return value

    @model_validator(mode="after")
    def _check_groups(self) -> EnvConfig:
        n, g = self.num_envs, self.group_size
        if n % g != 0:
            lower = (n // g) * g
            fixes = [f"num_envs={m}" for m in (lower, lower + g) if m > 0]
            divs = ", ".join(str(d) for d in _divisors(n))
            raise ValueError(
                f"num_envs={n} is not divisible by group_size={g}: each group of {g} "
                f"consecutive envs shares a reset seed; set {' or '.join(fixes)}, "
                f"or group_size to a divisor of {n} ({divs})"
            )
        return self

    @property
    def num_groups(self) -> int:
        """Reset-seed groups in one rank: ``num_envs // group_size``."""
        return self.num_envs // self.group_size
