"""semiring_ops.distributions against torch-struct's distribution classes (where torch-struct runs and is exact)
and against the structures' own enumeration-tested answers: partition, marginals, argmax, max, entropy,
count, log_prob, cross_entropy, kl."""

from __future__ import annotations

import pytest
import torch

from semiring_ops import distributions as D


def _pair(make, shape, seed, **kwargs):
    g = torch.Generator().manual_seed(seed)
    p, q = torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)
    return make(p, **kwargs), make(q, **kwargs)


CASES = {  # name: (class, shape, kwargs) at full lengths, where torch-struct 0.5 is exact
    "LinearChainCRF": (7, 4, 4),
    "SemiMarkovCRF": (6, 3, 3, 3),
    "TreeCRF": (5, 5, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_answers_as_torch_struct(name):
    ts = pytest.importorskip("torch_struct")
    shape = (3, *CASES[name])
    ours, ours_q = _pair(getattr(D, name), shape, seed=1)
    theirs, theirs_q = _pair(getattr(ts, name), shape, seed=1)
    for member in ("partition", "marginals", "argmax", "max", "count"):
        torch.testing.assert_close(getattr(ours, member), getattr(theirs, member).detach(), msg=member)
    torch.testing.assert_close(ours.entropy(), theirs.entropy.detach())
    if name != "SemiMarkovCRF":  # torch-struct 0.5's SemiMarkov cross_entropy / kl raise ('list' object has no
        # attribute 'requires_grad_'): ours are checked against the definition below
        torch.testing.assert_close(ours.cross_entropy(ours_q), theirs.cross_entropy(theirs_q).detach())
        torch.testing.assert_close(ours.kl(ours_q), theirs.kl(theirs_q).detach())
    manual = ours_q.partition - (ours.marginals * ours_q.log_potentials).flatten(1).sum(-1)
    torch.testing.assert_close(ours.cross_entropy(ours_q), manual)
    torch.testing.assert_close(ours.kl(ours_q), manual - ours.entropy())
    value = theirs.argmax.detach()
    torch.testing.assert_close(ours.log_prob(value), theirs.log_prob(value).detach())
    twice = value[None].expand(2, *value.shape)  # a sample dimension in front
    torch.testing.assert_close(ours.log_prob(twice), theirs.log_prob(value)[None].expand(2, -1).detach())


def test_dependency_alignment_and_nonprojective_use_their_structures():
    g = torch.Generator().manual_seed(3)
    arc = torch.randn(2, 4, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    dep = D.DependencyCRF(arc, lengths, multiroot=False)
    assert dep.argmax.sum((1, 2)).tolist() == [4.0, 3.0] and dep.marginals.shape == arc.shape
    nonproj = D.NonProjectiveDependencyCRF(arc, lengths)
    assert not nonproj.multiroot and torch.all(nonproj.partition >= dep.partition)  # more trees, crossings allowed
    torch.testing.assert_close(nonproj.count, torch.tensor([64.0, 9.0], dtype=torch.float64))  # n^(n-1) single-root
    align = D.AlignmentCRF(torch.randn(2, 3, 4, 3, generator=g, dtype=torch.float64), local=True, max_gap=2)
    assert align.partition.shape == (2,) and torch.isfinite(align.entropy()).all()
    assert (dep.kl(D.DependencyCRF(arc, lengths, multiroot=False)).abs() < 1e-12).all()  # KL(p || p) = 0


def test_log_prob_checks_the_event_shape():  # (sample / topk / enumerate_support: tests/test_distribution_sampling.py)
    dist = D.TreeCRF(torch.randn(1, 3, 3, 2))
    with pytest.raises(ValueError, match=r"value's event shape \(1, 3, 3\) is not \(3, 3, 2\)"):
        dist.log_prob(torch.zeros(1, 3, 3))
