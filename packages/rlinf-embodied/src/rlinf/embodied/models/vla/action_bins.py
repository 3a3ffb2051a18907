"""A discrete action vocabulary: continuous values <-> bins <-> token ids (OpenVLA's action ids).

Mapping (one convention, used everywhere): ``[-1, 1]`` is cut into ``n_bins``
equal-width bins; bin ``b`` covers ``[-1 + b w, -1 + (b + 1) w)`` with
``w = 2 / n_bins`` and decodes to its centre ``-1 + (b + 0.5) w``. Bins take the
*last* ``n_bins`` ids of the vocabulary in ascending order:
``token_id = vocab_size - n_bins + b``. Word ids stay below ``vocab_size - n_bins``,
so a tokenizer can grow without touching the bins. OpenVLA counts its bins down
from the end instead; :mod:`.openvla.action_tokenizer` maps its id range onto this
class (:meth:`~.openvla.action_tokenizer.OpenVLAActionTokenizer.action_bins`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ActionBins"]


@dataclass(frozen=True)
class ActionBins:
    """The bin layout of one model.

    Attributes:
        n_bins: Bins per action dimension.
        vocab_size: Size of the whole vocabulary (words + bins).
    """

    n_bins: int
    vocab_size: int

    def __post_init__(self) -> None:
        if not 1 <= self.n_bins < self.vocab_size:
            raise ValueError(
                f"n_bins={self.n_bins} must be in [1, vocab_size={self.vocab_size}) so the "
                "vocabulary keeps at least one word id"
            )

    @property
    def first_id(self) -> int:
        """Token id of bin 0."""
        return self.vocab_size - self.n_bins

    @property
    def width(self) -> float:
        """Bin width in normalised units."""
        return 2.0 / self.n_bins

    def values_to_bins(self, values: Tensor) -> Tensor:
        """Normalised values (clipped to ``[-1, 1]``) to int64 bin indices."""
        scaled = (values.float().clamp(-1.0, 1.0) + 1.0) / self.width
        return scaled.floor().long().clamp(0, self.n_bins - 1)

    def bins_to_values(self, bins: Tensor) -> Tensor:
        """Bin indices to their float32 centres in ``[-1, 1]``."""
        return -1.0 + (bins.float() + 0.5) * self.width

    def bins_to_ids(self, bins: Tensor) -> Tensor:
        """Bin indices to vocabulary ids."""
        return bins.long() + self.first_id

    def ids_to_bins(self, ids: Tensor) -> Tensor:
        """Vocabulary ids to bin indices.

        Raises:
            ValueError: An id is not a bin id.
        """
        bins = ids.long() - self.first_id
        if bool(((bins < 0) | (bins >= self.n_bins)).any()):
            raise ValueError(
                f"token ids outside the action bins [{self.first_id}, {self.vocab_size}) "
                "cannot be decoded as actions"
            )
        return bins

    def values_to_ids(self, values: Tensor) -> Tensor:
        """Normalised values to vocabulary ids."""
        return self.bins_to_ids(self.values_to_bins(values))

    def ids_to_values(self, ids: Tensor) -> Tensor:
        """Vocabulary ids to bin centres."""
        return self.bins_to_values(self.ids_to_bins(ids))

    def bin_id_mask(self, device: torch.device | None = None) -> Tensor:
        """``[vocab_size]`` bool, True at the bin ids."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=device)
        mask[self.first_id :] = True
        return mask
