"""Second derivatives of the linear-chain CRF on the fused kernels (issue 44 item 1): log Z, the loss and the
marginals are differentiable twice (gradcheck / gradgradcheck in float64, with masks and forbidden transitions), the
marginals are themselves differentiable, and structured attention (marginals as attention weights) trains with
gradients equal to torch-struct's LinearChainCRF."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.structures.fused import generic_only


@pytest.fixture(autouse=True)
def _fused(device):
    if backend_for(torch.device(device)).family("chain") is None:
        pytest.skip("no compiled chain kernels here")


def _parameters(parts) -> list[torch.Tensor]:
    return [p for m in parts for p in (m.parameters() if isinstance(m, torch.nn.Module) else [m])]


def _crf(C: int, device: str, seed: int, forbid: bool) -> so.LinearChainCRF:
    g = torch.Generator().manual_seed(seed)
    crf = so.LinearChainCRF(C, batch_first=True).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        if forbid:  # a forbidden transition (a tagging constraint): the semiring's zero
            crf.transitions[0, 1] = -torch.inf
    return crf.to(device)


def _inputs(B: int, T: int, C: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    em = torch.randn(B, T, C, generator=g, dtype=torch.float64).to(device).requires_grad_()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(device)
    tags = torch.randint(0, C, (B, T), generator=g).to(device)
    tags[:, :] = torch.where(tags == 1, 2 % C, tags)  # no gold path through the forbidden 0 -> 1
    return em, mask, tags


@pytest.mark.parametrize("forbid", [False, True])
def test_log_partition_and_loss_have_second_derivatives(device, forbid):
    crf = _crf(4, device, 0, forbid)
    em, mask, tags = _inputs(3, 6, 4, device, 0)
    trans = crf.transitions
    assert gradcheck(lambda e, t: crf.log_partition(e, mask), (em, trans), atol=1e-7)
    assert gradgradcheck(lambda e, t: crf.log_partition(e, mask), (em, trans), atol=1e-7)
    assert gradgradcheck(lambda e, t: crf(e, tags, mask, reduction="sum"), (em, trans), atol=1e-7)


def test_the_second_derivatives_are_those_of_the_pytorch_program(device):
    crf = _crf(5, device, 1, True)
    em, mask, _ = _inputs(4, 7, 5, device, 1)
    v = torch.randn_like(em)

    def hessian_vector(generic: bool):
        with generic_only() if generic else torch.enable_grad():
            (g,) = torch.autograd.grad(crf.log_partition(em, mask).sum(), em, create_graph=True)
            return torch.autograd.grad((g * v).sum(), (em, crf.transitions, crf.start_transitions))

    for fused, generic in zip(hessian_vector(False), hessian_vector(True), strict=True):
        torch.testing.assert_close(fused, generic, rtol=1e-9, atol=1e-10)


def test_marginals_are_differentiable(device):
    crf = _crf(4, device, 2, False)
    em, mask, _ = _inputs(3, 5, 4, device, 2)
    marg = crf.marginals(em, mask)
    assert marg.requires_grad
    assert gradcheck(lambda e, t: crf.marginals(e, mask), (em, crf.transitions), atol=1e-7)
    with torch.no_grad():
        assert not crf.marginals(em, mask).requires_grad, "no graph under no_grad"


def _torch_struct_marginals(crf: so.LinearChainCRF, em: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Node marginals (B, T, C) of torch-struct's LinearChainCRF over the same chains: its edge potentials
    phi[b, n, next, prev] = trans[prev, next] + em[b, n + 1, next], with em[b, 0] + start on the first edge and end
    on each chain's last."""
    ts = pytest.importorskip("torch_struct")
    T = em.shape[1]
    phi = crf.transitions.t()[None, None] + em[:, 1:, :, None]  # (B, T - 1, next, prev)
    phi = torch.cat([phi[:, :1] + (em[:, 0] + crf.start_transitions)[:, None, None, :], phi[:, 1:]], 1)
    last_edge = (torch.arange(T - 1, device=em.device)[None, :] == (lengths - 2)[:, None]).to(em.dtype)
    phi = phi + last_edge[:, :, None, None] * crf.end_transitions[None, None, :, None]
    edge = ts.LinearChainCRF(phi, lengths=lengths).marginals  # (B, T - 1, next, prev)
    nodes = torch.cat([edge[:, :1].sum(2), edge.sum(3)], 1)  # position 0: over next; t >= 1: over prev
    return nodes * (torch.arange(T, device=em.device)[None, :, None] < lengths[:, None, None])


def test_structured_attention_trains_with_torch_structs_gradients(device):
    """Marginals as attention weights over tag embeddings; a few SGD steps; at each step the gradients of every
    parameter equal those of the same model on torch-struct's marginals."""
    torch.manual_seed(0)
    B, T, D, C = 4, 6, 5, 3
    x = torch.randn(B, T, D, dtype=torch.float64, device=device)
    y = torch.randn(B, T, D, dtype=torch.float64, device=device)
    lengths = torch.tensor([6, 4, 5, 2], device=device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]

    def model():
        torch.manual_seed(1)
        proj = torch.nn.Linear(D, C).double().to(device)
        tag_vectors = torch.nn.Parameter(torch.randn(C, D, dtype=torch.float64, device=device))
        crf = so.LinearChainCRF(C, batch_first=True).double().to(device)
        return proj, tag_vectors, crf

    def loss(parts, marginals_of):
        proj, tag_vectors, crf = parts
        em = proj(x)
        attended = marginals_of(crf, em) @ tag_vectors  # (B, T, D)
        return ((attended - y) ** 2)[mask].sum()

    ours, theirs = model(), model()
    opt_ours = torch.optim.SGD(_parameters(ours), lr=0.05)
    opt_theirs = torch.optim.SGD(_parameters(theirs), lr=0.05)
    losses = []
    for _ in range(3):
        for opt in (opt_ours, opt_theirs):
            opt.zero_grad()
        a = loss(ours, lambda crf, em: crf.marginals(em, mask))
        b = loss(theirs, lambda crf, em: _torch_struct_marginals(crf, em, lengths))
        a.backward()
        b.backward()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        for p, q in zip(_parameters(ours), _parameters(theirs), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-10)
        losses.append(a.item())
        opt_ours.step()
        opt_theirs.step()
    assert losses[-1] < losses[0], losses
