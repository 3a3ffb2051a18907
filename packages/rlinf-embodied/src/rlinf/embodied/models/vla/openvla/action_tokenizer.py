"""OpenVLA's action tokenizer: normalised values <-> 256 bins <-> token ids counted from the end.

The formulas of OpenVLA's ``ActionTokenizer`` (``prismatic/vla/action_tokenizer.py``)::

    bins        = linspace(-1, 1, n_bins)                # n_bins edges
    bin_centers = (bins[:-1] + bins[1:]) / 2             # n_bins - 1 centres
    encode: d   = digitize(clip(a, -1, 1), bins)         # in [1, n_bins]
            id  = vocab_size - d
    decode: d   = vocab_size - id
            v   = bin_centers[clip(d - 1, 0, n_bins - 2)]

``vocab_size`` is the *unpadded* tokenizer vocabulary
(``text_config.vocab_size - pad_to_multiple_of``: 32000 for openvla-7b), so the
action ids ``[vocab_size - n_bins, vocab_size)`` overlap the least used word
pieces. ``d = n_bins`` (only ``a == 1`` exactly) and ``d = n_bins - 1`` decode to
the same, last centre: the *last-id alias*. Encoding runs in float64 like
NumPy's, so a value on a bin edge lands where OpenVLA puts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlinf.embodied.models.vla.action_bins import ActionBins

__all__ = ["OpenVLAActionTokenizer"]


@dataclass(frozen=True)
class OpenVLAActionTokenizer:
    """OpenVLA's bin layout of one model.

    Attributes:
        n_bins: Bin edges per dimension (``n_action_bins``; 256).
        vocab_size: The unpadded vocabulary size the ids count down from.
    """

    n_bins: int
    vocab_size: int

    def __post_init__(self) -> None:
        if not 2 <= self.n_bins < self.vocab_size:
            raise ValueError(
                f"n_action_bins={self.n_bins} must be in [2, vocab_size={self.vocab_size}) so "
                "the vocabulary keeps word ids below the action ids"
            )

    @property
    def first_id(self) -> int:
        """Smallest action id (``d = n_bins``)."""
        return self.vocab_size - self.n_bins

    def bins(self, device: torch.device | None = None) -> Tensor:
        """``[n_bins]`` float64 bin edges, bit-equal to NumPy's ``linspace(-1, 1, n_bins)``.

        NumPy computes ``arange(n) * step + start`` and sets the last edge to ``stop``;
        ``torch.linspace`` rounds some edges differently, which would move values that
        sit on an edge into the neighbouring bin.
        """
        step = 2.0 / (self.n_bins - 1)
        edges = torch.arange(self.n_bins, dtype=torch.float64, device=device) * step - 1.0
        edges[-1] = 1.0
        return edges

    def bin_centers(self, device: torch.device | None = None) -> Tensor:
        """``[n_bins - 1]`` float64 bin centres."""
        edges = self.bins(device)
        return (edges[:-1] + edges[1:]) / 2.0

    def encode(self, values: Tensor) -> Tensor:
        """Normalised actions ``[...]`` to int64 token ids (OpenVLA's ``__call__``)."""
        clipped = values.double().clamp(-1.0, 1.0)
        digits = torch.bucketize(clipped, self.bins(values.device), right=True)
        return self.vocab_size - digits

    def decode(self, ids: Tensor) -> Tensor:
        """Token ids ``[...]`` to float32 bin centres (``decode_token_ids_to_actions``).

        Ids outside the action range are clipped like OpenVLA's NumPy code does
        (policies only sample action ids, see :meth:`action_bins`).
        """
        digits = (self.vocab_size - ids.long() - 1).clamp(0, self.n_bins - 2)
        return self.bin_centers(ids.device)[digits].float()

    def action_bins(self) -> ActionBins:
        """The id range as :class:`ActionBins` over the first ``vocab_size`` logits.

        The action ids are the last ``n_bins`` ids below ``vocab_size``, so
        :func:`~rlinf.embodied.models.vla.token_sampling.warp_action_logits` applied to
        ``logits[..., :vocab_size]`` restricts sampling to exactly them.
        """
        return ActionBins(self.n_bins, self.vocab_size)
