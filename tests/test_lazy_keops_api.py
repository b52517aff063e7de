"""The parts of KeOps's LazyTensor API added for issue 15 (drop-in gaps): new operations, reductions and
reduction options, each against a float64 torch computation of the dense (M, N, D) formula written by hand,
on the generated kernels and on the PyTorch fallback (the ``backend`` fixture), on the CPU and CUDA (the
``device`` fixture); gradients by gradcheck in float64 and against torch autograd of the dense formula.
tests/test_keops_suite.py runs KeOps's own test files; this module tests each addition on its own."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
import torch
from conftest import HAS_CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj
from semiring_ops.lazy import formula_math as FM
from semiring_ops.lazy.cluster import from_matrix
from semiring_ops.lazy.formula import canonicalize
from semiring_ops.lazy.formula_key import parse_formula

SIZES = st.sampled_from([1, 2, 15, 16, 17, 40])
F64 = torch.float64


def _inputs(m: int, n: int, seed: int, device: str) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=None, scale=1.0):
        t = torch.randn(*shape, generator=g, dtype=F64) if lo is None else torch.rand(*shape, generator=g, dtype=F64)
        return (t * scale + (0 if lo is None else lo)).to(device)

    return SimpleNamespace(
        x=r(m, 3, lo=0.1),  # i-variable in [0.1, 1.1)
        a=r(m, 6),  # i-variable, a 2 x 3 matrix
        y=r(n, 3),  # j-variable
        b=r(n, 6),  # j-variable, a 3 x 2 matrix
        s=r(n, 1),  # j-variable of dimension 1
        p=r(3),  # parameter (3,)
        q=r(1, lo=0.5),  # parameter (1,), positive
        w=r(9),  # parameter (9,): a 3 x 3 matrix
    )


def _lazy(v: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(
        x=Vi(v.x), a=Vi(v.a), y=Vj(v.y), b=Vj(v.b), s=Vj(v.s), p=Pm(v.p), q=Pm(v.q), w=Pm(v.w), raw=v
    )


def _dense(v: SimpleNamespace) -> SimpleNamespace:
    """The variables as broadcastable tensors: i (M, 1, D), j (1, N, D), parameters (D,)."""
    return SimpleNamespace(x=v.x[:, None], a=v.a[:, None], y=v.y[None], b=v.b[None], s=v.s[None], p=v.p, q=v.q, w=v.w)


def _cat(*ts: torch.Tensor) -> torch.Tensor:
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in ts))
    return torch.cat([t.expand(*lead, t.shape[-1]) for t in ts], -1)


def _round(x: torch.Tensor, d: int = 0) -> torch.Tensor:
    """C's round (half away from zero) to d decimals."""
    s = 10.0**d
    return torch.sign(x * s) * torch.floor((x * s).abs() + 0.5) / s


def _xlogx(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, torch.zeros_like(x), x * torch.log(torch.where(x == 0, torch.ones_like(x), x)))


def _lead(*ts: torch.Tensor) -> tuple[int, ...]:
    return torch.broadcast_shapes(*(t.shape[:-1] for t in ts))


def _mat(t: torch.Tensor, r: int, c: int) -> torch.Tensor:
    return t.reshape(*t.shape[:-1], r, c)


KNOTS = [-1.0, -0.5, -0.5, 0.0, 0.3, 0.9, 1.0, 1.0, 2.0]  # repeated knots: some ratios are 0 / 0


def _bspline_dense(t: list[float], x: torch.Tensor, k: int) -> torch.Tensor:
    """The B-splines of order k on the knots t at x (..., 1), by Cox-de Boor's definition (0 / 0 counts 0)."""

    def b(i: int, p: int) -> torch.Tensor:
        if p == 0:
            return ((t[i] <= x) & (x < t[i + 1])).to(x.dtype)
        left = (x - t[i]) / (t[i + p] - t[i]) * b(i, p - 1) if t[i + p] > t[i] else 0 * x
        right = (t[i + p + 1] - x) / (t[i + p + 1] - t[i + 1]) * b(i + 1, p - 1) if t[i + p + 1] > t[i + 1] else 0 * x
        return left + right

    return torch.cat([b(i, k) for i in range(len(t) - k - 1)], -1)


# name: (the LazyTensor formula, the same by hand in torch)
FORMULAS = {
    "inverse_trig": (
        lambda v: (
            (v.x - 0.6).asin() * v.y
            + (v.x * 0.8 - 0.4).acos()
            + (v.x - v.y).atan()
            + v.y.atan2(v.x - 0.6)
            + v.s.atan2(v.y)
        ),
        lambda v: (
            torch.asin(v.x - 0.6) * v.y
            + torch.acos(v.x * 0.8 - 0.4)
            + torch.atan(v.x - v.y)
            + torch.atan2(*torch.broadcast_tensors(v.y, v.x - 0.6))
            + torch.atan2(*torch.broadcast_tensors(v.s, v.y))
        ),
    ),
    "sinc_xlogx": (
        lambda v: (
            (v.x - v.y).sinc()
            + (v.y * v.q).sinxdivx() * v.s
            + v.x.xlogx()
            + (v.y - v.y).sinc()  # exactly 0: 1
            + (v.s * 0).xlogx()  # exactly 0: 0
            + (v.x * 3 + v.y).abs().xlogx()
        ),
        lambda v: (
            torch.sinc(v.x - v.y)
            + torch.sinc(v.y * v.q / math.pi) * v.s
            + _xlogx(v.x)
            + 1
            + 0
            + _xlogx((v.x * 3 + v.y).abs())
        ),
    ),
    "rounding": (
        lambda v: (
            (v.x * 10 - v.y).round()
            + (v.y * 3).floor()
            + (v.x - v.y).round(2)
            + (v.x - v.y).mod(0.7, 0.1)
            + v.y.mod(2)
            + v.s.mod(v.x + 0.5)
        ),
        lambda v: (
            _round(v.x * 10 - v.y)
            + torch.floor(v.y * 3)
            + _round(v.x - v.y, 2)
            + ((v.x - v.y) - 0.7 * torch.floor(((v.x - v.y) - 0.1) / 0.7))
            + (v.y - 2 * torch.floor(v.y / 2))
            + (v.s - (v.x + 0.5) * torch.floor(v.s / (v.x + 0.5)))
        ),
    ),
    "comparisons": (
        lambda v: (
            (v.x < v.y)
            + 2 * (v.x <= v.s)
            + 4 * (v.y > v.p)
            + 8 * (v.y >= 0.5)
            + 16 * (v.x == v.x)
            + 32 * (v.y != v.s)
            + 64 * (0 < v.y)  # noqa: SIM300 (the reflected comparison is the point)
            + 128 * (v.s == v.y)
        ),
        lambda v: (
            (v.x < v.y).double()
            + 2 * (v.x <= v.s).double()
            + 4 * (v.y > v.p).double()
            + 8 * (v.y >= 0.5).double()
            + 16
            + 32 * (v.y != v.s).double()
            + 64 * (v.y > 0).double()
            + 128 * (v.s == v.y).double()
        ),
    ),
    "one_hot_power_norm": (
        lambda v: (
            (v.s * 2 + 1).one_hot(4) * v.x.elem(0)
            + v.x.power(v.s.abs()).concat(v.x.norm(-1))
            + (v.x - v.y).power(2).concat(v.q)
        ),
        lambda v: (
            torch.nn.functional.one_hot((torch.floor(v.s * 2 + 1.5).clamp(-1, 4) + 1).long()[..., 0], 6)[
                ..., 1:5
            ].double()
            * v.x[..., :1]
            + _cat(v.x ** v.s.abs(), v.x.norm(dim=-1, keepdim=True))
            + _cat((v.x - v.y) ** 2, v.q.expand(1, 1, 1))
        ),
    ),
    "contractions": (
        lambda v: LazyTensor.cat(
            (
                v.a.matvecmult(v.y),  # (2 x 3) @ 3
                v.y.vecmatmult(v.b),  # 3 @ (3 x 2)
                v.a.keops_tensordot(v.b, (2, 3), (3, 2), (1,), (0,)),  # (2 x 3) @ (3 x 2), 4
                v.a.keops_tensordot(v.b, (2, 3), (3, 2), (1,), (0,), (1, 0)),  # its transpose
                v.x.tensorprod(v.y),  # 9
                v.x.keops_kron(v.b, (3, 1), (2, 3)),  # np.kron of (3 x 1) and (2 x 3): 18
                v.a.keops_tensordot(v.x, (2, 3), (3,), (), ()),  # no contraction: 18
            ),
            -1,
        ),
        lambda v: _cat(
            (_mat(v.a, 2, 3) @ v.y[..., :, None])[..., 0],
            (v.y[..., None, :] @ _mat(v.b, 3, 2))[..., 0, :],
            (_mat(v.a, 2, 3) @ _mat(v.b, 3, 2)).flatten(-2),
            (_mat(v.a, 2, 3) @ _mat(v.b, 3, 2)).transpose(-1, -2).flatten(-2),
            (v.x[..., :, None] * v.y[..., None, :]).flatten(-2),
            torch.einsum("...ij,...kl->...ikjl", _mat(v.x, 3, 1), _mat(v.b, 2, 3)).flatten(-4),
            (v.a[..., :, None] * v.x[..., None, :]).flatten(-2),
        ),
    ),
    "bspline": (
        lambda v: Pm(torch.tensor(KNOTS, dtype=F64, device=v.raw.x.device)).bspline((v.x - v.y).elem(0) * v.q, 2),
        lambda v: _bspline_dense(KNOTS, (v.x - v.y)[..., :1] * v.q, 2),
    ),
    "weighted_norms": (
        lambda v: (
            (v.x - v.y).weightedsqnorm(v.q).concat((v.x - v.y).weightedsqnorm(v.p)).concat(v.x.weightedsqdist(v.y, v.w))
        ),
        lambda v: _cat(
            v.q * ((v.x - v.y) ** 2).sum(-1, keepdim=True),
            (v.p * (v.x - v.y) ** 2).sum(-1, keepdim=True),
            torch.einsum("...d,de,...e->...", v.x - v.y, _mat(v.w, 3, 3), v.x - v.y)[..., None],
        ),
    ),
}


def _assert_sum_close(got: torch.Tensor, terms: torch.Tensor, dim: int) -> None:
    ref = terms.sum(dim)
    assert got.dtype == F64 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    bound = 1e-12 * (terms.shape[dim] + 10) * (terms.abs().sum(dim) + 1)
    err = (got - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


@pytest.mark.parametrize("name", list(FORMULAS))
@settings(max_examples=3, deadline=None)
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_operations_against_the_dense_formula(backend, device, name, m, n, seed):
    v = _inputs(m, n, seed, device)
    lazy, ref = FORMULAS[name]
    f = lazy(_lazy(v))
    terms = ref(_dense(v))
    terms = terms.expand(m, n, terms.shape[-1])
    assert f.shape == (m, n, terms.shape[-1])
    torch.testing.assert_close(f.dense(), terms, rtol=1e-12, atol=1e-12)
    _assert_sum_close(f.sum(1), terms, 1)
    _assert_sum_close(f.sum(0), terms, 0)


# ---------------------------------------------------------------- sin(x) / x and its derivatives


SINC_POINTS = [0.0, 1e-300, -1e-8, 1e-3, -0.1, 0.3, 0.4999, -0.5, 0.5001, 1.0, -2.5, 7.0, -31.0, 1e4]


def _sinxdivx_derivative(x: float, n: int) -> float:
    """The n-th derivative of sin(x)/x at x, by mpmath at 40 digits (the integral form at 0)."""
    with mpmath.workdps(40):
        if x == 0:
            return float(mpmath.quad(lambda t: t**n * mpmath.cos(n * mpmath.pi / 2), [0, 1]))
        return float(mpmath.diff(lambda t: mpmath.sin(t) / t, mpmath.mpf(x), n))


def test_sinxdivx_and_its_derivatives_are_exact_at_and_near_zero(backend, device):
    """sin(x)/x and its first three derivatives, through gradients of reductions (d/dx of sum_j f(x_i)
    is f'(x_i) with one j), against mpmath; KeOps's derivative cos(x)/x - sin(x)/x^2 is NaN at 0."""
    x = torch.tensor(SINC_POINTS, dtype=F64, device=device)[:, None].requires_grad_()
    values = Vi(x).sinxdivx().sum(1)
    (d1,) = torch.autograd.grad(values.sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), x, create_graph=True)
    (d3,) = torch.autograd.grad(d2.sum(), x)
    for n, got in enumerate((values, d1, d2, d3)):
        want = torch.tensor([_sinxdivx_derivative(p, n) for p in SINC_POINTS], dtype=F64, device=device)[:, None]
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=lambda m, n=n: f"derivative {n}: {m}")


def test_sinc_is_torch_sinc_with_its_gradient(backend, device):
    """sinc(x) = sin(pi x) / (pi x), 1 at 0 (the KeOps test file's check), with torch.sinc's gradient (0 at 0)
    where torch's is exact; NaN gives NaN, +-inf gives NaN (as torch.sinc)."""
    pts = torch.tensor([0.0, 0.5, -1.0, 1.5, 1e-9, 3.25, math.nan, math.inf], dtype=F64, device=device)[:, None]
    x = pts.clone().requires_grad_()
    got = Vi(x).sinc().sum(1)
    ref_x = pts.clone().requires_grad_()
    ref = torch.sinc(ref_x)
    torch.testing.assert_close(got, ref, rtol=1e-14, atol=1e-15, equal_nan=True)
    (g,) = torch.autograd.grad(got[:6].sum(), x)
    (gr,) = torch.autograd.grad(ref[:6].sum(), ref_x)
    torch.testing.assert_close(g[[0, 1, 2, 3, 5]], gr[[0, 1, 2, 3, 5]], rtol=1e-12, atol=1e-14)
    # at 1e-9 torch's formula cancels to 0; the exact slope is pi f'(pi x) ~ -pi^2 x / 3
    torch.testing.assert_close(g[4].item(), math.pi * _sinxdivx_derivative(math.pi * 1e-9, 1), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- gradients


def _grad_args(device: str, m: int = 4, n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, 3, generator=g, dtype=F64) * 0.8 - 0.4  # asin / acos need |x| < 1
    y = torch.randn(n, 3, generator=g, dtype=F64)
    b = torch.randn(n, 6, generator=g, dtype=F64)
    s = torch.rand(1, generator=g, dtype=F64) + 0.5
    return [t.to(device).requires_grad_() for t in (x, y, b, s)]


def _knots(like: torch.Tensor, k: int = 7) -> LazyTensor:
    """A parameter of k uneven knots in [-1, 1]."""
    return Pm(torch.linspace(-1, 1, k, dtype=F64, device=like.device) ** 3)


# name: (function of (x (M, 3) i, y (N, 3) j, b (N, 6) j, s (1,) parameter), second order checked too)
GRADIENTS = {
    "inverse_trig": (
        lambda x, y, b, s: (Vi(x).asin() * Vj(y) + Vi(x).acos() * Pm(s) + (Vi(x) - Vj(y)).atan()).sum(1),
        True,
    ),
    "atan2": (lambda x, y, b, s: Vj(y).atan2(Vi(x) + Pm(s)).sum(0), True),
    "sinc": (lambda x, y, b, s: ((Vi(x) - Vj(y)) * Pm(s)).sinc().sum(1), True),
    "xlogx": (lambda x, y, b, s: ((Vi(x) - Vj(y)).square() + Pm(s)).xlogx().sum(0), True),
    "mod": (lambda x, y, b, s: (Vi(x) * 3 - Vj(y)).mod(Pm(s) + 1, 0.25).exp().sum(1), True),
    "contractions": (
        lambda x, y, b, s: LazyTensor.cat(
            (
                Vj(b).matvecmult(Vi(x)),
                Vi(x).vecmatmult(Vj(b)),
                Vi(x).tensorprod(Vj(y) * Pm(s)),
                Vj(b).keops_tensordot(Vi(x), (3, 2), (3,), (0,), (0,)),
                Vi(x).keops_kron(Vj(b), (1, 3), (2, 3)),
            ),
            -1,
        ).sum(1),
        True,
    ),
    "weighted_sqnorm": (
        lambda x, y, b, s: (Vi(x) - Vj(y)).weightedsqnorm(Vj(b).concat(Vj(b)).extract(0, 9)).exp().sum(1),
        True,
    ),
    "softdtw": (lambda x, y, b, s: Vi(x).softdtw_sqdist(Vj(b).extract(1, 4), Pm(s)).sum(1), True),
    "bspline_x": (
        lambda x, y, b, s: _knots(x).bspline(Vi(x).elem(0) + Vj(y).elem(0) * 0.1, 2).sum(1),
        False,
    ),
    "sumsoftmaxweight_j": (lambda x, y, b, s: (-Vi(x).sqdist(Vj(y)) * Pm(s)).sumsoftmaxweight(Vj(b), dim=1), True),
    "sumsoftmaxweight_i": (lambda x, y, b, s: (Vi(x) | Vj(y)).sumsoftmaxweight(Vi(x) * Pm(s), axis=0), True),
}


@pytest.mark.parametrize("name", list(GRADIENTS))
def test_gradcheck(backend, device, name):
    fn, second = GRADIENTS[name]
    args = _grad_args(device)
    out = fn(*args)
    assert out.requires_grad and torch.isfinite(out).all()
    assert gradcheck(fn, args, atol=1e-6, rtol=1e-5)
    if second:
        assert gradgradcheck(fn, args, atol=1e-6, rtol=1e-5)


def test_functions_without_a_gradient_pass_zero(backend, device):
    """round, floor, comparisons, one_hot: zero almost everywhere, so a zero gradient (KeOps' too)."""
    x, y, _, _ = _grad_args(device)
    f = (Vi(x) * 7).round(1) + (Vi(x) * 3).floor() + (Vi(x) < Vj(y)) + (Vi(x).elem(0) * 4 + 1).one_hot(3).sum(-1)
    out = (f * Vj(y)).sum(1)
    (gx, gy) = torch.autograd.grad(out.sum(), [x, y])
    assert not gx.any()
    xd, yd = x.detach()[:, None], y.detach()[None]
    k = torch.floor(xd[..., :1] * 4 + 1.5)  # the one-hot's component, in range or not
    dense = _round(xd * 7, 1) + torch.floor(xd * 3) + (xd < yd).double() + ((k >= 0) & (k < 3)).double()
    want = dense.sum(0)
    torch.testing.assert_close(gy, want, rtol=1e-12, atol=1e-12)


def test_bspline_refuses_knots_that_require_a_gradient(device):
    knots = torch.linspace(0, 1, 6, dtype=F64, device=device, requires_grad=True)
    x = Vi(torch.rand(5, 1, dtype=F64, device=device))
    with pytest.raises(ValueError, match="knots"):
        Pm(knots).bspline(x, 1)
    with torch.no_grad():
        assert Pm(knots).bspline(x, 1).sum(1).shape == (5, 4)


# ---------------------------------------------------------------- values of the larger constructions


def _softdtw_ref(x: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """Soft-DTW of the vectors x (n) and y (m) on squared differences, the recursion written out (float64)."""
    n, m = x.shape[-1], y.shape[-1]
    inf = torch.full(_lead(x, y), math.inf, dtype=x.dtype, device=x.device)
    r = [[inf] * (m + 1) for _ in range(n + 1)]
    r[0][0] = torch.zeros_like(inf)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            prev = torch.stack([r[i - 1][j - 1], r[i - 1][j], r[i][j - 1]])
            soft = -gamma * torch.logsumexp(-prev / gamma, 0)
            r[i][j] = (x[..., i - 1] - y[..., j - 1]) ** 2 + soft
    return r[n][m]


def _bspline_ref(t: list[float], x: float, k: int) -> list[float]:
    """Cox-de Boor's B-splines of order k on knots t at x, by the definition (0/0 ratios count 0)."""

    def b(i: int, p: int) -> float:
        if p == 0:
            return 1.0 if t[i] <= x < t[i + 1] else 0.0
        left = (x - t[i]) / (t[i + p] - t[i]) * b(i, p - 1) if t[i + p] > t[i] else 0.0
        right = (t[i + p + 1] - x) / (t[i + p + 1] - t[i + 1]) * b(i + 1, p - 1) if t[i + p + 1] > t[i + 1] else 0.0
        return left + right

    return [b(i, k) for i in range(len(t) - k - 1)]


@settings(max_examples=3, deadline=None)
@given(n=st.integers(1, 5), m=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_softdtw_sqdist_against_the_recursion(backend, device, n, m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, n, generator=g, dtype=F64).to(device)
    y = torch.randn(5, m, generator=g, dtype=F64).to(device)
    gamma = 0.3
    got = Vi(x).softdtw_sqdist(Vj(y), gamma)
    want = _softdtw_ref(x[:, None], y[None], gamma)[..., None]
    torch.testing.assert_close(got.dense(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.sum(1), want.sum(1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.logsumexp(0), want.logsumexp(0), rtol=1e-12, atol=1e-12)


def test_softdtw_sqdist_size_limit():
    x = Vi(torch.randn(3, 65, dtype=F64))
    with pytest.raises(ValueError, match="SOFTDTW_MAX_CELLS"):
        x.softdtw_sqdist(Vj(torch.randn(4, 64, dtype=F64)), 0.1)
    with pytest.raises(ValueError, match="gamma must be a scalar"):
        x.softdtw_sqdist(Vj(torch.randn(4, 2, dtype=F64)), Pm(torch.ones(2, dtype=F64)))


@pytest.mark.parametrize("k", [0, 1, 3])
def test_bspline_against_cox_de_boor(backend, device, k):
    knots = [-1.0, -0.5, -0.5, 0.0, 0.3, 0.9, 1.0, 1.0]  # repeated knots: some ratios are 0 / 0
    x = torch.tensor([-1.0, -0.7, -0.5, -0.2, 0.0, 0.29, 0.3, 0.95, 1.0, 1.2, -3.0], dtype=F64)
    got = Pm(torch.tensor(knots, dtype=F64, device=device)).bspline(Vi(x[:, None].to(device)), k)
    want = torch.tensor([_bspline_ref(knots, float(p), k) for p in x], dtype=F64, device=device)
    assert got.shape == (11, 1, len(knots) - k - 1)
    torch.testing.assert_close(got.sum(1), want, rtol=1e-14, atol=1e-14)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_keops_tensordot_is_torch_tensordot(backend, device, data):
    """Random shapes, contracted axes and permutations, against torch.tensordot (then permuted as KeOps: the
    free axis p goes to position perm[p]), with its gradient."""
    na, nb = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    nc = data.draw(st.integers(0, min(na, nb)))
    ca = data.draw(st.permutations(range(na)))[:nc]
    cb = data.draw(st.permutations(range(nb)))[:nc]
    da = [data.draw(st.integers(1, 3)) for _ in range(na)]
    db = [data.draw(st.integers(1, 3)) for _ in range(nb)]
    for a, b in zip(ca, cb, strict=True):
        db[b] = da[a]
    nfree = na + nb - 2 * nc
    perm = data.draw(st.permutations(range(nfree))) if nfree else []
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    x = torch.randn(3, math.prod(da), generator=g, dtype=F64).to(device).requires_grad_()
    y = torch.randn(4, math.prod(db), generator=g, dtype=F64).to(device).requires_grad_()
    got = Vi(x).keops_tensordot(Vj(y), tuple(da), tuple(db), tuple(ca), tuple(cb), tuple(perm)).sum(1)
    inverse = [perm.index(k) for k in range(nfree)]
    ref = torch.stack(
        [
            sum(
                torch.tensordot(x[i].reshape(da), y[j].reshape(db), dims=(list(ca), list(cb))).permute(inverse)
                for j in range(4)
            ).reshape(-1)
            for i in range(3)
        ]
    )
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    go = torch.randn(ref.shape, generator=g, dtype=F64).to(device)
    for a, b in zip(torch.autograd.grad(got, [x, y], go), torch.autograd.grad(ref, [x, y], go), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_tensordot_and_contraction_errors():
    x, y = Vi(torch.randn(3, 6)), Vj(torch.randn(4, 6))
    with pytest.raises(ValueError, match=r"\(3, 1, 6\).*must have dimension 4, got 6"):
        x.keops_tensordot(y, (2, 2), (6,), (), ())
    with pytest.raises(ValueError, match="differ"):
        x.keops_tensordot(y, (2, 3), (3, 2), (0,), (0,))
    with pytest.raises(ValueError, match="permutation"):
        x.keops_tensordot(y, (2, 3), (3, 2), (1,), (0,), (0, 0))
    with pytest.raises(ValueError, match="as many axes"):
        x.keops_kron(y, (2, 3), (6,))
    with pytest.raises(ValueError, match="not a multiple"):
        x.matvecmult(Vj(torch.randn(4, 4)))
    with pytest.raises(ValueError, match="weights of dimension 1, 6 or 36"):
        x.weightedsqnorm(Pm(torch.ones(5)))


def test_new_formula_nodes_parse_back_from_their_keys():
    """torch.compile and the registered operator carry a plan as its key: every node class of formula_math
    must parse back (formula_key.py)."""
    x, y, p = Vi(torch.randn(3, 6, dtype=F64)), Vj(torch.randn(4, 6, dtype=F64)), Pm(torch.rand(9, dtype=F64))
    f = LazyTensor.cat(
        (
            x.asin() + x.acos() + x.atan() + x.atan2(y) + x.sinxdivx() + x.xlogx() + x.floor() + x.round(2),
            (x < y) + (x <= y) + (x == y) + (x != y),
            x.elem(0).one_hot(3),
            p.bspline(x.elem(1), 2),
            x.keops_tensordot(y, (2, 3), (3, 2), (1,), (0,), (1, 0)),
            x.elem(0).sinxdivx().grad(x, y.elem(0)),
        ),
        -1,
    )
    canon, _ = canonicalize(f.formula)
    seen = {type(node).__name__ for node in _walk(canon)}
    classes = {c.__name__ for c in vars(FM).values() if isinstance(c, type) and c.__module__ == FM.__name__}
    assert classes - {"_SafeRecip"} <= seen | {"Atan2"}, classes - seen
    assert parse_formula(canon.key).key == canon.key
    bs = canonicalize(Pm(torch.rand(9, dtype=F64)).bspline(x.elem(1), 2).grad(x, Pm(torch.ones(6, dtype=F64))).formula)
    assert "SafeRecip" in bs[0].key and parse_formula(bs[0].key).key == bs[0].key


def _walk(node):
    yield node
    for c in node.children:
        yield from _walk(c)


# ---------------------------------------------------------------- keepdim, the aliases, @


def _kd_inputs(device, seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, 7, 2, generator=g, dtype=F64).to(device)
    y = torch.randn(*batch, 5, 2, generator=g, dtype=F64).to(device)
    return x, y


@pytest.mark.parametrize("batch", [(), (3,)])
def test_keepdim_keeps_the_reduced_axis(backend, device, batch):
    """keepdim=True gives torch's keepdim shape, (*batch, M, 1, D) over j and (*batch, 1, N, D) over i; for the
    vector dimension KeOps ignores it (the result is a LazyTensor, whose vector dimension stays)."""
    x, y = _kd_inputs(device, batch=batch)
    f = LazyTensor(x[..., :, None, :]) - LazyTensor(y[..., None, :, :])
    dense = x[..., :, None, :] - y[..., None, :, :]
    nb = len(batch)
    for axis in (nb, nb + 1):
        for name, ref in (
            ("sum", lambda t, a: t.sum(a, keepdim=True)),
            ("logsumexp", lambda t, a: t.logsumexp(a, keepdim=True)),
            ("max", lambda t, a: t.amax(a, keepdim=True)),
            ("min", lambda t, a: t.amin(a, keepdim=True)),
            ("argmax", lambda t, a: t.argmax(a, keepdim=True)),
            ("argmin", lambda t, a: t.argmin(a, keepdim=True)),
        ):
            got = getattr(f, name)(axis, keepdim=True)
            torch.testing.assert_close(got, ref(dense, axis), rtol=1e-12, atol=1e-12)
            assert getattr(f, name)(axis, keepdim=False).shape == ref(dense, axis).squeeze(axis).shape
        vals, idx = f.min_argmin(dim=axis, keepdim=True)
        torch.testing.assert_close(vals, dense.amin(axis, keepdim=True))
        torch.testing.assert_close(idx, dense.argmin(axis, keepdim=True))
    assert f.sum(-1, keepdim=True).shape == f.sum(-1).shape == (*batch, 7, 5, 1)
    with pytest.raises(ValueError, match="keepdim"):
        f.Kmin(2, dim=nb, keepdim=True)


def test_reduction_aliases_and_matmul_forms(backend, device):
    x, y = _kd_inputs(device)
    f = -Vi(x).sqdist(Vj(y))
    dense = -((x[:, None] - y[None]) ** 2).sum(-1, keepdim=True)
    pairs = [
        (f.max_reduction(dim=1), dense.amax(1)),
        (f.__max__(dim=1), dense.amax(1)),
        (f.min_reduction(axis=0), dense.amin(0)),
        (f.__min__(dim=0), dense.amin(0)),
        (f.argmax_reduction(dim=1), dense.argmax(1)),
        (f.argmin_reduction(dim=1), dense.argmin(1)),
        (f.max_argmax_reduction(dim=1)[0], dense.amax(1)),
        (f.min_argmin_reduction(dim=0)[1], dense.argmin(0)),
        (f.Kmin_reduction(2, dim=1), dense.topk(2, 1, largest=False).values[..., 0]),
        (f.argKmax_reduction(K=2, dim=1), dense.topk(2, 1).indices[..., 0]),
        (f.Kmax_argKmax_reduction(2, dim=1)[0], dense.topk(2, 1).values[..., 0]),
        (f.argKmin_reduction(2, dim=0), dense.topk(2, 0, largest=False).indices[..., 0].T),
        (f.Kmin_argKmin_reduction(2, dim=1)[1], dense.topk(2, 1, largest=False).indices[..., 0]),
        (f.Kmax_reduction(2, dim=0), dense.topk(2, 0).values[..., 0].T),
        (f.exp() @ y[:, 0], (dense.exp()[..., 0] * y[:, 0]).sum(1)),  # v of shape (N,): (M,)
        (LazyTensor.__matmul__(f.exp(), y, backend="CPU" if device == "cpu" else "GPU"), dense.exp()[..., 0] @ y),
        (f.exp().matvec(y), dense.exp()[..., 0] @ y),
        (f.exp().rmatvec(x), dense.exp()[..., 0].T @ x),
        (f.t().sum(1), dense.sum(0)),
    ]
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert f.dim() == f.ndim == 3 and f.nbatchdims == 0
    assert LazyTensor(torch.randn(2, 3, 4, 1, 2)).nbatchdims == 2


def test_indexing_concatenation_and_factorize(backend, device):
    x, y = _kd_inputs(device)
    f = Vi(x).concat(Vj(y)).concat(Vi(x) * Vj(y))  # dimension 6
    dense = f.dense()
    for key, want in (
        (0, dense[..., 0:1]),
        (-1, dense[..., 5:6]),
        (slice(1, 4), dense[..., 1:4]),
        (slice(None, 2), dense[..., :2]),
        (slice(3, None), dense[..., 3:]),
        ((slice(None), slice(None), 2), dense[..., 2:3]),
        ((Ellipsis, slice(2, 5)), dense[..., 2:5]),
    ):
        torch.testing.assert_close(f[key].sum(1), want.sum(1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="vector dimension only"):
        f[0, 0]
    with pytest.raises(ValueError, match="step 1"):
        f[::2]
    cat = LazyTensor.concatenate((Vi(x), Vj(y), Vi(x)), axis=-1)
    torch.testing.assert_close(cat.sum(0), LazyTensor.cat((Vi(x), Vj(y), Vi(x)), -1).sum(0))
    assert cat.shape == (7, 5, 6)
    with pytest.raises(ValueError, match="vector dimension"):
        LazyTensor.concatenate((Vi(x), Vj(y)), axis=0)
    assert f.factorize(Vi(x)) is f and f.auto_factorize() is f


# ---------------------------------------------------------------- sumsoftmaxweight


@settings(max_examples=3, deadline=None)
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_sumsoftmaxweight_is_softmax_weighted_sum(backend, device, m, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2, generator=g, dtype=F64).to(device) * 3
    y = torch.randn(n, 2, generator=g, dtype=F64).to(device) * 3
    w = torch.randn(n, 4, generator=g, dtype=F64).to(device)
    f = -Vi(x).sqdist(Vj(y)) * 20  # sharp: exp underflows without the shift
    dense = -((x[:, None] - y[None]) ** 2).sum(-1) * 20
    torch.testing.assert_close(f.sumsoftmaxweight(Vj(w), dim=1), torch.softmax(dense, 1) @ w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(f.sumsoftmaxweight(w[None], axis=1), torch.softmax(dense, 1) @ w, rtol=1e-10, atol=1e-12)
    v = torch.randn(m, 3, generator=g, dtype=F64).to(device)
    torch.testing.assert_close(
        f.sumsoftmaxweight_reduction(Vi(v), dim=0), torch.softmax(dense, 0).T @ v, rtol=1e-10, atol=1e-12
    )


def test_sumsoftmaxweight_of_minus_infinity_rows_is_zero(backend, device):
    x = torch.tensor([[0.0], [1.0]], dtype=F64, device=device)
    y = torch.tensor([[0.0], [2.0], [3.0]], dtype=F64, device=device)
    f = (Vi(x) - 0.5).log() + Vj(y)  # row 0: log(-0.5) is NaN; row 1: log(0.5) + y
    g = (Vi(x) - 1).log() * 1 + Vj(y)  # row 1: log 0 = -inf for every j
    w = Vj(torch.tensor([[1.0], [2.0], [4.0]], dtype=F64, device=device))
    assert torch.isnan(f.sumsoftmaxweight(w, dim=1)[0]).all()
    assert (g.sumsoftmaxweight(w, dim=1)[1] == 0).all()
    with pytest.raises(ValueError, match="scalar formula"):
        (Vi(x).concat(Vi(x)) + Vj(y)).sumsoftmaxweight(w, dim=1)


# ---------------------------------------------------------------- reduction options


def _rounding_products(device):
    """x_i y_j with x = y = 1 + 2^-12 and 3 j: the product is 1 + 2^-11 + 2^-24, which float32 rounds to
    1 + 2^-11 (a tie, to even), and the float32 sum 3 + 3 2^-11 is exact in any order (with or without fused
    multiply-adds); in float64 the 3 2^-24 left over is 0.75 float32 ulp of the result (2^-22 at 3), so the
    float64 sum cast to float32 is one ulp above the float32 sum, whatever the order of the terms."""
    x = torch.full((3, 1), 1 + 2.0**-12, device=device)
    y = torch.full((3, 1), 1 + 2.0**-12, device=device)
    return Vi(x) * Vj(y), x, y


def test_dtype_acc_and_use_double_acc_reduce_in_float64(backend, device):
    """float32 inputs reduced in float64 and cast back (the result's dtype stays float32)."""
    f, x, y = _rounding_products(device)
    in_float32 = torch.full((3, 1), 3 + 3 * 2.0**-11, device=device)
    in_float64 = torch.tensor(3 + 3 * 2.0**-11 + 3 * 2.0**-24, dtype=F64).float().expand(3, 1).to(device)
    assert in_float32[0, 0] != in_float64[0, 0]
    torch.testing.assert_close(f.sum(1), in_float32, rtol=0, atol=0)
    v = torch.ones(3, 1, device=device)
    for kwargs in (
        {"dtype_acc": "float64"},
        {"use_double_acc": True},
        {"dtype_acc": F64},
        {"sum_scheme": "kahan_scheme"},
    ):
        got = f.sum(1, **kwargs)
        assert got.dtype == torch.float32, kwargs
        torch.testing.assert_close(got, in_float64, rtol=0, atol=0, msg=lambda m, k=kwargs: f"{k}: {m}")
        torch.testing.assert_close(f.__matmul__(v, **kwargs), in_float64, rtol=0, atol=0)  # @ passes them on
    # logsumexp too: the float64 reduction of the same data, cast
    lse64 = (Vi(x.double()) * Vj(y.double())).logsumexp(1).float()
    torch.testing.assert_close(f.logsumexp(1, dtype_acc="float64"), lse64, rtol=0, atol=0)


def test_dtype_acc_for_16_bit_inputs_is_float32_already(backend, device):
    x = torch.randn(20, 3, device=device).half()
    y = torch.randn(30, 3, device=device).half()
    f = Vi(x).sqdist(Vj(y))
    for acc in ("float16", "float32"):
        assert torch.equal(f.sum(1, dtype_acc=acc), f.sum(1))
    assert f.sum(1, dtype_acc="float64").dtype == torch.float16
    ref = (x.double()[:, None] - y.double()[None]).square().sum(-1).sum(1, keepdim=True).half()
    torch.testing.assert_close(f.sum(1, dtype_acc="float64"), ref, rtol=0, atol=0)


def test_accepted_and_ignored_options_change_nothing(backend, device):
    x, y = _kd_inputs(device)
    f = (-Vi(x).sqdist(Vj(y))).exp()
    plain = f.sum(1)
    for kwargs in (
        {"sum_scheme": "direct_sum"},
        {"sum_scheme": "block_sum"},
        {"sum_scheme": "auto"},
        {"enable_chunks": False},
        {"use_fast_math": False},
        {"optional_flags": ["-O2"]},
        {"dtype_acc": "auto", "use_double_acc": False},
        {"backend": "auto", "device_id": -1},
        {"call": True},
        {"dtype_acc": "float64"},  # float64 inputs: already
    ):
        assert torch.equal(f.sum(1, **kwargs), plain), kwargs
    assert torch.equal(f.min(1, sum_scheme="direct_sum"), f.min(1))


def test_option_errors(backend):
    x, y = _kd_inputs("cpu")
    f = Vi(x).sqdist(Vj(y))
    f32 = Vi(x.float()).sqdist(Vj(y.float()))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['bakend'\]"):
        f.sum(1, bakend="CPU")
    with pytest.raises(ValueError, match="backend='GPU_3D'"):
        f.sum(1, backend="GPU_3D")
    with pytest.raises(ValueError, match=r"narrower than the torch\.float64 inputs"):
        f.sum(1, dtype_acc="float32")
    with pytest.raises(ValueError, match="narrower"):
        f32.sum(1, dtype_acc="float16")
    with pytest.raises(ValueError, match="not one of"):
        f.sum(1, dtype_acc="float128")
    with pytest.raises(ValueError, match="set one of them"):
        f32.sum(1, dtype_acc="float64", use_double_acc=True)
    with pytest.raises(ValueError, match="sum-type reductions"):
        f32.min(1, dtype_acc="float64")
    with pytest.raises(ValueError, match="sum-type reductions"):
        f32.argKmin(2, dim=1, sum_scheme="block_sum")
    with pytest.raises(ValueError, match="sum_scheme='pairwise'"):
        f.sum(1, sum_scheme="pairwise")
    with pytest.raises(TypeError, match="enable_chunks must be True or False"):
        f.sum(1, enable_chunks=1)
    with pytest.raises(TypeError, match="device_id must be an int"):
        f.sum(1, device_id="0")
    with pytest.raises(TypeError, match="optional_flags"):
        f.sum(1, optional_flags="-O3")
    assert torch.equal(f.sum(1, call=False)(), f.sum(1))  # a callable (tests/test_lazy_symbolic.py)
    with pytest.raises(ValueError, match="backend='CPU' with device_id=0"):
        f.sum(1, backend="CPU", device_id=0)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error without a GPU")
def test_gpu_options_without_a_gpu_are_refused():
    f = Vi(torch.randn(3, 2)).sqdist(Vj(torch.randn(4, 2)))
    with pytest.raises(RuntimeError, match="backend='GPU_1D' asks for a CUDA device"):
        f.sum(1, backend="GPU_1D")
    with pytest.raises(RuntimeError, match="device_id=0 asks for a CUDA device"):
        f.__matmul__(torch.randn(4, 1), device_id=0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_gpu_backend_and_device_id_reduce_cpu_data_on_the_gpu(backend, monkeypatch):
    """KeOps' "from host" mode: CPU tensors, reduced on the GPU, the result (and gradients) back on the CPU."""
    from semiring_ops.lazy import lazy_tensor

    seen: list[str] = []  # the device each reduction's tensors were moved to
    retarget = lazy_tensor._retargeted

    def spy(formula, device, dtype):
        seen.append(torch.device(device).type)
        return retarget(formula, device, dtype)

    monkeypatch.setattr(lazy_tensor, "_retargeted", spy)
    x = torch.randn(50, 3, dtype=F64, requires_grad=True)
    y = torch.randn(40, 3, dtype=F64)
    f = (-Vi(x).sqdist(Vj(y))).exp()
    want = f.sum(1)
    for kwargs in (
        {"backend": "GPU"},
        {"backend": "GPU_2D_host"},
        {"device_id": 0},
        {"backend": "auto", "device_id": 0},
    ):
        seen.clear()
        got = f.sum(1, **kwargs)
        assert seen == ["cuda"] and got.device.type == "cpu", (kwargs, seen)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        (g,) = torch.autograd.grad(got.sum(), x)
        (gw,) = torch.autograd.grad(want.sum(), x, retain_graph=True)
        torch.testing.assert_close(g, gw, rtol=1e-12, atol=1e-12)
    seen.clear()
    xc, yc = x.detach().cuda(), y.cuda()
    got = (-Vi(xc).sqdist(Vj(yc))).exp().sum(1, backend="CPU")  # device data reduced on the CPU
    assert seen == ["cpu"] and got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-12, atol=1e-12)
    too_far = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"device_id={too_far}, but there are {too_far} CUDA devices"):
        f.sum(1, device_id=too_far)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="device_id=1, but the tensors are on cuda:0"):
            (-Vi(xc).sqdist(Vj(yc))).sum(1, device_id=1)


def _spy_retargets(monkeypatch) -> list[str]:
    """The device type each reduction's tensors are moved to (lazy_tensor._retargeted's calls), in order."""
    from semiring_ops.lazy import lazy_tensor

    seen: list[str] = []
    retarget = lazy_tensor._retargeted

    def spy(formula, device, dtype):
        seen.append(torch.device(device).type)
        return retarget(formula, device, dtype)

    monkeypatch.setattr(lazy_tensor, "_retargeted", spy)
    return seen


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_auto_reduces_large_cpu_reductions_on_the_gpu(backend, monkeypatch):
    """backend "auto" (KeOps' default, which always picks the GPU): CPU tensors reduced over at least AUTO_GPU_PAIRS
    pairs go to the GPU, the result and gradients back on the CPU; smaller ones and backend="CPU" stay."""
    from semiring_ops.lazy import options

    monkeypatch.setattr(options, "AUTO_GPU_PAIRS", 2000)
    seen = _spy_retargets(monkeypatch)
    x = torch.randn(50, 3, dtype=F64, requires_grad=True)
    y = torch.randn(40, 3, dtype=F64)
    f = (-Vi(x).sqdist(Vj(y))).exp()
    want = f.sum(1, backend="CPU")
    assert seen == []
    got = f.sum(1)  # 50 x 40 = 2000 pairs
    assert seen == ["cuda"] and got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g, gw, rtol=1e-12, atol=1e-12)
    seen.clear()
    small = (-Vi(x[:10]).sqdist(Vj(y))).exp().sum(1)
    assert seen == [] and small.device.type == "cpu"


def test_auto_keeps_cpu_reductions_on_the_cpu_without_a_gpu(monkeypatch):
    from semiring_ops.lazy import options

    monkeypatch.setattr(options, "AUTO_GPU_PAIRS", 100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen = _spy_retargets(monkeypatch)
    f = Vi(torch.randn(20, 2)).sqdist(Vj(torch.randn(30, 2)))
    assert f.sum(1).device.type == "cpu" and seen == []


def test_out_writes_the_result_in_place(backend, device):
    x, y = _kd_inputs(device)
    f = (-Vi(x).sqdist(Vj(y))).exp()
    out = torch.empty(7, 1, dtype=F64, device=device)
    assert f.sum(1, out=out) is out
    torch.testing.assert_close(out, f.sum(1), rtol=0, atol=0)
    v = torch.randn(5, 2, dtype=F64, device=device)
    out2 = torch.full((7, 2), math.nan, dtype=F64, device=device)
    assert f.__matmul__(v, out=out2) is out2 and torch.equal(out2, f @ v)
    idx = torch.empty(7, 1, dtype=torch.int64, device=device)
    assert f.argmin(1, out=idx) is idx and torch.equal(idx, f.argmin(1))
    with pytest.raises(ValueError, match=r"out has shape \(7, 2\).*result has shape \(7, 1\)"):
        f.sum(1, out=out2)
    with pytest.raises(ValueError, match=r"torch\.float32"):
        f.sum(1, out=out.float())
    with pytest.raises(TypeError, match="returns two"):
        f.min_argmin(1, out=out)
    xg = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        (-Vi(xg).sqdist(Vj(y))).exp().sum(1, out=out)
    with torch.no_grad():
        assert (-Vi(xg).sqdist(Vj(y))).exp().sum(1, out=out) is out


# ---------------------------------------------------------------- block-sparse reductions (ranges=)


def _block_ranges(draw, n_rows: int, n_cols: int):
    """KeOps' (ranges, slices, redranges) for random disjoint row blocks (some rows in none), each reducing over
    random column ranges (which may overlap: a term in two ranges counts twice, as KeOps loops over them); the
    transposed half of the same pairs, cut differently (a block per piece of the columns between the ranges'
    bounds); and how many times each (row, column) term counts."""
    cuts = sorted(draw(st.sets(st.integers(0, n_rows), min_size=2, max_size=6)))
    blocks = [(a, b) for a, b in itertools.pairwise(cuts) if draw(st.booleans())]
    count = torch.zeros(n_rows, n_cols, dtype=F64)
    red, slices, rects = [], [], []
    for a, b in blocks:
        for _ in range(draw(st.integers(0, 3))):
            lo = draw(st.integers(0, n_cols))
            hi = draw(st.integers(lo, n_cols))
            red.append((lo, hi))
            rects.append((a, b, lo, hi))
            count[a:b, lo:hi] += 1
        slices.append(len(red))
    col_cuts = sorted({c for *_, lo, hi in rects for c in (lo, hi)})
    t_blocks, t_slices, t_red = [], [], []
    for lo, hi in itertools.pairwise(col_cuts):
        t_red += [(a, b) for a, b, c, d in rects if c <= lo and hi <= d]
        t_blocks.append((lo, hi))
        t_slices.append(len(t_red))
    as_int = lambda v, shape: torch.tensor(v, dtype=torch.int32).reshape(shape)  # noqa: E731
    triple = (as_int(blocks, (len(blocks), 2)), as_int(slices, (len(slices),)), as_int(red, (len(red), 2)))
    shapes = ((len(t_blocks), 2), (len(t_slices),), (len(t_red), 2))
    transposed = tuple(as_int(v, shape) for v, shape in zip((t_blocks, t_slices, t_red), shapes, strict=True))
    return triple, transposed, count


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_ranges_are_a_masked_dense_reduction(backend, device, data):
    m, n = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 20))
    rows_j, cols_of_j, count_j = _block_ranges(data.draw, m, n)  # a pattern cut by blocks of rows i
    rows_i, cols_of_i, count_i = _block_ranges(data.draw, n, m)  # another, cut by blocks of columns j
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    x = torch.randn(m, 2, generator=g, dtype=F64).to(device).requires_grad_()
    y = torch.randn(n, 2, generator=g, dtype=F64).to(device).requires_grad_()
    f = -Vi(x).sqdist(Vj(y))
    cases = ((1, (*rows_j, *cols_of_j), count_j.to(device)), (0, (*cols_of_i, *rows_i), count_i.T.to(device)))
    for dim, ranges, count in cases:
        dense = -((x[:, None] - y[None]) ** 2).sum(-1)
        got = f.sum(dim, ranges=ranges)
        want = (dense * count).sum(dim)[:, None]
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        gx, gy = torch.autograd.grad(got.sum(), [x, y])
        wx, wy = torch.autograd.grad(want.sum(), [x, y], retain_graph=True)
        torch.testing.assert_close(gx, wx, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gy, wy, rtol=1e-12, atol=1e-12)
        lse = f.logsumexp(dim, ranges=ranges)
        want_lse = (dense + count.log()).logsumexp(dim)[:, None]
        torch.testing.assert_close(lse, want_lse)
        finite = torch.isfinite(want_lse)  # rows of no terms: -inf, and no gradient
        some = (count > 0).any(dim, keepdim=True)  # (torch's logsumexp of -infs only has a NaN gradient)
        want_lse = torch.where(some, dense + count.log(), 0.0).logsumexp(dim)[:, None]
        gx, gy = torch.autograd.grad(lse[finite].sum(), [x, y], allow_unused=True, materialize_grads=True)
        wx, wy = torch.autograd.grad(want_lse[finite].sum(), [x, y], allow_unused=True, materialize_grads=True)
        torch.testing.assert_close(gx, wx)
        torch.testing.assert_close(gy, wy)
        masked = torch.where(count > 0, dense, -math.inf)
        vals, idx = f.max_argmax(dim, ranges=ranges)
        torch.testing.assert_close(vals, masked.amax(dim)[:, None])
        empty = (count == 0).all(dim)
        want_idx = torch.where(empty, 0, masked.argmax(dim))
        assert torch.equal(idx[:, 0], want_idx)


def test_ranges_of_long_rows(backend, device):
    """Blocks whose rows reduce over thousands of terms in ranges of all lengths (on CUDA: the terms of a
    segment cut over several blocks and merged, the 2-D scheme), against the masked dense reduction."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 2, generator=g, dtype=F64).to(device).requires_grad_()
    y = torch.randn(3000, 2, generator=g, dtype=F64).to(device).requires_grad_()
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    cuts_i, cuts_j = [0, 7, 33, 40], [0, 1, 300, 301, 2000, 2999, 3000]
    blocks_i = [(a, b) for a, b in itertools.pairwise(cuts_i)]
    blocks_j = [(a, b) for a, b in itertools.pairwise(cuts_j)]
    keep = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 1], [1, 0, 1, 1, 1, 0]], dtype=torch.bool)
    ranges = from_matrix(i64(*blocks_i), i64(*blocks_j), keep)
    mask = torch.zeros(40, 3000, dtype=F64)
    for k, (a, b) in enumerate(blocks_i):
        for m, (c, d) in enumerate(blocks_j):
            mask[a:b, c:d] = float(keep[k, m])
    mask = mask.to(device)
    f = -Vi(x).sqdist(Vj(y))
    dense = -((x[:, None] - y[None]) ** 2).sum(-1)
    for dim in (1, 0):
        got = f.exp().sum(dim, ranges=ranges)
        want = (dense.exp() * mask).sum(dim)[:, None]
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        gx, gy = torch.autograd.grad(got.sum(), [x, y])
        wx, wy = torch.autograd.grad(want.sum(), [x, y], retain_graph=True)
        torch.testing.assert_close(gx, wx, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gy, wy, rtol=1e-10, atol=1e-12)
        masked = torch.where(mask > 0, dense, -math.inf)
        torch.testing.assert_close(f.logsumexp(dim, ranges=ranges), masked.logsumexp(dim)[:, None])
        vals, idx = f.max_argmax(dim, ranges=ranges)
        torch.testing.assert_close(vals, masked.amax(dim)[:, None])
        assert torch.equal(idx[:, 0], masked.argmax(dim))
        vals, idx = f.Kmax_argKmax(3, dim, ranges=ranges)
        want_k = masked.topk(3, dim)
        torch.testing.assert_close(vals, want_k.values if dim == 1 else want_k.values.T)
        assert torch.equal(idx, want_k.indices if dim == 1 else want_k.indices.T)


@pytest.mark.parametrize("ranged", [False, True])
def test_wide_vector_sums(backend, device, ranged):
    """Sums over more than formula.WIDE_COMPONENTS components of elementwise formulas (on the CPU: loops over
    the components, wide.py), reduced every way, against float64 torch: a squared distance, a weighted L1
    distance with a parameter and a number, an exponential of a difference; over full and block-sparse rows
    (the gathered, padded tail group), and a gradient."""
    g = torch.Generator().manual_seed(9)
    d = 97
    x = torch.randn(37, d, generator=g, dtype=F64).to(device).requires_grad_()
    y = torch.randn(53, d, generator=g, dtype=F64).to(device)
    s = torch.rand(1, generator=g, dtype=F64).to(device)
    xi, yj = Vi(x), Vj(y)
    forms = {
        "sqdist": (((xi - yj) ** 2).sum(-1), lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1)),
        "l1": (((xi - yj).abs() * Pm(s) + 0.5).sum(-1), lambda a, b: ((a[:, None] - b[None]).abs() * s + 0.5).sum(-1)),
        "exp": ((-(xi - yj).exp() / 4).sum(-1), lambda a, b: (-(a[:, None] - b[None]).exp() / 4).sum(-1)),
    }
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    ranges = from_matrix(i64([0, 20], [20, 37]), i64([0, 5], [5, 53]), torch.tensor([[True, False], [True, True]]))
    mask = torch.ones(37, 53, dtype=F64, device=device)
    if ranged:
        mask[:20, 5:] = 0
    opts = {"ranges": ranges} if ranged else {}
    for name, (lazy, dense_of) in forms.items():
        dense = dense_of(x, y)
        masked = torch.where(mask > 0, dense, math.inf)
        got = lazy.sum(1, **opts)
        torch.testing.assert_close(got, (dense * mask).sum(1, keepdim=True), msg=name)
        torch.testing.assert_close(lazy.min(1, **opts), masked.amin(1, keepdim=True), msg=name)
        vals, idx = lazy.Kmin_argKmin(3, 1, **opts)
        want = masked.topk(3, 1, largest=False)
        torch.testing.assert_close(vals, want.values, msg=name)
        assert torch.equal(idx, want.indices), name
        (gx,) = torch.autograd.grad(got.sum(), x)
        (wx,) = torch.autograd.grad((dense * mask).sum(), x)
        torch.testing.assert_close(gx, wx, msg=name)


def test_ranges_halves_that_disagree(backend, device):
    """The gradient of the reduced variables reads the other half of ranges= (KeOps' rule): halves of different
    pairs give the forward of their own half and refuse that gradient; with only the rows' variables needing a
    gradient, all is fine."""
    x = torch.randn(6, 1, dtype=F64, device=device, requires_grad=True)
    y = torch.randn(8, 1, dtype=F64, device=device)
    f = (Vi(x) - Vj(y)) ** 2
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    ranges = (i32([0, 3], [3, 6]), i32(1, 2), i32([0, 4], [2, 8]), i32([0, 8]), i32(1), i32([0, 6]))
    mask = torch.zeros(6, 8, dtype=F64, device=device)
    mask[:3, :4] = mask[3:, 2:] = 1
    got = f.sum(1, ranges=ranges)
    want = (((x - y.T) ** 2) * mask).sum(1, keepdim=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])
    y.requires_grad_()
    with pytest.raises(ValueError, match="different"):
        torch.autograd.grad(((Vi(x) - Vj(y)) ** 2).sum(1, ranges=ranges).sum(), y)


def test_ranges_k_best_and_errors(backend, device):
    x = torch.randn(6, 1, dtype=F64, device=device)
    y = torch.randn(8, 1, dtype=F64, device=device)
    f = (Vi(x) - Vj(y)).abs()
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    full_i = (i32([0, 6]), i32(1), i32([0, 8]))
    full_j = (i32([0, 8]), i32(1), i32([0, 6]))
    ranges = (i32([0, 3], [3, 6]), i32(1, 2), i32([0, 4], [2, 8]), *full_j)
    vals, idx = f.Kmin_argKmin(2, dim=1, ranges=ranges)
    dense = (x - y.T).abs()
    mask = torch.zeros(6, 8, dtype=torch.bool, device=device)
    mask[:3, :4] = mask[3:, 2:] = True
    want = torch.where(mask, dense, math.inf).topk(2, 1, largest=False)
    torch.testing.assert_close(vals, want.values)
    assert torch.equal(idx, want.indices)
    with pytest.raises(ValueError, match="every row needs at least K"):
        f.Kmin(5, dim=1, ranges=ranges)
    with pytest.raises(ValueError, match="overlap"):
        f.sum(1, ranges=(i32([0, 4], [3, 6]), i32(1, 2), i32([0, 8], [0, 8]), *full_j))
    with pytest.raises(ValueError, match="within"):
        f.sum(1, ranges=(i32([0, 7]), i32(1), i32([0, 8]), *full_j))
    with pytest.raises(ValueError, match="within"):
        f.sum(0, ranges=(*full_i, i32([0, 8]), i32(1), i32([0, 9])))
    with pytest.raises(ValueError, match="non-decreasing"):
        f.sum(1, ranges=(i32([0, 3], [3, 6]), i32(1, 0), i32([0, 8], [0, 8]), *full_j))
    with pytest.raises(ValueError, match=r"shapes \(Mc, 2\)"):
        f.sum(1, ranges=(i32(0, 6), i32(1), i32([0, 8]), *full_j))
    with pytest.raises(TypeError, match="6-tuple"):
        f.sum(1, ranges=full_i)
    with pytest.raises(ValueError, match="batch"):
        (LazyTensor(torch.randn(2, 6, 1, 1)) - LazyTensor(torch.randn(2, 1, 8, 1))).sum(2, ranges=(*full_i, *full_j))


# ---------------------------------------------------------------- symbolic differentiation


def _per_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, D) and y (N, D) repeated to (M, N, D) leaves: each pair's own copy, so autograd of a dense formula
    gives per-pair derivatives."""
    m, n = x.shape[0], y.shape[0]
    xr = x[:, None].expand(m, n, x.shape[1]).clone().requires_grad_()
    yr = y[None].expand(m, n, y.shape[1]).clone().requires_grad_()
    return xr, yr


def _field(x, y):  # a vector field of x (dimension 3), for the formula and by hand
    return (x * y).sin() * (x**2).sum(-1, keepdim=True) + x.flip(-1) * y


def _field_lazy(X, Y):
    return (X * Y).sin() * X.sqnorm2() + LazyTensor.cat((X.elem(2), X.elem(1), X.elem(0)), -1) * Y


def test_grad_diff_and_grad_matrix_against_autograd(backend, device):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, generator=g, dtype=F64).to(device)
    y = torch.randn(4, 3, generator=g, dtype=F64).to(device)
    e = torch.randn(5, 3, generator=g, dtype=F64).to(device)
    u = torch.randn(4, 3, generator=g, dtype=F64).to(device)
    X, Y = Vi(x), Vj(y)
    F = _field_lazy(X, Y)
    xr, yr = _per_pair(x, y)
    dense = _field(xr, yr)
    # grad: sum_d e_d dF_d / dx, per pair
    (want,) = torch.autograd.grad(dense, xr, e[:, None].expand_as(dense), retain_graph=True)
    torch.testing.assert_close(F.grad(X, Vi(e)).dense(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(F.grad(X, Vi(e)).sum(1), want.sum(1), rtol=1e-12, atol=1e-12)
    (want_y,) = torch.autograd.grad(dense, yr, e[:, None].expand_as(dense), retain_graph=True)
    torch.testing.assert_close(F.grad(Y, Vi(e)).sum(0), want_y.sum(0), rtol=1e-12, atol=1e-12)
    # diff: the directional derivative along u_j with respect to y, per pair (forward mode)
    _, jvp = torch.func.jvp(lambda yy: _field(xr.detach(), yy), (yr.detach(),), (u[None].expand_as(yr),))
    torch.testing.assert_close(F.diff(Y, Vj(u)).sum(1), jvp.sum(1), rtol=1e-12, atol=1e-12)
    # grad_matrix: the gradients of the 3 components, one after the other (dimension 9)
    rows = [torch.autograd.grad(dense[..., k].sum(), xr, retain_graph=True)[0] for k in range(3)]
    torch.testing.assert_close(F.grad_matrix(X).sum(1), torch.cat(rows, -1).sum(1), rtol=1e-12, atol=1e-12)
    # a variable the formula does not contain: zeros of its dimension
    z = torch.randn(5, 2, dtype=F64, device=device)
    assert F.grad(Vi(z), Vi(e)).shape == (5, 4, 2) and not F.grad(Vi(z), Vi(e)).sum(1).any()
    with pytest.raises(TypeError, match="one tensor"):
        F.grad(X * 2, Vi(e))
    with pytest.raises(ValueError, match="gradin has dimension 1"):
        F.grad(X, Vi(e[:, :1]))


def test_divergence_laplacian_and_trace_against_autograd(backend, device):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, generator=g, dtype=F64).to(device)
    y = torch.randn(4, 3, generator=g, dtype=F64).to(device)
    b = torch.randn(4, 9, generator=g, dtype=F64).to(device)
    X, Y = Vi(x), Vj(y)
    xr, yr = _per_pair(x, y)
    dense = _field(xr, yr)
    div = sum(torch.autograd.grad(dense[..., k].sum(), xr, create_graph=True)[0][..., k] for k in range(3))
    torch.testing.assert_close(_field_lazy(X, Y).divergence(X).sum(1), div.sum(1)[:, None], rtol=1e-12, atol=1e-12)
    s = (-((xr - yr) ** 2).sum(-1)).exp() * (xr * yr).sum(-1)
    (gs,) = torch.autograd.grad(s.sum(), xr, create_graph=True)
    lap = sum(torch.autograd.grad(gs[..., k].sum(), xr, retain_graph=True)[0][..., k] for k in range(3))
    S = (-X.sqdist(Y)).exp() * (X | Y)
    torch.testing.assert_close(S.laplacian(X).sum(1), lap.sum(1)[:, None], rtol=1e-12, atol=1e-12)
    # the trace of linear functions of x: x -> B_j x (the trace of B_j), x -> <y_j, x> (the sum of y_j)
    traces = Vj(b).matvecmult(X).trace_operator(X)
    torch.testing.assert_close(traces.sum(0), b.reshape(4, 3, 3).diagonal(0, 1, 2).sum(-1)[:, None] * 5)
    torch.testing.assert_close((X | Y).trace_operator(X).sum(0), y.sum(-1, keepdim=True) * 5)
    with pytest.raises(ValueError, match="divergence"):
        (X | Y).divergence(X)
    with pytest.raises(ValueError, match="scalar formula"):
        X.laplacian(X)


# ---------------------------------------------------------------- LazyTensors of NumPy arrays


def test_numpy_lazy_tensors_return_numpy_arrays(backend):
    from semiring_ops.lazy.numpy import LazyTensor as NpLazyTensor
    from semiring_ops.lazy.numpy import Pm as NpPm
    from semiring_ops.lazy.numpy import Vi as NpVi
    from semiring_ops.lazy.numpy import Vj as NpVj

    rng = np.random.default_rng(0)
    x, y, b = rng.random((30, 3)), rng.random((20, 3)), rng.standard_normal((20, 2))
    X, Y = NpLazyTensor(x[:, None, :]), NpLazyTensor(y[None, :, :])
    K = (-((X - Y) ** 2).sum(axis=2) * NpPm(np.float32(2.0))).exp()
    dense = np.exp(-2 * ((x[:, None] - y[None]) ** 2).sum(-1))
    for got, want in (
        (K @ b, dense @ b),
        (K.sum(axis=1), dense.sum(1, keepdims=True)),
        (K.sum(0), dense.sum(0)[:, None]),
        (b[None, :, :1] * K * 2.0, None),
    ):
        if want is None:
            assert isinstance(got, NpLazyTensor)  # array * LazyTensor stays lazy (NumPy defers to __rmul__)
            continue
        assert isinstance(got, np.ndarray) and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)
    out = np.empty((30, 2))
    assert K.__matmul__(b, out=out) is out
    np.testing.assert_allclose(out, dense @ b, rtol=1e-12)
    idx = NpVi(x).sqdist(NpVj(y)).argKmin(3, dim=1)
    assert isinstance(idx, np.ndarray) and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, np.argsort(((x[:, None] - y[None]) ** 2).sum(-1), 1, kind="stable")[:, :3])
    vals, ids = NpVi(x).sqdist(NpVj(y)).min_argmin(dim=0)
    assert isinstance(vals, np.ndarray) and isinstance(ids, np.ndarray)
    assert isinstance(K.dense(), np.ndarray) and K.dense().shape == (30, 20, 1)
    x32 = x.astype(np.float32)
    assert NpVi(x32).sqdist(NpVj(x32)).sum(1, dtype_acc="float64").dtype == np.float32


# ---------------------------------------------------------------- solve


@settings(max_examples=3, deadline=None)
@given(n=st.sampled_from([1, 2, 17, 40]), e=st.sampled_from([1, 3]), seed=st.integers(0, 2**32 - 1))
def test_solve_is_a_regularised_linear_solve(backend, device, n, e, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g, dtype=F64).to(device)
    b = torch.randn(n, e, generator=g, dtype=F64).to(device)
    K = (-Vi(x).sqdist(Vj(x)) / 0.5).exp()
    dense = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1) / 0.5) + 0.1 * torch.eye(n, dtype=F64, device=device)
    want = torch.linalg.solve(dense, b)
    torch.testing.assert_close(K.solve(b, alpha=0.1, eps=1e-12), want, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(K.solve(b[:, 0], alpha=0.1, eps=1e-12), want[:, 0], rtol=1e-8, atol=1e-9)
    if n == 1:
        return  # Vi / Vj of one row make parameters
    torch.testing.assert_close(K.solve(Vi(b), alpha=0.1, eps=1e-12), want, rtol=1e-8, atol=1e-9)
    # b indexed by j: sum_i K_ij a_i = b_j, with a K that is not symmetric in form (the transpose solved)
    A = (-Vi(x).sqdist(Vj(x)) / 0.5).exp() * Vi(x).elem(0).exp() * Vj(x).elem(0).exp()
    dense_a = dense - 0.1 * torch.eye(n, dtype=F64, device=device)
    dense_a = dense_a * x[:, None, 0].exp() * x[None, :, 0].exp() + 0.1 * torch.eye(n, dtype=F64, device=device)
    torch.testing.assert_close(
        A.solve(Vj(b), alpha=0.1, eps=1e-12), torch.linalg.solve(dense_a.T, b), rtol=1e-8, atol=1e-9
    )


def test_solve_gradients_and_batches(backend, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 2, generator=g, dtype=F64).to(device).requires_grad_()
    b = torch.randn(6, 2, generator=g, dtype=F64).to(device).requires_grad_()
    s = torch.tensor([0.7], dtype=F64, device=device, requires_grad=True)

    def fn(x, b, s):
        return (-Vi(x).sqdist(Vj(x)) * Pm(s)).exp().solve(b, alpha=0.5, eps=1e-13)

    assert gradcheck(fn, (x, b, s), atol=1e-6, rtol=1e-5)
    xb = torch.randn(3, 5, 2, generator=g, dtype=F64).to(device)
    bb = torch.randn(3, 5, 1, generator=g, dtype=F64).to(device)
    K = (-(LazyTensor(xb[:, :, None]) - LazyTensor(xb[:, None])).sqnorm2()).exp()
    dense = torch.exp(-((xb[:, :, None] - xb[:, None]) ** 2).sum(-1)) + torch.eye(5, dtype=F64, device=device)
    torch.testing.assert_close(K.solve(bb, alpha=1.0, eps=1e-12), torch.linalg.solve(dense, bb), rtol=1e-8, atol=1e-9)


def test_solve_errors_and_non_convergence(backend):
    x = torch.randn(5, 2, dtype=F64)
    K = (-Vi(x).sqdist(Vj(x))).exp()
    with pytest.raises(ValueError, match="square"):
        (-Vi(x).sqdist(Vj(x[:4]))).exp().solve(torch.ones(5, 1, dtype=F64))
    with pytest.raises(ValueError, match="scalar formula"):
        (Vi(x) - Vj(x)).solve(torch.ones(5, 1, dtype=F64))
    with pytest.raises(ValueError, match="does not fit"):
        K.solve(torch.ones(4, 1, dtype=F64))
    with pytest.raises(TypeError, match="symbolic variable"):
        K.solve(torch.ones(5, 1, dtype=F64), var=Vi(x))
    with pytest.warns(RuntimeWarning, match="conjugate gradients stopped"):
        (Vi(x) | Vj(x)).solve(torch.randn(5, 1, dtype=F64), alpha=0.0)  # rank 2: no solution
    out = torch.empty(5, 1, dtype=F64)
    assert K.solve(torch.ones(5, 1, dtype=F64), out=out) is out


def test_solve_for_a_symbolic_variable(backend, device):
    """solve(b, var=a_j) of a formula F linear in a_j: (alpha Id + A) a = b with A(a)_i = sum_j F_ij(a_j), here
    F = K_ij (s * a_j + t * (a_j . w_j) w_j): not of the K @ a form, and A not symmetric in form (w_j only),
    so the gradient's transposed solve is the formula's own vjp. Against the dense system, with gradients."""
    g = torch.Generator().manual_seed(2)
    n, e = 7, 2
    x = torch.randn(n, 2, generator=g, dtype=F64).to(device).requires_grad_()
    w = (0.3 * torch.randn(n, e, generator=g, dtype=F64)).to(device).requires_grad_()
    b = torch.randn(n, e, generator=g, dtype=F64).to(device).requires_grad_()
    s = torch.tensor([1.3, 0.6], dtype=F64, device=device, requires_grad=True)
    a_j = Vj(0, e)

    def lazy(x, w, b, s):
        k = (-Vi(x).sqdist(Vj(x))).exp()
        f = k * (Pm(s) * a_j + 0.5 * (a_j | Vj(w)) * Vj(w))
        return f.solve(b, var=a_j, alpha=0.7, eps=1e-13)

    def dense(x, w, b, s):
        k = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1))  # (n, n)
        blocks = k[:, :, None, None] * (torch.diag(s) + 0.5 * w[:, :, None] * w[:, None, :])[None]  # (i, j, e, e)
        a = blocks.permute(0, 2, 1, 3).reshape(n * e, n * e) + 0.7 * torch.eye(n * e, dtype=F64, device=device)
        return torch.linalg.solve(a, b.reshape(-1)).reshape(n, e)

    got, want = lazy(x, w, b, s), dense(x, w, b, s)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    u = torch.randn(n, e, generator=g, dtype=F64).to(device)
    for a, c in zip(torch.autograd.grad(got, [x, w, b, s], u), torch.autograd.grad(want, [x, w, b, s], u), strict=True):
        torch.testing.assert_close(a, c, rtol=1e-7, atol=1e-8)
    # the plain form is the formula K * a_j
    k = (-Vi(x).sqdist(Vj(x))).exp()
    torch.testing.assert_close((k * Vj(0, e)).solve(b, var=Vj(0, e), alpha=0.7), k.solve(b, alpha=0.7))
    with pytest.raises(ValueError, match="not linear"):
        (k * a_j.square()).solve(b, var=a_j)
    with pytest.raises(ValueError, match="not a variable"):
        (k * a_j).solve(b, var=Vj(1, e))
    with pytest.raises(NotImplementedError, match="only symbolic variable"):
        (k * a_j * Vi(1, e)).solve(b, var=a_j)
    with pytest.raises(ValueError, match="j-variable of that dimension"):
        (k * Vi(0, e)).solve(b, var=Vi(0, e))
    with pytest.raises(NotImplementedError, match="call=False"):
        (k * a_j).solve(b, var=a_j, call=False)


def test_ranges_set_as_an_attribute(backend, device):
    """KeOps' ``K.ranges = ranges_ij``: this LazyTensor's reductions (and @) use it unless given ranges= of their
    own; the transpose swaps its halves; LazyTensors made from it inherit it (KeOps' rule: from the operand that has
    one; two different ones are refused)."""
    x = torch.randn(6, 2, dtype=F64, device=device)
    y = torch.randn(8, 2, dtype=F64, device=device)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    ranges = (i32([0, 3], [3, 6]), i32(1, 2), i32([0, 4], [2, 8]), i32([0, 8]), i32(1), i32([1, 5]))
    dense = torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1))
    mask = torch.zeros(6, 8, dtype=F64, device=device)
    mask[:3, :4] = mask[3:, 2:] = 1
    mask_i = torch.zeros(6, 8, dtype=F64, device=device)
    mask_i[1:5, :] = 1
    b = torch.randn(8, 2, dtype=F64, device=device)
    full = K @ b
    K.ranges = ranges
    torch.testing.assert_close(K @ b, (dense * mask) @ b)
    torch.testing.assert_close(K.sum(1), (dense * mask).sum(1, keepdim=True))
    torch.testing.assert_close(K.sum(0), (dense * mask_i).sum(0)[:, None])
    torch.testing.assert_close(K.T.sum(1), (dense * mask_i).sum(0)[:, None])  # the transpose swaps the halves
    own = (i32([0, 6]), i32(1), i32([0, 8]), *ranges[3:])  # a ranges= of the call's own wins: here, everything
    torch.testing.assert_close(K.sum(1, ranges=own), dense.sum(1, keepdim=True))
    assert (K * 1).ranges is ranges and (2 * K.exp()).ranges is ranges and (K.T * 1).ranges == K.T.ranges
    torch.testing.assert_close((K * 1) @ b, (dense * mask) @ b)
    other = (-Vi(x).sqdist(Vj(y))).exp()
    assert (other + K).ranges is ranges and (other * other).ranges is None and torch.equal(other @ b, full)
    other.ranges = tuple(r.clone() for r in ranges)  # equal values: accepted
    assert (K - other).ranges is ranges
    other.ranges = own
    with pytest.raises(ValueError, match="different ranges"):
        K + other
    K.ranges = (1, 2)
    with pytest.raises(TypeError, match="6-tuple"):
        K.sum(1)


def test_logsumexp_takes_other_as_the_weight(backend):
    x, y = _kd_inputs("cpu")
    w = torch.rand(5, 2, dtype=F64) + 0.1
    f = -Vi(x).sqdist(Vj(y))
    torch.testing.assert_close(f.logsumexp(1, other=Vj(w)), f.logsumexp(1, weight=Vj(w)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="same argument"):
        f.logsumexp(1, weight=Vj(w), other=Vj(w))
