"""``ReplayBuffer``: a fixed-capacity ring of transitions for off-policy training (SAC).

Why: off-policy learners reuse each env step many times; the buffer keeps the
last ``capacity`` transitions ``(obs, action, reward, next_obs, terminated,
truncated)`` and samples uniform minibatches from them.

Storage is one preallocated tensor per field on the given device, allocated at
full capacity on the first :meth:`ReplayBuffer.add` (the shapes come from that
batch), so memory is known up front and adding is a copy into a slice. Once
full, the oldest rows are overwritten (ring). ``terminated`` ends the
bootstrap; ``truncated`` (a time limit) is kept for bookkeeping only: the
learner still bootstraps from ``next_obs``, which for a truncated row is the
episode's real final observation (not the reset one).

Cost: ``capacity * (2 * obs + action + 3)`` values of memory; ``add`` and
``sample`` are one indexed copy per field. :meth:`ReplayBuffer.state_dict`
holds the valid rows (on the CPU), so checkpoints grow with the buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["ReplayBuffer", "Transitions"]

_OBS_FIELDS = ("obs", "next_obs")
_TENSOR_FIELDS = ("actions", "rewards", "terminations", "truncations")


@dataclasses.dataclass
class Transitions:
    """A batch of ``B`` transitions.

    Attributes:
        obs: Observation entries, each ``[B, ...]``.
        actions: ``[B, A]`` float32 actions in env units.
        rewards: ``[B]`` float32.
        next_obs: The observation after the action (the final one for an
            episode that ended), same keys and shapes as ``obs``.
        terminations: ``[B]`` bool: the episode terminated (no bootstrap).
        truncations: ``[B]`` bool: the episode was cut by a time limit (bootstrap).
    """

    obs: dict[str, torch.Tensor]
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: dict[str, torch.Tensor]
    terminations: torch.Tensor
    truncations: torch.Tensor

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def flat(self) -> dict[str, torch.Tensor]:
        """The fields as one flat ``name -> tensor`` dict (``obs.<key>``, ``next_obs.<key>``)."""
        out = {f"{part}.{k}": v for part in _OBS_FIELDS for k, v in getattr(self, part).items()}
        out.update({name: getattr(self, name) for name in _TENSOR_FIELDS})
        return out

    @classmethod
    def from_flat(cls, flat: Mapping[str, torch.Tensor]) -> Transitions:
        """Inverse of :meth:`flat`."""
        return cls(
            obs={k[4:]: v for k, v in flat.items() if k.startswith("obs.")},
            next_obs={k[9:]: v for k, v in flat.items() if k.startswith("next_obs.")},
            **{name: flat[name] for name in _TENSOR_FIELDS},
        )


class ReplayBuffer:
    """Uniform-sampling ring buffer of :class:`Transitions`.

    Args:
        capacity: Rows kept; older rows are overwritten.
        device: Where the storage lives (and sampled batches come from).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(
                f"algorithm.replay_capacity={capacity} must be >= 1; set it to the number of "
                "transitions to keep (e.g. 1000000)"
            )
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._data: dict[str, torch.Tensor] = {}
        self._pos = 0
        self._size = 0
        self.total_added = 0
        """Transitions added over the buffer's life (not capped by ``capacity``)."""

    @property
    def size(self) -> int:
        """Valid rows (``min(total_added, capacity)``)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def ready(self, min_size: int) -> bool:
        """Whether at least ``min_size`` rows are stored (the warm-up check)."""
        return self._size >= min_size

    def _allocate(self, flat: Mapping[str, torch.Tensor]) -> None:
        self._data = {
            name: torch.zeros(
                (self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device
            )
            for name, value in flat.items()
        }

    def add(self, batch: Transitions) -> None:
        """Appends a batch, overwriting the oldest rows once full.

        Args:
            batch: Transitions; every field has the same leading size ``B``.

        Raises:
            ValueError: Fields disagree on ``B``, or the fields/shapes differ from
                the first batch added.
        """
        flat = batch.flat()
        n = len(batch)
        for name, value in flat.items():
            if value.shape[0] != n:
                raise ValueError(
                    f"Transitions.{name} has {value.shape[0]} rows but rewards has {n}; "
                    "every field needs one row per transition"
                )
        if n == 0:
            return
        if not self._data:
            self._allocate(flat)
        if set(flat) != set(self._data):
            raise ValueError(
                f"transition fields {sorted(flat)} differ from the buffer's {sorted(self._data)}"
            )
        for name, value in flat.items():
            if value.shape[1:] != self._data[name].shape[1:]:
                raise ValueError(
                    f"Transitions.{name} rows have shape {tuple(value.shape[1:])}, the buffer "
                    f"stores {tuple(self._data[name].shape[1:])}"
                )
        if n > self.capacity:  # only the newest rows fit
            flat = {k: v[-self.capacity :] for k, v in flat.items()}
            n = self.capacity
        idx = ((torch.arange(n) + self._pos) % self.capacity).to(self.device)
        for name, value in flat.items():
            store = self._data[name]
            store[idx] = value.to(device=self.device, dtype=store.dtype)
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        self.total_added += len(batch)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transitions:
        """``batch_size`` rows drawn uniformly (with replacement) from the valid rows.

        Args:
            batch_size: Rows to draw.
            generator: CPU random generator (the global one if None).

        Returns:
            The transitions, on the buffer's device.

        Raises:
            ValueError: The buffer is empty.
        """
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer; add transitions first")
        idx = torch.randint(0, self._size, (batch_size,), generator=generator).to(self.device)
        return Transitions.from_flat({name: store[idx] for name, store in self._data.items()})

    def state_dict(self) -> dict[str, Any]:
        """Capacity, cursor, counters and the valid rows (CPU copies) for a checkpoint."""
        return {
            "capacity": self.capacity,
            "pos": self._pos,
            "size": self._size,
            "total_added": self.total_added,
            "data": {k: v[: self._size].cpu().clone() for k, v in self._data.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (into this buffer's device).

        Raises:
            ValueError: The saved capacity differs from this buffer's.
        """
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"the checkpoint's replay buffer has capacity {state['capacity']} but "
                f"algorithm.replay_capacity={self.capacity}; resume with the same capacity"
            )
        data: Mapping[str, torch.Tensor] = state["data"]
        self._data = {}
        self._pos, self._size = int(state["pos"]), int(state["size"])
        self.total_added = int(state["total_added"])
        if data:
            self._allocate(data)
            for name, value in data.items():
                self._data[name][: self._size] = value.to(self.device)
