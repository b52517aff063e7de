"""CTC's log program over a thread block cluster (sm_90+): an item's states split into contiguous slices over c
blocks, which send each other their boundary states through distributed shared memory at every step
(csrc/cuda/ctc_kernels.cu, ClusterTeam). SEMIRING_OPS_CTC_CLUSTER forces c, so every cluster size runs on small
items too: slices of two states, items with fewer states than 2 c (fewer blocks take part), no frames, one frame,
odd and even frame counts (pass 1's last step without beta, pass 2's without alpha), impossible items. Checked
against the CTC structure's PyTorch program in float64 (loss and occupancies) and torch's ctc_loss."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_ctc_loss_matches
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.alignment.ctc import reference_log_partition
from semiring_ops.ops import ctc_ops

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("needs_clusters")]


def _batch(seed: int, T: int, N: int, C: int, S: int, dtype: torch.dtype):
    """log_probs (T, N, C) on the GPU, targets (N, S) with repeats (few labels), lengths; item 0 takes the full
    sizes, so that the launch's K is the item's."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(T, N, C, generator=g, dtype=torch.float64).log_softmax(-1).to(dtype)
    targets = torch.randint(1, C, (N, S), generator=g)
    target_lengths = torch.randint(0, S + 1, (N,), generator=g)
    input_lengths = torch.randint(0, T + 1, (N,), generator=g)
    target_lengths[0], input_lengths[0] = S, T
    return [x.cuda() for x in (lp, targets, input_lengths, target_lengths)]


def _check(lp, targets, il, tl):
    total, occupancy = ctc_ops.ctc_occupancy(lp, targets, il, tl, 0)
    x = lp.double().requires_grad_()
    ref = reference_log_partition(x, targets, il, tl, 0, "log")
    (grad,) = torch.autograd.grad(ref, x, torch.isfinite(ref).double())
    tol = 1e-10 if lp.dtype == torch.float64 else 2e-5
    assert torch.equal(torch.isinf(total), torch.isinf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(total.double()[finite], ref.detach()[finite], rtol=tol, atol=tol)
    torch.testing.assert_close(occupancy.double(), grad, rtol=tol, atol=tol)
    forward_only = ctc_ops.ctc_log(lp, targets, il, tl, 0, False)
    assert torch.equal(forward_only[0], total)


@pytest.mark.parametrize("c", [2, 3, 4, 7, 8])
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(0, 14),
    N=st.integers(1, 4),
    C=st.integers(2, 6),
    S=st.integers(0, 24),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_forced_clusters_match_the_structure(monkeypatch, c, seed, T, N, C, S, dtype):
    monkeypatch.setenv("SEMIRING_OPS_CTC_CLUSTER", str(c))
    _check(*_batch(seed, T, N, C, S, dtype))


@pytest.mark.parametrize("c", [1, 2, 8])
def test_forced_clusters_on_a_long_item_match_torch(monkeypatch, c):
    """K = 401 states over c blocks, 457 frames, float64 (in float32 the occupancies of so long an item carry
    ~3e-4 of rounding, as the loss ~1,500 does 1e-4): the loss against torch's ctc_loss in float64, the loss and its
    gradient against the structure's program (torch's gradient is taken as if through a log_softmax)."""
    monkeypatch.setenv("SEMIRING_OPS_CTC_CLUSTER", str(c))
    assert_ctc_loss_matches(*_batch(5, 457, 3, 30, 200, torch.float64), 1e-9)


def test_long_items_take_clusters_unforced():
    """Few long items (the launcher's own choice: clusters when every item still has blocks of its own) give
    the structure's numbers; in float64, 300 frames, K = 201 and 161."""
    lp, targets, il, tl = _batch(9, 300, 2, 12, 100, torch.float64)
    tl[1] = 80
    _check(lp, targets, il, tl)
