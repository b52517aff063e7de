"""Monotone alignments (structures/alignment.py), global and local, banded or not, against enumeration of every
path, with lengths; gradcheck; impossible items; bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.semirings import StdSemiring
from semiring_ops.structures.alignment import Alignment
from tests.structure_enumeration import alignments, assert_derived, expectations


@settings(deadline=None, max_examples=30)
@given(
    B=st.integers(1, 3),
    N=st.integers(1, 3),
    M=st.integers(1, 4),
    local=st.booleans(),
    max_gap=st.sampled_from([None, 0, 1, 2]),
    seed=st.integers(0, 999),
)
def test_every_quantity_equals_enumeration(B, N, M, local, max_gap, seed):
    g = torch.Generator().manual_seed(seed)
    match = torch.randn(B, N, M, 3, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    align = Alignment(local, max_gap)
    want = expectations(list(match), [alignments(N, M, L, local, max_gap) for L in lengths.tolist()])
    assert_derived(align, match, lengths, want)  # marginals 0 and log Z -inf where no path exists


def test_delannoy_counts():
    ones = torch.ones(1, 5, 5, 3, dtype=torch.float64)
    counts = [Alignment().logpartition(ones[:, :n, :n], None, StdSemiring).item() for n in range(1, 6)]
    assert counts == [1, 3, 13, 63, 321]  # central Delannoy numbers D(n - 1, n - 1)


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(1)
    match = torch.randn(2, 3, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([3, 2])
    for align in (Alignment(), Alignment(local=True), Alignment(max_gap=1)):
        assert torch.autograd.gradcheck(lambda m, a=align: a.partition(m, lengths).clamp(min=-1e6), (match,))
        assert torch.autograd.gradgradcheck(lambda m, a=align: a.partition(m, lengths).clamp(min=-1e6), (match,))


@pytest.mark.parametrize(
    "shape, lengths, kwargs, message",
    [
        ((2, 3, 4, 2), None, {}, r"match must be \(B, N, M, 3\), got \(2, 3, 4, 2\)"),
        ((2, 0, 4, 3), None, {}, r"N, M >= 1"),
        ((2, 3, 4, 3), [3, 4], {}, r"lengths must be in \[1, N = 3\], got \[3, 4\]"),
        ((2, 3, 4, 3), None, {"max_gap": -1}, r"max_gap must be None or an int >= 0, got -1"),
    ],
)
def test_bad_input_is_named(shape, lengths, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Alignment(**kwargs).partition(torch.randn(shape), None if lengths is None else torch.tensor(lengths))
