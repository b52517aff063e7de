"""The matrix-unit route (semiring_ops/lazy/gemm_route.py, inner_products.py): squared distances and dot products
of wide variables as GEMMs, the rest of the formula and the reduction in the generated kernel.

Every reduction kind against float64 torch on the dense matrix, on random, clustered, near-duplicate and
large-norm points, with the route forced (SEMIRING_OPS_LAZY_GEMM=on), blocks of rows straddling the outputs,
outputs poisoned; the route must actually run (a spy on its GEMM), agree with the plain kernel, and carry
gradients (gradcheck in float64: the backward's own formulas take the route too).
"""

from __future__ import annotations

import pytest
import torch
from conftest import CUDA, counted_calls
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj, distance_blocks, gemm_route, linear_route
from semiring_ops.lazy.formula import InnerProduct, _postorder, canonicalize
from semiring_ops.lazy.inner_products import gram_plan
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import semiring_reduction

DEVICES = ["cpu", CUDA]


@pytest.fixture
def route(monkeypatch, compiled):
    """The route forced on for every matching sum, its blocks' GEMMs counted: the kernel's matrix blocks, the fused
    selections' (Hopper, hopper_gemm.kbest_nt), or the linear route's (on the CPU, K @ b of several columns is S @ b,
    linear_route.py)."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    calls = counted_calls(monkeypatch, gemm_route, "_block_matrix")
    calls = counted_calls(monkeypatch, gemm_route, "_fused_candidates", calls)
    return counted_calls(monkeypatch, linear_route, "block_gram", calls)


def points(kind: str, m: int, n: int, d: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (m, d), y (n, d)) float32 of one of the layouts the route must keep accurate."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        x, y = torch.randn(m, d, generator=g), torch.randn(n, d, generator=g)
    elif kind == "clustered":
        centres = torch.randn(4, d, generator=g) * 3
        x = centres[torch.randint(0, 4, (m,), generator=g)] + 0.05 * torch.randn(m, d, generator=g)
        y = centres[torch.randint(0, 4, (n,), generator=g)] + 0.05 * torch.randn(n, d, generator=g)
    elif kind == "near_duplicate":  # |x - y| << |x|: |x|^2 + |y|^2 - 2 x.y cancels to a few ulp
        y = torch.randn(n, d, generator=g) + 5
        x = y[torch.randint(0, n, (m,), generator=g)] + 1e-3 * torch.randn(m, d, generator=g)
    elif kind == "large_norm":  # far from the origin: the shift by the mean keeps the digits
        x, y = torch.randn(m, d, generator=g) + 1000, torch.randn(n, d, generator=g) + 1000
    else:
        raise AssertionError(kind)
    return x.to(device), y.to(device)


def dense_sqdist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x.double()[:, None, :] - y.double()[None, :, :]) ** 2).sum(-1)


def test_the_routed_plan_reads_its_inner_products_and_round_trips_through_its_key():
    x, y = torch.randn(5, 40), torch.randn(7, 40)
    f = (-((Vi(x) - Vj(y)) ** 2).sum(-1)).exp() + (Vi(x) | Vj(y))
    canon, tvars = canonicalize(f.formula)
    plan = Plan(canon, tuple(v.cat for v in tvars), tuple(v.dim for v in tvars), semiring_reduction("log"), "i", False)
    routed, specs = gram_plan(plan, 16)
    assert [s.kind for s in specs] == ["sqdist", "dot"]
    assert routed.grams == 2 and plan.grams == 0
    assert sum(isinstance(node, InnerProduct) for node in _postorder(routed.formula)) == 2
    assert Plan.from_key(routed.key).key == routed.key
    assert gram_plan(plan, 64) is None  # D = 40 is below that threshold
    # not an inner product of an outer and an inner variable: |x_i - x_i'|, a product with a parameter
    g = ((Vi(x) - Vi(x * 2)) ** 2).sum(-1) + (Vi(x) * LazyTensor(torch.randn(40))).sum(-1) + Vj(y).sum(-1)
    canon, tvars = canonicalize(g.formula)
    plain = Plan(canon, tuple(v.cat for v in tvars), tuple(v.dim for v in tvars), semiring_reduction("log"), "i", False)
    assert gram_plan(plain, 1) is None


REDUCTIONS = ["sum", "logsumexp", "min", "argmin", "argKmin", "max_dot", "matmul"]


def _reduce(name: str, x: torch.Tensor, y: torch.Tensor, b: torch.Tensor, over: int):
    d_ij = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    if name == "sum":
        return (-d_ij / 40).exp().sum(over)
    if name == "logsumexp":
        return (-d_ij / 40).logsumexp(over)
    if name == "min":
        return d_ij.min(over)
    if name == "argmin":
        return d_ij.argmin(over)
    if name == "argKmin":
        return d_ij.argKmin(3, dim=over)
    if name == "max_dot":
        return (Vi(x) | Vj(y)).max(over)
    if name == "matmul":
        return (-d_ij / 40).exp() @ b if over == 1 else None
    raise AssertionError(name)


def _reference(name: str, x, y, b, over: int):
    d = dense_sqdist(x, y)
    if over == 0:
        d = d.t()
    if name == "sum":
        return (-d / 40).exp().sum(1, keepdim=True)
    if name == "logsumexp":
        return torch.logsumexp(-d / 40, 1, keepdim=True)
    if name == "min":
        return d.min(1, keepdim=True).values
    if name == "argmin":
        return d.argmin(1, keepdim=True)
    if name == "argKmin":
        return torch.sort(d, dim=1, stable=True).indices[:, :3]
    if name == "max_dot":
        dots = x.double() @ y.double().t()
        return (dots if over == 1 else dots.t()).max(1, keepdim=True).values
    if name == "matmul":
        return (-d / 40).exp() @ b.double()
    raise AssertionError(name)


@pytest.mark.parametrize("fused", ["0", "1"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["random", "clustered", "near_duplicate", "large_norm"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_every_reduction_on_the_route_matches_float64(route, device, layout, name, fused, monkeypatch):
    """fused: the selections' candidates from hopper_gemm.kbest_nt where it runs (SEMIRING_OPS_LAZY_FUSED_KBEST)."""
    if fused == "1" and not (device == "cuda" and name == "argKmin"):
        pytest.skip("the fused selections: k-best on Hopper")
    monkeypatch.setenv("SEMIRING_OPS_LAZY_FUSED_KBEST", fused)
    m, n, d = 300, 517, 70
    x, y = points(layout, m, n, d, device, seed=hash((layout, name)) % 1000)
    b = torch.randn(n, 3, device=device)
    for over in (1, 0):
        got = _reduce(name, x, y, b, over)
        if got is None:
            continue
        ref = _reference(name, x, y, b, over)
        if name.startswith("arg"):
            # the route's distances carry float32 rounding: an index may differ only where the float64
            # distances tie within that rounding
            dd = (dense_sqdist(x, y) if over == 1 else dense_sqdist(x, y).t()).cpu()
            picked, want = dd.gather(1, got.cpu()), dd.gather(1, ref.cpu())
            torch.testing.assert_close(picked, want, rtol=2e-5, atol=1e-6)
        else:
            torch.testing.assert_close(got.double().cpu(), ref.cpu(), rtol=2e-5, atol=2e-5 * ref.abs().max().item())
    assert route["n"] > 0, "the route did not run"


@pytest.mark.parametrize("device", DEVICES)
def test_near_duplicates_are_summed_again_exactly(route, device):
    """Points 1e-3 apart at norm ~ 5 sqrt(D): the GEMM form alone would give distances wrong in every digit
    (and negative); the kernel sums such cells again, so the smallest distances are float32-accurate."""
    x, y = points("near_duplicate", 200, 300, 128, device, seed=3)
    got = ((Vi(x) - Vj(y)) ** 2).sum(-1).min(1)
    ref = dense_sqdist(x, y).min(1, keepdim=True).values
    assert (got > 0).all()
    torch.testing.assert_close(got.double().cpu(), ref.cpu(), rtol=1e-5, atol=0)
    assert route["n"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_of_rows_straddle_the_output(route, device, monkeypatch):
    """Blocks of 256 rows over 700 rows (the last one short), with a block budget of one row quantum."""
    monkeypatch.setitem(gemm_route.BLOCK_BYTES, torch.device(device).type, 1)
    x, y = points("random", 700, 333, 33, device, seed=5)
    b = torch.randn(333, 2, device=device)
    got = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 33).exp() @ b
    ref = (-dense_sqdist(x, y) / 33).exp() @ b.double()
    scale = (-dense_sqdist(x, y) / 33).exp() @ b.double().abs()  # the terms' size: a sum near 0 cancels
    assert ((got.double() - ref).abs() <= 1e-5 * scale).all()
    assert route["n"] == 3


@pytest.mark.parametrize("device", DEVICES)
def test_route_and_plain_kernel_agree(compiled, device, monkeypatch):
    x, y = points("clustered", 257, 1025, 96, device, seed=7)
    f = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "off")
    plain = (f.argKmin(5, dim=1), (-f / 96).exp().sum(1))
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    routed = (f.argKmin(5, dim=1), (-f / 96).exp().sum(1))
    assert torch.equal(plain[0], routed[0])
    torch.testing.assert_close(routed[1], plain[1], rtol=1e-5, atol=1e-7)


@settings(max_examples=10)
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    d=st.sampled_from([1, 3, 17, 65, 130]),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_sizes_on_the_cpu(m, n, d, seed):
    import os

    old = os.environ.get("SEMIRING_OPS_LAZY_GEMM")
    os.environ["SEMIRING_OPS_LAZY_GEMM"] = "on"
    try:
        x, y = points("random", m, n, d, "cpu", seed)
        b = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))
        got = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / d).exp() @ b
        kmin = ((Vi(x) - Vj(y)) ** 2).sum(-1).Kmin(min(3, n), dim=1)
    finally:
        if old is None:
            del os.environ["SEMIRING_OPS_LAZY_GEMM"]
        else:
            os.environ["SEMIRING_OPS_LAZY_GEMM"] = old
    dd = dense_sqdist(x, y)
    scale = (-dd / d).exp() @ b.double().abs()  # the terms' size: a sum near 0 cancels
    assert ((got.double() - (-dd / d).exp() @ b.double()).abs() <= 1e-5 * scale + 1e-30).all()
    torch.testing.assert_close(kmin.double(), torch.sort(dd, 1).values[:, : min(3, n)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_through_the_route(route, device):
    """gradcheck in float64 of a Gaussian kernel product and a logsumexp of dot products: their backward
    reductions hold the same sums, which take the route too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 20, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = torch.randn(11, 20, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(11, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()

    def gauss(x, y, b):
        return (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 20).exp() @ b

    def lse(x, y):
        return (LazyTensor(x[:, None, :]) | LazyTensor(y[None, :, :])).logsumexp(1)

    assert torch.autograd.gradcheck(gauss, (x, y, b))
    assert torch.autograd.gradcheck(lse, (x, y))
    assert route["n"] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(route, device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pass  # the CPU computes 16-bit inputs in float32 too
    x, y = points("random", 129, 260, 48, device, seed=11)
    x, y = x.to(dtype), y.to(dtype)
    got = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 48).exp().sum(1)
    assert got.dtype == dtype
    ref = (-dense_sqdist(x, y) / 48).exp().sum(1, keepdim=True)
    tol = 1e-12 if dtype == torch.float64 else 1e-2
    torch.testing.assert_close(got.double().cpu(), ref.cpu(), rtol=tol, atol=tol)
    assert route["n"] > 0


def test_bad_mode_is_refused(monkeypatch):
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "sometimes")
    with pytest.raises(ValueError, match="SEMIRING_OPS_LAZY_GEMM"):
        gemm_route.route_mode()


def test_bad_fused_kbest_setting_is_refused(monkeypatch):
    for setting in ("auto", "0", "1"):
        monkeypatch.setenv("SEMIRING_OPS_LAZY_FUSED_KBEST", setting)
        assert gemm_route.fused_kbest_setting() == setting
    monkeypatch.delenv("SEMIRING_OPS_LAZY_FUSED_KBEST")
    assert gemm_route.fused_kbest_setting() == "auto"
    monkeypatch.setenv("SEMIRING_OPS_LAZY_FUSED_KBEST", "yes")
    with pytest.raises(ValueError, match="SEMIRING_OPS_LAZY_FUSED_KBEST"):
        gemm_route.fused_kbest_setting()


@pytest.fixture
def linear(monkeypatch, route):
    """The linear route (lazy/linear_route.py) forced on, its blocks counted."""
    return counted_calls(monkeypatch, linear_route, "route_mm")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["random", "near_duplicate", "large_norm"])
def test_gradients_of_a_gaussian_kernel_product_by_gemms(linear, device, layout):
    """d/dx, d/dy and d/db of (exp(-|x - y|^2 / D) @ b) . g: the x and y gradients are sums of a scalar cell times
    x_i - y_j, computed as S Y and x S.sum(1) from GEMMs, against float64 autograd of the dense matrix."""
    x, y = points(layout, 257, 300, 70, device, seed=21)
    b = torch.randn(300, 2, device=device)
    g = torch.randn(257, 2, device=device)
    xs, ys, bs = (t.clone().requires_grad_() for t in (x, y, b))
    out = (-((Vi(xs) - Vj(ys)) ** 2).sum(-1) / 70).exp() @ bs
    got = torch.autograd.grad(out, (xs, ys, bs), g)
    xd, yd, bd = (t.double().requires_grad_() for t in (x, y, b))
    ref_out = (-dense_sqdist(xd, yd) / 70).exp() @ bd
    want = torch.autograd.grad(ref_out, (xd, yd, bd), g.double())
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), w, rtol=1e-4, atol=1e-5 * w.abs().max().item())
    assert linear["n"] >= 2  # the x and the y gradient


@pytest.mark.parametrize("device", [CUDA])
def test_a_deep_gradient_keeps_float32_digits(linear, device):
    """The x gradient of a Gaussian K @ b of 4,096 x 20,000 points at D = 784: S @ y is a reduction of depth 20,000,
    where a 3xTF32 product on the tensor cores is off by ~2e-4 (an H200: gemm_route's docstring; at this shape cuBLAS
    does not split the depth, as it does for a small output). The route's SGEMM keeps a float32 evaluation's digits
    (KeOps's gradient: 1.5e-6)."""
    m, n, d = 4096, 20000, 784
    x, y = points("random", m, n, d, device, seed=5)
    b, g = torch.randn(n, 1, device=device), torch.randn(m, 1, device=device)
    xs = x.clone().requires_grad_()
    got = torch.autograd.grad((-((Vi(xs) - Vj(y)) ** 2).sum(-1) / d).exp() @ b, xs, g)[0].double()
    xd, yd, bd = x.double(), y.double(), b.double()
    k = (torch.cdist(xd, yd).square_() / -d).exp_()  # (float64 |x|^2 + |y|^2 - 2 x.y: to ~1e-13 here)
    want = (-2 / d) * g.double() * (xd * (k @ bd) - k @ (bd * yd))
    err = (got - want).abs()
    assert (err / want.abs()).median() < 1e-5
    assert err.max() < 1e-5 * want.abs().max()
    assert linear["n"] >= 1


def test_the_linear_route_matches_only_scalar_cells_times_affine_terms():
    x, y, w = torch.randn(5, 40), torch.randn(7, 40), torch.randn(40)
    d_ij = ((Vi(x) - Vj(y)) ** 2).sum(-1)

    def plan_of(f):
        canon, tvars = canonicalize(f.formula)
        cats, dims = tuple(v.cat for v in tvars), tuple(v.dim for v in tvars)
        return Plan(canon, cats, dims, semiring_reduction("std"), "i", False)

    (term,) = linear_route.match_linear(plan_of((-d_ij).exp() * (Vi(x) - Vj(y)) * 3.0), 16, 16)
    assert term.outer_coef is not None and len(term.grams) == 1
    assert linear_route.match_linear(plan_of((-d_ij).exp() * Vj(y)), 16, 16)[0].outer_coef is None
    parts = linear_route.match_linear(plan_of(((-d_ij).exp() * Vj(y)).concat(-(d_ij * Vj(y)))), 16, 16)
    assert [(t.offset, t.dim) for t in parts] == [(0, 40), (40, 40)]
    # a vector left in the cell, a product of two variables, a max: not this route
    assert linear_route.match_linear(plan_of((Vi(x) * Vj(y)).exp() * Vj(y)), 16, 16) is None
    assert linear_route.match_linear(plan_of((-d_ij).exp() * (Vi(x) * Vj(y))), 16, 16) is None
    assert linear_route.match_linear(plan_of((-d_ij).exp() * (Vj(y) + LazyTensor(w))), 16, 16) is None


@pytest.mark.parametrize("device", DEVICES)
def test_precision_fast_is_a_plan_of_its_own_and_close(route, device):
    """precision="fast" (plain TF32 on CUDA) gives its own plan key, results within TF32's rounding, and the
    exact route where it changes nothing (CPU); a bad value is refused naming the argument."""
    x, y = points("clustered", 300, 400, 128, device, seed=9)
    b = torch.randn(400, 3, device=device)
    d_ij = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    exact = (-d_ij / 128).exp() @ b
    fast = (-d_ij / 128).exp().__matmul__(b, precision="fast")
    ref = (-dense_sqdist(x, y) / 128).exp() @ b.double()
    tol = 1e-5 if device == "cpu" else 3e-3
    scale = (-dense_sqdist(x, y) / 128).exp() @ b.double().abs()
    assert ((fast.double() - ref).abs().cpu() <= tol * scale.cpu()).all()
    assert ((exact.double() - ref).abs().cpu() <= 1e-5 * scale.cpu()).all()
    knn = d_ij.argKmin(4, dim=1, precision="fast")
    assert knn.shape == (300, 4)
    with pytest.raises(ValueError, match="precision"):
        d_ij.argKmin(4, dim=1, precision="tf32")


@pytest.mark.parametrize(("precision", "flags"), [("exact", "|1"), ("high", "|1h"), ("fast", "|1f")])
def test_a_plan_key_round_trips_its_precision(precision, flags):
    x, y = torch.randn(5, 40), torch.randn(7, 40)
    canon, tvars = canonicalize(((Vi(x) - Vj(y)) ** 2).sum(-1).formula)
    cats, dims = tuple(v.cat for v in tvars), tuple(v.dim for v in tvars)
    plan = Plan(canon, cats, dims, semiring_reduction("min"), "i", True, False, precision)
    assert plan.key.endswith(flags) and Plan.from_key(plan.key).key == plan.key
    assert Plan.from_key(plan.key).precision == precision and plan.fast == (precision == "fast")
    routed, _ = gram_plan(plan, 16)
    assert routed.precision == precision and Plan.from_key(routed.key).key == routed.key
    with pytest.raises(ValueError, match="precision"):
        Plan(canon, cats, dims, semiring_reduction("min"), "i", True, False, "tf32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["random", "near_duplicate", "large_norm"])
def test_weighted_squared_distances(route, device, layout):
    """sum_d w_d (x_d - y_d)^2 (KeOps' weightedsqdist with weights of dimension D) as |x|_w^2 + |y|_w^2 - 2 x.(w y):
    k-NN, a Gaussian product and its gradient against float64."""
    x, y = points(layout, 260, 300, 40, device, seed=31)
    w = torch.rand(40, device=device) + 0.5
    b = torch.randn(300, 2, device=device)
    xs = x.clone().requires_grad_()
    d_ij = Vi(xs).weightedsqdist(Vj(y), LazyTensor(w))
    dense = lambda x: ((x.double()[:, None] - y.double()[None]) ** 2 * w.double()).sum(-1)  # noqa: E731
    knn = d_ij.argKmin(3, dim=1)
    dd = dense(x).cpu()
    torch.testing.assert_close(dd.gather(1, knn.cpu()), torch.sort(dd, dim=1).values[:, :3], rtol=2e-5, atol=1e-6)
    out = (-d_ij / 40).exp() @ b
    ref = (-dense(x) / 40).exp() @ b.double()
    scale = (-dense(x) / 40).exp() @ b.double().abs()
    assert ((out.double() - ref).abs() <= 1e-5 * scale).all()
    g = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, xs, g)
    xd = x.double().requires_grad_()
    (want,) = torch.autograd.grad((-dense(xd) / 40).exp() @ b.double(), xd, g.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
    assert route["n"] > 0


def test_cpu_kernel_product_of_many_columns_takes_the_linear_route(compiled, monkeypatch):
    """On the CPU, K @ b with b of at least MIN_PRODUCT_DIM columns is S @ b (dispatch.execute): it must run
    there by default (a large enough reduction) and match float64; one column stays in the kernel."""
    monkeypatch.delenv("SEMIRING_OPS_LAZY_GEMM", raising=False)
    terms = counted_calls(monkeypatch, linear_route, "_run_term")
    x, y = points("random", 300, 260, 40, "cpu", seed=41)
    b = torch.randn(260, linear_route.MIN_PRODUCT_DIM["cpu"], generator=torch.Generator().manual_seed(1))
    got = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 40).exp() @ b
    ref = (-dense_sqdist(x, y) / 40).exp() @ b.double()
    scale = (-dense_sqdist(x, y) / 40).exp() @ b.double().abs()
    assert ((got.double() - ref).abs() <= 1e-5 * scale).all()
    assert terms["n"] == 1
    (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 40).exp() @ b[:, :1]
    assert terms["n"] == 1


def test_cpu_gradient_terms_below_the_linear_minimum_stay_in_the_kernel(compiled, monkeypatch):
    """A term with an outer part (the gradients' a x_i + b y_j) takes the linear route from MIN_LINEAR_DIM
    components only, though S @ b does from MIN_PRODUCT_DIM."""
    monkeypatch.delenv("SEMIRING_OPS_LAZY_GEMM", raising=False)
    terms = counted_calls(monkeypatch, linear_route, "_run_term")
    d = linear_route.MIN_PRODUCT_DIM["cpu"] * 2
    assert d < linear_route.MIN_LINEAR_DIM["cpu"]
    x, y = points("random", 300, 260, d, "cpu", seed=43)
    xs = x.clone().requires_grad_()
    out = (-((Vi(xs) - Vj(y)) ** 2).sum(-1) / d).exp().sum(1)
    (gx,) = torch.autograd.grad(out.sum(), xs)
    xd = x.double().requires_grad_()
    (want,) = torch.autograd.grad((-dense_sqdist(xd, y) / d).exp().sum(), xd)
    torch.testing.assert_close(gx.double(), want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
    assert terms["n"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("far_rows, specials", [(2, False), (3, False), (0, False), (2, True)])
def test_cpu_distance_blocks_sum_again_only_the_cells_that_cancel_and_keep_nan_and_inf(
    route, monkeypatch, dtype, far_rows, specials
):
    """The CPU's distance blocks (the GEMM's -2 x.y, then the norms added, the exact test and the re-summation in
    one pass of C++, distance_blocks.py): rows of near-duplicates beside rows of far points (every ``far_rows``-th
    row, or none); with ``specials`` a NaN and an infinite coordinate (the inner terms' mean, then every
    shifted y, is infinite: every cell is summed again). Each block the linear route reads against float64 of the
    dense matrix (inf and NaN where the dense form has them)."""
    x, y = points("near_duplicate", 300, 90, 48, "cpu", seed=5)
    if far_rows:
        x[::far_rows] += 40  # far from every y: no cell of these rows is summed again
    x, y = x.to(dtype), y.to(dtype)
    if specials:
        x[3, 7] = float("nan")
        y[11, 2] = float("inf")
    blocks = []
    real = linear_route.block_gram

    def kept(spec, inner, call, lo, n, fast, out, exp_scale=None):
        blocks.append((lo, n, real(spec, inner, call, lo, n, fast)))  # the distances alone (the route's own call
        return real(spec, inner, call, lo, n, fast, out, exp_scale)  # makes the Gaussian cell in the same pass)

    monkeypatch.setattr(linear_route, "block_gram", kept)
    monkeypatch.setattr(gemm_route, "BLOCK_BYTES", {"cpu": 256 * 90 * 8 * x.element_size()})  # blocks of 256 rows
    b = torch.randn(90, 16, dtype=dtype)
    (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 48).exp() @ b
    want = dense_sqdist(x, y)
    assert [(lo, n) for lo, n, _ in blocks] == [(0, 256), (256, 44)]
    for lo, n, got in blocks:
        ref = want[lo : lo + n]
        finite = torch.isfinite(ref)
        assert torch.isnan(got[ref.isnan()]).all() and (got[ref == float("inf")] == float("inf")).all()
        tol = 2e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(got[finite].double(), ref[finite], rtol=tol, atol=0)


def test_cpu_distance_blocks_exp_is_faithful_with_subnormals_inf_and_nan():
    """complete_distances' exp_scale (the Gaussian cell made in the distances' pass, float32): within 1 ulp of the
    float64 exp of the same float argument over [-200, 200] (torch.exp itself: 0.57), subnormal results within one
    subnormal step, 0 / inf past the range, and a NaN distance summed again (here to 0, so exp(0) = 1)."""
    d = torch.cat([torch.linspace(0, 200, 200_001), torch.tensor([float("inf"), float("nan")])])
    for scale in (-1.0, 1.0, -0.0123):
        got = torch.zeros(1, d.numel())
        distance_blocks.complete_distances(
            got, torch.zeros(1, 1), torch.zeros(d.numel(), 1), torch.zeros(1), d, None, scale
        )
        arg = torch.tensor(scale) * d
        want = torch.exp(arg.double())
        want[-1] = 1.0  # the NaN cell: summed again from the (zero) variables
        got = got[0].double()
        wf = want.float()  # (past float's range: inf)
        finite = torch.isfinite(wf)
        ulp = torch.nextafter(wf, torch.tensor(float("inf"))).double() - wf.double()
        normal = finite & (wf >= torch.finfo(torch.float32).tiny)
        assert ((got - want).abs() / ulp)[normal].max() <= 1.0, scale
        subnormal = (got - want)[finite & ~normal].abs()
        assert subnormal.numel() == 0 or subnormal.max() <= 2 * 2**-149, scale
        assert torch.equal(got[~finite], wf[~finite].double()), scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_cells_are_made_in_the_distances_pass_and_others_are_not(route, monkeypatch, dtype):
    """The linear route recognises exp(a * |x - y|^2) with a of numbers and scalar parameters (/ D, * g, -g *)
    and block_gram makes the cell in its C++ pass (CPU); other cells are evaluated by torch as before. Each against
    float64 of the dense form."""
    x, y = points("near_duplicate", 300, 90, 48, "cpu", seed=3)
    x, y = x.to(dtype), y.to(dtype)
    b = torch.randn(90, 16, dtype=dtype)
    g = torch.tensor([0.03], dtype=dtype)
    seen = []
    real = linear_route.block_gram

    def spy(*args):
        seen.append(args[-1])  # exp_scale
        return real(*args)

    monkeypatch.setattr(linear_route, "block_gram", spy)
    d2 = dense_sqdist(x, y)
    cases = [
        (lambda D: (-D / 48).exp(), (-d2 / 48).exp(), -1 / 48),
        (lambda D: (-Pm(g) * D).exp(), (-0.03 * d2).exp(), -0.03),
        (lambda D: (D * (-0.5)).exp(), (-0.5 * d2).exp(), -0.5),
        (lambda D: (-D / 48).exp() * 2, 2 * (-d2 / 48).exp(), None),
        (lambda D: (-(D * D) / 1e4).exp(), (-(d2 * d2) / 1e4).exp(), None),
    ]
    for cell, dense, scale in cases:
        seen.clear()
        got = cell(((Vi(x) - Vj(y)) ** 2).sum(-1)) @ b
        want = dense @ b.double()
        tol = 2e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())
        assert seen and all(s == pytest.approx(scale) if scale is not None else s is None for s in seen), seen
