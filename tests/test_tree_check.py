"""structures/tree_check.py (the support of the dependency structures): every head assignment of tiny items,
with lengths and padding, against the enumerated projective and non-projective trees; log_prob -inf outside."""

from __future__ import annotations

import itertools

import pytest
import torch

from semiring_ops.distributions import DependencyCRF, NonProjectiveDependencyCRF
from semiring_ops.structures import DependencyTree, NonProjectiveDependencyTree
from semiring_ops.structures.tree_check import dependency_trees
from tests.structure_enumeration import projective_trees, spanning_trees


def _all_head_assignments(N: int, L: int) -> torch.Tensor:
    """(S, N, N) arcs: every way to give each word < L one head among the root and the other words < L, so
    trees, cycles and several roots all occur."""
    out = []
    for heads in itertools.product(range(L + 1), repeat=L):  # 0 the root, h + 1 word h
        if any(h == m + 1 for m, h in enumerate(heads)):
            continue  # (a self-head is the root arc of this layout: already there as h = 0)
        arcs = torch.zeros(N, N, dtype=torch.float64)
        for m, h in enumerate(heads):
            arcs[m if h == 0 else h - 1, m] = 1
        out.append(arcs)
    return torch.stack(out)


def _key(arcs: torch.Tensor) -> bytes:
    return arcs.to(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("multiroot", [True, False])
@pytest.mark.parametrize("projective", [True, False])
@pytest.mark.parametrize(("N", "L"), [(1, 1), (3, 3), (4, 4), (5, 3), (5, 5)])
def test_equals_enumeration(N, L, multiroot, projective):
    every = _all_head_assignments(N, L)
    trees = (projective_trees if projective else spanning_trees)(N, L, multiroot)
    keys = {_key(t) for t in trees}
    want = torch.tensor([_key(a) in keys for a in every])
    got = dependency_trees(every, torch.full((len(every),), L), multiroot, projective)
    assert torch.equal(got, want)
    assert int(got.sum()) == len(trees)


def test_padding_arcs_and_doubled_heads_are_not_trees():
    tree = projective_trees(4, 3, True)[0]
    ok = dependency_trees(tree[None], torch.tensor([3]), True, True)
    assert ok.all()
    padded = tree.clone()
    padded[3, 3] = 1  # the padding word 3 gets a root arc
    doubled = tree.clone()
    doubled[0, 1] += tree[:, 1].sum()  # word 1 gets a second head (or a doubled arc)
    got = dependency_trees(torch.stack([padded, doubled]), torch.tensor([3, 3]), True, False)
    assert not got.any()


def test_log_prob_is_minus_inf_outside_the_support():
    g = torch.Generator().manual_seed(0)
    arc = torch.randn(1, 4, 4, generator=g, dtype=torch.float64)
    crossing = torch.zeros(1, 4, 4, dtype=torch.float64)  # root -> 0, 0 -> 2, 2 -> 1? no: 0 -> 2, 1 -> 3, 2 -> 1
    for h, m in ((0, 0), (0, 2), (2, 1), (1, 3)):  # arcs (1, 3) and (2, 4) over positions cross
        crossing[0, h, m] = 1
    assert not DependencyTree(False).support(crossing).any()
    assert NonProjectiveDependencyTree(False).support(crossing).all()
    assert torch.isneginf(DependencyCRF(arc, multiroot=False).log_prob(crossing)).all()
    assert torch.isfinite(NonProjectiveDependencyCRF(arc).log_prob(crossing)).all()
    assert torch.isneginf(DependencyTree(False).log_prob(arc, crossing)).all()
    # samples (sample_shape, B): the check per sample, lengths repeated
    dist = DependencyCRF(arc.expand(2, 4, 4), torch.tensor([4, 3]), multiroot=False)
    best = dist.argmax
    value = torch.stack([best, best.flip(0)])  # the second sample has each item's tree on the other item
    lp = dist.log_prob(value)
    assert torch.isfinite(lp[0]).all() and torch.isneginf(lp[1, 1])  # a length-4 tree on a length-3 item
