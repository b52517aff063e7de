"""semiring_ops.lazy: formulas and reductions against float64 torch computed by hand, on the compiled kernels
(CPU, and CUDA when a GPU is there) and the PyTorch fallback; gradients; bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj, cpu_kernels

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _device(device: str) -> str:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return device


def _close(got, ref, tol):
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not torch.isnan(got).any() or torch.isnan(ref).any()
    torch.testing.assert_close(got.double().cpu(), ref.double().cpu(), rtol=tol, atol=tol, equal_nan=True)


# ---------------------------------------------------------------- operations

OPS = {
    "gauss": (
        lambda x, y, p: (-(x - y).sqnorm2() * p).exp(),
        lambda x, y, p: torch.exp(-((x - y) ** 2).sum(-1, True) * p),
    ),
    "arith": (lambda x, y, p: (x * 2 + y / (p + 3) - 1.5) ** 3, lambda x, y, p: (x * 2 + y / (p + 3) - 1.5) ** 3),
    "unary": (
        lambda x, y, p: (x.abs() + 1).log() + y.sin() * x.cos() + (y.square() + 1).sqrt() + (x * x + 1).rsqrt(),
        lambda x, y, p: (x.abs() + 1).log() + y.sin() * x.cos() + (y**2 + 1).sqrt() + (x * x + 1).rsqrt(),
    ),
    "pieces": (
        lambda x, y, p: x.relu() + y.sign() + (x - y).step() + x.clamp(-0.5, 0.5) + (x - y).ifelse(x, y),
        lambda x, y, p: (
            x.relu()
            + y.sign()
            + (x - y >= 0).double()
            + x.clamp(-0.5, 0.5)
            + torch.where(x - y >= 0, x, y).expand_as(x + y)
        ),
    ),
    "vector": (
        lambda x, y, p: (x | y) + x.norm2() + (x - y).logsumexp(-1) - (x * y).max(-1) + (x + y).min(-1),
        lambda x, y, p: (
            (x * y).sum(-1, True)
            + x.norm(dim=-1, keepdim=True)
            + (x - y).logsumexp(-1, True)
            - (x * y).amax(-1, True)
            + (x + y).amin(-1, True)
        ),
    ),
    "shape": (
        lambda x, y, p: x.concat(y).extract(1, 3) * y.elem(0) + x.normalize() ** -2 + (x**0.5).abs() ** 1.5,
        lambda x, y, p: (
            torch.cat([x.expand_as(x + y), y.expand_as(x + y)], -1)[..., 1:4] * y[..., :1]
            + (x / x.norm(dim=-1, keepdim=True)) ** -2
            + (x**0.5).abs() ** 1.5
        ),
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=3, deadline=None)
@given(m=st.sampled_from([1, 17, 40]), n=st.sampled_from([1, 15, 33]), seed=st.integers(0, 2**31 - 1))
def test_operations_against_torch(name, device, m, n, seed):
    device = _device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, 3, generator=g, dtype=torch.float64).to(device) + 0.1
    y = torch.randn(n, 3, generator=g, dtype=torch.float64).to(device)
    p = torch.rand(1, generator=g, dtype=torch.float64).to(device) + 0.5
    lazy, ref = OPS[name]
    f = lazy(Vi(x), Vj(y), Pm(p))
    dense = ref(x[:, None, :], y[None, :, :], p)
    dense = dense.expand(m, n, dense.shape[-1])
    _close(f.dense(), dense, 1e-10)
    _close(f.sum(1), dense.sum(1), 1e-9)
    _close(f.sum(0), dense.sum(0), 1e-9)


# ---------------------------------------------------------------- reductions


def _points(m, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 3, generator=g, dtype=torch.float64).to(device, dtype)
    y = torch.randn(n, 3, generator=g, dtype=torch.float64).to(device, dtype)
    d = ((x.double()[:, None] - y.double()[None]) ** 2).sum(-1)
    return x, y, d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 1500), (700, 5), (257, 513)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_reductions(device, m, n, dtype, backend):
    device = _device(device)
    x, y, _ = _points(m, n, dtype, device)
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    D = Vi(x).sqdist(Vj(y))
    dd = ((x.double()[:, None] - y.double()[None]) ** 2).sum(-1)  # the inputs as rounded to dtype
    assert D.sum(1).dtype == dtype
    _close(D.sum(dim=1), dd.sum(1, True), tol)
    _close(D.sum(axis=0), dd.sum(0)[:, None], tol)
    _close((-D).logsumexp(1), (-dd).logsumexp(1, True), tol)
    _close(D.max(-2), dd.amax(1, True), tol)
    _close(D.min(-3), dd.amin(0)[:, None], tol)
    if dtype == torch.float64:
        assert torch.equal(D.argmin(1).cpu(), dd.argmin(1, True).cpu())
        _, idx = D.max_argmax(0)
        assert torch.equal(idx.cpu(), dd.argmax(0)[:, None].cpu())
        k = min(3, n)
        kv, ki = D.Kmin_argKmin(k, dim=1)
        ref = torch.sort(dd, dim=1, stable=True)
        _close(kv, ref.values[:, :k], tol)
        assert torch.equal(ki.cpu(), ref.indices[:, :k].cpu())
        _close(D.Kmax(k, dim=1), torch.sort(dd, dim=1, descending=True, stable=True).values[:, :k], tol)
        b = torch.randn(n, 2, dtype=dtype, device=device)
        _close((-D).exp() @ b, torch.exp(-dd) @ b.double(), tol)
        w = torch.rand(n, 2, dtype=dtype, device=device)
        _close((-D).logsumexp(1, weight=Vj(w)), torch.logsumexp(-dd[..., None] + w.double().log()[None], 1), tol)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_nan_inf_and_empty(device, backend):
    device = _device(device)
    x = torch.tensor([[0.0], [1.0], [float("nan")]], dtype=torch.float64, device=device)
    y = torch.tensor([[1.0], [-1.0], [2.0], [1.0]], dtype=torch.float64, device=device)
    D = (Vi(x) - Vj(y)).abs()
    assert D.argmin(1).flatten().tolist()[:2] == [0, 0]  # planted tie |0-1| = |0+1|: lowest index
    assert torch.isnan(D.sum(1)[2]) and not torch.isnan(D.sum(1)[:2]).any()
    # an all -inf row: logsumexp -inf, gradient 0 (never NaN)
    a = torch.tensor([[-math.inf], [0.5]], dtype=torch.float64, device=device, requires_grad=True)
    z = torch.zeros(4, 1, dtype=torch.float64, device=device)
    out = (Vi(a) + Vj(z)).logsumexp(1)
    assert out[0].item() == -math.inf
    out[0].sum().backward()
    assert torch.equal(a.grad, torch.zeros_like(a))
    # empty sizes
    e = torch.zeros(0, 1, dtype=torch.float64, device=device)
    assert (Vi(e) + Vj(y)).sum(1).shape == (0, 1)
    assert torch.equal((Vi(x[:1]) + Vj(e)).sum(1).cpu(), torch.zeros(1, 1, dtype=torch.float64))
    assert (Vi(x[:1]) + Vj(e)).logsumexp(1).item() == -math.inf
    vals, idx = (Vi(x) + Vj(e)).min_argmin(1)  # the semiring zero +inf, and index 0
    assert torch.equal(vals.cpu(), torch.full((3, 1), math.inf, dtype=torch.float64))
    assert torch.equal(idx.cpu(), torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(
        ValueError, match=r"K=1 must be between 1 and the reduced size 0 \(over j\); the reduced axis is empty"
    ):
        (Vi(x) + Vj(e)).argKmin(1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_broadcasting(device, backend):
    device = _device(device)
    x = torch.randn(2, 1, 30, 1, 4, dtype=torch.float64, device=device)
    y = torch.randn(1, 3, 1, 70, 4, dtype=torch.float64, device=device)
    p = torch.rand(2, 1, 1, 1, 4, dtype=torch.float64, device=device)
    f = ((LazyTensor(x) - LazyTensor(y)) * LazyTensor(p)).abs().sum(-1)
    ref = ((x - y) * p).abs().sum(-1)
    assert f.shape == (2, 3, 30, 70, 1)
    _close((-f).logsumexp(dim=-2), (-ref).logsumexp(-1, keepdim=True), 1e-10)
    _close(f.min(dim=2), ref.amin(-2)[..., None], 1e-10)


# ---------------------------------------------------------------- gradients

GRADS = {
    "sum": lambda x, y, b, s: (-Vi(x).sqdist(Vj(y)) * Pm(s)).exp() @ b,
    "sum_over_i": lambda x, y, b, s: ((Vi(x) * Vj(y)).sum(-1) * Pm(s)).sin().sum(0),
    "logsumexp": lambda x, y, b, s: (-Vi(x).sqdist(Vj(y)) / Pm(s) + Vj(b).elem(0)).logsumexp(1),
    "weighted": lambda x, y, b, s: (-Vi(x).sqdist(Vj(y)) * Pm(s)).logsumexp(1, weight=Vj(b).exp()),
    "max": lambda x, y, b, s: ((Vi(x) * Vj(y)).sum(-1) * Pm(s)).max(1),
    "vector_min": lambda x, y, b, s: ((Vi(x) - Vj(y)).abs() * Pm(s)).min(1),
    "kmin": lambda x, y, b, s: (Vi(x).sqdist(Vj(y)) * Pm(s)).Kmin(2, dim=0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradcheck(name, device):
    device = _device(device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    b, s = torch.randn(5, 2, generator=g, dtype=torch.float64), torch.tensor([0.7], dtype=torch.float64)
    args = [t.to(device).requires_grad_() for t in (x, y, b, s)]
    # on CUDA the selected pairs' gradient (max, min, k-best) sums the pairs that share an index through torch's
    # index_select backward, an index_add_ of atomic adds: equal to the last bits only, in no fixed order
    tol = 1e-12 if device == "cuda" else 0.0
    assert gradcheck(GRADS[name], args, nondet_tol=tol)
    assert gradgradcheck(GRADS[name], args, nondet_tol=tol)


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_operands(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMIRING_OPS_LAZY_CACHE", str(tmp_path))
    x2, y3 = Vi(torch.randn(5, 2)), Vj(torch.randn(6, 3))
    with pytest.raises(ValueError, match=r"\(5, 1, 2\).*\(1, 6, 3\)|vector dimension"):
        x2 - y3
    with pytest.raises(ValueError, match="i-indices"):
        Vi(torch.randn(5, 2)) + Vi(torch.randn(4, 2))
    D = Vi(torch.randn(5, 2)).sqdist(Vj(torch.randn(6, 2)))
    for axis in (3, -4):
        with pytest.raises(ValueError, match="not a reduction axis"):
            D.sum(axis)
    with pytest.raises(TypeError, match="dtypes"):
        Vi(torch.randn(5, 2)) + Vj(torch.randn(6, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="int64"):
        Vi(torch.ones(5, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="dense"):
        LazyTensor(torch.randn(4, 5, 2))
    with pytest.raises(ValueError, match="axis=0"):
        LazyTensor(torch.randn(4, 2))
    with pytest.raises(ValueError, match="K=9"):
        D.Kmin(9, dim=1)
    with pytest.raises(ValueError, match="out of range"):
        Vi(torch.randn(5, 2)).extract(1, 3)
    with pytest.raises(ValueError, match="scalar formula"):
        Vi(torch.randn(5, 2)) @ torch.randn(1, 2)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="devices"):
            Vi(torch.randn(5, 2)) + Vj(torch.randn(6, 2, device="cuda"))
    assert not any(tmp_path.iterdir()), "nothing may be compiled before the input is checked"


# (linear memory at M = N = 200,000 on the compiled CPU kernel: test_lazy_memory.py, in a fresh process whose
# peak is reset first; an in-process ru_maxrss is a high-water mark that an earlier peak hides)


def test_small_cpu_calls_run_on_one_thread(monkeypatch, compiled):
    """The compiled CPU kernel gets one OpenMP thread below cpu_kernels.SERIAL_PAIRS (output row, reduced
    index) pairs, no fork for a few microseconds of work; above, torch's thread count, at most one per row."""
    monkeypatch.setattr(cpu_kernels.torch, "get_num_threads", lambda: 4)
    threads = []
    real = cpu_kernels._function

    class Spy:
        def __init__(self, fn):
            self.fn = fn

        def call(self, *args):
            threads.append(args[7])  # (vals, idx, args, bstride, nbatch, n_outer, n_inner, nthreads, ...)
            return self.fn.call(*args)

    monkeypatch.setattr(cpu_kernels, "_function", lambda plan, dtype: Spy(real(plan, dtype)))
    g = torch.Generator().manual_seed(5)
    for m, n, want in ((100, 100, 1), (1000, 32, 1), (200, 200, 4), (2, 20_000, 2), (1, 100_000, 1)):
        x, y = torch.randn(m, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
        threads.clear()
        out = Vi(x).sqdist(Vj(y)).sum(1)
        assert threads == [want], (m, n, threads)
        torch.testing.assert_close(out, ((x[:, None] - y[None]) ** 2).sum(-1).sum(1, keepdim=True))
    assert cpu_kernels.cpu_threads(0, 0) == cpu_kernels.cpu_threads(3, 0) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 5), (4, 1)])
def test_matmul_takes_the_remembered_plan_when_an_axis_has_one_point(device, backend, m, n):
    """K @ v with M = 1 or N = 1 (a variable of one row, or none on an axis) is the remembered-plan path too,
    and equals the dense product; K with no j-variable at all broadcasts v's rows (the general path)."""
    device = _device(device)
    g = torch.Generator().manual_seed(m * 10 + n)
    x, y = torch.randn(m, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
    x, y, v = x.to(device), y.to(device), torch.randn(n, 3, generator=g, dtype=torch.float64).to(device)
    K = (-((Vi(x) - Vj(y)) ** 2).sum(-1)).exp()
    dense = torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    torch.testing.assert_close(K @ v, dense @ v, rtol=1e-12, atol=1e-12)
    assert ("@", 3) in K.formula._plans  # the remembered plan, not (K * v_j).sum
    Kx = (-(Vi(x) ** 2).sum(-1)).exp()  # no j-variable: every row of v is a j
    torch.testing.assert_close(Kx @ v, torch.exp(-(x**2).sum(-1, keepdim=True)) * v.sum(0), rtol=1e-12, atol=1e-12)


def test_repeated_reductions_and_matmul_reuse_plans_but_read_fresh_data(device, backend):
    """K @ v and K.sum reuse the plan remembered on K's formula: each call still reads the current tensors
    (a new v, x changed in place), matches the general path ((K * v_j).sum), and v may also appear in K."""
    device = _device(device)
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(37, 2, generator=g, dtype=torch.float64), torch.randn(300, 2, generator=g, dtype=torch.float64)
    x, y = x.to(device), y.to(device)
    K = (-((Vi(x) - Vj(y)) ** 2).sum(-1) * 0.5).exp()

    def dense_k():
        return torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) * 0.5)

    for e in (1, 3, 3, 1):
        v = torch.randn(300, e, generator=g, dtype=torch.float64).to(device)
        out = K @ v
        torch.testing.assert_close(out, dense_k() @ v, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out, (K * Vj(v)).sum(1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(K @ y, dense_k() @ y, rtol=1e-12, atol=1e-12)  # v is one of K's variables
    before = K.sum(1)
    x.mul_(0.5)  # the same tensor, new values: the remembered plan reads them
    after = K.sum(1)
    torch.testing.assert_close(after, dense_k().sum(1, keepdim=True), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(before, after)
    # gradients through the remembered matmul plan: wrt v and wrt K's own variables
    v = torch.randn(300, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()
    xg = x.clone().requires_grad_()
    Kg = (-((Vi(xg) - Vj(y)) ** 2).sum(-1) * 0.5).exp()
    for _ in range(2):
        (gv, gx) = torch.autograd.grad((Kg @ v).square().sum(), [v, xg])
        dense = torch.exp(-((xg[:, None, :] - y[None, :, :]) ** 2).sum(-1) * 0.5)
        rv, rx = torch.autograd.grad((dense @ v).square().sum(), [v, xg])
        torch.testing.assert_close(gv, rv, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gx, rx, rtol=1e-10, atol=1e-10)


def test_a_formula_thousands_of_operations_deep_reduces(backend):
    """Keys, canonical forms and kernels of a 3000-deep formula: no recursion limit on the way."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.rand(4, 1, generator=g, dtype=torch.float64), torch.rand(6, 1, generator=g, dtype=torch.float64)
    f, ref = Vi(x), x[:, None, :]
    yj = Vj(y)
    for k in range(1500):
        f = (f * 0.5 + yj) if k % 2 else (f - yj * 0.25)
        ref = (ref * 0.5 + y[None, :, :]) if k % 2 else (ref - y[None, :, :] * 0.25)
    torch.testing.assert_close(f.sum(1), ref.sum(1), rtol=1e-12, atol=1e-12)
