"""OpenVLA's action tokenizer against a hand computation of its NumPy formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf.embodied.models.vla.openvla.action_tokenizer import OpenVLAActionTokenizer

VOCAB, BINS = 32000, 256  # openvla-7b: text vocab 32064 - pad_to_multiple_of 64


def test_encode_matches_clip_digitize_and_counts_ids_down_from_the_vocab() -> None:
    tok = OpenVLAActionTokenizer(BINS, VOCAB)
    edges = np.linspace(-1.0, 1.0, BINS)
    values = np.concatenate(
        [
            np.random.default_rng(0).uniform(-1.3, 1.3, size=500),
            edges,  # exactly on the edges
            [-1.0, 1.0, -5.0, 5.0, 0.0],
        ]
    )
    expected = VOCAB - np.digitize(np.clip(values, -1.0, 1.0), edges)
    got = tok.encode(torch.from_numpy(values))
    assert got.dtype == torch.int64
    assert got.tolist() == expected.tolist()
    assert int(tok.encode(torch.tensor(-1.0))) == VOCAB - 1  # d = 1
    assert int(tok.encode(torch.tensor(1.0))) == VOCAB - BINS  # d = 256 only at exactly 1
    assert int(tok.encode(torch.tensor(0.999))) == VOCAB - (BINS - 1)
    assert set(got.tolist()) <= set(range(VOCAB - BINS, VOCAB))


def test_decode_matches_bin_centers_with_the_last_id_alias() -> None:
    tok = OpenVLAActionTokenizer(BINS, VOCAB)
    edges = np.linspace(-1.0, 1.0, BINS)
    centers = (edges[:-1] + edges[1:]) / 2.0
    assert centers.shape == (BINS - 1,)
    ids = np.arange(VOCAB - BINS - 3, VOCAB + 3)  # action ids plus a few outside (clipped)
    expected = centers[np.clip(VOCAB - ids - 1, 0, centers.shape[0] - 1)]
    got = tok.decode(torch.from_numpy(ids))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected.astype(np.float32), rtol=0, atol=0)
    # the alias: d = 256 and d = 255 both decode to the last centre
    last, second_last = tok.decode(torch.tensor([VOCAB - BINS, VOCAB - BINS + 1])).tolist()
    assert last == second_last == pytest.approx(float(centers[-1]))
    assert float(tok.decode(torch.tensor(VOCAB - 1))) == pytest.approx(float(centers[0]))


def test_round_trip_is_within_one_bin_and_ids_fill_the_action_range() -> None:
    tok = OpenVLAActionTokenizer(BINS, VOCAB)
    values = torch.linspace(-1, 1, 5001, dtype=torch.float64)
    decoded = tok.decode(tok.encode(values)).double()
    width = 2.0 / (BINS - 1)
    assert float((decoded - values).abs().max()) <= width + 1e-9
    assert set(tok.encode(values).tolist()) == set(range(VOCAB - BINS, VOCAB))
    bins = tok.action_bins()
    assert (bins.first_id, bins.vocab_size, bins.n_bins) == (VOCAB - BINS, VOCAB, BINS)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="n_action_bins=300"):
        OpenVLAActionTokenizer(300, 256)
