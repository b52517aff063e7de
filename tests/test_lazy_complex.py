"""Complex LazyTensors (semiring_ops.lazy.complex): complex arithmetic on lazy formulas against the dense complex
torch computation in complex128, sums over i and j, the vector sum, ``@``, gradients with respect to complex
and real tensors (torch's convention for complex gradients), ``call=False``, the NumPy front end, and what is
refused. KeOps' own test_complex.py and test_complex_numpy.py run in tests/test_keops_suite.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj

DEVICES = ["cpu", CUDA]
C128 = torch.complex128

# name: (lazy, dense), each a function of (z_i, w_j, r_j, c): z (M, D) and w (N, D) complex, r (N, D) real, c (D,)
# complex; lazy gets them as Vi(z), Vj(w), Vj(r), Pm(c), dense as (M, 1, D), (1, N, D), (1, N, D), (D,)
CASES = {
    "mul_conj": (lambda z, w, r, c: z * w.conj() + r, lambda z, w, r, c: z * w.conj() + r),
    "div": (lambda z, w, r, c: (z + 1.5) / (w * w + 2.0), lambda z, w, r, c: (z + 1.5) / (w * w + 2.0)),
    "div_real": (lambda z, w, r, c: z / (r * r + 1.0) - r / z, lambda z, w, r, c: z / (r * r + 1.0) - r / z),
    "exp_numbers": (
        lambda z, w, r, c: (0.3j * z * w).exp() * r - (0.5 - 0.25j) * c,
        lambda z, w, r, c: (0.3j * z * w).exp() * r - (0.5 - 0.25j) * c,
    ),
    "parts": (
        lambda z, w, r, c: (z.real * w.imag).exp1j() + r.imag2complex() * c.conj() - (z * w).real.real2complex(),
        lambda z, w, r, c: torch.exp(1j * z.real * w.imag) + 1j * r * c.conj() - (z * w).real,
    ),
}


def _data(device, m=6, n=9, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(m, d, generator=g, dtype=C128)
    w = torch.randn(n, d, generator=g, dtype=C128)
    r = torch.randn(n, d, generator=g, dtype=torch.float64)
    c = torch.randn(d, generator=g, dtype=C128)
    return [t.to(device).requires_grad_() for t in (z, w, r, c)]


def _lazy(name, z, w, r, c):
    return CASES[name][0](Vi(z), Vj(w), Vj(r), Pm(c))


def _dense(name, z, w, r, c):
    return CASES[name][1](z[:, None], w[None], r[None], c)


def _grads(out, u, args):
    """The gradients of Re <out, u> (torch's convention for complex tensors: the conjugate Wirtinger one)."""
    loss = (out * u.conj()).real.sum()
    return torch.autograd.grad(loss, args, allow_unused=True, materialize_grads=True, retain_graph=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
@settings(max_examples=2, deadline=None)
@given(m=st.sampled_from([1, 5, 17]), n=st.sampled_from([2, 16, 33]), seed=st.integers(0, 2**32 - 1))
def test_sums_and_gradients_equal_the_dense_complex_computation(compiled, device, name, m, n, seed):
    args = _data(device, m, n, seed=seed)
    f, dense = _lazy(name, *args), _dense(name, *args)
    assert isinstance(f, ComplexLazyTensor) and f.dtype == C128 and f.shape == (m, n, 2)
    for dim in (0, 1):
        got, want = f.sum(dim), dense.sum(dim)
        assert got.dtype == C128 and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        u = torch.randn(want.shape, dtype=C128, device=device)
        gots = torch.autograd.grad(
            (got * u.conj()).real.sum(), args, allow_unused=True, materialize_grads=True, retain_graph=True
        )
        wants = torch.autograd.grad(
            (want * u.conj()).real.sum(), args, allow_unused=True, materialize_grads=True, retain_graph=True
        )
        for a, b, what in zip(gots, wants, "zwrc", strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda msg, w=what: f"grad of {w}: {msg}")
    vector = f.sum(-1)
    assert isinstance(vector, ComplexLazyTensor) and vector.shape == (m, n, 1)
    torch.testing.assert_close(vector.sum(1), dense.sum(-1).sum(1)[:, None], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(f.dense(), dense.expand(m, n, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_real_results_of_complex_formulas(compiled, device):
    z, w, _, _ = _data(device)
    zl, wl = Vi(z), Vj(w)
    zd, wd = z[:, None], w[None]
    for lazy, dense in (
        ((zl * wl).abs(), (zd * wd).abs()),
        ((zl - wl).angle(), torch.angle(zd - wd)),
        ((zl * wl).real + (zl / wl).imag, (zd * wd).real + (zd / wd).imag),
        (abs(zl.conj() * 1j), (zd.conj() * 1j).abs()),
    ):
        assert isinstance(lazy, LazyTensor)
        torch.testing.assert_close(lazy.sum(1), dense.sum(1), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lazy.max(0), dense.amax(0), rtol=1e-12, atol=1e-12)
        gz = torch.autograd.grad(lazy.sum(1).sum(), z)[0]
        torch.testing.assert_close(
            gz, torch.autograd.grad(dense.sum(1).sum(), z, retain_graph=True)[0], rtol=1e-9, atol=1e-9
        )


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_of_a_complex_kernel(compiled, device):
    """The non-uniform discrete Fourier transform (KeOps' test_complex.py) at odd sizes, with complex and real
    right-hand sides, and a real kernel times a complex vector."""
    g = torch.Generator().manual_seed(3)
    m, n = 37, 53
    freq = torch.rand(m, 1, generator=g, dtype=torch.float64).to(device) * 10
    pos = torch.rand(n, 1, generator=g, dtype=torch.float64).to(device)
    v = torch.randn(n, 3, generator=g, dtype=C128).to(device)
    kernel = (-2 * math.pi * 1j * Vi(freq) * Vj(pos)).exp()
    dense = torch.exp(-2j * math.pi * freq * pos.T)
    torch.testing.assert_close(kernel @ v, dense @ v, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kernel @ v.real, dense @ v.real.to(C128), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kernel @ v[:, 0], dense @ v[:, 0], rtol=1e-10, atol=1e-10)
    real = (-Vi(freq).sqdist(Vj(pos))).exp()
    torch.testing.assert_close(real @ v, torch.exp(-((freq - pos.T) ** 2)).to(C128) @ v, rtol=1e-10, atol=1e-10)


def test_float32_and_callables(compiled):
    z = torch.randn(5, 3, dtype=torch.complex64)
    w = torch.randn(7, 3, dtype=torch.complex64)
    f = Vi(z) * Vj(w)
    assert f.dtype == torch.complex64
    torch.testing.assert_close(f.sum(1), (z[:, None] * w[None]).sum(1), rtol=1e-5, atol=1e-5)
    later = f.sum(1, call=False)
    torch.testing.assert_close(later(), f.sum(1))
    symbolic = (Vi(0, 3) * LazyTensor(w[None])).sum(1)  # a real symbolic variable times complex data
    torch.testing.assert_close(symbolic(z.real), (z.real[:, None] * w[None]).sum(1), rtol=1e-5, atol=1e-5)


def test_what_complex_lazy_tensors_refuse():
    z = Vi(torch.randn(4, 2, dtype=C128))
    with pytest.raises(ValueError, match="exp1j cannot be applied to a complex"):
        z.exp1j()
    with pytest.raises(AttributeError, match="logsumexp"):
        z.logsumexp(1)
    with pytest.raises(TypeError, match="complex tensor"):
        ComplexLazyTensor(torch.randn(3, 2))
    with pytest.raises(ValueError, match="scalar formula"):
        (z * Vj(torch.randn(5, 2, dtype=C128))) @ torch.randn(5, 1, dtype=C128)


def test_numpy_complex_arrays(compiled):
    from semiring_ops.lazy.numpy import ComplexLazyTensor as NpComplex
    from semiring_ops.lazy.numpy import LazyTensor as NpLazy

    rng = np.random.default_rng(0)
    x = rng.random((6, 1, 3)) + 1j * rng.random((6, 1, 3))
    y = rng.random((1, 8, 3)) + 1j * rng.random((1, 8, 3))
    lx, ly = NpLazy(x), NpLazy(y)
    assert isinstance(lx, NpComplex) and lx.is_complex and lx.dtype == np.complex128
    got = ((lx * ly) * ly.real + lx - lx.imag / 2).sum(axis=1)
    want = ((x * y) * y.real + x - x.imag / 2).sum(axis=1)
    assert isinstance(got, np.ndarray) and got.dtype == np.complex128
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose((lx.conj() * ly).sum(axis=-1).sum(axis=0), (x.conj() * y).sum(-1).sum(0)[:, None])
    np.testing.assert_allclose((lx * ly).angle().sum(axis=0), np.angle(x * y).sum(0), rtol=1e-12)
    assert not NpLazy(x.real).is_complex and NpComplex(x.real).is_complex
