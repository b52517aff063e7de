"""The fused chain kernels (chain_scan / chain_viterbi behind chain_sum_factored and
chain_viterbi_factored) against brute-force enumeration of all C^T paths, against the generic engine for
sizes past the kernels' tile edges, and on -inf, NaN padding, gradients and bad input. Every test runs on
the compiled kernels and on their PyTorch twin (the `impl` fixture), on CPU and CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from brute import chain_path_scores
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.build import reference
from semiring_ops.ops.chain_ops import chain_scan
from semiring_ops.semirings import resolve_semiring
from semiring_ops.structures import chain_sum, chain_sum_factored, chain_viterbi_factored
from semiring_ops.structures.factored import factored_to_edges

REDUCE = {
    "log": lambda s: torch.logsumexp(s, 0),
    "max": lambda s: s.max(),
    "min": lambda s: s.min(),
    "std": lambda s: s.sum(),
}


def _random_factored(B, T, C, device, seed=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.randint(0, 2**31, ()).item())
    em = torch.randn(B, T, C, generator=g, dtype=dtype)
    trans = torch.randn(C, C, generator=g, dtype=dtype)
    start, end = torch.randn(C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    return [x.to(device) for x in (em, trans, start, end, lengths)]


def _enumerate(em, trans, start, end, L, semiring):
    """{path: score} of one chain; the std semiring multiplies, so its scores are products."""
    S = resolve_semiring(semiring)
    init, edges, final = factored_to_edges(em[None], trans, start, end, resolve_semiring("log"))
    scores = chain_path_scores(init[0], edges[0], final[0], L)
    if S.name == "std":  # the same paths, potentials multiplied instead of added
        init, edges, final = factored_to_edges(em[None], trans, start, end, S)
        prod = {}
        for path in scores:
            p = init[0, path[0]] * final[0, path[-1]]
            for t in range(1, L):
                p = p * edges[0, t - 1, path[t - 1], path[t]]
            prod[path] = p
        return prod
    return scores


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@given(B=st.integers(1, 3), T=st.integers(0, 5), C=st.integers(1, 3), ends=st.booleans())
def test_sum_matches_enumeration(impl, device, semiring, B, T, C, ends):
    em, trans, start, end, lengths = _random_factored(B, T, C, device)
    if not ends:
        start = end = None
    out = chain_sum_factored(em, trans, start, end, lengths, semiring)
    one = resolve_semiring(semiring).one
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            assert out[b].item() == one
            continue
        zeros = torch.zeros(C, dtype=em.dtype, device=device)
        ones = torch.ones(C, dtype=em.dtype, device=device)
        neutral = ones if semiring == "std" else zeros
        s0 = neutral if start is None else start
        s1 = neutral if end is None else end
        scores = torch.stack(list(_enumerate(em[b], trans, s0, s1, L, semiring).values()))
        torch.testing.assert_close(out[b], REDUCE[semiring](scores))


@given(B=st.integers(1, 3), T=st.integers(0, 5), C=st.integers(1, 3))
def test_viterbi_matches_enumeration(impl, device, B, T, C):
    em, trans, start, end, lengths = _random_factored(B, T, C, device)
    score, tags = chain_viterbi_factored(em, trans, start, end, lengths)
    assert tags.shape == (B, T) and tags.dtype == torch.long
    for b in range(B):
        L = int(lengths[b])
        assert (tags[b, L:] == -1).all()
        if L == 0:
            assert score[b].item() == 0.0
            continue
        scores = _enumerate(em[b], trans, start, end, L, "max")
        best = max(scores, key=lambda p: scores[p].item())
        assert tuple(tags[b, :L].tolist()) == best
        torch.testing.assert_close(score[b], scores[best])


# Sizes straddling the kernels' edges: 32 lanes, 4 outputs per warp, the CPU's 32 / 24-column tiles,
# and on the GPU a transition matrix too big for shared memory (C = 260 in float64 is 528 KiB).
EDGE_SIZES = [(2, 3, 1), (3, 6, 31), (2, 5, 33), (3, 4, 65), (2, 3, 130), (2, 3, 260)]


@pytest.mark.parametrize("B,T,C", EDGE_SIZES)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_scans_match_generic_engine_past_tile_edges(impl, device, semiring, B, T, C):
    em, trans, start, end, lengths = _random_factored(B, T, C, device, seed=C)
    lengths[0] = T
    S = resolve_semiring(semiring)
    want = chain_sum(*factored_to_edges(em, trans, start, end, S), lengths, S)
    torch.testing.assert_close(chain_sum_factored(em, trans, start, end, lengths, S), want)
    # the reverse scan (beta) reaches the same total, and both agree with the PyTorch twin
    for reverse in (False, True):
        total, scores = chain_scan(em, trans, start, end, lengths, S.kernel_id, reverse, True)
        _, ref_scores = reference.chain_scan(em, trans, start, end, lengths, S.kernel_id, reverse, True)
        torch.testing.assert_close(total, want)
        torch.testing.assert_close(scores, ref_scores)
    if semiring == "max":
        score, tags = chain_viterbi_factored(em, trans, start, end, lengths)
        ref_score, ref_tags = reference.chain_viterbi(em, trans, start, end, lengths, S.kernel_id)
        torch.testing.assert_close(score, ref_score)
        assert torch.equal(tags, ref_tags)


@given(B=st.integers(1, 4), T=st.integers(1, 6), C=st.integers(1, 5))
def test_gradients_match_generic_engine(impl, device, B, T, C):
    leaves = _random_factored(B, T, C, device)
    lengths = leaves.pop()
    leaves = [x.requires_grad_() for x in leaves]
    weights = torch.randn(B, dtype=torch.float64, device=device)  # negative weights too
    got = torch.autograd.grad((chain_sum_factored(*leaves, lengths) * weights).sum(), leaves)
    want = torch.autograd.grad(
        (chain_sum(*factored_to_edges(*leaves, resolve_semiring("log")), lengths) * weights).sum(),
        leaves,
        allow_unused=True,
    )
    for g, w, x in zip(got, want, leaves, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(x) if w is None else w)


def test_marginals_are_distributions(impl, device):
    em, trans, start, end, lengths = _random_factored(5, 9, 7, device, seed=3)
    em.requires_grad_()
    (marg,) = torch.autograd.grad(chain_sum_factored(em, trans, start, end, lengths).sum(), (em,))
    live = torch.arange(9, device=device)[None, :] < lengths[:, None]
    torch.testing.assert_close(marg.sum(-1), live.to(marg.dtype))


def test_gradcheck(impl, device):
    em, trans, start, end, lengths = _random_factored(3, 4, 3, device, seed=5)
    lengths = torch.tensor([4, 2, 0], device=device)
    inputs = [x.requires_grad_() for x in (em, trans, start, end)]
    assert torch.autograd.gradcheck(lambda *xs: chain_sum_factored(*xs, lengths), inputs)


def test_forbidden_transitions_and_impossible_chains(impl, device):
    """-inf potentials are never on a path; a chain with no legal path sums to -inf with zero gradient."""
    em, trans, start, end, lengths = _random_factored(3, 6, 4, device, seed=7)
    lengths = torch.tensor([6, 3, 1], device=device)
    trans = trans.masked_fill(torch.eye(4, dtype=torch.bool, device=device), -math.inf)  # no self loops
    trans.requires_grad_()
    em.requires_grad_()
    total = chain_sum_factored(em, trans, start, end, lengths)
    _, tags = chain_viterbi_factored(em, trans, start, end, lengths)
    assert torch.isfinite(total).all()
    for b in range(3):
        path = tags[b, : int(lengths[b])]
        assert (path[1:] != path[:-1]).all()
    g_em, g_trans = torch.autograd.grad(total.sum(), (em, trans))
    assert (g_trans[torch.eye(4, dtype=torch.bool, device=device)] == 0).all()
    # no legal start at all: -inf, zero gradient, no NaN
    dead_start = torch.full_like(start, -math.inf)
    total = chain_sum_factored(em, trans, dead_start, end, lengths)
    assert (total == -math.inf).all()
    g_em, g_trans = torch.autograd.grad(total.sum(), (em, trans))
    assert (g_em == 0).all() and (g_trans == 0).all()


def test_padding_is_never_read(impl, device):
    """Emissions past each length (NaN here) change nothing, in values or gradients."""
    em, trans, start, end, _ = _random_factored(3, 5, 4, device, seed=11)
    lengths = torch.tensor([5, 2, 0], device=device)
    dirty = em.clone()
    dirty[1, 2:] = math.nan
    dirty[2] = math.nan
    clean_leaf, dirty_leaf = em.clone().requires_grad_(), dirty.requires_grad_()
    a = chain_sum_factored(clean_leaf, trans, start, end, lengths)
    b = chain_sum_factored(dirty_leaf, trans, start, end, lengths)
    torch.testing.assert_close(a, b)
    (ga,) = torch.autograd.grad(a.sum(), clean_leaf)
    (gb,) = torch.autograd.grad(b.sum(), dirty_leaf)
    torch.testing.assert_close(ga, gb)
    sa, ta = chain_viterbi_factored(em, trans, start, end, lengths)
    sb, tb = chain_viterbi_factored(dirty, trans, start, end, lengths)
    torch.testing.assert_close(sa, sb)
    assert torch.equal(ta, tb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_accumulate_in_float32(device, dtype):
    em, trans, start, end, lengths = _random_factored(4, 7, 5, device, seed=13)
    want = chain_sum_factored(em, trans, start, end, lengths)
    out = chain_sum_factored(em.to(dtype), trans.to(dtype), start.to(dtype), end.to(dtype), lengths)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=0.05, rtol=0.02)


def test_empty_batch_and_zero_tags(device):
    em = torch.randn(0, 4, 3, dtype=torch.float64, device=device)
    trans = torch.randn(3, 3, dtype=torch.float64, device=device)
    assert chain_sum_factored(em, trans).shape == (0,)
    score, tags = chain_viterbi_factored(em, trans)
    assert score.shape == (0,) and tags.shape == (0, 4)
    em0 = torch.randn(2, 3, 0, dtype=torch.float64, device=device)
    out = chain_sum_factored(em0, torch.zeros(0, 0, dtype=torch.float64, device=device))
    assert (out == -math.inf).all()  # no tag, no path


def test_bad_input_names_the_argument(device):
    em = torch.randn(2, 3, 4, device=device)
    with pytest.raises(ValueError, match=r"transitions must have shape \(4, 4\).*\(2, 3, 4\).*\(3, 3\)"):
        chain_sum_factored(em, torch.randn(3, 3, device=device))
    with pytest.raises(ValueError, match=r"start must have shape \(4,\)"):
        chain_sum_factored(em, torch.randn(4, 4, device=device), torch.randn(5, device=device))
    with pytest.raises(ValueError, match=r"emissions must be \(B, T, C\)"):
        chain_sum_factored(em[0], torch.randn(4, 4, device=device))
    with pytest.raises(TypeError, match="emissions must be floating point"):
        chain_sum_factored(em.long(), torch.randn(4, 4, device=device))
    with pytest.raises(ValueError, match="lengths"):
        chain_sum_factored(em, torch.randn(4, 4, device=device), lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="lengths"):
        chain_sum_factored(em, torch.randn(4, 4, device=device), lengths=torch.tensor([1, 7]))


def test_torch_compile_fullgraph():
    em, trans, start, end, lengths = _random_factored(3, 5, 4, "cpu", seed=17)
    em.requires_grad_()
    fn = torch.compile(lambda e: chain_sum_factored(e, trans, start, end, lengths), fullgraph=True)
    out = fn(em)
    torch.testing.assert_close(out, chain_sum_factored(em, trans, start, end, lengths))
    (g,) = torch.autograd.grad(out.sum(), em)
    (want,) = torch.autograd.grad(chain_sum_factored(em, trans, start, end, lengths).sum(), em)
    torch.testing.assert_close(g, want)


@pytest.mark.parametrize("with_tags", [False, True])
def test_pair_marginals_left_off_chip_are_summed_by_the_caller(device, monkeypatch, with_tags):
    """Large C on a GPU: the gradient kernel leaves the pair marginals' sum to chain_ops (one log_contract of the bmm
    family over (b, t)), returning beta and the chains' weights. Here a backend that always does so, built from the
    reference, must give the whole gradient, with tags (a CRF's loss) and without, -inf chains included."""
    from semiring_ops.ops import chain_ops

    em, trans, start, end, lengths = _random_factored(5, 9, 6, device, seed=3)
    trans[0, 1] = -math.inf  # a forbidden transition
    em[1] = -math.inf  # an impossible chain (log_z = -inf)
    log_semiring = resolve_semiring("log").kernel_id
    log_z, alpha = reference.chain_scan(em, trans, start, end, lengths, log_semiring, False, True)
    grad = torch.rand(5, dtype=em.dtype, device=device)
    tags = torch.randint(2, 6, (5, 9), device=device) if with_tags else None  # gold paths avoid 0 -> 1
    want = reference.chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags)

    class OffChip:
        """The reference's gradient, minus its pair marginals, plus beta and the weights (csrc/ops.h)."""

        @staticmethod
        def chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags):
            g_em, g_trans, g_start, g_end = reference.chain_log_backward(
                em, trans, start, end, lengths, alpha, log_z, grad, tags
            )
            _, beta = reference.chain_scan(em, trans, start, end, lengths, log_semiring, True, True)
            weight = torch.where(log_z == -math.inf, 0.0, grad)
            pairs = chain_ops.pair_marginal_sum(em, trans, lengths, alpha, log_z, weight, beta)
            return g_em, g_trans - pairs, g_start, g_end, beta, weight

        log_contract = staticmethod(reference.log_contract)

    monkeypatch.setattr(chain_ops, "backend_for", lambda device: OffChip)
    got = chain_ops._chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_pair_marginal_sum_equals_the_pair_marginals(device):
    """pair_marginal_sum with grad = 1 is the expected count of every transition: sum over the chains and steps of
    the pair marginals, which the reference's gradient of log Z with respect to trans is."""
    from semiring_ops.ops.chain_ops import pair_marginal_sum

    em, trans, start, end, lengths = _random_factored(7, 140, 5, device, seed=11)  # 973 rows: several chunks
    log_semiring = resolve_semiring("log").kernel_id
    log_z, alpha = reference.chain_scan(em, trans, start, end, lengths, log_semiring, False, True)
    _, beta = reference.chain_scan(em, trans, start, end, lengths, log_semiring, True, True)
    ones = torch.ones(7, dtype=em.dtype, device=device)
    want = reference.chain_log_backward(em, trans, start, end, lengths, alpha, log_z, ones)[1]
    torch.testing.assert_close(pair_marginal_sum(em, trans, lengths, alpha, log_z, ones, beta), want)
