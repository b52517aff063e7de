"""Binary span trees (structures/cky.py, CKY) against enumeration of every labelled bracketing, with lengths;
torch-struct's CKY_CRF; gradcheck; bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.semirings import StdSemiring
from semiring_ops.structures.cky import CKYTree
from tests.structure_enumeration import assert_derived, assert_twice_differentiable, binary_trees, expectations

CKY = CKYTree()


@settings(deadline=None, max_examples=20)
@given(B=st.integers(1, 3), N=st.integers(1, 5), NT=st.integers(1, 2), seed=st.integers(0, 999))
def test_every_quantity_equals_enumeration(B, N, NT, seed):
    g = torch.Generator().manual_seed(seed)
    span = torch.randn(B, N, N, NT, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    want = expectations(list(span), [binary_trees(N, NT, L) for L in lengths.tolist()])
    assert_derived(CKY, span, lengths, want)
    best = CKY.argmax(span, lengths)
    assert best.sum((1, 2, 3)).tolist() == (2 * lengths - 1).double().tolist()  # 2L - 1 spans, one label each


def test_counts_are_catalan_times_labels():
    ones = torch.ones(1, 6, 6, 2, dtype=torch.float64)
    for n in range(1, 7):
        count = CKY.logpartition(ones, torch.tensor([n]), StdSemiring).item()
        assert count == math.comb(2 * (n - 1), n - 1) // n * 2 ** (2 * n - 1)


def test_torch_struct_agrees():
    ts = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(2)
    span = torch.randn(3, 6, 6, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 1])
    for ours, semiring in ((CKY.partition, ts.LogSemiring), (CKY.max, ts.MaxSemiring)):
        theirs = ts.CKY_CRF(semiring).sum(span.clone(), lengths)
        torch.testing.assert_close(ours(span, lengths), theirs.detach(), rtol=1e-8, atol=1e-8)
    theirs = ts.CKY_CRF(ts.LogSemiring).marginals(span.clone(), lengths).detach()
    torch.testing.assert_close(CKY.marginals(span, lengths), theirs, rtol=1e-8, atol=1e-8)


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(1)
    span = torch.randn(2, 4, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 3])
    assert_twice_differentiable([CKY], span, lengths)


@pytest.mark.parametrize(
    "shape, lengths, message",
    [
        ((2, 3, 4, 2), None, r"span must be \(B, N, N, NT\), got \(2, 3, 4, 2\)"),
        ((2, 3, 3), None, r"span must be \(B, N, N, NT\)"),
        ((2, 3, 3, 2), [3, 4], r"lengths must be in \[1, N = 3\], got \[3, 4\]"),
    ],
)
def test_bad_input_is_named(shape, lengths, message):
    with pytest.raises(ValueError, match=message):
        CKY.partition(torch.randn(shape), None if lengths is None else torch.tensor(lengths))
