"""The CRF's fused loss (crf_log_likelihood: log Z and the gold path's score in one forward scan; its
gradient, chain_log_backward with the tags, in one reverse scan) and the one-round-trip validation of masks,
lengths and tags (sequence_lengths), on the compiled kernels and their PyTorch twins (the `impl` fixture),
CPU and CUDA, against enumeration and against autograd through the generic chain engine."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.build import reference
from semiring_ops.ops.chain_ops import chain_scan, chain_viterbi_eager, sequence_lengths_eager
from semiring_ops.semirings import LogSemiring, MaxSemiring
from semiring_ops.structures import LinearChainCRF, chain_sum
from semiring_ops.structures.factored import chain_log_likelihood_factored, factored_to_edges


def _problem(B, T, C, device, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    em = torch.randn(B, T, C, generator=g, dtype=dtype)
    trans, start, end = torch.randn(C, C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype), None
    end = torch.randn(C, generator=g, dtype=dtype)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    tags = torch.randint(0, C, (B, T), generator=g)
    tags = torch.where(torch.arange(T)[None, :] < lengths[:, None], tags, 10 * C + 7)  # junk past each length
    return [x.to(device) for x in (em, trans, start, end, lengths, tags)]


def _want(em, trans, start, end, lengths, tags):
    """gold - log Z by differentiable torch ops and the generic (explicit-edge) engine."""
    if em.shape[1] == 0:
        log_z = em.new_zeros(em.shape[0]) + 0 * (trans.sum() + start.sum() + end.sum())  # every length is 0
    else:
        log_z = chain_sum(*factored_to_edges(em, trans, start, end, LogSemiring), lengths, LogSemiring)
    gold = reference.gold_path_score(em, trans, start, end, lengths, tags)
    return gold - log_z


@given(B=st.integers(1, 4), T=st.integers(0, 7), C=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_log_likelihood_and_gradients_match_the_generic_engine(impl, device, B, T, C, seed):
    em, trans, start, end, lengths, tags = _problem(B, T, C, device, seed)
    leaves = [x.requires_grad_() for x in (em, trans, start, end)]
    weights = torch.randn(B, dtype=torch.float64, device=device)  # negative weights too
    got = chain_log_likelihood_factored(*leaves, lengths, tags)
    want = _want(*leaves, lengths, tags)
    torch.testing.assert_close(got, want)
    g_got = torch.autograd.grad((got * weights).sum(), leaves)
    g_want = torch.autograd.grad((want * weights).sum(), leaves, allow_unused=True)
    for g, w, x in zip(g_got, g_want, leaves, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(x) if w is None else w)


def test_gradcheck(impl, device):
    em, trans, start, end, _, tags = _problem(3, 5, 4, device, seed=3)
    lengths = torch.tensor([5, 2, 0], device=device)
    tags = tags.clamp(0, 3)
    inputs = [x.requires_grad_() for x in (em, trans, start, end)]
    assert torch.autograd.gradcheck(lambda *xs: chain_log_likelihood_factored(*xs, lengths, tags), inputs)


def test_forbidden_gold_path_is_minus_inf_with_zero_gradient(impl, device):
    """A gold path through a forbidden (-inf) transition has log-likelihood -inf and no gradient (not NaN);
    the other chains are unaffected; an all -inf chain too."""
    em, trans, start, end, _, _ = _problem(3, 5, 4, device, seed=5)
    lengths = torch.tensor([5, 5, 3], device=device)
    trans = trans.clone()
    trans[1, 2] = -math.inf
    tags = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 3], [2, 1, 2, 0, 0]], device=device)
    em[2] = -math.inf  # chain 2: every path -inf
    leaves = [x.requires_grad_() for x in (em, trans, start, end)]
    llh = chain_log_likelihood_factored(*leaves, lengths, tags)
    assert llh[0] == -math.inf and llh[2] == -math.inf and torch.isfinite(llh[1])
    grads = torch.autograd.grad(llh.masked_fill(llh == -math.inf, 0).sum() + 0 * llh.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    g_em = grads[0]
    assert (g_em[0] == 0).all() and (g_em[2] == 0).all() and (g_em[1] != 0).any()


def test_unvalidated_out_of_range_tags_give_nan_not_a_crash(impl, device):
    """The op's contract asks for validated tags (the CRF validates); bad ones must still not read out of
    bounds: that chain's log-likelihood and gradient are NaN, the others unaffected."""
    em, trans, start, end, _, tags = _problem(2, 4, 3, device, seed=23)
    lengths = torch.tensor([4, 4], device=device)
    tags = tags.clamp(0, 2)
    tags[0, 2] = 1000
    leaves = [x.requires_grad_() for x in (em, trans, start, end)]
    llh = chain_log_likelihood_factored(*leaves, lengths, tags)
    assert llh[0].isnan() and torch.isfinite(llh[1])
    (g_em,) = torch.autograd.grad(llh[1] + 0 * llh[0], leaves[:1])
    assert g_em[0].isnan().all() and torch.isfinite(g_em[1]).all()


@pytest.mark.parametrize("bad_length", [-1, 6])
def test_invalid_length_gives_nan_for_that_chain_only(impl, device, bad_length):
    """A length outside 0..T (-1 is how sequence_lengths marks a bad sequence under CUDA graph capture): that
    chain's totals, log-likelihood, Viterbi score and emission gradient are NaN and its tags -1; the other
    chains, and the gradients summed over chains, are those of the batch without it."""
    em, trans, start, end, _, tags = _problem(3, 5, 4, device, seed=29)
    tags = tags.clamp(0, 3)
    lengths, keep, kept_lengths = torch.tensor([5, bad_length, 3], device=device), [0, 2], torch.tensor([5, 3])
    kept_lengths = kept_lengths.to(device)
    leaves = [x.detach().clone().requires_grad_() for x in (em, trans, start, end)]
    kept = [x.detach().clone().requires_grad_() for x in (em[keep], trans, start, end)]
    llh = chain_log_likelihood_factored(*leaves, lengths, tags)
    want = chain_log_likelihood_factored(*kept, kept_lengths, tags[keep])
    assert llh[1].isnan()
    torch.testing.assert_close(llh[keep], want)
    grads, want_grads = torch.autograd.grad(llh.sum(), leaves), torch.autograd.grad(want.sum(), kept)
    assert grads[0][1].isnan().all()
    torch.testing.assert_close(grads[0][keep], want_grads[0])
    for g, w in zip(grads[1:], want_grads[1:], strict=True):
        torch.testing.assert_close(g, w)
    args = (em, trans, start, end)
    for reverse in (False, True):
        total, _ = chain_scan(*args, lengths, LogSemiring.kernel_id, reverse, False)
        want_total, _ = chain_scan(em[keep], trans, start, end, kept_lengths, LogSemiring.kernel_id, reverse, False)
        assert total[1].isnan()
        torch.testing.assert_close(total[keep], want_total)
    score, path = chain_viterbi_eager(*args, lengths, MaxSemiring.kernel_id)
    want_score, want_path = chain_viterbi_eager(em[keep], trans, start, end, kept_lengths, MaxSemiring.kernel_id)
    assert score[1].isnan() and (path[1] == -1).all()
    torch.testing.assert_close(score[keep], want_score)
    assert torch.equal(path[keep], want_path)


@pytest.mark.cuda
@pytest.mark.parametrize("C", [130, 200])
def test_pair_marginals_off_chip_on_the_gpu(impl, C, monkeypatch):
    """Large C in float64 on one block per chain (no clusters): the pair marginals do not fit in shared
    memory and are summed by log_contract; the gold transitions' counts must still be subtracted (and
    skipped for an impossible gold path)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    monkeypatch.setenv("SEMIRING_OPS_CHAIN_CLUSTER", "1")
    em, trans, start, end, lengths, tags = _problem(3, 6, C, "cuda", seed=C)
    lengths = torch.tensor([6, 4, 1], device="cuda")
    tags = tags.clamp(0, C - 1)
    trans = trans.clone()
    trans[tags[1, 0], tags[1, 1]] = -math.inf  # chain 1's gold path is impossible
    leaves = [x.requires_grad_() for x in (em, trans, start, end)]
    got = chain_log_likelihood_factored(*leaves, lengths, tags)
    want = _want(*leaves, lengths, tags)
    torch.testing.assert_close(got, want)
    finite = torch.isfinite(want)
    g_got = torch.autograd.grad(got[finite].sum(), leaves)
    g_want = torch.autograd.grad(want[finite].sum(), leaves, allow_unused=True)
    for g, w in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(g, w)


def test_crf_module_uses_the_fused_loss_and_matches_the_reference(impl, device):
    B, T, C = 4, 6, 5
    crf = LinearChainCRF(C, batch_first=False).to(device=device, dtype=torch.float64)
    em, _, start, end, lengths, tags = _problem(B, T, C, device, seed=11)
    tags = tags.clamp(0, C - 1)
    with torch.no_grad():
        crf.start_transitions.copy_(start)
        crf.end_transitions.copy_(end)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    em_t = em.transpose(0, 1).contiguous().requires_grad_()  # (T, B, C): strided batch-major views inside
    llh = crf(em_t, tags.t(), mask.t(), reduction="none")
    want = _want(em_t.transpose(0, 1), crf.transitions, crf.start_transitions, crf.end_transitions, lengths, tags)
    torch.testing.assert_close(llh, want)
    params = [em_t, crf.transitions, crf.start_transitions, crf.end_transitions]
    for got, w in zip(torch.autograd.grad(llh.sum(), params), torch.autograd.grad(want.sum(), params), strict=True):
        torch.testing.assert_close(got, w)


# ---------------------------------------------------------------- sequence_lengths


def _check_both(device, fn, match):
    """The kernel and the reference twin raise the same error."""
    with pytest.raises(ValueError, match=match):
        fn(sequence_lengths_eager)
    with pytest.raises(ValueError, match=match):
        fn(reference.sequence_lengths)


@given(B=st.integers(0, 5), T=st.integers(0, 300), C=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_sequence_lengths_match_the_reference(device, B, T, C, seed):
    g = torch.Generator().manual_seed(seed)
    L = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < L[:, None]).to(device)
    tags = torch.randint(0, C, (B, T), generator=g).to(device)
    tags = torch.where(mask, tags, -1)  # junk past the lengths is allowed
    for m in (mask, mask.to(torch.uint8), mask.t().contiguous().t()):  # bool, uint8, strided
        got = sequence_lengths_eager(m, None, tags, B, T, C)
        assert got.dtype == torch.int64 and torch.equal(got.cpu(), L)
    got = sequence_lengths_eager(None, L.to(device, torch.int32), tags.to(torch.int32), B, T, C)
    assert torch.equal(got.cpu(), L)
    assert torch.equal(sequence_lengths_eager(None, None, tags.clamp(min=0), B, T, C).cpu(), torch.full((B,), T))


def test_sequence_lengths_refuse_bad_input(device):
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool, device=device)
    _check_both(device, lambda f: f(mask, None, None, 2, 4, 3), "holes")
    _check_both(
        device, lambda f: f(None, torch.tensor([2, 5], device=device), None, 2, 4, 3), r"lengths must lie in 0..4"
    )
    _check_both(device, lambda f: f(None, torch.tensor([-1, 2], device=device), None, 2, 4, 3), r"lengths must lie")
    tags = torch.tensor([[0, 2, 3, 9], [1, 1, 1, 1]], device=device)  # 3 is out of range below length 3
    good = torch.tensor([3, 4], device=device)
    _check_both(device, lambda f: f(None, good, tags, 2, 4, 3), r"tags must lie in \[0, 3\)")
    assert torch.equal(
        sequence_lengths_eager(None, torch.tensor([2, 4], device=device), tags.clamp(max=2), 2, 4, 3).cpu(),
        torch.tensor([2, 4]),
    )
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\)"):
        sequence_lengths_eager(mask[:, :3], None, None, 2, 4, 3)
    with pytest.raises(ValueError, match="lengths must be an integer"):
        sequence_lengths_eager(None, torch.ones(2, device=device), None, 2, 4, 3)
    with pytest.raises(ValueError, match="tags has shape"):
        sequence_lengths_eager(None, good, tags[:, :2], 2, 4, 3)
    with pytest.raises(ValueError, match="mask or lengths, not both"):
        sequence_lengths_eager(mask, good, None, 2, 4, 3)


def test_crf_loss_under_torch_compile_fullgraph():
    crf = LinearChainCRF(4, batch_first=True).double()
    em, _, _, _, lengths, tags = _problem(3, 5, 4, "cpu", seed=19)
    tags = tags.clamp(0, 3)
    mask = torch.arange(5)[None, :] < lengths[:, None]
    em.requires_grad_()
    fn = torch.compile(lambda e: crf(e, tags, mask), fullgraph=True)
    out = fn(em)
    torch.testing.assert_close(out, crf(em, tags, mask))
    (g,) = torch.autograd.grad(out, em)
    (want,) = torch.autograd.grad(crf(em, tags, mask), em)
    torch.testing.assert_close(g, want)


# ---------------------------------------------------------------- validate=False: marking, not raising


def _expected_marks(mask, lengths, tags, T, C):
    """The lengths sequence_lengths(raise_errors=False) gives, written out row by row in Python."""
    out = []
    for b in range(tags.shape[0]):
        if mask is not None:
            row = [bool(v) for v in mask[b].tolist()]
            bad = any(on and not prev for prev, on in zip([True, *row], row, strict=False))
            n = sum(row)
        else:
            n = int(lengths[b])
            bad = not 0 <= n <= T
        bad = bad or any(not 0 <= v < C for v in tags[b, : max(n, 0)].tolist())
        out.append(-1 if bad else n)
    return torch.tensor(out, dtype=torch.long)


@given(B=st.integers(0, 6), T=st.integers(0, 40), C=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_sequence_lengths_without_raise_errors_mark_each_bad_sequence(device, B, T, C, seed):
    """Holes in some masks, lengths out of range, tags out of range below or past the length: each bad
    sequence's length -1, every other length as counted; the kernel and the twin agree, the caller's lengths
    tensor is never written."""
    g = torch.Generator().manual_seed(seed)
    L = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < L[:, None]
    holes = (torch.rand(B, T, generator=g) < 0.05) & mask
    mask = mask & ~holes
    lengths = torch.where(torch.rand(B, generator=g) < 0.3, torch.randint(-2, T + 3, (B,), generator=g), L)
    tags = torch.where(torch.rand(B, T, generator=g) < 0.05, C, torch.randint(0, C, (B, T), generator=g))
    for m, n in ((mask, None), (None, lengths)):
        want = _expected_marks(m, n, tags, T, C)
        args = [None if x is None else x.to(device) for x in (m, n, tags)]
        given_lengths = None if n is None else args[1].clone()
        for fn in (sequence_lengths_eager, reference.sequence_lengths):
            got = fn(*args, B, T, C, False)
            assert got.dtype == torch.int64 and torch.equal(got.cpu(), want), fn
            if n is not None:
                assert torch.equal(args[1], given_lengths)


@pytest.mark.parametrize("problem", ["mask hole", "tag out of range", "length out of range"])
def test_crf_with_validate_false_gives_nan_for_a_bad_sequence_only(impl, device, problem):
    """validate=False: no exception; the bad sequence's log-likelihood, log Z, Viterbi score and marginals
    are NaN (tags -1), the others and the transitions' gradients those of the batch without it; the
    methods that cannot mark (score, top-k, decode) still raise."""
    B, T, C = 4, 6, 5
    em, trans, start, end, _, tags = _problem(B, T, C, device, seed=41)
    tags = tags.clamp(0, C - 1)
    lengths = torch.tensor([6, 4, 5, 2], device=device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    if problem == "mask hole":
        mask[1, 1] = False
    elif problem == "tag out of range":
        tags[1, 2] = C
    else:
        lengths[1] = T + 1
    keep = [0, 2, 3]
    given, kept = (
        (dict(lengths=lengths), dict(lengths=lengths[keep]))
        if problem.startswith("length")
        else (
            dict(mask=mask),
            dict(mask=mask[keep]),
        )
    )
    crf = LinearChainCRF(C, batch_first=True, validate=False).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for p, v in zip(
            (crf.transitions, crf.start_transitions, crf.end_transitions), (trans, start, end), strict=True
        ):
            p.copy_(v)
    strict = LinearChainCRF(C, batch_first=True).to(device=device, dtype=torch.float64)
    strict.load_state_dict(crf.state_dict())
    with pytest.raises(ValueError):
        strict(em, tags, **given)

    em_all, em_kept = em.clone().requires_grad_(), em[keep].clone().requires_grad_()
    llh = crf(em_all, tags, reduction="none", **given)
    want = strict(em_kept, tags[keep], reduction="none", **kept)
    assert llh[1].isnan()
    torch.testing.assert_close(llh[keep], want)
    params = [crf.transitions, crf.start_transitions, crf.end_transitions]
    strict_params = [strict.transitions, strict.start_transitions, strict.end_transitions]
    grads = torch.autograd.grad(crf.nll(em_all, tags, **given), [em_all, *params])
    want_grads = torch.autograd.grad(strict.nll(em_kept, tags[keep], **kept), [em_kept, *strict_params])
    assert grads[0][1].isnan().all()
    torch.testing.assert_close(grads[0][keep], want_grads[0])
    for g, w in zip(grads[1:], want_grads[1:], strict=True):
        torch.testing.assert_close(g, w)

    if problem == "tag out of range":  # a bad tag spoils the loss only: decoding and log Z do not read tags
        for got, want in zip(crf.viterbi(em, **given), strict.viterbi(em, **given), strict=True):
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(crf.log_partition(em, **given), strict.log_partition(em, **given))
    else:
        path, score = crf.viterbi(em, **given)
        want_path, want_score = strict.viterbi(em[keep], **kept)
        assert score[1].isnan() and (path[1] == -1).all()
        torch.testing.assert_close(score[keep], want_score)
        assert torch.equal(path[keep], want_path)
        log_z = crf.log_partition(em, **given)
        assert log_z[1].isnan()
        torch.testing.assert_close(log_z[keep], strict.log_partition(em[keep], **kept))
        assert crf.marginals(em, **given)[1].isnan().all()
        with pytest.raises(ValueError):
            crf.viterbi(em, top_k=2, **given)
        if "mask" in given:
            with pytest.raises(ValueError):
                crf.decode(em, given["mask"])
    with pytest.raises(ValueError):
        crf.score(em, tags, **given)
