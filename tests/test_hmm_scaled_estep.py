"""The compiled scaled E-step (csrc/cpu/hmm_scaled_cpu.cpp) against the lockstep torch one (hmm/scaling.py): the
same log-likelihoods, posteriors, expected counts and underflow flags, on random HMMs with lengths 0 to T, strided
log-emissions, spreads that underflow, -inf and NaN emissions; and its argument checks."""

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
    assert got[4].tolist() == want.suspect.tolist()
    keep = ~want.suspect
    torch.testing.assert_close(got[0][keep], want.log_likelihood[keep], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1][keep], want.posteriors[keep], rtol=tol, atol=tol)
    torch.testing.assert_close(got[2], want.transitions, rtol=tol, atol=tol)
    torch.testing.assert_close(got[3], want.starts, rtol=tol, atol=tol)


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
