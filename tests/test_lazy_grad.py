"""Gradients of semiring_ops.lazy reductions: gradcheck and gradgradcheck in float64 (small sizes) for sum,
logsumexp, weighted logsumexp, max, min and k-best, through formulas of i-variables, j-variables and
parameters (batched too), over i and over j; the gradients of every reduction against torch autograd on the
dense matrix at sizes straddling the CPU lanes; -inf rows give zero gradients, never NaN."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lazy_ops import FORMULAS as OP_FORMULAS
from test_lazy_ops import lazy_vars, make_inputs
from torch.autograd import gradcheck, gradgradcheck

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj

DEVICES = ["cpu", CUDA]


# ---------------------------------------------------------------- gradcheck / gradgradcheck

# name: (function of (x (M, D) i, y (N, D) j, b (N, 2) j, s (1,) p, p (D,) p), second order checked too)
CASES = {
    "sum_j": lambda x, y, b, s, p: (-Vi(x).sqdist(Vj(y)) * Pm(s)).exp() @ b,
    "sum_i_vector": lambda x, y, b, s, p: ((Vi(x) * Vj(y) + Pm(p)) * Pm(s)).sin().sum(0),
    "logsumexp_j": lambda x, y, b, s, p: (-Vi(x).sqdist(Vj(y)) * Pm(s) + Vj(b).elem(0)).logsumexp(1),
    "logsumexp_i_vector": lambda x, y, b, s, p: (Vi(x) * Vj(y) - Pm(p) * Vj(b).elem(1)).logsumexp(dim=0),
    "weighted_logsumexp": lambda x, y, b, s, p: (-Vi(x).sqdist(Vj(y)) * Pm(s)).logsumexp(
        1, weight=(Vj(b) + Vi(x) * Pm(p)).exp()
    ),
    "max_j": lambda x, y, b, s, p: ((Vi(x) * Vj(y)).sum(-1) * Pm(s) + Vj(b).elem(0)).max(1),
    "min_i_vector": lambda x, y, b, s, p: ((Vi(x) - Vj(y)).abs() * Pm(p) + Pm(s)).min(0),
    "kmin_j": lambda x, y, b, s, p: (Vi(x).sqdist(Vj(y)) * Pm(s) - Vj(b).elem(1)).Kmin(2, dim=1),
    "kmax_i_vector": lambda x, y, b, s, p: ((Vi(x) + Vj(y)) * Pm(p)).Kmax(2, dim=0),
    # one tensor as the i- and the j-variable (a kernel matrix of a point set), a 0-d tensor as a parameter
    "self_kernel": lambda x, y, b, s, p: (-Vi(x).sqdist(Vj(x)) * LazyTensor(s[0])).exp() @ (x * p),
}


def _args(device, m=4, n=3, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    b = torch.randn(n, 2, generator=g, dtype=torch.float64)
    s = torch.rand(1, generator=g, dtype=torch.float64) + 0.5
    p = torch.randn(d, generator=g, dtype=torch.float64)
    return [t.to(device).requires_grad_() for t in (x, y, b, s, p)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_and_gradgradcheck(compiled, device, name):
    fn = CASES[name]
    args = _args(device)
    out = fn(*args)
    assert out.requires_grad and torch.isfinite(out).all()
    assert gradcheck(fn, args, atol=1e-6, rtol=1e-5)
    assert gradgradcheck(fn, args, atol=1e-6, rtol=1e-5)


def _batched(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 1, 3, 1, 2, generator=g, dtype=torch.float64)
    y = torch.randn(1, 3, 1, 2, 2, generator=g, dtype=torch.float64)
    p = torch.rand(3, 1, 1, 2, generator=g, dtype=torch.float64) + 0.5  # a batched parameter
    return [t.to(device).requires_grad_() for t in (x, y, p)]


BATCHED = {
    "sum": lambda x, y, p: ((LazyTensor(x) - LazyTensor(y)) * LazyTensor(p)).sqnorm2().sin().sum(-2),
    "logsumexp_i": lambda x, y, p: (-((LazyTensor(x) - LazyTensor(y)) * LazyTensor(p)).square()).logsumexp(-3),
    "max": lambda x, y, p: ((LazyTensor(x) * LazyTensor(y)) * LazyTensor(p)).sum(-1).max(3),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BATCHED))
def test_gradcheck_with_batch_dimensions(compiled, device, name):
    fn = BATCHED[name]
    args = _batched(device)
    assert fn(*args).shape[:2] == (2, 3)
    assert gradcheck(fn, args, atol=1e-6, rtol=1e-5)
    if name != "max":
        assert gradgradcheck(fn, args, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- against torch autograd on the dense matrix


def _dense_reduce(name, dense, dim, k):
    if name == "sum":
        return dense.sum(dim)
    if name == "logsumexp":
        return torch.logsumexp(dense, dim)
    if name == "max":
        return dense.amax(dim)
    if name == "min":
        return dense.amin(dim)
    vals = torch.sort(dense, dim=dim, descending=name == "Kmax", stable=True).values
    vals = vals.narrow(dim, 0, k)
    return vals.movedim(dim, -2) if dim == 0 else vals  # (rows, K, D)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "logsumexp", "max", "min", "Kmin", "Kmax"])
@settings(max_examples=3, deadline=None)
@given(m=st.sampled_from([1, 15, 17, 33]), n=st.sampled_from([2, 16, 17, 40]), seed=st.integers(0, 2**32 - 1))
def test_gradients_equal_torch_autograd_of_the_dense_matrix(backend, device, name, m, n, seed):
    """Random continuous inputs (no ties): the max / min / k-best subgradient is torch's gradient."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(m, 3, generator=g, dtype=torch.float64).to(device)
    y0 = torch.randn(n, 3, generator=g, dtype=torch.float64).to(device)
    s0 = torch.tensor([0.7], dtype=torch.float64, device=device)
    k = min(2, m, n)
    for dim in (1, 0):
        rows = m if dim == 1 else n
        x, y, s = (t.clone().requires_grad_() for t in (x0, y0, s0))
        f = (Vi(x) - Vj(y)).abs() * Pm(s) + Vi(x).sqdist(Vj(y)) * 0.5
        lazy = getattr(f, name)(k, dim=dim) if name.startswith("K") else getattr(f, name)(dim=dim)
        xd, yd, sd = (t.clone().requires_grad_() for t in (x0, y0, s0))
        dense = (xd[:, None] - yd[None]).abs() * sd + ((xd[:, None] - yd[None]) ** 2).sum(-1, keepdim=True) * 0.5
        ref = _dense_reduce(name, dense, dim, k)
        if name.startswith("K"):
            assert lazy.shape == (rows, k, 3)
        torch.testing.assert_close(lazy, ref, rtol=1e-10, atol=1e-10)
        go = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(device)
        got = torch.autograd.grad(lazy, [x, y, s], go)
        want = torch.autograd.grad(ref, [xd, yd, sd], go)
        for a, b, what in zip(got, want, "xys", strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda msg, w=what: f"grad of {w}: {msg}")


@pytest.mark.parametrize("device", DEVICES)
def test_second_derivatives_equal_torch_autograd_of_the_dense_matrix(compiled, device):
    """Hessian-vector products of sum and logsumexp reductions, against the dense computation."""
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(17, 3, generator=g, dtype=torch.float64).to(device)
    y0 = torch.randn(33, 3, generator=g, dtype=torch.float64).to(device)
    for name, dim in (("sum", 1), ("logsumexp", 1), ("sum", 0), ("logsumexp", 0)):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        xd, yd = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        lazy = getattr((-Vi(x).sqdist(Vj(y))).exp() + (Vi(x) | Vj(y)), name)(dim)
        dd = (-((xd[:, None] - yd[None]) ** 2).sum(-1)).exp() + (xd[:, None] * yd[None]).sum(-1)
        ref = getattr(dd, name)(dim)[..., None]
        gx, gy = torch.autograd.grad(lazy.sum(), [x, y], create_graph=True)
        rx, ry = torch.autograd.grad(ref.sum(), [xd, yd], create_graph=True)
        torch.testing.assert_close(gx, rx)
        v = torch.randn(17, 3, generator=g, dtype=torch.float64).to(device)
        hx, hy = torch.autograd.grad((gx * v).sum() + gy.sum(), [x, y])
        wx, wy = torch.autograd.grad((rx * v).sum() + ry.sum(), [xd, yd])
        torch.testing.assert_close(hx, wx, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(hy, wy, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- -inf


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [3, 17])
def test_an_all_minus_infinity_row_gives_a_zero_gradient(backend, device, n):
    g = torch.Generator().manual_seed(n)
    a0 = torch.randn(5, 1, generator=g, dtype=torch.float64)
    a0[0] = -math.inf
    z0 = torch.randn(n, 1, generator=g, dtype=torch.float64)
    w0 = torch.rand(n, 1, generator=g, dtype=torch.float64) + 0.5
    a0, z0, w0 = a0.to(device), z0.to(device), w0.to(device)
    for name in ("logsumexp", "weighted", "max", "min", "Kmax"):
        a, z, w = (t.clone().requires_grad_() for t in (a0, z0, w0))
        f = Vi(a) + Vj(z).sin()
        if name == "weighted":
            out = f.logsumexp(1, weight=Vj(w))
        elif name == "Kmax":
            out = f.Kmax(2, dim=1)
        else:
            out = getattr(f, name)(1)
        assert (out[0] == -math.inf).all(), name
        out.sum().backward()
        for t in (a, z, w):
            assert t.grad is None or torch.isfinite(t.grad).all(), name
        assert a.grad[0].item() == 0.0, name
        # the other rows: torch on the dense matrix without the -inf row
        ad, zd, wd = (t.clone().requires_grad_() for t in (a0[1:], z0, w0))
        dense = ad[:, None] + zd[None].sin()
        if name == "logsumexp":
            ref = torch.logsumexp(dense, 1)
        elif name == "weighted":
            ref = torch.logsumexp(dense + wd[None].log(), 1)
        elif name in ("max", "min"):
            ref = dense.amax(1) if name == "max" else dense.amin(1)
        else:
            ref = torch.sort(dense, 1, descending=True).values[:, :2]
        ref.sum().backward()
        torch.testing.assert_close(a.grad[1:], ad.grad)
        torch.testing.assert_close(z.grad, zd.grad)
        if name == "weighted":
            torch.testing.assert_close(w.grad, wd.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_minus_infinity_terms_pass_no_gradient_in_logsumexp(compiled, device):
    """Some -inf terms in a row (not all): their softmax weight is exactly 0, the others' gradients finite."""
    a = torch.tensor([[0.5], [-1.0], [2.0]], dtype=torch.float64, device=device, requires_grad=True)
    z = torch.tensor([[-math.inf], [0.25], [-math.inf], [1.0]], dtype=torch.float64, device=device, requires_grad=True)
    out = (Vi(a) * 2 + Vj(z)).logsumexp(1)
    out.sum().backward()
    ad, zd = a.detach().clone().requires_grad_(), z.detach().clone().requires_grad_()
    torch.logsumexp(ad[:, None] * 2 + zd[None], 1).sum().backward()
    torch.testing.assert_close(a.grad, ad.grad)
    torch.testing.assert_close(z.grad, zd.grad)
    assert z.grad[0].item() == z.grad[2].item() == 0.0


# ---------------------------------------------------------------- the derivative of every operation


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(OP_FORMULAS))
def test_gradcheck_of_every_operation_through_a_sum_over_j(compiled, device, name):
    """The symbolic VJP of each operation (formula.py), as the kernels run it: gradcheck of the formulas of
    test_lazy_ops.py summed over j, with respect to every i-variable, j-variable and parameter."""
    v = make_inputs(4, 3, 1, device)
    keys = list(v)
    lazy, _ = OP_FORMULAS[name]

    def fn(*ts):
        return lazy(lazy_vars(dict(zip(keys, ts, strict=True)))).sum(1)

    args = [v[k].clone().requires_grad_() for k in keys]
    assert gradcheck(fn, args, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("over", ["j", "i"])
@pytest.mark.parametrize(
    "name",
    [
        "sum",
        "logsumexp",
        "max",
        "min",
    ],
)
def test_an_empty_reduced_axis_gives_zero_gradients(backend, over, name):
    """Reducing over nothing gives the semiring zero, a constant: every variable gets a zero gradient."""
    full = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    empty = torch.randn(0, 2, dtype=torch.float64, requires_grad=True)
    x, y = (full, empty) if over == "j" else (empty, full)
    s = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    out = getattr((Vi(x) - Vj(y)) * Pm(s), name)(1 if over == "j" else 0)
    grads = torch.autograd.grad(out[torch.isfinite(out)].sum(), [x, y, s], allow_unused=True)
    for g, t in zip(grads, (x, y, s), strict=True):
        assert g is None or (g.shape == t.shape and not g.any())
