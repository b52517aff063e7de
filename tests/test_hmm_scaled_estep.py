"""The compiled scaled E-step (csrc/cpu/hmm_scaled_cpu.cpp) against the lockstep torch one (hmm/scaling.py) where
that one vouches for a sequence, and against the float64 log-space recursions everywhere (the compiled pass redoes
flagged sequences in log space): random HMMs with lengths 0 to T, strided log-emissions, spreads that underflow, -inf
and NaN emissions; and its argument checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.hmm.scaling import compiled_estep, lockstep_forward_backward

pytestmark = pytest.mark.filterwarnings("ignore")


def _estep():
    fn = compiled_estep(torch.zeros(1, dtype=torch.float64))
    if fn is None:
        pytest.skip("the hmm kernel family is not built here")
    return fn


def _random_hmm(C: int, gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    log_trans = torch.log_softmax(torch.randn(C, C, generator=gen, dtype=torch.float64) * 2, -1).to(dtype)
    log_start = torch.log_softmax(torch.randn(C, generator=gen, dtype=torch.float64), -1).to(dtype)
    return log_trans, log_start


def _log_space_float64(le, log_trans, log_start, lengths):
    """(log-likelihood (B,), posteriors (B, T, C), transition counts (C, C) and start counts (C,) summed over the
    sequences of finite likelihood), by the forward and backward recursions in log space, in float64."""
    le, lt, ls = le.double(), log_trans.double(), log_start.double()
    B, T, C = le.shape
    ll, post = torch.zeros(B, dtype=torch.float64), torch.zeros(B, T, C, dtype=torch.float64)
    trans, starts = torch.zeros(C, C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            continue
        alpha = [ls + le[b, 0]]
        for t in range(1, n):
            alpha.append(torch.logsumexp(alpha[-1][:, None] + lt, 0) + le[b, t])
        ll[b] = torch.logsumexp(alpha[-1], 0)
        beta = [torch.zeros(C, dtype=torch.float64)] * n
        for t in range(n - 2, -1, -1):
            beta[t] = torch.logsumexp(lt + (le[b, t + 1] + beta[t + 1])[None, :], 1)
        if not torch.isfinite(ll[b]):
            continue
        for t in range(n):
            post[b, t] = torch.exp(alpha[t] + beta[t] - ll[b])
        for t in range(n - 1):
            trans += torch.exp(alpha[t][:, None] + lt + (le[b, t + 1] + beta[t + 1])[None, :] - ll[b])
        starts += post[b, 0]
    return ll, post, trans, starts


@settings(max_examples=40, deadline=None)
@given(
    C=st.integers(1, 9),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    spread=st.sampled_from([1.0, 30.0, 400.0]),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compiled_matches_lockstep(C, lengths, spread, dtype, seed):
    estep = _estep()
    gen = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    log_trans, log_start = _random_hmm(C, gen, dtype)
    # strided: the padded batch is a transposed view
    le = (torch.randn(B, C, T, generator=gen, dtype=torch.float64) * spread).to(dtype).transpose(1, 2)
    if T > 2 and C > 1:
        le[0, 1, 0] = -torch.inf  # structural zero: flagged, recomputed on the log chain by the caller
        le[-1, T - 1, C - 1] = torch.nan
    L = torch.tensor(lengths)
    got = estep(le, log_trans, log_start, L)
    want = lockstep_forward_backward(le, log_trans, log_start, L)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    keep = ~want.suspect
    torch.testing.assert_close(got[0][keep], want.log_likelihood[keep], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1][keep], want.posteriors[keep], rtol=tol, atol=tol)
    # the sequences the lockstep pass flags, the compiled one does again in log space: against float64 by definition
    ref = _log_space_float64(le, log_trans, log_start, L)
    finite = torch.isfinite(ref[0])
    assert got[4].tolist() == (~finite).tolist()
    # float32 in log space: log-values reach spread * T nats, resolved to eps32 of that in each exponent
    tol64 = 1e-9 if dtype == torch.float64 else max(2e-3, 1e-6 * spread * T)
    torch.testing.assert_close(got[0][finite].double(), ref[0][finite], rtol=tol64, atol=tol64)
    torch.testing.assert_close(got[1][finite].double(), ref[1][finite], rtol=tol64, atol=tol64)
    torch.testing.assert_close(got[2].double(), ref[2], rtol=tol64, atol=tol64)
    torch.testing.assert_close(got[3].double(), ref[3], rtol=tol64, atol=tol64)


def test_a_long_single_sequence_matches_lockstep():
    """hmmlearn's shape: one sequence of 30,000 steps, 2 states (the casino example)."""
    estep = _estep()
    gen = torch.Generator().manual_seed(0)
    log_trans, log_start = _random_hmm(2, gen, torch.float64)
    le = torch.randn(1, 30000, 2, generator=gen, dtype=torch.float64)
    L = torch.tensor([30000])
    got = estep(le, log_trans, log_start, L)
    want = lockstep_forward_backward(le, log_trans, log_start, L)
    for a, b in zip(got[:4], want[:4], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1].sum(-1), torch.ones(1, 30000, dtype=torch.float64))


def test_bad_arguments_name_themselves():
    estep = _estep()
    le = torch.zeros(2, 3, 4, dtype=torch.float64)
    lt, ls, L = torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), torch.tensor([3, 1])
    with pytest.raises(RuntimeError, match="log_trans must be"):
        estep(le, lt[:3], ls, L)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        estep(le.half(), lt.half(), ls.half(), L)
    with pytest.raises(RuntimeError, match=r"lengths\[1\] = 4 is outside"):
        estep(le, lt, ls, torch.tensor([3, 4]))
    with pytest.raises(RuntimeError, match="lengths must be"):
        estep(le, lt, ls, L.int())


def test_zero_start_and_transition_probabilities_go_to_log_space():
    """A start or transition probability of 0 (a one-sequence fit's start after one EM step) is structure: the
    compiled pass does such chains in log space, exactly, and leaves no sequence to the caller but impossible ones."""
    estep = _estep()
    gen = torch.Generator().manual_seed(3)
    log_trans, log_start = _random_hmm(4, gen, torch.float64)
    log_trans[0, 2] = log_trans[3, 1] = -torch.inf
    log_start[1:] = -torch.inf
    log_start[0] = 0.0
    le = torch.randn(3, 50, 4, generator=gen, dtype=torch.float64) * 5
    le[2, 0, 0] = -torch.inf  # the only start state cannot emit this: probability 0
    L = torch.tensor([50, 0, 30])
    got = estep(le, log_trans, log_start, L)
    ref = _log_space_float64(le, log_trans, log_start, L)
    assert got[4].tolist() == [False, False, True]
    torch.testing.assert_close(got[0][:2], ref[0][:2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1][:2], ref[1][:2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[3], ref[3], rtol=1e-10, atol=1e-10)


def test_log_space_counts_stay_finite_where_a_transition_underflows():
    """A transition of log-probability -1e3 (exp underflows to 0; the variational E-step's sub-normalised
    transitions reach such values from tiny Dirichlet posteriors) on a sequence done in log space: its expected
    count is ~0, never inf * 0 = NaN, and the counts equal the float64 log-space recursions'."""
    estep = _estep()
    gen = torch.Generator().manual_seed(5)
    log_trans, log_start = _random_hmm(4, gen, torch.float64)
    log_trans[1, 2] = -1000.0
    log_trans[2, 0] = -5000.0
    le = torch.randn(3, 40, 4, generator=gen, dtype=torch.float64) * 3
    le[:, :, 3] = -2e35  # a state that never emits these: every sequence goes to log space
    # sequence 0 sees state 1 at t = 10 and state 2 at t = 11 sharply (800 nats over the others): the pair's
    # alpha beta e / p without A is ~e^800, which overflows; with log A inside the exponent it is ~e^-200
    le[0, 10] = torch.tensor([-800.0, 0.0, -800.0, -2e35], dtype=torch.float64)
    le[0, 11] = torch.tensor([-800.0, -800.0, 0.0, -2e35], dtype=torch.float64)
    L = torch.tensor([40, 25, 40])
    got = estep(le, log_trans, log_start, L)
    ref = _log_space_float64(le, log_trans, log_start, L)
    assert not got[4].any() and torch.isfinite(got[2]).all()
    for a, b in zip(got[:4], ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_transition_rows_need_not_sum_to_one():
    """Rows of A summing to e^5 (a caller's unnormalised transitions): each step's normaliser is ~e^5, so their
    running product leaves [2^-300, 2^300] within ~40 steps and is folded into the log-likelihood there; the result
    is the float64 log-space recursions' (a product left to overflow would send the sequence to log space)."""
    estep = _estep()
    gen = torch.Generator().manual_seed(9)
    log_trans, log_start = _random_hmm(3, gen, torch.float64)
    log_trans = log_trans + 5.0
    le = torch.randn(2, 1000, 3, generator=gen, dtype=torch.float64)
    L = torch.tensor([1000, 700])
    got = estep(le, log_trans, log_start, L)
    ref = _log_space_float64(le, log_trans, log_start, L)
    assert torch.isfinite(got[0]).all() and not got[4].any()
    torch.testing.assert_close(got[0], ref[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-9, atol=1e-9)
