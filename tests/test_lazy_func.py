"""torch.func transforms and forward-mode AD of semiring_ops.lazy reductions: vmap (the batching rule), jvp
(forward-mode derivatives, formula.jvp), and their compositions jacrev, jacfwd and hessian, against dense
torch computations and against finite differences in float64 (gradcheck's forward-mode and batched checks).
KeOps' own test_vmap.py and test_torch_func*.py run in tests/test_keops_suite.py."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lazy_grad import CASES, _args
from torch.autograd import gradcheck, gradgradcheck

from semiring_ops.lazy import LazyTensor, Vi, Vj
from semiring_ops.lazy.formula import Exp, FormulaError, Mul, Sin, Square, Sub, Var, evaluate, jvp, transpose_linear

DEVICES = ["cpu", CUDA]
F64 = torch.float64


# ---------------------------------------------------------------- the formula-level jvp


def test_formula_jvp_is_the_directional_derivative():
    g = torch.Generator().manual_seed(0)
    x, y, tx = (torch.randn(5, 3, generator=g, dtype=F64) for _ in range(3))
    vx, vy, vt = Var("i", 3, tensor=x), Var("j", 3, tensor=y), Var("i", 3, tensor=tx)
    f = Exp(Mul(Sin(Square(Sub(vx, vy))), vx))

    def read(v):
        return v.tensor

    df = jvp(f, [vx], [vt])
    ref = torch.func.jvp(lambda a: ((a - y).square().sin() * a).exp(), (x,), (tx,))[1]
    torch.testing.assert_close(evaluate(df, read, x), ref, rtol=1e-12, atol=1e-12)
    assert jvp(f, [Var("p", 3, tensor=torch.ones(3))], [vt]) is None  # f does not depend on it
    with pytest.raises(FormulaError, match="tangent of dimension 2"):
        jvp(f, [vx], [Var("i", 2, tensor=x[:, :2])])


def test_transpose_linear():
    a = torch.randn(4, 3, dtype=F64)
    va, vy = Var("i", 3, tensor=a), Var("i", 3, tensor=torch.randn(4, 3, dtype=F64))
    out = transpose_linear(lambda e: Mul(e, va), 3, vy)  # diagonal: its own transpose
    torch.testing.assert_close(evaluate(out, lambda v: v.tensor, a), a * vy.tensor)
    with pytest.raises(FormulaError, match="not linear"):
        transpose_linear(lambda e: Mul(Mul(e, e), va), 3, vy)


# ---------------------------------------------------------------- forward mode and batching, by gradcheck


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_mode_equals_finite_differences(compiled, device, name):
    """gradcheck's forward-mode check (the jvp against finite differences, and the reverse mode as before) for
    sum, logsumexp, weighted logsumexp, max, min, k-best, over i and over j, with parameters and numbers."""
    fn, args = CASES[name], _args(device)
    assert gradcheck(fn, args, atol=1e-6, rtol=1e-5, check_forward_ad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum_j", "logsumexp_i_vector"])
def test_forward_over_reverse(compiled, device, name):
    """The jvp of the backward's reductions (what hessian = jacfwd(jacrev) runs), against finite differences."""
    fn, args = CASES[name], _args(device)
    assert gradgradcheck(fn, args, atol=1e-6, rtol=1e-5, check_fwd_over_rev=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum_i_vector", "weighted_logsumexp", "max_j", "kmin_j"])
def test_batched_jacobians(compiled, device, name):
    """torch.func.jacrev (vmap of the vjp) and jacfwd (vmap of the jvp), both through the batching rule, against
    the Jacobian built one backward pass at a time."""
    fn, args = CASES[name], _args(device)
    want = torch.autograd.functional.jacobian(fn, tuple(args), vectorize=False)
    argnums = tuple(range(len(args)))
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        got = transform(fn, argnums=argnums)(*args)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_legacy_vmap_is_refused_clearly(compiled):
    fn, args = CASES["sum_j"], _args("cpu")
    with pytest.raises(NotImplementedError, match="vectorize=False"):
        torch.autograd.functional.jacobian(fn, tuple(args), vectorize=True)


def _dense_gauss(x, y, b, p):
    """The dense twin of _lazy_gauss: sum_j exp(-p |x_i - y_j|^2) b_j."""
    k = (-p[..., None] * ((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1)).exp()
    return k @ b


def _lazy_gauss(x, y, b, p):
    k = -LazyTensor(p[..., None, None, :]) * LazyTensor(x[..., :, None, :]).sqdist(LazyTensor(y[..., None, :, :]))
    return (k.exp() * LazyTensor(b[..., None, :, :])).sum(-2)


def _gauss_inputs(device, batch=(), m=7, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, m, 2, generator=g, dtype=F64)
    y = torch.randn(*batch, n, 2, generator=g, dtype=F64)
    b = torch.randn(*batch, n, 3, generator=g, dtype=F64)
    p = torch.rand(*batch, 1, generator=g, dtype=F64) + 0.5
    return [t.to(device) for t in (x, y, b, p)]


# ---------------------------------------------------------------- vmap


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=6, deadline=None)
@given(
    dims=st.tuples(*[st.sampled_from([None, 0, 1]) for _ in range(4)]).filter(lambda d: any(x is not None for x in d)),
    out_dim=st.sampled_from([0, 1, -1]),
    inner_batch=st.sampled_from([(), (2,)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_vmap_equals_the_dense_computation(compiled, device, dims, out_dim, inner_batch, seed):
    """Any combination of vmapped and shared inputs, vmapped along any dimension, over LazyTensors with
    batch dimensions of their own or none, and the gradient through the vmap."""
    size = 3
    base = _gauss_inputs(device, inner_batch, seed=seed)
    args = []
    for t, d in zip(base, dims, strict=True):
        if d is not None:
            t = torch.stack([t + 0.1 * k for k in range(size)], dim=min(d, t.dim()))
        args.append(t.requires_grad_())
    in_dims = tuple(None if d is None else min(d, t.dim() - 1) for t, d in zip(args, dims, strict=True))
    got = torch.vmap(_lazy_gauss, in_dims=in_dims, out_dims=out_dim)(*args)
    want = torch.vmap(_dense_gauss, in_dims=in_dims, out_dims=out_dim)(*args)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    u = torch.randn_like(want)
    gots = torch.autograd.grad(got, args, u)
    wants = torch.autograd.grad(want, args, u)
    for a, b in zip(gots, wants, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_of_arg_and_kbest_reductions(compiled, device):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 2, generator=g, dtype=F64).to(device)
    y = torch.randn(11, 2, generator=g, dtype=F64).to(device)

    def lazy(x):
        d = Vi(x).sqdist(Vj(y))
        return d.argmin(1), d.Kmin_argKmin(3, dim=1), d.min(0)

    def dense(x):
        d = ((x[:, None] - y[None]) ** 2).sum(-1, keepdim=True)
        s = d.sort(dim=1)
        return d.argmin(1), (s.values[:, :3, 0], s.indices[:, :3, 0]), d.amin(0)

    got, want = torch.vmap(lazy)(x), torch.vmap(dense)(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1][1], want[1][1])
    torch.testing.assert_close(got[1][0], want[1][0])
    torch.testing.assert_close(got[2], want[2])


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_of_a_block_sparse_reduction(compiled, device):
    """Block-sparse reductions have no batch dimensions: vmap runs one per entry."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 2, generator=g, dtype=F64).to(device).requires_grad_()
    y = torch.randn(8, 2, generator=g, dtype=F64).to(device)
    ranges_i = torch.tensor([[0, 3], [3, 6]], dtype=torch.int32)
    slices_i = torch.tensor([1, 2], dtype=torch.int32)
    red_j = torch.tensor([[0, 4], [2, 8]], dtype=torch.int32)
    ranges_j = torch.tensor([[0, 2], [2, 4], [4, 8]], dtype=torch.int32)
    slices_j = torch.tensor([1, 3, 4], dtype=torch.int32)
    red_i = torch.tensor([[0, 3], [0, 3], [3, 6], [3, 6]], dtype=torch.int32)
    ranges = (ranges_i, slices_i, red_j, ranges_j, slices_j, red_i)
    mask = torch.zeros(6, 8, dtype=F64, device=device)
    mask[:3, :4] = 1
    mask[3:, 2:8] = 1

    def lazy(x):
        return (-Vi(x).sqdist(Vj(y))).exp().sum(1, ranges=ranges)

    def dense(x):
        return ((-((x[:, None] - y[None]) ** 2).sum(-1)).exp() * mask).sum(1, keepdim=True)

    got, want = torch.vmap(lazy)(x), torch.vmap(dense)(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


# ---------------------------------------------------------------- jvp, jacfwd, hessian


@pytest.mark.parametrize("device", DEVICES)
def test_jacobians_and_hessian_equal_the_dense_ones(compiled, device):
    x, y, b, p = _gauss_inputs(device, m=3, n=5)

    def loss(fn):
        return lambda x, y, b, p: fn(x, y, b, p).sin().sum()

    for transform in (torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        got = transform(loss(_lazy_gauss), argnums=(0, 1, 2, 3))(x, y, b, p)
        want = transform(loss(_dense_gauss), argnums=(0, 1, 2, 3))(x, y, b, p)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["logsumexp", "max", "Kmin"])
def test_jvp_of_other_reductions_equals_the_dense_one(compiled, device, reduction):
    g = torch.Generator().manual_seed(6)
    x, tx = (torch.randn(2, 5, 3, generator=g, dtype=F64).to(device) for _ in range(2))
    y, ty = (torch.randn(2, 7, 3, generator=g, dtype=F64).to(device) for _ in range(2))

    def lazy(x, y):
        f = (LazyTensor(x[:, :, None]) * LazyTensor(y[:, None])).cos()
        return getattr(f, reduction)(*((2,) if reduction == "Kmin" else ()), dim=2)

    def dense(x, y):
        f = (x[:, :, None] * y[:, None]).cos()
        if reduction == "logsumexp":
            return f.logsumexp(2)
        if reduction == "max":
            return f.amax(2)
        return f.sort(dim=2).values[:, :, :2]

    got = torch.func.jvp(lazy, (x, y), (tx, ty))
    want = torch.func.jvp(dense, (x, y), (tx, ty))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_dual_tensors_of_forward_ad(compiled, device):
    """torch.autograd.forward_ad's dual tensors (no torch.func): a reduction of one carries its tangent, and
    one of plain tensors inside a dual level has none."""
    x, y, b, p = _gauss_inputs(device)
    t = torch.randn_like(x)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(_lazy_gauss(fwAD.make_dual(x, t), y, b, p))
        want = fwAD.unpack_dual(_dense_gauss(fwAD.make_dual(x, t), y, b, p))
        plain = fwAD.unpack_dual(_lazy_gauss(x, y, b, p))
    torch.testing.assert_close(got.primal, want.primal)
    torch.testing.assert_close(got.tangent, want.tangent, rtol=1e-12, atol=1e-12)
    assert plain.tangent is None
