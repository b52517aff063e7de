"""Projective dependency trees (structures/dependency.py, Eisner's algorithm) against enumeration of every
projective tree, multi- and single-root, with lengths and labelled arcs; gradcheck; bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.semirings import StdSemiring
from semiring_ops.structures.dependency import DependencyTree
from semiring_ops.structures.nonprojective import NonProjectiveDependencyTree
from tests.structure_enumeration import assert_derived, assert_twice_differentiable, expectations, projective_trees


def brute(arc: torch.Tensor, lengths: list[int], multiroot: bool) -> dict[str, torch.Tensor]:
    N = arc.shape[1]
    return expectations(list(arc), [projective_trees(N, L, multiroot) for L in lengths])


@pytest.mark.parametrize("multiroot", [True, False])
@settings(deadline=None, max_examples=15)
@given(B=st.integers(1, 3), N=st.integers(1, 5), seed=st.integers(0, 999))
def test_every_quantity_equals_enumeration(multiroot, B, N, seed):
    g = torch.Generator().manual_seed(seed)
    arc = torch.randn(B, N, N, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    tree = DependencyTree(multiroot)
    want = brute(arc, lengths.tolist(), multiroot)
    assert_derived(tree, arc, lengths, want)
    best = tree.argmax(arc, lengths)
    assert best.sum((1, 2)).tolist() == lengths.double().tolist()  # one head per word


def test_known_counts():
    # projective trees over n words: multi-root 1, 2, 7, 30, 143 ... for the single root, 2, 7, 30, 143, 728
    # with the root as an extra word (multi-root): the standard sequences
    ones = torch.ones(1, 6, 6, dtype=torch.float64)
    single = [DependencyTree(False).logpartition(ones, torch.tensor([n]), StdSemiring).item() for n in range(1, 6)]
    multi = [DependencyTree(True).logpartition(ones, torch.tensor([n]), StdSemiring).item() for n in range(1, 6)]
    assert single == [1, 2, 7, 30, 143]
    assert multi == [1, 3, 12, 55, 273]


def test_labelled_arcs_sum_their_labels():
    g = torch.Generator().manual_seed(4)
    arc = torch.randn(2, 4, 4, 3, generator=g, dtype=torch.float64)
    tree = DependencyTree()
    torch.testing.assert_close(tree.partition(arc), tree.partition(torch.logsumexp(arc, -1)))
    marg = tree.marginals(arc)  # per label: the arc's marginal split by the labels' weights
    torch.testing.assert_close(marg.sum(-1), tree.marginals(torch.logsumexp(arc, -1)))


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(1)
    arc = torch.randn(2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 2])
    both = [
        DependencyTree(True),
        DependencyTree(False),
        NonProjectiveDependencyTree(True),
        NonProjectiveDependencyTree(False),
    ]
    assert_twice_differentiable(both, arc, lengths)  # the projective and non-projective structures share the layout


def test_torch_struct_deptree_agrees_or_is_documented():
    ts = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(2)
    arc = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    ours = DependencyTree().partition(arc)
    try:
        theirs = ts.DepTree(ts.LogSemiring).sum(arc.clone())
    except Exception as exc:  # torch-struct 0.5's DepTree on current torch (../shared/ANCHORS.md)
        pytest.skip(f"torch-struct's DepTree raises here: {type(exc).__name__}: {exc}")
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize(
    "shape, lengths, message",
    [
        ((2, 3, 4), None, r"arc must be \(B, N, N\) or \(B, N, N, labels\), got \(2, 3, 4\)"),
        ((2, 3), None, r"arc must be \(B, N, N\)"),
        ((2, 3, 3), [3, 4], r"lengths must be in \[1, N = 3\], got \[3, 4\]"),
        ((2, 3, 3), [0, 3], r"lengths must be in \[1, N = 3\]"),
        ((2, 3, 3), [1.5, 2.0], r"lengths must be \(B,\) = \(2,\) integers"),
    ],
)
def test_bad_input_is_named(shape, lengths, message):
    with pytest.raises(ValueError, match=message):
        DependencyTree().partition(torch.randn(shape), None if lengths is None else torch.tensor(lengths))
