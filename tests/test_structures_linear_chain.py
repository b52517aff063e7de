"""Linear chains in torch-struct's layout (structures/linear_chain.py) against enumeration of every label
sequence, with lengths; torch-struct's LinearChain; gradcheck; bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.structures.linear_chain import LinearChain
from tests.structure_enumeration import assert_derived, assert_twice_differentiable, expectations, label_sequences

CHAIN = LinearChain()


@settings(deadline=None, max_examples=25)
@given(B=st.integers(1, 3), N=st.integers(1, 5), C=st.integers(1, 3), seed=st.integers(0, 999))
def test_every_quantity_equals_enumeration(B, N, C, seed):
    g = torch.Generator().manual_seed(seed)
    edge = torch.randn(B, N - 1, C, C, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    want = expectations(list(edge), [label_sequences(N, C, L) for L in lengths.tolist()])
    assert_derived(CHAIN, edge, lengths, want)


def test_torch_struct_agrees():
    ts = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(2)
    edge = torch.randn(3, 7, 4, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 2])
    theirs = ts.LinearChain(ts.LogSemiring)
    torch.testing.assert_close(CHAIN.partition(edge, lengths), theirs.sum(edge.clone(), lengths).detach())
    torch.testing.assert_close(CHAIN.marginals(edge, lengths), theirs.marginals(edge.clone(), lengths).detach())
    torch.testing.assert_close(CHAIN.max(edge, lengths), ts.LinearChain(ts.MaxSemiring).sum(edge.clone(), lengths))


def test_gradcheck_and_bad_input():
    g = torch.Generator().manual_seed(1)
    edge = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert_twice_differentiable([CHAIN], edge, torch.tensor([5, 3]))
    with pytest.raises(ValueError, match=r"edge must be \(B, N - 1, C, C\), got \(2, 4, 3\)"):
        CHAIN.partition(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match=r"LinearChain: lengths must be in \[1, N = 5\]"):
        CHAIN.partition(torch.randn(2, 4, 3, 3), torch.tensor([5, 6]))
