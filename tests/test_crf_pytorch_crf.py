"""LinearChainCRF against pytorch-crf's CRF, the module it is a drop-in for: the same state_dict (both
directions, strict), log-likelihood under every reduction, gradients and decoded paths (float64)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.structures import LinearChainCRF

torchcrf = pytest.importorskip("torchcrf")

REDUCTIONS = ("none", "sum", "mean", "token_mean")


def _theirs(C, batch_first, device):
    crf = torchcrf.CRF(C, batch_first=batch_first).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


def _case(B, T, C, batch_first, device, gen):
    """emissions, tags, bool prefix mask (lengths 1..T: pytorch-crf needs the first step on), lengths."""
    em = torch.randn(B, T, C, dtype=torch.float64, generator=gen).to(device)
    tags = torch.randint(0, C, (B, T), generator=gen).to(device)
    lengths = torch.randint(1, T + 1, (B,), generator=gen).to(device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    if not batch_first:
        em, tags, mask = em.transpose(0, 1).contiguous(), tags.T.contiguous(), mask.T.contiguous()
    return em, tags, mask, lengths


def _grads(crf, em, tags, mask, reduction):
    em = em.detach().clone().requires_grad_()
    crf.zero_grad()
    llh = crf(em, tags, mask, reduction=reduction)
    (llh.sum() if reduction == "none" else llh).backward()
    # a parameter that takes no part (transitions when T = 1) has grad None in pytorch-crf
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in crf.named_parameters()}
    return llh.detach(), em.grad, grads


@given(
    B=st.integers(1, 4),
    T=st.integers(1, 7),
    C=st.integers(1, 6),
    batch_first=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_same_likelihood_gradients_and_decode_as_pytorch_crf(device, B, T, C, batch_first, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    theirs = _theirs(C, batch_first, device)
    ours = LinearChainCRF(C, batch_first=batch_first).to(device=device, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())  # strict: the same names and shapes
    em, tags, mask, lengths = _case(B, T, C, batch_first, device, gen)

    for reduction in REDUCTIONS:
        want_llh, want_em_grad, want_p_grads = _grads(theirs, em, tags, mask, reduction)
        llh, em_grad, p_grads = _grads(ours, em, tags, mask, reduction)
        torch.testing.assert_close(llh, want_llh, msg=f"log-likelihood, reduction={reduction}")
        torch.testing.assert_close(em_grad, want_em_grad, msg=f"d/d emissions, reduction={reduction}")
        assert set(p_grads) == set(want_p_grads)
        for name, g in p_grads.items():
            torch.testing.assert_close(g, want_p_grads[name], msg=f"d/d {name}, reduction={reduction}")

    with torch.no_grad():
        assert ours.decode(em, mask) == theirs.decode(em, mask)
        # no mask: every sequence runs the full T (pytorch-crf's own default mask is uint8, deprecated in where)
        full = torch.ones_like(mask)
        assert ours.decode(em) == theirs.decode(em, full)
        torch.testing.assert_close(ours(em, tags), theirs(em, tags, full))
        # lengths= is ours alone; it must agree with the equivalent mask
        torch.testing.assert_close(
            ours(em, tags, lengths=lengths, reduction="none"), theirs(em, tags, mask, reduction="none")
        )


@pytest.mark.parametrize("batch_first", [True, False])
def test_our_state_dict_loads_into_pytorch_crf(device, batch_first):
    torch.manual_seed(0)
    C, B, T = 5, 3, 6
    ours = LinearChainCRF(C, batch_first=batch_first).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    theirs = torchcrf.CRF(C, batch_first=batch_first).to(device=device, dtype=torch.float64)
    theirs.load_state_dict(ours.state_dict())  # strict
    for name, p in theirs.named_parameters():
        assert torch.equal(p, getattr(ours, name))
    em, tags, mask, _ = _case(B, T, C, batch_first, device, torch.Generator().manual_seed(1))
    with torch.no_grad():
        for reduction in REDUCTIONS:
            torch.testing.assert_close(ours(em, tags, mask, reduction), theirs(em, tags, mask, reduction))
        assert ours.decode(em, mask) == theirs.decode(em, mask)


def test_default_initialisation_matches_pytorch_crf():
    """Both draw Uniform(-0.1, 0.1) in the same order, so equal seeds give equal parameters."""
    torch.manual_seed(123)
    theirs = torchcrf.CRF(7)
    torch.manual_seed(123)
    ours = LinearChainCRF(7)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    for name, p in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], p), name
