"""semiring_ops.distributions' sample, topk / kmax, enumerate_support and HMM: samples against the enumerated
Gibbs distribution (chi-square goodness of fit at a fixed seed, every sample a structure of the enumeration),
k best and the support against enumeration, for every structure (CASES of tests/test_structure_semirings.py,
float64, tiny sizes); HMM against torch-struct's."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from semiring_ops import distributions as D
from semiring_ops.structures import nonprojective
from tests.test_structure_semirings import CASES, as_set, ranked

SAMPLES = 3000
P_MIN = 1e-3  # chi-square p-values at the fixed seeds are far above it; a biased sampler gives ~0


def _fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """The chi-square p-value of observed ``counts`` against ``probs``, bins of expected count < 5 merged."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum().view(1)]) if small.any() else expected
    if len(obs) < 2:
        return 1.0
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


@pytest.mark.parametrize("name", list(CASES))
def test_samples_are_structures_drawn_from_the_distribution(name):
    case = CASES[name]
    g = torch.Generator().manual_seed(11)
    pot, lengths, enums = case.make(g, fixed=True)
    pot = pot * 0.7  # probabilities spread enough for most structures to be seen
    dist = case.dist(pot, lengths)
    samples = dist.sample((SAMPLES,), generator=torch.Generator().manual_seed(12))
    assert samples.shape == (SAMPLES, *pot.shape)
    for b, parts_list in enumerate(enums):
        scores, parts = ranked(pot[b], parts_list)
        rows = samples[:, b].flatten(1)
        hit = (rows[:, None, :] == parts.flatten(1)[None]).all(-1)  # (SAMPLES, T)
        assert (hit.sum(1) >= 1).all(), "a sample that is no structure of the enumeration"
        if len(as_set(parts)) < len(parts):  # structures without parts (one position's labels): one bin
            continue
        counts = hit.sum(0).double()
        p_value = _fit(counts, scores.softmax(0))
        assert p_value > P_MIN, f"item {b}: chi-square p = {p_value:.2e} over {len(parts)} structures"
        if len(parts) >= 20:  # the test's power: the distribution at another temperature is rejected
            assert _fit(counts, (1.3 * scores).softmax(0)) < P_MIN


@pytest.mark.parametrize("name", list(CASES))
def test_sample_shapes_seeds_and_the_global_generator(name):
    case = CASES[name]
    pot, lengths, _ = case.make(torch.Generator().manual_seed(2))
    dist = case.dist(pot, lengths)
    one = dist.sample(generator=torch.Generator().manual_seed(0))
    assert one.shape == pot.shape
    grid = dist.sample((2, 3), generator=torch.Generator().manual_seed(0))
    assert grid.shape == (2, 3, *pot.shape)
    assert torch.equal(grid, dist.sample((2, 3), generator=torch.Generator().manual_seed(0)))
    assert dist.sample((0,)).shape == (0, *pot.shape)
    torch.manual_seed(5)
    a = dist.sample((4,))
    torch.manual_seed(5)
    assert torch.equal(a, dist.sample((4,)))
    assert set(a.unique().tolist()) <= {0.0, 1.0}


def test_an_item_without_structure_samples_all_zeros_and_forbidden_parts_never():
    g = torch.Generator().manual_seed(1)
    pot = torch.randn(3, 3, 2, 2, generator=g, dtype=torch.float64)
    pot[1] = -math.inf  # item 1: no label sequence at all
    pot[2, :, 0, :] = -math.inf  # item 2: label 0 never follows anything
    arc = torch.randn(3, 3, 3, generator=g, dtype=torch.float64)
    arc[1] = -math.inf  # no tree
    arc[2, 0, 1] = arc[2, 2, 2] = -math.inf
    for dist in (D.LinearChainCRF(pot), D.NonProjectiveDependencyCRF(arc), D.DependencyCRF(arc)):
        samples = dist.sample((200,), generator=torch.Generator().manual_seed(0))
        forbidden = torch.isneginf(dist.log_potentials).to(samples.dtype)
        assert not samples.isnan().any() and (samples * forbidden).sum() == 0 and (samples[:, 1] == 0).all()
        assert (samples[:, 0].flatten(1).sum(-1) > 0).all()
    chain = D.LinearChainCRF(pot).sample((50,))
    assert (chain[:, 1] == 0).all() and (chain[:, 2, :, 0, :] == 0).all() and (chain[:, 0].sum((1, 2, 3)) == 3).all()


@pytest.mark.parametrize("name", list(CASES))
def test_kmax_and_topk_equal_enumeration(name):
    case = CASES[name]
    pot, lengths, enums = case.make(torch.Generator().manual_seed(21), forbid=0.2)
    dist = case.dist(pot, lengths)
    for k in (1, 2, 3, 40):
        scores, parts = dist.kmax(k), dist.topk(k)
        log_probs = dist.log_prob(parts)  # (k, B)
        assert scores.shape == (k, pot.shape[0]) and parts.shape == (k, *pot.shape)
        for b, e in enumerate(enums):
            want, want_parts = ranked(pot[b], e)
            n = min(k, len(want))
            torch.testing.assert_close(scores[:n, b], want[:n])
            assert torch.isneginf(scores[n:, b]).all() and (parts[n:, b] == 0).all()
            assert as_set(parts[:n, b]) <= as_set(want_parts)
            torch.testing.assert_close(log_probs[:n, b], want[:n] - dist.partition[b])


@pytest.mark.parametrize("name", list(CASES))
def test_enumerate_support_is_the_enumeration(name):
    case = CASES[name]
    pot, lengths, enums = case.make(torch.Generator().manual_seed(31), forbid=0.15)
    dist = case.dist(pot, lengths)
    assert dist.has_enumerate_support
    support = dist.enumerate_support()
    counts = [len(ranked(pot[b], e)[0]) for b, e in enumerate(enums)]
    assert support.shape == (max(counts), *pot.shape)
    torch.testing.assert_close(dist.count, torch.tensor(counts, dtype=torch.float64))
    log_probs = dist.log_prob(support)  # (K, B)
    for b, e in enumerate(enums):
        assert as_set(support[: counts[b], b]) == as_set(ranked(pot[b], e)[1])
        assert (support[counts[b] :, b] == 0).all()
        if counts[b]:
            torch.testing.assert_close(log_probs[: counts[b], b].exp().sum(), torch.tensor(1.0, dtype=torch.float64))


def test_enumerate_support_expand_false_and_the_limit(monkeypatch):
    g = torch.Generator().manual_seed(4)
    pot = torch.randn(3, 3, 3, 2, generator=g, dtype=torch.float64)
    dist = D.TreeCRF(pot)
    full = dist.enumerate_support()
    assert full.shape == (64, 3, 3, 3, 2)  # 2 bracketings x 2^5 labels of their 5 spans
    single = dist.enumerate_support(expand=False)
    assert single.shape == (64, 1, 3, 3, 2) and as_set(single[:, 0]) == as_set(full[:, 1])
    with pytest.raises(ValueError, match="different supports"):
        D.TreeCRF(pot, torch.tensor([3, 2, 3])).enumerate_support(expand=False)
    monkeypatch.setattr(D, "ENUMERATION_LIMIT", 63)
    with pytest.raises(ValueError, match="64 structures, more than ENUMERATION_LIMIT = 63"):
        dist.enumerate_support()
    monkeypatch.setattr(nonprojective, "ENUMERATION_LIMIT", 63)  # (the structure ranks its trees itself)
    with pytest.raises(ValueError, match="item 0 has 125, more than ENUMERATION_LIMIT"):
        D.NonProjectiveDependencyCRF(torch.randn(1, 4, 4, generator=g), multiroot=True).topk(2)


def test_enumerate_support_of_a_thousand_structures():
    pot = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    dist = D.LinearChainCRF(pot)
    support = dist.enumerate_support()  # 4^5 = 1024 label sequences: 20 backward passes of 52 slots each
    assert support.shape == (1024, 1, 4, 4, 4) and len(as_set(support[:, 0])) == 1024
    torch.testing.assert_close(dist.log_prob(support).exp().sum(), torch.tensor(1.0, dtype=torch.float64))
    scores = dist.kmax(1024)[:, 0]
    assert (scores[:-1] >= scores[1:]).all()


def test_entropy_is_a_property_and_a_method():
    pot = torch.randn(2, 3, 3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    dist = D.LinearChainCRF(pot)
    assert type(dist.entropy()) is torch.Tensor and type(dist.entropy + 0) is torch.Tensor
    torch.testing.assert_close(dist.entropy(), dist.entropy.as_subclass(torch.Tensor))
    torch.testing.assert_close(dist.entropy, D.LinearChainCRF(pot).entropy())
    torch.testing.assert_close(dist.kl(D.LinearChainCRF(pot)), torch.zeros(2, dtype=torch.float64))


def _hmm_params(g, C=3, V=5, B=3, N=6):
    transition = torch.randn(C, C, generator=g, dtype=torch.float64).log_softmax(0)
    emission = torch.randn(V, C, generator=g, dtype=torch.float64).log_softmax(0)
    init = torch.randn(C, generator=g, dtype=torch.float64).log_softmax(0)
    return transition, emission, init, torch.randint(0, V, (B, N), generator=g)


@pytest.mark.filterwarnings("ignore:.*does not define `arg_constraints`")
def test_hmm_equals_torch_structs():
    ts = pytest.importorskip("torch_struct")
    params = _hmm_params(torch.Generator().manual_seed(0))
    ours, theirs = D.HMM(*params), ts.HMM(*params)
    torch.testing.assert_close(ours.log_potentials, theirs.log_potentials, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.partition, theirs.partition.detach(), rtol=0, atol=1e-8)
    torch.testing.assert_close(ours.marginals, theirs.marginals.detach(), rtol=0, atol=1e-8)
    torch.testing.assert_close(ours.argmax, theirs.argmax.detach())
    assert isinstance(ours, D.LinearChainCRF)


def test_hmm_partition_is_the_likelihood_of_the_observations():
    """log Z of an HMM is log p(x): the forward algorithm, written out."""
    transition, emission, init, obs = _hmm_params(torch.Generator().manual_seed(1), N=4)
    lengths = torch.tensor([4, 2, 3])
    dist = D.HMM(transition, emission, init, obs, lengths)
    for b in range(3):
        alpha = init + emission[obs[b, 0]]
        for n in range(1, int(lengths[b])):
            alpha = torch.logsumexp(transition + alpha[None, :], 1) + emission[obs[b, n]]
        torch.testing.assert_close(dist.partition[b], torch.logsumexp(alpha, 0))


def test_hmm_checks_its_arguments():
    transition, emission, init, obs = _hmm_params(torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"observations \(B, N >= 2\)"):
        D.HMM(transition, emission, init, obs[:, :1])
    with pytest.raises(ValueError, match=r"transition \(C, C\)"):
        D.HMM(transition[:2], emission, init, obs)
