"""``lang_reach``: a built-in language-conditioned visual reaching task, vectorised in torch.

Why it exists: VLA policies need an instruction, an image and a success signal,
and a learning test on 2 CPU cores needs thousands of env steps per second.
ManiSkill renders RGB at ~10 steps/s on CPU here, so the VLA learning tests
and tutorials run on this task; the simulator wrappers get wiring tests.

The task: an arena ``[-1, 1]^2`` holds three coloured targets (red, green, blue
squares of 5x5 pixels at 32x32) on three of the four corners ``(+-0.75,
+-0.75)`` and a white 3x3 agent. The instruction names one colour ("move to the
red square"); an action is a 2-D move in ``[-1, 1]`` scaled by 0.15; the
episode succeeds (and terminates) when the agent is within 0.12 of the named
target, and is truncated after 16 steps by default.

``env_id`` picks the layout:

* ``fixed``: each colour always sits on the same corner, so the instruction
  alone says where to go (vision and ``states`` locate the agent).
* ``random``: colours are dealt to three random corners per episode, so the
  policy must find the named colour in the image.

Observations: ``main_images`` [n, H, W, 3] uint8 (``obs_mode: rgb``, default
32x32), ``states`` [n, 2] agent position (``rgb``) or [n, 8] agent and the three
targets' positions in red/green/blue order (``obs_mode: state``), and
``task_ids`` [n] int64 into ``EnvSpec.instructions`` (3 phrasings x 3 colours).
Reward (``env_kwargs: {reward: sparse|shaped}``): ``sparse`` is 1 on the
success step; ``shaped`` adds the decrease of the distance to the target.
``env_kwargs: {instruction_text: true}`` adds ``instruction_text`` (each env's
instruction as UTF-8 bytes, :mod:`rlinf.core.protocols.instruction_text`), which
language policies read instead of ``task_ids``; ``instruction_perturbation:
swap_colour`` makes that text name the next colour (red -> green -> blue -> red)
while the target stays, a language-grounding check: a policy that reads the
instruction should then fail. ``task_ids`` always name the true task.
``env_kwargs: {wrist_camera: true}`` (``rgb`` only) adds ``wrist_images``, the
same size as ``main_images``: a view that moves with the agent (centred on
it, 2x zoom, so half the arena wide), with the area outside the arena grey.

:meth:`LangReachEnv.expert_actions` (and :meth:`LangReachEnv.expert_chunk`,
``C`` steps ahead) is a scripted expert, straight to the named target, for
behaviour-cloning demonstrations (:mod:`rlinf.embodied.demos`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from rlinf.core.protocols.embodied import EnvSpec
from rlinf.core.protocols.instruction_text import INSTRUCTION_TEXT_KEY, encode_instruction_text
from rlinf.embodied.envs.base import Obs, StepResult, VectorEnv
from rlinf.embodied.envs.registry import register_env

__all__ = ["COLOURS", "INSTRUCTIONS", "LangReachEnv"]

COLOURS = ("red", "green", "blue")
_RGB = torch.tensor([[230, 40, 40], [40, 200, 60], [50, 80, 230]], dtype=torch.uint8)
_TEMPLATES = ("move to the {} square", "go to the {} block", "reach the {} target")
INSTRUCTIONS = tuple(t.format(c) for c in COLOURS for t in _TEMPLATES)
"""Every instruction; ``task_id // 3`` is the colour index, ``task_id % 3`` the phrasing."""

_CORNERS = torch.tensor([[-0.75, -0.75], [0.75, -0.75], [-0.75, 0.75], [0.75, 0.75]])
_FIXED_CORNERS = (0, 1, 2)  # red, green, blue in the fixed layout
_STEP_SCALE = 0.15
_SUCCESS_RADIUS = 0.12
_START_RANGE = 0.5
_WRIST_ZOOM = 2.0
_OUTSIDE_GREY = 90
_DEFAULT_STEPS = 16
_DEFAULT_IMAGE = (32, 32)
_MIN_IMAGE = 16
_REWARDS = ("sparse", "shaped")
_PERTURBATIONS = ("none", "swap_colour")
_OPTIONS = ("reward", "wrist_camera", "instruction_text", "instruction_perturbation")


@register_env("lang_reach")
class LangReachEnv(VectorEnv):
    """``num_envs`` lang_reach episodes stepped together (see the module docstring)."""

    can_continue_after_termination = True

    def _setup(self) -> EnvSpec:
        cfg = self.cfg
        if cfg.env_id not in ("fixed", "random"):
            raise ValueError(
                f"env_id {cfg.env_id!r} is not a lang_reach layout; use env_id: fixed "
                "(each colour on its own corner) or env_id: random (colours dealt per episode)"
            )
        self._refuse_gpu("lang_reach", "it runs in torch on the CPU")
        extra = set(cfg.env_kwargs) - set(_OPTIONS)
        if extra:
            raise ValueError(
                f"env_kwargs {sorted(extra)} are not lang_reach options; they are "
                "reward: sparse|shaped, wrist_camera: true|false, instruction_text: "
                "true|false and instruction_perturbation: none|swap_colour"
            )
        perturbation = str(cfg.env_kwargs.get("instruction_perturbation", "none"))
        if perturbation not in _PERTURBATIONS:
            raise ValueError(
                f"env_kwargs.instruction_perturbation={perturbation!r}; use 'none' or "
                "'swap_colour' (the text names the next colour; the target stays)"
            )
        self._text_table: torch.Tensor | None = None
        if perturbation == "swap_colour" or cfg.env_kwargs.get("instruction_text", False):
            texts = INSTRUCTIONS
            if perturbation == "swap_colour":
                texts = tuple(
                    t.format(COLOURS[(c + 1) % len(COLOURS)])
                    for c in range(len(COLOURS))
                    for t in _TEMPLATES
                )
            self._text_table = encode_instruction_text(texts)
        self._reward_mode = str(cfg.env_kwargs.get("reward", "sparse"))
        if self._reward_mode not in _REWARDS:
            raise ValueError(
                f"env_kwargs.reward={self._reward_mode!r}; use 'sparse' (1 on success) or "
                "'shaped' (plus the decrease of the distance to the target)"
            )
        self._rgb = cfg.obs_mode == "rgb"
        self._wrist = bool(cfg.env_kwargs.get("wrist_camera", False))
        if self._wrist and not self._rgb:
            raise ValueError(
                f"env_kwargs.wrist_camera=true needs obs_mode: rgb (got {cfg.obs_mode!r}); "
                "set obs_mode: rgb or drop wrist_camera"
            )
        self._size = cfg.image_size or _DEFAULT_IMAGE
        if min(self._size) < _MIN_IMAGE:
            raise ValueError(
                f"image_size={list(self._size)} is too small for lang_reach's targets; "
                f"use at least [{_MIN_IMAGE}, {_MIN_IMAGE}] (default 32x32)"
            )
        n = self.num_envs
        self._random = cfg.env_id == "random"
        self._agent = torch.zeros(n, 2)
        self._targets = _CORNERS[list(_FIXED_CORNERS)].expand(n, 3, 2).clone()
        self._task = torch.zeros(n, dtype=torch.int64)
        self.defines_success = True
        return EnvSpec(
            state_dim=2 if self._rgb else 8,
            image_shape=(self._size[0], self._size[1], 3) if self._rgb else None,
            action_dim=2,
            action_low=(-1.0, -1.0),
            action_high=(1.0, 1.0),
            max_episode_steps=cfg.max_episode_steps or _DEFAULT_STEPS,
            instructions=INSTRUCTIONS,
            wrist_image_shape=(self._size[0], self._size[1], 3) if self._wrist else None,
        )

    # ------------------------------------------------------------------ state

    @property
    def goal(self) -> torch.Tensor:
        """[n, 2] position of each env's instructed target."""
        colour = self._task // len(_TEMPLATES)
        return self._targets[torch.arange(self.num_envs), colour]

    def expert_actions(self) -> torch.Tensor:
        """[n, 2] scripted-expert actions: straight to the instructed target, full speed."""
        delta = (self.goal - self._agent) / _STEP_SCALE
        return delta / delta.abs().amax(dim=1, keepdim=True).clamp(min=1.0)

    def expert_chunk(self, num_action_chunks: int) -> torch.Tensor:
        """[n, C, 2] the expert's next ``C`` actions, planned from the current state.

        The plan moves a copy of the agent; the env itself does not change.
        """
        saved = self._agent.clone()
        actions = []
        try:
            for _ in range(num_action_chunks):
                action = self.expert_actions()
                actions.append(action)
                self._agent = (self._agent + action * _STEP_SCALE).clamp(-1.0, 1.0)
        finally:
            self._agent = saved
        return torch.stack(actions, dim=1)

    def _distance(self) -> torch.Tensor:
        distance: torch.Tensor = (self.goal - self._agent).norm(dim=1)
        return distance

    # ------------------------------------------------------------------ hooks

    def _reset_envs(self, env_ids: NDArray[Any], seeds: NDArray[Any]) -> Obs:
        rows = torch.as_tensor(env_ids, dtype=torch.int64)
        for row, seed in zip(env_ids.tolist(), seeds.tolist(), strict=True):
            rng = np.random.default_rng(int(seed))
            start = rng.uniform(-_START_RANGE, _START_RANGE, size=2)
            self._agent[row] = torch.as_tensor(start, dtype=torch.float32)
            self._task[row] = int(rng.integers(len(INSTRUCTIONS)))
            if self._random:
                corners = rng.permutation(len(_CORNERS))[:3]
                self._targets[row] = _CORNERS[torch.as_tensor(corners)]
        return self._observe(rows)  # only the reset envs are rendered

    def _step_envs(self, actions: torch.Tensor, active: NDArray[Any]) -> StepResult:
        moving = torch.as_tensor(active, dtype=torch.bool)
        before = self._distance()
        step = actions.to(torch.float32) * _STEP_SCALE
        self._agent[moving] = (self._agent[moving] + step[moving]).clamp(-1.0, 1.0)
        after = self._distance()
        success = after < _SUCCESS_RADIUS
        rewards = success.to(torch.float32)
        if self._reward_mode == "shaped":
            rewards = rewards + (before - after)
        return StepResult(
            obs=self._observe(),
            rewards=rewards.numpy(),
            terminated=success.numpy(),
            truncated=np.zeros(self.num_envs, dtype=bool),
            success=success.numpy(),
        )

    def _close(self) -> None:
        pass

    def _render_frame(self) -> NDArray[Any] | None:
        frame: NDArray[Any] = self._render(slice(0, 1))[0].numpy()
        return frame

    def _default_fps(self) -> float:
        return 8.0

    # ------------------------------------------------------------------ rendering

    def _observe(self, rows: torch.Tensor | slice = slice(None)) -> Obs:
        """Observations of the envs in ``rows`` (all by default), as new tensors."""
        obs: Obs = {"task_ids": self._task[rows].clone()}
        if self._text_table is not None:
            obs[INSTRUCTION_TEXT_KEY] = self._text_table[self._task[rows]]
        if self._rgb:
            obs["main_images"] = self._render(rows)
            if self._wrist:
                obs["wrist_images"] = self._render(rows, wrist=True)
            obs["states"] = self._agent[rows].clone()
        else:
            targets = self._targets[rows].reshape(-1, 6)
            obs["states"] = torch.cat([self._agent[rows], targets], dim=1)
        return obs

    def _render(self, rows: torch.Tensor | slice, *, wrist: bool = False) -> torch.Tensor:
        """[m, H, W, 3] uint8 frames of the envs in ``rows``: targets, then the agent on top.

        ``wrist``: the view centred on the agent at ``_WRIST_ZOOM`` (positions become
        ``(p - agent) * zoom``), grey outside the arena.
        """
        height, width = self._size
        agent, targets = self._agent[rows], self._targets[rows]
        m = agent.shape[0]
        ys = torch.arange(height).view(1, height, 1)
        xs = torch.arange(width).view(1, 1, width)
        frames = torch.zeros(m, height, width, 3, dtype=torch.uint8)
        zoom = _WRIST_ZOOM if wrist else 1.0
        origin = agent if wrist else torch.zeros_like(agent)
        if wrist:  # pixel -> arena coordinates; outside [-1, 1]^2 is grey
            arena_x = origin[:, 0].view(-1, 1, 1) + (xs / (width - 1) * 2 - 1) / zoom
            arena_y = origin[:, 1].view(-1, 1, 1) + (1 - ys / (height - 1) * 2) / zoom
            frames[(arena_x.abs() > 1) | (arena_y.abs() > 1)] = _OUTSIDE_GREY
        scale = min(height, width) / 32 * zoom
        half_target = max(1, int(2 * scale))  # 5x5 pixels at 32x32
        for colour in range(len(COLOURS)):
            centre = (targets[:, colour] - origin) * zoom
            frames[self._square(centre, ys, xs, half_target)] = _RGB[colour]
        half_agent = max(1, int(scale))  # 3x3 pixels at 32x32
        frames[self._square((agent - origin) * zoom, ys, xs, half_agent)] = 255
        return frames

    def _square(
        self, centre: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor, half: int
    ) -> torch.Tensor:
        """[m, H, W] bool: pixels within ``half`` pixels of each ``centre`` (arena coords)."""
        height, width = self._size
        col = ((centre[:, 0] + 1) / 2 * (width - 1)).round().view(-1, 1, 1)
        row = ((1 - centre[:, 1]) / 2 * (height - 1)).round().view(-1, 1, 1)  # y up
        return ((ys - row).abs() <= half) & ((xs - col).abs() <= half)
