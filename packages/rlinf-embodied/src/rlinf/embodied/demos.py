"""Demonstrations for behaviour cloning: a file format users fill, and a scripted-expert collector.

A demonstration set is ``N`` (observation, action chunk) pairs: the observation
entries a policy reads (``main_images`` [N, H, W, 3] uint8, ``states`` [N, d]
float32, ``task_ids`` [N] int64) and the expert's chunk ``actions`` [N, C, A]
float32 in env units, plus the instruction strings the ``task_ids`` index.

On disk it is one ``.npz`` (numpy's zip of arrays, readable without RLinf):
``obs/<key>`` arrays, ``actions`` and, for language-conditioned data,
``instructions`` (a 1-D unicode array). To bring your own data, write those
arrays with ``numpy.savez`` and load the file with :meth:`Demonstrations.load`.

:func:`collect_expert_demos` records a scripted expert (an env with an
``expert_chunk(C)`` method, such as ``lang_reach``): each chunk step stores the
expert's clean chunk as the label, and executes it with Gaussian noise so the
recorded states cover more than the expert's own path (as DART does).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from rlinf.embodied.envs.base import VectorEnv

__all__ = ["Demonstrations", "ExpertEnv", "collect_expert_demos"]


class ExpertEnv(Protocol):
    """An env that knows the expert's next action chunk (``lang_reach``)."""

    def expert_chunk(self, num_action_chunks: int) -> Tensor:
        """[n, C, A] expert actions for the current state of every env."""
        ...


@dataclass
class Demonstrations:
    """``N`` observations with the expert's action chunk for each.

    Attributes:
        obs: Observation entries, each ``[N, ...]``.
        actions: ``[N, C, A]`` float32 expert actions (env units).
        instructions: What ``obs["task_ids"]`` index, or None without language.
    """

    obs: dict[str, Tensor]
    actions: Tensor
    instructions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.actions.dim() != 3:
            raise ValueError(
                f"demonstration actions must be [N, C, A], got shape {tuple(self.actions.shape)}"
            )
        n = int(self.actions.shape[0])
        for key, value in self.obs.items():
            if int(value.shape[0]) != n:
                raise ValueError(
                    f"demonstration obs[{key!r}] has {value.shape[0]} rows but actions have {n}; "
                    "every array needs one row per sample"
                )
        if "task_ids" in self.obs and self.instructions is None:
            raise ValueError("demonstrations with obs['task_ids'] need their instructions")

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def save(self, path: str | Path) -> Path:
        """Writes the set as one ``.npz`` (see the module docstring); returns the path."""
        arrays = {f"obs/{key}": value.numpy() for key, value in self.obs.items()}
        arrays["actions"] = self.actions.numpy()
        if self.instructions is not None:
            arrays["instructions"] = np.array(self.instructions, dtype=np.str_)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            np.savez(f, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Demonstrations:
        """Reads a set written by :meth:`save` or by ``numpy.savez`` with the same keys.

        Raises:
            FileNotFoundError: No file at ``path``.
            ValueError: ``actions`` is missing or the arrays disagree on ``N``.
        """
        with np.load(Path(path), allow_pickle=False) as data:
            if "actions" not in data.files:
                raise ValueError(
                    f"{path} has no 'actions' array (found {data.files}); a demonstration file "
                    "holds obs/<key> arrays, actions [N, C, A] and optional instructions"
                )
            obs = {
                name.split("/", 1)[1]: torch.from_numpy(data[name].copy())
                for name in data.files
                if name.startswith("obs/")
            }
            actions = torch.from_numpy(data["actions"].astype(np.float32))
            instructions = (
                tuple(str(s) for s in data["instructions"].tolist())
                if "instructions" in data.files
                else None
            )
        return cls(obs=obs, actions=actions, instructions=instructions)

    def batches(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
        """Endless random mini-batches ``(obs, actions)``, reshuffled every pass."""
        if not 1 <= batch_size <= len(self):
            raise ValueError(
                f"batch_size={batch_size} must be in [1, {len(self)}] (the demonstrations' size)"
            )
        while True:
            order = torch.randperm(len(self), generator=generator)
            for start in range(0, len(self) - batch_size + 1, batch_size):
                rows = order[start : start + batch_size]
                yield {k: v[rows] for k, v in self.obs.items()}, self.actions[rows]


def collect_expert_demos(
    env: VectorEnv,
    num_samples: int,
    num_action_chunks: int,
    *,
    noise_std: float = 0.5,
    seed: int = 0,
) -> Demonstrations:
    """Records an env's scripted expert for at least ``num_samples`` chunk steps.

    Args:
        env: An env with auto-reset whose class has ``expert_chunk(C)``.
        num_samples: Observation/chunk pairs to record (rounded up to whole env batches).
        num_action_chunks: ``C`` of the policy that will learn from them.
        noise_std: Standard deviation of the Gaussian noise added to the executed
            actions (not to the labels).
        seed: Seeds the env reset and the noise.

    Returns:
        The demonstrations, with the env's instructions.

    Raises:
        TypeError: The env has no scripted expert.
        ValueError: The env does not auto-reset (episodes would stall).
    """
    expert_chunk = getattr(env, "expert_chunk", None)
    if expert_chunk is None:
        raise TypeError(
            f"{type(env).__name__} has no scripted expert (an expert_chunk(C) method); record "
            "demonstrations another way and load them with Demonstrations.load"
        )
    if not env.auto_reset:
        raise ValueError("collect_expert_demos needs an env built with auto_reset: true")
    generator = torch.Generator().manual_seed(seed)
    obs = env.reset(seed=seed).obs
    observed: list[dict[str, Tensor]] = []
    labels: list[Tensor] = []
    while sum(len(a) for a in labels) < num_samples:
        chunk = expert_chunk(num_action_chunks)
        observed.append(obs)
        labels.append(chunk.to(torch.float32))
        noise = torch.randn(chunk.shape, generator=generator) * noise_std
        obs = env.chunk_step(chunk + noise)[0].obs
    return Demonstrations(
        obs={k: torch.cat([o[k] for o in observed]) for k in observed[0]},
        actions=torch.cat(labels),
        instructions=env.spec.instructions,
    )
