"""Gradients: gradcheck / gradgradcheck in float64 (broadcast batches, non-contiguous views, odd sizes),
16-bit gradients against float64 autograd of the brute force, and the max / min routing rule."""

from __future__ import annotations

import pytest
import torch
from brute import bmm as brute_bmm
from hypothesis import given
from hypothesis import strategies as st

import semiring_ops as so

SHAPES = [
    ((3, 5, 7), (3, 7, 4)),
    ((2, 1, 4, 6), (1, 3, 6, 5)),  # broadcast batch
    ((9, 17), (17, 3)),  # 2-D, k straddling a small tile
    ((2, 3, 65), (65, 2)),  # 2-D b broadcast over a's batch, k over a 64 tile
]


def _leaf(shape, device, transposed=False):
    x = torch.randn(shape, dtype=torch.float64, device=device)
    if transposed:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x.requires_grad_()


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_gradcheck(device, impl, semiring, shapes):
    a = _leaf(shapes[0], device, transposed=True)
    b = _leaf(shapes[1], device)
    assert torch.autograd.gradcheck(lambda x, y: so.semiring_matmul(x, y, semiring), (a, b))


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_gradgradcheck(device, impl, semiring, shapes):
    a = _leaf(shapes[0], device)
    b = _leaf(shapes[1], device, transposed=True)
    assert torch.autograd.gradgradcheck(lambda x, y: so.semiring_matmul(x, y, semiring), (a, b))


def test_gradgradcheck_through_chained_log_products(device, impl):
    """Marginals of marginals: second derivatives of a small chain of log products."""
    a = _leaf((2, 4, 5), device)
    b = _leaf((2, 5, 6), device)
    c = _leaf((6, 3), device)
    f = lambda x, y, z: so.logbmm(so.logbmm(x, y), z)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (a, b, c))


@pytest.mark.parametrize("semiring", ["log", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@given(n=st.integers(1, 70), k=st.integers(1, 70), m=st.integers(1, 70))
def test_low_precision_gradients_match_float64(device, impl, semiring, dtype, n, k, m):
    a = torch.randn(2, n, k, device=device).to(dtype).requires_grad_()
    b = torch.randn(2, k, m, device=device).to(dtype).requires_grad_()
    g = torch.randn(2, n, m, device=device)
    out = so.semiring_matmul(a, b, semiring)
    ga, gb = torch.autograd.grad(out, (a, b), g.to(dtype))
    assert ga.dtype == dtype and gb.dtype == dtype
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = brute_bmm(a64, b64, semiring)
    ra, rb = torch.autograd.grad(ref, (a64, b64), g.to(dtype).double())
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype]
    scale = max(1.0, g.abs().max().item())
    if semiring == "log":
        torch.testing.assert_close(ga.double(), ra, rtol=tol, atol=tol * scale)
        torch.testing.assert_close(gb.double(), rb, rtol=tol, atol=tol * scale)
    else:
        # the selected k may differ from float64's at near-ties; the total gradient mass may not
        torch.testing.assert_close(ga.double().sum(), ra.sum(), rtol=tol, atol=tol * scale * n * m)
        torch.testing.assert_close(gb.double().sum(), rb.sum(), rtol=tol, atol=tol * scale * n * m)


@pytest.mark.parametrize("semiring", ["max", "min"])
def test_selection_gradient_goes_to_the_argmax(device, impl, semiring):
    a = torch.randn(3, 6, 9, device=device, requires_grad=True)
    b = torch.randn(3, 9, 5, device=device, requires_grad=True)
    g = torch.randn(3, 6, 5, device=device)
    out, idx = so.semiring_matmul(a, b, semiring, return_argmax=True)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    want_a = torch.zeros_like(a).scatter_add(2, idx, g)
    want_b = torch.zeros_like(b).scatter_add(1, idx, g)
    torch.testing.assert_close(ga, want_a)
    torch.testing.assert_close(gb, want_b)


def test_gradient_only_for_the_operand_that_needs_it(device, impl):
    a = torch.randn(2, 4, 5, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 3, device=device, dtype=torch.float64)
    out = so.logbmm(a, b)
    (ga,) = torch.autograd.grad(out.sum(), (a,))
    ref = torch.autograd.grad(brute_bmm(a, b, "log").sum(), (a,))[0]
    torch.testing.assert_close(ga, ref)


# The CPU computes both log gradients in one pass (csrc/cpu/log_bmm_grads_cpu.cpp), splitting the work by
# blocks of 8 rows of b, chunks of 256 columns and, when (batch, k block) pairs are too few for the threads,
# by rows of a; work under 2**18 cells runs as one task. These shapes take each path and straddle each edge.
GRAD_SPLIT_SHAPES = [
    (1, 300, 3, 300),  # few (batch, k block) pairs: rows split, partial grad_b summed; 2 column chunks
    (2, 40, 19, 600),  # k blocks of 8, 8, 3; 3 column chunks, the last partial
    (3, 9, 17, 33),  # one task; a column tile and one column past it
    (8, 64, 64, 64),  # many tasks, no split
]


def _log_grads_float64(a, b, g):
    """Both log gradients by their definition, in float64: w = g exp(a + b - c), 0 where c is -inf."""
    a, b, g = a.double(), b.double(), g.double()
    cells = a.unsqueeze(-1) + b.unsqueeze(-3)  # (B, n, k, m)
    c = torch.logsumexp(cells, dim=-2, keepdim=True)
    w = g.unsqueeze(-2) * torch.where(c == -torch.inf, 0.0, torch.exp(cells - c))
    return w.sum(-1), w.sum(-3)


@pytest.mark.parametrize("shape", GRAD_SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("need", ["both", "a", "b"])
def test_log_gradients_on_every_work_split_match_float64(device, impl, shape, need):
    B, n, k, m = shape
    gen = torch.Generator().manual_seed(n * k + m)
    a_t = torch.randn(B, k, n, generator=gen)  # a is passed transposed: strided rows
    a_t[0, :, 1] = -torch.inf  # row 1 of c is all -inf: no gradient flows through it
    b = torch.randn(1, k, m, generator=gen)  # broadcast over the batch
    b[0, 0, :3] = -torch.inf
    g = torch.randn(B, n, m, generator=gen)
    g[-1, -1, -1] = torch.nan  # reaches exactly grad_a[-1, -1, :] and grad_b[:, -1]
    a_t, b = (t.to(device).requires_grad_(need in ("both", name)) for t, name in ((a_t, "a"), (b, "b")))
    g = g.to(device)
    leaves = [t for t in (a_t, b) if t.requires_grad]
    got = torch.autograd.grad(so.logbmm(a_t.transpose(1, 2), b), leaves, g)
    want_a, want_b = _log_grads_float64(a_t.detach().transpose(1, 2), b.detach(), g)
    want = {"both": (want_a.transpose(1, 2), want_b.sum(0, keepdim=True)), "a": (want_a.transpose(1, 2),)}
    want["b"] = want["both"][1:]
    for x, y in zip(got, want[need], strict=True):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x.double(), y, rtol=1e-4, atol=1e-4, equal_nan=True)
