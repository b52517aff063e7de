"""The semi-Markov structure (structures/semimarkov.py) against brute-force enumeration of every
segmentation, for each quantity the structures layer derives (log Z, max, marginals, argmax, entropy,
count), with lengths; gradcheck; torch-struct's SemiMarkov where it is exact; bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.structures.semimarkov import SemiMarkov
from tests.structure_enumeration import assert_derived, assert_twice_differentiable, expectations, segmentations

SM = SemiMarkov()


def brute(edge: torch.Tensor, lengths: list[int]) -> dict[str, torch.Tensor]:
    _, N1, K, C, _ = edge.shape
    return expectations(list(edge), [segmentations(N1 + 1, K, C, L) for L in lengths])


@settings(deadline=None, max_examples=25)
@given(B=st.integers(1, 3), N=st.integers(1, 6), K=st.integers(2, 4), C=st.integers(1, 3), seed=st.integers(0, 999))
def test_every_quantity_equals_enumeration(B, N, K, C, seed):
    g = torch.Generator().manual_seed(seed)
    edge = torch.randn(B, max(N - 1, 0), K, C, C, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    lengths[0] = N
    want = brute(edge, lengths.tolist())
    assert_derived(SM, edge, lengths, want)
    best = SM.argmax(edge, lengths)
    torch.testing.assert_close(SM.log_prob(edge, best, lengths), want["max"] - want["logz"])


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(1)
    edge = torch.randn(2, 4, 3, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 3])
    assert_twice_differentiable([SM], edge, lengths)
    marg = SM.marginals(edge, lengths)  # differentiable when the potentials require grad
    assert marg.requires_grad


def test_forbidden_items_give_minus_inf_and_zero_gradient():
    edge = torch.randn(2, 3, 3, 2, 2, dtype=torch.float64)
    edge[1] = -torch.inf  # no segmentation of item 1 is allowed
    edge.requires_grad_()
    logz = SM.partition(edge)
    assert torch.isfinite(logz[0]) and logz[1] == -torch.inf
    (grad,) = torch.autograd.grad(logz[0] + torch.where(torch.isfinite(logz[1]), logz[1], 0.0), edge)
    assert not grad.isnan().any() and grad[1].eq(0).all()
    assert SM.marginals(edge.detach())[1].eq(0).all()


def test_torch_struct_agrees_where_it_is_exact():
    ts = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(2)
    edge = torch.randn(4, 7, 4, 3, 3, generator=g, dtype=torch.float64)
    ours = SM.partition(edge)
    theirs = ts.SemiMarkov(ts.LogSemiring).sum(edge.clone())
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(SM.marginals(edge), ts.SemiMarkov(ts.LogSemiring).marginals(edge.clone()).detach())
    torch.testing.assert_close(SM.max(edge), ts.SemiMarkov(ts.MaxSemiring).sum(edge.clone()).detach())
    # torch-struct 0.5 with lengths below N in one batch is not exact (its chart pads by the shortest
    # length): enumeration is the reference there (test_every_quantity_equals_enumeration)
    lengths = torch.tensor([8, 5, 2, 8])
    want = brute(edge, lengths.tolist())["logz"]
    torch.testing.assert_close(SM.partition(edge, lengths), want)
    assert not torch.allclose(ts.SemiMarkov(ts.LogSemiring).sum(edge.clone(), lengths).detach(), want)


@pytest.mark.parametrize(
    "shape, lengths, message",
    [
        ((2, 3, 3, 2), None, r"edge must be \(B, N - 1, K, C, C\), got \(2, 3, 3, 2\)"),
        ((2, 3, 3, 2, 3), None, r"edge must be \(B, N - 1, K, C, C\)"),
        ((2, 3, 1, 2, 2), None, "K = 1: segments need K >= 2"),
        ((2, 3, 3, 2, 2), [4, 5], r"lengths must be in \[1, N = 4\], got \[4, 5\]"),
        ((2, 3, 3, 2, 2), [4, 0], r"lengths must be in \[1, N = 4\]"),
        ((2, 3, 3, 2, 2), [4], r"lengths must be \(B,\) = \(2,\) integers, got \(1,\)"),
    ],
)
def test_bad_input_is_named(shape, lengths, message):
    with pytest.raises(ValueError, match=message):
        SM.partition(torch.randn(shape), None if lengths is None else torch.tensor(lengths))
