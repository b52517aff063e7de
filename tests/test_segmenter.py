"""SemiMarkovSegmenter (semiring_ops/nn/segmenter.py): the potentials' layout, the distribution it makes against
enumeration of every segmentation, parts <-> segments, gradients, a few training steps, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from semiring_ops.nn import SemiMarkovSegmenter
from tests.structure_enumeration import segmentations


def _model(H=6, C=3, max_length=2, seed=0) -> SemiMarkovSegmenter:
    torch.manual_seed(seed)
    seg = SemiMarkovSegmenter(H, C, max_length, hidden=8).double()
    with torch.no_grad():  # non-zero duration and transition scores, so a wrong index shows
        seg.duration.normal_()
        seg.transition.normal_()
    return seg


def test_potentials_layout_and_masks():
    seg = _model()
    h = torch.randn(2, 5, 6, dtype=torch.float64)
    edge = seg.potentials(h)
    assert edge.shape == (2, 4, 3, 3, 3)
    assert torch.isneginf(edge[:, :, 0]).all()  # length 0: never a segment
    assert torch.isneginf(edge[:, 3, 2]).all()  # from boundary 3, length 2 runs past position 4
    assert torch.isneginf(edge[:, 0, :, :, 1:]).all()  # the start label is 0
    assert torch.isfinite(edge[:, 1, 1]).all()
    # the formula, for one segment: boundary 1 to 3 labelled 2 after label 1
    left, right = h[:, 1], h[:, 3]
    span = seg.label(seg.span(torch.cat([left, right, right - left], -1)))[:, 2]
    want = span + seg.duration[2, 2] + seg.transition[2, 1]
    torch.testing.assert_close(edge[:, 1, 2, 2, 1], want)


def test_the_distribution_sums_to_one_over_every_segmentation():
    seg = _model()
    N, L = 5, 4
    h = torch.randn(1, N, 6, dtype=torch.float64)
    dist = seg(h, torch.tensor([L]))
    every = torch.stack(segmentations(N, 3, 3, L))  # (S, N - 1, K, C, C)
    probs = dist.log_prob(every.unsqueeze(1)).exp()  # (S, 1)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0, dtype=torch.float64))
    best = dist.argmax
    assert best.sum() >= 1
    torch.testing.assert_close(dist.log_prob(best).exp().squeeze(), probs.max())


def test_parts_and_segments_round_trip():
    seg = _model(max_length=3)
    gold = [[(0, 2, 1), (2, 3, 0), (3, 6, 2)], [(0, 1, 2)]]
    parts = seg.parts(gold, 7)
    assert parts.shape == (2, 6, 4, 3, 3)
    assert seg.segments(parts) == gold
    h = torch.randn(2, 7, 6, dtype=torch.float64)
    dist = seg(h, torch.tensor([7, 2]))
    assert torch.isfinite(dist.log_prob(parts)).all()
    decoded = seg.segments(dist.argmax)
    for item, length in zip(decoded, (7, 2), strict=True):  # a segmentation covering 0 .. length - 1
        assert item[0][0] == 0 and item[-1][1] == length - 1
        assert all(a[1] == b[0] for a, b in itertools.pairwise(item))


def test_training_raises_the_gold_probability_and_gradients_reach_every_parameter():
    seg = _model(seed=3, max_length=3)
    h = torch.randn(2, 6, 6, dtype=torch.float64)
    gold = seg.parts([[(0, 2, 1), (2, 5, 2)], [(0, 1, 0), (1, 3, 1)]], 6)
    lengths = torch.tensor([6, 4])
    opt = torch.optim.Adam(seg.parameters(), lr=0.05)
    before = seg(h, lengths).log_prob(gold).sum().item()
    for _ in range(30):
        opt.zero_grad()
        loss = -seg(h, lengths).log_prob(gold).sum()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in seg.parameters())
        opt.step()
    after = seg(h, lengths).log_prob(gold).sum().item()
    assert after > before + 1.0
    assert after <= 1e-9 and math.isfinite(after)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="max_length"):
        SemiMarkovSegmenter(4, 3, 0)
    seg = _model()
    with pytest.raises(ValueError, match=r"h must be \(B, N, H\)"):
        seg.potentials(torch.randn(5, 6))
    with pytest.raises(ValueError, match="out of range"):
        seg.parts([[(0, 4, 1)]], 6)  # length 4 > max_length 2
