"""A sampler whose position is part of a checkpoint.

Not torchdata: the runner uses no DataLoader, and StatefulDataLoader too resumes via such a sampler.

:class:`ResumableSampler` yields a permutation of ``range(data_size)`` per epoch (the
identity without shuffling). The permutation of epoch ``e`` depends only on
``(seed, e)``, and the sampler counts what it has yielded (``epoch``, ``cursor``), so
``load_state_dict(state_dict())`` in a new process continues exactly where the old one
stopped.

The cursor counts the indices *yielded*. With a :class:`~torch.utils.data.DataLoader`
that prefetches (``num_workers > 0``) the sampler runs ahead of the batches the trainer
has consumed; save the state when the loader is drained, or use ``num_workers=0``
(the math prompts are in memory, so loading is cheap).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import Sampler

__all__ = ["ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """Per-epoch shuffled indices with a resumable position.

    Each ``iter()`` yields the rest of the current epoch and then moves to the next
    epoch. Use one iterator at a time.

    Example:
        >>> s = ResumableSampler(5, seed=0)
        >>> it = iter(s)
        >>> first = [next(it), next(it)]
        >>> t = ResumableSampler(5, seed=0)
        >>> t.load_state_dict(s.state_dict())
        >>> first + list(t) == list(ResumableSampler(5, seed=0))
        True
    """

    def __init__(self, data_size: int, *, shuffle: bool = True, seed: int = 0) -> None:
        """Create a sampler at epoch 0, cursor 0.

        Args:
            data_size: Number of items (``len(dataset)``).
            shuffle: Shuffle each epoch; otherwise yield ``0..data_size-1`` in order.
            seed: Seed of the permutations.

        Raises:
            ValueError: If ``data_size`` < 1 or ``seed`` < 0.
        """
        if data_size < 1:
            raise ValueError(f"data_size={data_size} must be >= 1 (is the dataset empty?)")
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        self.data_size = data_size
        self.shuffle = shuffle
        self.seed = seed
        self._epoch = 0
        self._cursor = 0
        self._order_cache: tuple[int, list[int]] | None = None

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._epoch

    @property
    def cursor(self) -> int:
        """How many indices of the current epoch were yielded."""
        return self._cursor

    def epoch_order(self, epoch: int) -> list[int]:
        """The index order of ``epoch``; a pure function of ``(seed, epoch)``.

        Args:
            epoch: The epoch.

        Returns:
            A permutation of ``range(data_size)``.
        """
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            order = [int(i) for i in rng.permutation(self.data_size)]
        else:
            order = list(range(self.data_size))
        self._order_cache = (epoch, order)
        return order

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``.

        Args:
            epoch: The epoch (>= 0).

        Raises:
            ValueError: If ``epoch`` < 0.
        """
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        self._epoch, self._cursor = epoch, 0

    def __iter__(self) -> Iterator[int]:
        if self._cursor >= self.data_size:
            self._epoch, self._cursor = self._epoch + 1, 0
        order = self.epoch_order(self._epoch)
        while self._cursor < self.data_size:
            index = order[self._cursor]
            self._cursor += 1
            yield index
        self._epoch, self._cursor = self._epoch + 1, 0

    def __len__(self) -> int:
        return self.data_size

    def state_dict(self) -> dict[str, Any]:
        """The position and the settings it depends on (plain ints/bools, JSON-friendly).

        Returns:
            ``{"epoch", "cursor", "seed", "shuffle", "data_size"}``.
        """
        return {
            "epoch": self._epoch,
            "cursor": self._cursor,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "data_size": self.data_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position.

        Args:
            state: A :meth:`state_dict` of a sampler with the same settings.

        Raises:
            KeyError: If a key is missing.
            ValueError: If the settings differ (the order would not continue) or the
                position is out of range.
        """
        missing = {"epoch", "cursor", "seed", "shuffle", "data_size"} - set(state)
        if missing:
            raise KeyError(f"sampler state lacks {sorted(missing)}; was it saved by state_dict()?")
        for key in ("data_size", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the checkpoint's sampler has {key}={state[key]!r} but this "
                    f"one has {key}={getattr(self, key)!r}; resume with the same data files, "
                    "filtering and data.seed/data.shuffle"
                )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= self.data_size:
            raise ValueError(
                f"sampler state epoch={epoch}, cursor={cursor} is out of range for "
                f"data_size={self.data_size}"
            )
        self._epoch, self._cursor = epoch, cursor
