"""Non-projective dependency trees (structures/nonprojective.py: the matrix-tree theorem, Chu-Liu-Edmonds)
against enumeration of every spanning tree, multi- and single-root, with lengths; torch-struct; (gradcheck:
test_structures_dependency.py, for both dependency structures);
bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.semirings import MaxSemiring
from semiring_ops.structures.nonprojective import NonProjectiveDependencyTree
from tests.structure_enumeration import assert_derived, expectations, spanning_trees


@pytest.mark.parametrize("multiroot", [True, False])
@settings(deadline=None, max_examples=15)
@given(B=st.integers(1, 3), N=st.integers(1, 4), seed=st.integers(0, 999), scale=st.sampled_from([1.0, 5.0]))
def test_every_quantity_equals_enumeration(multiroot, B, N, seed, scale):
    g = torch.Generator().manual_seed(seed)
    arc = torch.randn(B, N, N, generator=g, dtype=torch.float64) * scale
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    tree = NonProjectiveDependencyTree(multiroot)
    want = expectations(list(arc), [spanning_trees(N, L, multiroot) for L in lengths.tolist()])
    assert_derived(tree, arc, lengths, want, count=False)  # (the matrix-tree theorem is log-semiring only)
    best = tree.argmax(arc, lengths)
    assert best.sum((1, 2)).tolist() == lengths.double().tolist()
    if not multiroot:
        assert torch.diagonal(best, 0, 1, 2).sum(1).tolist() == [1.0] * B  # one root child


@pytest.mark.parametrize("multiroot", [True, False])
def test_best_tree_is_exact_at_any_scale(multiroot):
    # Chu-Liu-Edmonds does not depend on the scores' scale (the matrix-tree log Z does: docs/structures.md)
    g = torch.Generator().manual_seed(634)
    arc = torch.randn(8, 4, 4, generator=g, dtype=torch.float64) * 30
    want = expectations(list(arc), [spanning_trees(4, 4, multiroot)] * 8)
    tree = NonProjectiveDependencyTree(multiroot)
    torch.testing.assert_close(tree.max(arc), want["max"])
    torch.testing.assert_close(tree.argmax(arc), want["argmax"])


def test_torch_struct_differs_by_its_eps_only():
    ts = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(2)
    arc = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    ours = NonProjectiveDependencyTree(multiroot=False).partition(arc)
    theirs = ts.NonProjectiveDependencyCRF(arc.clone(), multiroot=False).partition.detach()
    # torch-struct adds eps = 1e-5 to every exp(score) in its Laplacian (../shared/ANCHORS.md): close, not equal
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)
    assert not torch.allclose(ours, theirs, rtol=1e-9, atol=0)


def test_bad_input_is_named():
    tree = NonProjectiveDependencyTree()
    with pytest.raises(NotImplementedError, match="matrix-tree theorem sums over trees"):
        tree.logpartition(torch.randn(1, 3, 3), None, MaxSemiring)
    with pytest.raises(ValueError, match=r"arc must be \(B, N, N\), got \(1, 3, 3, 2\)"):
        tree.partition(torch.randn(1, 3, 3, 2))
    with pytest.raises(ValueError, match=r"lengths must be in \[1, N = 3\]"):
        tree.partition(torch.randn(2, 3, 3), torch.tensor([3, 4]))


@pytest.mark.parametrize("multiroot", [True, False])
def test_structure_topk_kmax_and_sample(multiroot):
    # the structure ranks and samples its trees itself (no semiring program runs the matrix-tree theorem)
    tree = NonProjectiveDependencyTree(multiroot)
    g = torch.Generator().manual_seed(4)
    arc = torch.randn(2, 4, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    want = [
        torch.stack([(arc[b] * t).sum() for t in spanning_trees(4, L, multiroot)]).sort(descending=True).values
        for b, L in enumerate(lengths.tolist())
    ]
    best = tree.topk(arc, 5, lengths)
    scores = tree.kmax(arc, 5, lengths)
    for b in range(2):
        torch.testing.assert_close((best[:, b] * arc[b]).flatten(1).sum(1), want[b][:5])
        torch.testing.assert_close(scores[:, b], want[b][:5])
    draws = tree.sample(arc, 50, lengths, torch.Generator().manual_seed(0))
    assert draws.shape == (50, 2, 4, 4)
    assert tree.support(draws.reshape(100, 4, 4), lengths.repeat(50)).all()
