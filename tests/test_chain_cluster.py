"""The chain kernels' cluster path (sm_90+): a chain's steps split over K thread blocks that exchange each
step's outputs through distributed shared memory. SEMIRING_OPS_CHAIN_CLUSTER forces K, so every cluster
size runs at small C, with slices that straddle the tag count (C = 5 over 4 blocks: 2, 2, 1 and 0 tags);
large C in float32 takes clusters on its own. Checked against the PyTorch twins (reference.py) on fresh
random inputs in float64: forward and reverse scans with their saved scores, Viterbi tags, the CRF loss and
its whole gradient, -inf transitions and impossible chains."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.build import reference
from semiring_ops.ops import chain_ops
from semiring_ops.semirings import resolve_semiring

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("needs_clusters")]


def _problem(B, T, C, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    em = torch.randn(B, T, C, generator=g, dtype=dtype)
    trans = torch.randn(C, C, generator=g, dtype=dtype)
    start, end = torch.randn(C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    tags = torch.randint(0, C, (B, T), generator=g)
    return [x.cuda() for x in (em, trans, start, end, lengths, tags)]


CLUSTERS = [1, 2, 4, 8, 16]
SIZES = [5, 33, 67, 130]


@pytest.mark.parametrize("K", CLUSTERS)
@pytest.mark.parametrize("C", SIZES)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), semiring=st.sampled_from(["log", "max", "min", "std"]))
def test_scans_and_viterbi_match_the_reference(monkeypatch, K, C, seed, semiring):
    monkeypatch.setenv("SEMIRING_OPS_CHAIN_CLUSTER", str(K))
    em, trans, start, end, lengths, _ = _problem(3, 7, C, seed)
    if semiring == "std":  # products of positive potentials
        em, trans, start, end = (x.abs() * 0.1 for x in (em, trans, start, end))
    sid = resolve_semiring(semiring).kernel_id
    for reverse in (False, True):
        total, scores = chain_ops.chain_scan(em, trans, start, end, lengths, sid, reverse, True)
        want_total, want_scores = reference.chain_scan(em, trans, start, end, lengths, sid, reverse, True)
        torch.testing.assert_close(total, want_total)
        torch.testing.assert_close(scores, want_scores)
    if semiring in ("max", "min"):
        score, tags = chain_ops.chain_viterbi(em, trans, start, end, lengths, sid)
        want_score, want_tags = reference.chain_viterbi(em, trans, start, end, lengths, sid)
        torch.testing.assert_close(score, want_score)
        assert torch.equal(tags, want_tags)


@pytest.mark.parametrize("K", CLUSTERS)
@pytest.mark.parametrize("C", SIZES)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), with_tags=st.booleans())
def test_crf_loss_and_gradient_match_the_reference(monkeypatch, K, C, seed, with_tags):
    """Forward (log Z, the gold path) and the one-scan backward (marginals, start / end sums, and the pair
    marginals summed on chip by each block for its own rows, or off chip)."""
    monkeypatch.setenv("SEMIRING_OPS_CHAIN_CLUSTER", str(K))
    em, trans, start, end, lengths, tags = _problem(4, 6, C, seed)
    lengths[1] = 0
    grad = torch.randn(4, dtype=torch.float64, device="cuda")
    llh, alpha, log_z = chain_ops.crf_log_likelihood_eager(em, trans, start, end, lengths, tags)
    want_llh, want_alpha, want_log_z = reference.crf_log_likelihood(em, trans, start, end, lengths, tags)
    torch.testing.assert_close(llh, want_llh)
    torch.testing.assert_close(log_z, want_log_z)
    live = (torch.arange(6, device="cuda")[None, :] < lengths[:, None])[..., None]
    torch.testing.assert_close(alpha.where(live, 0), want_alpha.where(live, 0))
    gold = tags if with_tags else None
    got = chain_ops.chain_log_backward_eager(em, trans, start, end, lengths, alpha, log_z, grad, gold)
    want = reference.chain_log_backward(em, trans, start, end, lengths, want_alpha, want_log_z, grad, gold)
    for name, g, w in zip(("emissions", "transitions", "start", "end"), got, want, strict=True):
        torch.testing.assert_close(g, w, msg=lambda m, name=name: f"d/d{name}: {m}")


@pytest.mark.parametrize("K", [2, 4, 16])
def test_forbidden_transitions_and_impossible_chains(monkeypatch, K):
    """-inf transitions are never on a path; a chain with no legal start sums to -inf with zero gradient."""
    monkeypatch.setenv("SEMIRING_OPS_CHAIN_CLUSTER", str(K))
    C = 37
    em, trans, start, end, lengths, _ = _problem(3, 8, C, seed=K)
    trans = trans.masked_fill(torch.eye(C, dtype=torch.bool, device="cuda"), -math.inf)
    sid = resolve_semiring("log").kernel_id
    _, tags = chain_ops.chain_viterbi(em, trans, start, end, lengths, resolve_semiring("max").kernel_id)
    for b in range(3):
        path = tags[b, : int(lengths[b])]
        assert (path[1:] != path[:-1]).all()
    dead = torch.full_like(start, -math.inf)
    total, alpha = chain_ops.chain_scan(em, trans, dead, end, lengths, sid, False, True)
    live = lengths > 0
    assert (total[live] == -math.inf).all()
    grad = torch.ones(3, dtype=torch.float64, device="cuda")
    g_em, g_trans, g_start, g_end = chain_ops.chain_log_backward_eager(
        em, trans, dead, end, lengths, alpha, total, grad
    )
    for g in (g_em, g_trans, g_start, g_end):
        assert not g.isnan().any() and (g == 0).all()


@pytest.mark.parametrize("C", [300, 512])
def test_large_tag_sets_in_float32_take_clusters_on_their_own(C):
    """No override: C = 300 and 512 in float32 do not fit one SM's shared memory, so the chains run on
    clusters; checked against the float64 twin."""
    em, trans, start, end, lengths, tags = _problem(2, 5, C, seed=C)
    f32 = [x.float() for x in (em, trans, start, end)]
    sid = resolve_semiring("log").kernel_id
    total, _ = chain_ops.chain_scan(*f32, lengths, sid, False, False)
    want, _ = reference.chain_scan(em, trans, start, end, lengths, sid, False, False)
    torch.testing.assert_close(total.double(), want, rtol=1e-5, atol=1e-4)
    llh, alpha, log_z = chain_ops.crf_log_likelihood_eager(*f32, lengths, tags)
    want_llh, want_alpha, want_log_z = reference.crf_log_likelihood(em, trans, start, end, lengths, tags)
    torch.testing.assert_close(llh.double(), want_llh, rtol=1e-5, atol=1e-3)
    grad = torch.tensor([1.0, -0.5], device="cuda")
    got = chain_ops.chain_log_backward_eager(*f32, lengths, alpha, log_z, grad, tags)
    want = reference.chain_log_backward(em, trans, start, end, lengths, want_alpha, want_log_z, grad.double(), tags)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)
    max_id = resolve_semiring("max").kernel_id
    score, path = chain_ops.chain_viterbi(*f32, lengths, max_id)
    want_score, want_path = reference.chain_viterbi(em, trans, start, end, lengths, max_id)
    torch.testing.assert_close(score.double(), want_score, rtol=1e-5, atol=1e-4)
    assert torch.equal(path, want_path)


def test_bad_override_names_the_variable(monkeypatch):
    monkeypatch.setenv("SEMIRING_OPS_CHAIN_CLUSTER", "3")
    em, trans, start, end, lengths, _ = _problem(1, 2, 4, seed=0)
    with pytest.raises(RuntimeError, match="SEMIRING_OPS_CHAIN_CLUSTER"):
        chain_ops.chain_scan(em, trans, start, end, lengths, resolve_semiring("log").kernel_id, False, False)
