"""semiring_ops.structure_semirings (torch-struct's k-max, entropy, cross-entropy, KL and sampling semirings) and
the Structure members built on them (kmax, topk, entropy / cross_entropy / kl by semiring): each operation
against its definition, and every structure against brute-force enumeration (tests/structure_enumeration.py),
float64, tiny sizes, with forbidden (-inf) parts.

CASES (also used by tests/test_distribution_sampling.py) lists the structures with their distribution class,
a potentials shape, lengths and an enumerator."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops import distributions as D
from semiring_ops import structure_semirings as SS
from semiring_ops.semirings import LogSemiring, MaxSemiring
from semiring_ops.structure_semirings import (
    CrossEntropySemiring,
    EntropySemiring,
    KLDivergenceSemiring,
    KMaxSemiring,
    SampledSemiring,
    categorical_one_hot,
)
from semiring_ops.structures import Alignment, CKYTree, DependencyTree, LinearChain, SemiMarkov
from semiring_ops.structures.base import Structure
from tests.structure_enumeration import (
    alignments,
    binary_trees,
    label_sequences,
    projective_trees,
    segmentations,
    spanning_trees,
)

INF = math.inf


@dataclass(frozen=True)
class Case:
    """A structure at tiny sizes: ``make(g)`` draws (potentials, lengths, enumerations: one list of parts
    tensors per item); ``structure()`` (None: the distribution only, NonProjective) and ``dist(pot, lengths)``;
    ``sampling``: a fixed (shape, N) with tens of structures, for the goodness-of-fit tests."""

    structure: Callable[[], Structure] | None
    dist: Callable[[torch.Tensor, torch.Tensor], D.StructDistribution]
    shape: Callable[[torch.Generator], tuple[tuple[int, ...], int]]  # (potentials shape, N for the lengths)
    enumerate: Callable[[tuple[int, ...], int], list[torch.Tensor]]  # (shape, L) -> the item's structures
    sampling: tuple[tuple[int, ...], int]

    def make(self, g: torch.Generator, forbid: float = 0.0, fixed: bool = False):
        shape, N = self.sampling if fixed else self.shape(g)
        pot = torch.randn(shape, generator=g, dtype=torch.float64)
        if forbid:
            pot = pot.masked_fill(torch.rand(shape, generator=g, dtype=torch.float64) < forbid, -INF)
        lengths = torch.randint(1, N + 1, (shape[0],), generator=g)
        lengths[0] = N
        return pot, lengths, [self.enumerate(shape, int(L)) for L in lengths]


def _ri(g: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (), generator=g))


CASES: dict[str, Case] = {
    "linear_chain": Case(
        LinearChain,
        D.LinearChainCRF,
        lambda g: ((_ri(g, 1, 2), (N := _ri(g, 2, 4)) - 1, (C := _ri(g, 1, 3)), C), N),
        lambda s, L: label_sequences(s[1] + 1, s[2], L),
        ((2, 3, 3, 3), 4),
    ),
    "semimarkov": Case(
        SemiMarkov,
        D.SemiMarkovCRF,
        lambda g: ((_ri(g, 1, 2), (N := _ri(g, 2, 5)) - 1, _ri(g, 2, 3), (C := _ri(g, 1, 2)), C), N),
        lambda s, L: segmentations(s[1] + 1, s[2], s[3], L),
        ((2, 4, 3, 2, 2), 5),
    ),
    "dependency": Case(
        lambda: DependencyTree(True),
        lambda p, L: D.DependencyCRF(p, L, multiroot=True),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 4), N), N),
        lambda s, L: projective_trees(s[1], L, True),
        ((2, 4, 4), 4),
    ),
    "dependency_one_root": Case(
        lambda: DependencyTree(False),
        lambda p, L: D.DependencyCRF(p, L, multiroot=False),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 4), N), N),
        lambda s, L: projective_trees(s[1], L, False),
        ((2, 4, 4), 4),
    ),
    "nonprojective": Case(
        None,
        lambda p, L: D.NonProjectiveDependencyCRF(p, L, multiroot=True),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 4), N), N),
        lambda s, L: spanning_trees(s[1], L, True),
        ((2, 4, 4), 4),
    ),
    "nonprojective_one_root": Case(
        None,
        lambda p, L: D.NonProjectiveDependencyCRF(p, L),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 4), N), N),
        lambda s, L: spanning_trees(s[1], L, False),
        ((2, 4, 4), 4),
    ),
    "cky": Case(
        CKYTree,
        D.TreeCRF,
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 4), N, _ri(g, 1, 2)), N),
        lambda s, L: binary_trees(s[1], s[3], L),
        ((2, 3, 3, 2), 3),
    ),
    "alignment": Case(
        Alignment,
        lambda p, L: D.AlignmentCRF(p, lengths=L),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 3), _ri(g, 1, 3), 3), N),
        lambda s, L: alignments(s[1], s[2], L, False, None),
        ((2, 3, 4, 3), 3),
    ),
    "alignment_local_band": Case(
        lambda: Alignment(True, 1),
        lambda p, L: D.AlignmentCRF(p, local=True, lengths=L, max_gap=1),
        lambda g: ((_ri(g, 1, 2), N := _ri(g, 1, 3), _ri(g, 1, 3), 3), N),
        lambda s, L: alignments(s[1], s[2], L, True, 1),
        ((2, 3, 3, 3), 3),
    ),
}
STRUCTURES = [name for name, case in CASES.items() if case.structure is not None]


def ranked(pot: torch.Tensor, parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The enumerated structures of one item whose parts are all allowed, by score descending: (scores (T,),
    parts (T, *layout))."""
    if not parts:
        return pot.new_zeros(0), pot.new_zeros((0, *pot.shape))
    stacked = torch.stack(parts)
    scores = torch.where(stacked != 0, pot * stacked, 0.0).flatten(1).sum(-1)
    allowed = ~torch.isneginf(torch.where(stacked != 0, pot, 0.0)).flatten(1).any(-1)
    scores, stacked = scores[allowed], stacked[allowed]
    order = torch.sort(scores, descending=True, stable=True).indices
    return scores[order], stacked[order]


def as_set(parts: torch.Tensor) -> Counter[tuple[float, ...]]:
    """The structures (rows of parts (T, *layout)) as a multiset (an item of length 1 may have several
    structures of no part at all: the labels of its one position)."""
    return Counter(tuple(row) for row in parts.flatten(1).tolist())


# --- the semirings' operations against their definitions ---------------------------------------------------


def _sorted_lists(g: torch.Generator, k: int, shape: tuple[int, ...]) -> torch.Tensor:
    """(k, *shape) k-max values: descending along dim 0, with -inf tails."""
    x = torch.randn((k, *shape), generator=g, dtype=torch.float64)
    x = x.masked_fill(torch.rand((k, *shape), generator=g, dtype=torch.float64) < 0.3, -INF)
    return x.sort(0, descending=True).values


@settings(deadline=None, max_examples=20)
@given(k=st.integers(1, 6), seed=st.integers(0, 9999))
def test_kmax_operations_equal_their_definitions(k, seed):
    g = torch.Generator().manual_seed(seed)
    S = KMaxSemiring(k)
    x, y = _sorted_lists(g, k, (3, 4)), _sorted_lists(g, k, (3, 4))

    def top(c: torch.Tensor) -> torch.Tensor:  # the k largest of candidates (c, ...) by a plain sort
        c = torch.cat([c, c.new_full((max(0, k - c.shape[0]), *c.shape[1:]), -INF)])
        return c.sort(0, descending=True).values[:k]

    torch.testing.assert_close(S.plus(x, y), top(torch.cat([x, y])))
    torch.testing.assert_close(S.times(x, y), top((x[:, None] + y[None]).flatten(0, 1)))
    torch.testing.assert_close(S.sum(x, -1), top(x.movedim(-1, 0).flatten(0, 1)))
    torch.testing.assert_close(S.sum(x, 1), S.sum(x, -2))
    torch.testing.assert_close(S.dot(x, y), S.sum(S.times(x, y), -1))
    a, b = _sorted_lists(g, k, (2, 3, 5)), _sorted_lists(g, k, (2, 5, 4))
    want = S.sum(S.times(a.unsqueeze(-1), b.unsqueeze(-3)), -2)
    torch.testing.assert_close(S.matmul(a, b), want)
    torch.testing.assert_close(S.matmul(a, b[:, 0]), S.sum(S.times(a.unsqueeze(-1), b[:, :1].unsqueeze(-3)), -2))


def test_kmax_class_is_cached_and_k_is_checked():
    assert KMaxSemiring(3) is KMaxSemiring(3) and KMaxSemiring(3) is not KMaxSemiring(4)
    assert KMaxSemiring(3).lead == 1 and KMaxSemiring(3).k == 3 and KMaxSemiring(3).kernel_id is None
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            KMaxSemiring(bad)
    S = KMaxSemiring(3)
    p = torch.tensor([1.5, -2.0])
    torch.testing.assert_close(S.convert(p), torch.tensor([[1.5, -2.0], [-INF, -INF], [-INF, -INF]]))
    torch.testing.assert_close(S.ones((2,), like=p), torch.tensor([[0.0, 0.0], [-INF, -INF], [-INF, -INF]]))
    assert torch.isneginf(S.zeros((2,), like=p)).all() and S.identity(2).shape == (3, 2, 2)
    with pytest.raises(ValueError, match="dim 0 of a value of 2 dims"):
        S.sum(S.convert(p), 0)


def test_blocked_matmul_equals_one_block(monkeypatch):
    g = torch.Generator().manual_seed(0)
    for S in (KMaxSemiring(3), EntropySemiring, SampledSemiring):
        a = S.convert(torch.randn(2, 7, 5, generator=g, dtype=torch.float64))
        b = S.convert(torch.randn(2, 5, 3, generator=g, dtype=torch.float64))
        whole = SS.generic_matmul(S, a, b)
        monkeypatch.setattr(SS, "MATMUL_BLOCK_ELEMENTS", 16)  # one row per block
        torch.testing.assert_close(SS.generic_matmul(S, a, b), whole)
        monkeypatch.undo()
    with pytest.raises(ValueError, match=r"\(\.\.\., n, j\) x \(\.\.\., j, m\)"):
        SS.generic_matmul(EntropySemiring, a, b.transpose(-1, -2))


def test_kmax_of_one_is_max_and_its_gradient_the_argmax():
    """torch-struct's tests/test_semirings.py::test_max in float64, with ties excluded by the data."""
    g = torch.Generator().manual_seed(0)
    t1 = torch.rand(4, 1, 6, generator=g, dtype=torch.float64, requires_grad=True)
    t2 = torch.rand(1, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    r1 = MaxSemiring.dot(t1, t2)
    want = torch.autograd.grad(r1.sum(), (t1, t2))
    for k in (1, 2, 3):
        S = KMaxSemiring(k)
        c1, c2 = S.convert(t1), S.convert(t2)
        r = S.dot(c1, c2)
        torch.testing.assert_close(r[0], r1)
        got = torch.autograd.grad(r[0].sum(), (t1, t2))
        for w, h in zip(want, got, strict=True):
            torch.testing.assert_close(h, w)


@pytest.mark.parametrize(
    "S",
    [KMaxSemiring(1), KMaxSemiring(3), EntropySemiring, CrossEntropySemiring, KLDivergenceSemiring, SampledSemiring],
    ids=lambda S: S.__name__,
)
def test_all_minus_inf_gives_the_zero_and_no_nan(S):
    """A sum whose every term is the semiring's zero is the zero, with a zero (not NaN) gradient; and a mix."""
    pot = torch.tensor([[-INF, -INF, -INF], [0.5, -INF, 1.0]], dtype=torch.float64, requires_grad=True)
    value = S.convert((pot, pot) if S in (CrossEntropySemiring, KLDivergenceSemiring) else pot)
    total = S.sum(value, -1)
    zero = S.zeros((1,), like=pot)
    torch.testing.assert_close(total[..., :1], zero, equal_nan=False)
    reported = S.unconvert(total)
    (grad,) = torch.autograd.grad(reported.sum(), pot)
    assert not grad.isnan().any() and (grad[0] == 0).all()
    assert not S.unconvert(S.times(value, S.zeros((2, 3), like=pot))).isnan().any()


def test_expectation_semirings_on_one_sum_equal_their_definitions():
    g = torch.Generator().manual_seed(4)
    p, q = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    lp, lq = p.log_softmax(-1), q.log_softmax(-1)
    H = -(lp.exp() * lp).sum(-1)
    CE = -(lp.exp() * lq).sum(-1)
    torch.testing.assert_close(EntropySemiring.unconvert(EntropySemiring.sum(EntropySemiring.convert(p))), H)
    torch.testing.assert_close(
        CrossEntropySemiring.unconvert(CrossEntropySemiring.sum(CrossEntropySemiring.convert((p, q)))), CE
    )
    kl = KLDivergenceSemiring.unconvert(KLDivergenceSemiring.sum(KLDivergenceSemiring.convert(torch.stack([p, q]))))
    torch.testing.assert_close(kl, CE - H)
    pair = EntropySemiring.convert(p)
    torch.testing.assert_close(
        EntropySemiring.plus(pair[..., :2], pair[..., 2:4]),
        EntropySemiring.sum(torch.stack([pair[..., :2], pair[..., 2:4]], -1)),
    )
    with pytest.raises(ValueError, match="differ"):
        CrossEntropySemiring.convert((p, q[:, :2]))
    # q forbids what p allows: H(p, q) = +inf
    q_forbid = q.clone()
    q_forbid[0, 0] = -INF
    ce = CrossEntropySemiring.unconvert(CrossEntropySemiring.sum(CrossEntropySemiring.convert((p, q_forbid))))
    assert ce[0] == INF and torch.isfinite(ce[1:]).all()


def test_sampled_semiring_backward_draws_in_proportion():
    logits = torch.tensor([[0.0, math.log(2.0), -INF, math.log(5.0)]], dtype=torch.float64)
    n = 20000
    x = logits.expand(n, 4).clone().requires_grad_()
    S = SampledSemiring.using(torch.Generator().manual_seed(0))
    total = S.sum(x, -1)
    torch.testing.assert_close(total, torch.logsumexp(x.detach(), -1))
    (draws,) = torch.autograd.grad(total.sum(), x)
    assert (draws.sum(-1) == 1).all() and (draws[:, 2] == 0).all()
    freq = draws.mean(0)
    torch.testing.assert_close(freq, torch.tensor([1 / 8, 2 / 8, 0, 5 / 8], dtype=torch.float64), atol=0.015, rtol=0)
    # the same generator state, the same draws; the global generator without one
    again = SampledSemiring.using(torch.Generator().manual_seed(0))
    (draws2,) = torch.autograd.grad(again.sum(x, -1).sum(), x)
    assert torch.equal(draws, draws2)
    assert SampledSemiring.using(None) is SampledSemiring and SampledSemiring.generator is None


def test_categorical_one_hot_never_draws_zero_weight():
    w = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1e-300, 0.0, 0.0, 1.0]], dtype=torch.float64)
    for seed in range(50):
        draw = categorical_one_hot(w, -1, torch.Generator().manual_seed(seed))
        assert draw[0].tolist() == [0, 0, 1, 0] and draw[1].sum() == 0 and draw[2, 1:3].sum() == 0


# --- structures: k best, entropy / cross-entropy / KL by semiring, against enumeration ------------------------


@pytest.mark.parametrize("name", STRUCTURES)
@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 99999), forbid=st.sampled_from([0.0, 0.25]))
def test_k_best_equals_enumeration(name, seed, forbid):
    case = CASES[name]
    structure = case.structure()
    pot, lengths, enums = case.make(torch.Generator().manual_seed(seed), forbid)
    ranks = [ranked(pot[b], enums[b]) for b in range(pot.shape[0])]
    most = max(len(s) for s, _ in ranks)
    for k in sorted({1, 2, 3, most + 2}):
        scores = structure.kmax(pot, k, lengths)
        parts = structure.topk(pot, k, lengths)
        assert scores.shape == (k, pot.shape[0]) and parts.shape == (k, *pot.shape)
        for b, (want, want_parts) in enumerate(ranks):
            n = min(k, len(want))
            torch.testing.assert_close(scores[:n, b], want[:n])
            assert torch.isneginf(scores[n:, b]).all() and (parts[n:, b] == 0).all()
            got = parts[:n, b]
            assert set(got.unique().tolist()) <= {0.0, 1.0}
            assert as_set(got) <= as_set(want_parts)  # n different structures of the enumeration
            torch.testing.assert_close(torch.where(got != 0, pot[b] * got, 0.0).flatten(1).sum(-1), want[:n])


@pytest.mark.parametrize("name", STRUCTURES)
def test_k_best_with_ties_lists_every_structure_once(name):
    case = CASES[name]
    pot, lengths, enums = case.make(torch.Generator().manual_seed(7))
    pot = torch.zeros_like(pot)  # every structure scores 0
    count = max(len(e) for e in enums)
    parts = case.structure().topk(pot, count + 1, lengths)
    again = case.structure().topk(pot, count + 1, lengths)
    assert torch.equal(parts, again)  # deterministic
    for b, e in enumerate(enums):
        assert as_set(parts[: len(e), b]) == as_set(torch.stack(e)) and (parts[len(e) :, b] == 0).all()


@pytest.mark.parametrize("name", STRUCTURES)
@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 99999), forbid=st.sampled_from([0.0, 0.25]))
def test_entropy_cross_entropy_kl_semirings_equal_marginals_and_enumeration(name, seed, forbid):
    case = CASES[name]
    structure = case.structure()
    g = torch.Generator().manual_seed(seed)
    p, lengths, enums = case.make(g, forbid)
    q = torch.where(torch.isneginf(p), -INF, torch.randn(p.shape, generator=g, dtype=torch.float64))
    some = torch.tensor([len(ranked(p[b], e)[0]) > 0 for b, e in enumerate(enums)])
    by = {
        m: (structure.entropy(p, lengths, m), structure.cross_entropy(p, q, lengths, m), structure.kl(p, q, lengths, m))
        for m in ("marginals", "semiring")
    }
    for got, want in zip(by["semiring"], by["marginals"], strict=True):
        torch.testing.assert_close(got[some], want[some])
    for b, e in enumerate(enums):
        if not some[b]:
            assert by["semiring"][0][b] == 0  # no structure: the entropy semiring's zero has entropy 0
            continue
        sp, parts = ranked(p[b], e)
        sq = torch.where(parts != 0, q[b] * parts, 0.0).flatten(1).sum(-1)
        lp, lq = sp.log_softmax(0), sq.log_softmax(0)
        H, CE = -(lp.exp() * lp).sum(), -(lp.exp() * lq).sum()
        torch.testing.assert_close(by["semiring"][0][b], H)
        torch.testing.assert_close(by["semiring"][1][b], CE)
        torch.testing.assert_close(by["semiring"][2][b], CE - H)
    with pytest.raises(ValueError, match="method must be"):
        structure.entropy(p, lengths, "enumeration")


def test_semiring_entropy_is_differentiable_and_matches_marginal_gradient():
    g = torch.Generator().manual_seed(3)
    pot = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 3])
    chain = LinearChain()
    (g1,) = torch.autograd.grad(chain.entropy(pot, lengths, "semiring").sum(), pot)
    (g2,) = torch.autograd.grad(chain.entropy(pot, lengths).sum(), pot)
    torch.testing.assert_close(g1, g2)


def test_value_reports_what_the_semiring_reports():
    g = torch.Generator().manual_seed(5)
    pot = torch.randn(3, 4, 4, 2, generator=g, dtype=torch.float64)
    cky = CKYTree()
    torch.testing.assert_close(cky.value(pot, None, LogSemiring), cky.partition(pot))
    torch.testing.assert_close(cky.value(pot, None, KMaxSemiring(2))[0], cky.max(pot))
    assert cky.kmax(pot, 4).shape == (4, 3) and not cky.kmax(pot.requires_grad_(), 2).requires_grad


def test_the_zero_absorbs_the_expectations():
    """An item whose top span is forbidden has no tree, though its sub-spans have entropy: the expectation
    semirings report 0 for it; where q allows no tree that p allows, H(p, q) = KL = +inf."""
    pot = torch.randn(2, 3, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pot[1, 0, 2] = -INF
    cky = CKYTree()
    H = cky.entropy(pot, None, "semiring")
    assert H[1] == 0 and H[0] > 0
    assert cky.cross_entropy(pot, pot, None, "semiring")[1] == 0 and cky.kl(pot, pot, None, "semiring")[1] == 0
    q = pot.clone()
    q[0, 0, 2] = -INF
    assert cky.cross_entropy(pot, q, None, "semiring")[0] == INF and cky.kl(pot, q, None, "semiring")[0] == INF
    assert cky.cross_entropy(pot, q, None)[0] == INF  # the marginals' way agrees
