"""Every reduction of semiring_ops.lazy against torch on the dense (M, N, D) matrix in float64: sum, logsumexp
(per component, and with weight=), max, min, argmax, argmin, max_argmax, min_argmin, Kmin, argKmin,
Kmin_argKmin, Kmax, argKmax, Kmax_argKmax and ``@``; over i and j with dim= and axis=; planted ties (the lowest
index wins, across CPU lanes and CUDA blocks); batch dimensions; M << N and M >> N; empty dimensions; -inf,
+inf and NaN; float16 / bfloat16 / float32 inputs; on the compiled kernels and on the PyTorch fallback, with
the kernels' outputs poisoned (NaN / -1) before each run.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import LazyTensor, Vi, Vj
from semiring_ops.lazy.formula import Var
from semiring_ops.lazy.plan import CallArgs, Plan, new_outputs
from semiring_ops.lazy.reductions import semiring_reduction

DEVICES = ["cpu", CUDA]
SEEDS = st.integers(0, 2**32 - 1)
INF, NAN = math.inf, math.nan


# ---------------------------------------------------------------- references


def _inner_last(dense: torch.Tensor, over: str) -> torch.Tensor:
    """(..., M, N, D) -> (..., rows, inner, D): the reduced axis second to last."""
    return dense if over == "j" else dense.transpose(-3, -2)


def reference(name: str, dense: torch.Tensor, over: str, k: int = 1):
    """torch's result of reduction ``name`` of dense (..., M, N, D) over i or j, in the lazy layout."""
    d = _inner_last(dense.cpu(), over)  # on the CPU: CUDA's torch.sort puts NaN before +inf (torch 2.11)
    squeeze = d.shape[-1] == 1
    if name == "sum":
        return d.sum(-2)
    if name == "logsumexp":
        return torch.logsumexp(d, -2)
    if name in ("max", "min", "argmax", "argmin", "max_argmax", "min_argmin"):
        big = "max" in name
        vals = d.amax(-2) if big else d.amin(-2)
        idx = d.argmax(-2) if big else d.argmin(-2)  # the first extremum (and the first NaN)
        return {"max": vals, "min": vals, "argmax": idx, "argmin": idx}.get(name, (vals, idx))
    if name.removeprefix("arg").startswith(("Kmin", "Kmax")):
        vals, idx = torch.sort(d, dim=-2, descending="Kmax" in name, stable=True)  # ties: lowest index first
        vals, idx = vals[..., :k, :], idx[..., :k, :]
        if squeeze:
            vals, idx = vals.squeeze(-1), idx.squeeze(-1)
        if name.startswith("arg"):
            return idx
        return (vals, idx) if "_arg" in name else vals
    raise AssertionError(name)


def _lazy_call(f: LazyTensor, name: str, spec: dict, k: int):
    if name.removeprefix("arg").startswith(("Kmin", "Kmax")):
        return getattr(f, name)(k, **spec)
    return getattr(f, name)(**spec)


def assert_same(got, ref, tol: float, scale: torch.Tensor | None = None, dtype: torch.dtype | None = None):
    """Values: the same shape and dtype, NaN and infinities at the same places, finite values within
    tol * scale (default max(1, |ref|)); int64 indices: equal."""
    assert isinstance(got, torch.Tensor), type(got)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if not ref.is_floating_point():
        assert got.dtype == torch.int64
        bad = (got.cpu() != ref.cpu()).nonzero()
        assert not bad.numel(), f"{bad.shape[0]} indices differ, first at {bad[0].tolist()}"
        return
    if dtype is not None:
        assert got.dtype == dtype, (got.dtype, dtype)
    g, r = got.double().cpu(), ref.double().cpu()
    assert torch.equal(torch.isnan(g), torch.isnan(r)), f"NaN at {torch.isnan(g).nonzero()[:5].tolist()} vs ref"
    fin = torch.isfinite(r)
    assert torch.equal(torch.isfinite(g), fin), "infinite values at other places"
    assert torch.equal(g[torch.isinf(r)], r[torch.isinf(r)]), "infinities of another sign"
    s = r.abs().clamp_min(1.0) if scale is None else scale.double().cpu().expand_as(r)
    err = (g - r).abs()[fin]
    if err.numel():
        worst = (err / s[fin]).max().item()
        assert worst <= tol, f"relative error {worst:.3g} > {tol}"


def _plant_ties(t: torch.Tensor, low: bool, where: list[int]) -> None:
    """Rows ``where`` of t (n, D) become equal and the smallest (low) or largest of all: exact ties that are
    the extremum, placed in different CPU lanes / CUDA tiles / j-splits."""
    where = [w for w in where if w < t.shape[0]]
    if where:
        t[where] = (t.min() - 1) if low else (t.max() + 1)


def _points(m: int, n: int, seed: int, dtype=torch.float64, device="cpu", d: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    # ties at the extremum of x - y (over j the max comes from the smallest y, the min from the largest), the
    # lowest index in a higher CPU lane (j % 16) than the others, so merging the lanes must keep it
    low, high = [3, 16, 17, 33, 600, 4000], [5, 18, 20, 256, 1100, 4001]
    _plant_ties(y, True, low)
    _plant_ties(y, False, high)
    _plant_ties(x, False, low)
    _plant_ties(x, True, high)
    return x.to(device, dtype), y.to(device, dtype)


NAMES = ["sum", "logsumexp", "max", "min", "argmax", "argmin", "max_argmax", "min_argmin"]
NAMES += ["Kmin", "argKmin", "Kmin_argKmin", "Kmax", "argKmax", "Kmax_argKmax"]
SPECS = [("j", {"dim": 1}), ("j", {"axis": -2}), ("i", {"dim": -3}), ("i", {"axis": 0})]
SHAPES = [(4, 17), (17, 33), (3, 5000), (5000, 3), (257, 513), (1030, 255)]


# ---------------------------------------------------------------- every reduction, float64


def test_outputs_are_poisoned_in_these_tests():
    """The kernels' outputs start as NaN / -1 here, so an output a kernel does not write cannot pass."""
    plan = Plan(Var("i", 2, slot=0), ("i",), (2,), semiring_reduction("max"), "i", True)
    call = CallArgs([], [], 2, 3, 4, torch.float64)
    vals, idx = new_outputs(plan, call, torch.device("cpu"))
    assert vals.shape == idx.shape == (2, 3, 2)
    assert torch.isnan(vals).all() and (idx == -1).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n"), SHAPES)
@pytest.mark.parametrize(("over", "spec"), SPECS, ids=lambda s: str(s))
@settings(max_examples=2, deadline=None)
@given(seed=SEEDS)
def test_every_reduction_of_a_vector_formula(device, backend, m, n, over, spec, seed):
    x, y = _points(m, n, seed, device=device)
    f = Vi(x) - Vj(y)  # exact in any dtype, so indices are comparable exactly
    dense = x[:, None, :] - y[None, :, :]
    k = 3
    for name in NAMES:
        got = _lazy_call(f, name, spec, k)
        ref = reference(name, dense, over, k)
        if isinstance(ref, tuple):
            assert isinstance(got, tuple) and len(got) == 2, name
            assert_same(got[0], ref[0], 1e-12, dtype=torch.float64)
            assert_same(got[1], ref[1], 0)
        else:
            scale = _inner_last(dense, over).abs().sum(-2) if name == "sum" else None
            assert_same(got, ref, 1e-12, scale=scale, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_positional_dim_axis_keyword_and_negative_dims_agree(device, backend):
    x, y = _points(20, 21, 0, device=device)
    f = Vi(x).sqdist(Vj(y))
    for a, b in [(f.sum(1), f.sum(axis=-2)), (f.sum(0), f.sum(dim=-3)), (f.max(1), f.max(axis=1))]:
        assert torch.equal(a, b)
    assert f.sum_reduction(1).shape == (20, 1) and f.logsumexp_reduction(axis=0).shape == (21, 1)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=3, deadline=None)
@given(m=st.sampled_from([1, 2, 16, 17]), n=st.sampled_from([1, 2, 15, 16, 33]), seed=SEEDS)
def test_one_best_of_tiny_sizes(device, backend, m, n, seed):
    x, y = _points(m, n, seed, device=device)
    f = Vi(x).sqdist(Vj(y))  # dimension 1: k-best results are (rows, K)
    dense = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1, keepdim=True)
    for over, dim in (("j", 1), ("i", 0)):
        for name in ("Kmin_argKmin", "Kmax_argKmax"):
            vals, idx = getattr(f, name)(1, dim=dim)
            rv, ri = reference(name, dense, over, 1)
            assert_same(vals, rv, 1e-12)
            assert_same(idx, ri, 0)
        assert_same(f.min(dim), reference("min", dense, over), 1e-12)


# ---------------------------------------------------------------- weighted logsumexp and @


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n"), [(5, 17), (3, 5000), (5000, 3), (257, 513)])
@settings(max_examples=2, deadline=None)
@given(seed=SEEDS)
def test_matmul_and_weighted_logsumexp(device, backend, m, n, seed):
    x, y = _points(m, n, seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    b = torch.randn(n, 2, generator=g, dtype=torch.float64).to(device)
    w = torch.rand(n, 2, generator=g, dtype=torch.float64).to(device) + 0.1
    dd = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)  # (M, N)
    kern = (-Vi(x).sqdist(Vj(y))).exp()
    terms = torch.exp(-dd)[..., None] * b[None]
    assert_same(kern @ b, torch.exp(-dd) @ b, 1e-12, scale=terms.abs().sum(1))
    # a batch of right-hand sides: (B, N, E) -> (B, M, E)
    bb = torch.randn(4, n, 3, generator=g, dtype=torch.float64).to(device)
    assert_same(
        kern @ bb, torch.exp(-dd) @ bb, 1e-12, scale=(torch.exp(-dd)[None, ..., None] * bb[:, None]).abs().sum(2)
    )
    # log sum_j exp(F_ij) w_j, over j and over i, with a formula as the weight too
    f = -Vi(x).sqdist(Vj(y))
    ref_j = torch.logsumexp(-dd[..., None] + w.log()[None], 1)
    assert_same(f.logsumexp(1, weight=Vj(w)), ref_j, 1e-12)
    assert_same(f.logsumexp(axis=-2, weight=Vj(w.log()).exp()), ref_j, 1e-12)
    v = torch.rand(m, 2, generator=g, dtype=torch.float64).to(device) + 0.1
    ref_i = torch.logsumexp(-dd[..., None] + v.log()[:, None], 0)
    assert_same(f.logsumexp(dim=0, weight=Vi(v)), ref_i, 1e-12)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=2, deadline=None)
@given(seed=SEEDS)
def test_weighted_logsumexp_with_negative_weights_is_nan_exactly_where_the_sum_is_negative(device, backend, seed):
    m, n = 40, 33
    x, y = _points(m, n, seed, device=device)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, 2, generator=g, dtype=torch.float64).to(device)
    dd = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    s = (torch.exp(-dd)[..., None] * w[None]).sum(1)  # (M, 2), both signs
    keep = s.abs() > 1e-6 * (torch.exp(-dd)[..., None] * w.abs()[None]).sum(1)  # not a numerical toss-up
    got = (-Vi(x).sqdist(Vj(y))).logsumexp(1, weight=Vj(w))
    assert got.shape == (m, 2)
    assert torch.equal(torch.isnan(got)[keep], (s < 0)[keep])
    pos = keep & (s > 0)
    torch.testing.assert_close(got[pos], s[pos].log(), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- batch dimensions


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n"), [(5, 17), (3, 700), (600, 4)])
@settings(max_examples=2, deadline=None)
@given(seed=SEEDS)
def test_batch_dimensions_broadcast(device, backend, m, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 1, m, 1, 3, generator=g, dtype=torch.float64).to(device)
    y = torch.randn(1, 3, 1, n, 3, generator=g, dtype=torch.float64).to(device)
    p = torch.randn(3, 1, 1, 3, generator=g, dtype=torch.float64).to(device)  # a batched parameter
    f = (LazyTensor(x) - LazyTensor(y)) * LazyTensor(p)
    dense = (x - y) * p[None]  # (2, 3, M, N, 3)
    assert f.shape == (2, 3, m, n, 3)
    torch.testing.assert_close(f.dense(), dense)
    for over, specs in (("j", [{"dim": -2}, {"dim": 3}, {"axis": 3}]), ("i", [{"dim": 2}, {"axis": -3}])):
        for spec in specs:
            assert_same(
                f.sum(**spec), reference("sum", dense, over), 1e-12, scale=_inner_last(dense, over).abs().sum(-2)
            )
            assert_same(f.logsumexp(**spec), reference("logsumexp", dense, over), 1e-12)
            vals, idx = f.min_argmin(**spec)
            rv, ri = reference("min_argmin", dense, over)
            assert_same(vals, rv, 1e-12)
            assert_same(idx, ri, 0)
        vals, idx = f.Kmax_argKmax(2, **specs[0])
        rv, ri = reference("Kmax_argKmax", dense, over, 2)
        assert vals.shape == (2, 3, m if over == "j" else n, 2, 3)
        assert_same(vals, rv, 1e-12)
        assert_same(idx, ri, 0)
    # a scalar batched formula @ a batched right-hand side (3, N, E)
    s = f.sum(-1)
    b = torch.randn(3, n, 2, generator=g, dtype=torch.float64).to(device)
    ds = dense.sum(-1)
    assert_same(s @ b, ds @ b, 1e-12, scale=ds.abs() @ b.abs())
    # a weighted logsumexp in the batch
    w = torch.rand(3, n, 1, generator=g, dtype=torch.float64).to(device) + 0.1
    assert_same(s.logsumexp(-2, weight=Vj(w)), torch.logsumexp(ds + w.log().transpose(-1, -2), -1)[..., None], 1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_dimension(device, backend):
    x = torch.randn(0, 4, 1, 2, dtype=torch.float64, device=device)
    y = torch.randn(1, 1, 5, 2, dtype=torch.float64, device=device)
    f = LazyTensor(x) - LazyTensor(y)
    assert f.sum(-2).shape == (0, 4, 2)
    assert f.Kmin(2, dim=-2).shape == (0, 4, 2, 2)
    assert f.argmax(dim=-3).shape == (0, 5, 2)


# ---------------------------------------------------------------- empty M and N


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("over", ["j", "i"])
def test_an_empty_output_axis_gives_empty_results(device, backend, over):
    x, y = _points(0, 9, 0, device=device) if over == "j" else _points(9, 0, 0, device=device)
    f = Vi(x) - Vj(y)
    dim = 1 if over == "j" else 0
    assert f.sum(dim).shape == (0, 3)
    assert f.logsumexp(dim).shape == (0, 3)
    assert f.max(dim).shape == (0, 3)
    vals, idx = f.min_argmin(dim)
    assert vals.shape == idx.shape == (0, 3) and idx.dtype == torch.int64
    assert f.Kmin(2, dim).shape == (0, 2, 3)
    assert (f.sum(-1) @ torch.randn(y.shape[0], 2, dtype=torch.float64, device=device)).shape == (x.shape[0], 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("over", ["j", "i"])
def test_an_empty_reduced_axis_gives_the_semiring_zero(device, backend, over):
    x, y = _points(7, 0, 0, device=device) if over == "j" else _points(0, 7, 0, device=device)
    f = Vi(x) - Vj(y)
    dim = 1 if over == "j" else 0
    assert torch.equal(f.sum(dim).cpu(), torch.zeros(7, 3, dtype=torch.float64))
    assert torch.equal(f.logsumexp(dim).cpu(), torch.full((7, 3), -INF, dtype=torch.float64))
    ones = torch.ones(0, 2, dtype=torch.float64, device=device)
    w = Vj(ones) if over == "j" else Vi(ones)
    assert torch.equal(f.sum(-1).logsumexp(dim, weight=w).cpu(), torch.full((7, 2), -INF, dtype=torch.float64))
    if over == "j":
        assert torch.equal((f.sum(-1) @ y[:, :2]).cpu(), torch.zeros(7, 2, dtype=torch.float64))
    # max / min: the semiring zero, and index 0 (the reducers' initial state), on every backend
    zeros = torch.zeros(7, 3, dtype=torch.int64)
    for name, inf in (("max", -INF), ("min", INF)):
        fill = torch.full((7, 3), inf, dtype=torch.float64)
        assert torch.equal(getattr(f, name)(dim).cpu(), fill)
        assert torch.equal(getattr(f, "arg" + name)(dim).cpu(), zeros)
        vals, idx = getattr(f, f"{name}_arg{name}")(dim)
        assert torch.equal(vals.cpu(), fill) and torch.equal(idx.cpu(), zeros)
    # K best of nothing: refused, naming K and the size of the axis
    for name in ("Kmin", "argKmin", "Kmax_argKmax"):
        with pytest.raises(
            ValueError,
            match=rf"K=1 must be between 1 and the reduced size 0 \(over {over}\); the reduced axis is empty",
        ):
            getattr(f, name)(1, dim)


@pytest.mark.parametrize("over", ["j", "i"])
def test_max_and_min_over_an_empty_axis_give_minus_and_plus_infinity(backend, over):
    x, y = _points(7, 0, 0) if over == "j" else _points(0, 7, 0)
    f = Vi(x) - Vj(y)
    dim = 1 if over == "j" else 0
    assert torch.equal(f.max(dim), torch.full((7, 3), -INF, dtype=torch.float64))
    assert torch.equal(f.min(dim), torch.full((7, 3), INF, dtype=torch.float64))
    assert f.sum(-1).max(dim).shape == (7, 1)  # scalar formula
    batched = LazyTensor(x.expand(2, *x.shape)[:, :, None, :]) - LazyTensor(y[None, None, :, :])
    vals, idx = batched.max_argmax(dim + 1)
    assert torch.equal(vals, torch.full((2, 7, 3), -INF, dtype=torch.float64))
    assert torch.equal(idx, torch.zeros(2, 7, 3, dtype=torch.int64))


# ---------------------------------------------------------------- infinities and NaN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [5, 40, 1030])
def test_infinite_terms(device, backend, n):
    """Rows of -inf only (logsumexp, max and sum -inf, never NaN), rows with some -inf terms, +inf terms."""
    g = torch.Generator().manual_seed(n)
    a = torch.randn(6, 2, generator=g, dtype=torch.float64)
    a[0, 0] = -INF  # row 0, component 0: every term -inf
    a[1, 0] = INF  # row 1, component 0: every term +inf but one NaN (+inf - inf), so NaN
    b = torch.randn(n, 2, generator=g, dtype=torch.float64)
    b[n // 2, :] = -INF  # column n // 2: -inf terms in every row
    b[n - 1, 1] = INF  # component 1 of column n - 1: +inf terms (logsumexp, max: +inf; sum: NaN with the -inf)
    a, b = a.to(device), b.to(device)
    f = Vi(a) + Vj(b)
    dense = a[:, None, :] + b[None, :, :]
    for over, dim in (("j", 1), ("i", 0)):
        for name in ("logsumexp", "max", "min", "sum"):
            assert_same(getattr(f, name)(dim), reference(name, dense, over), 1e-12)
        vals, idx = f.max_argmax(dim)
        rv, ri = reference("max_argmax", dense, over)
        assert_same(vals, rv, 1e-12)
        assert_same(idx, ri, 0)
        vals, idx = f.Kmin_argKmin(3, dim)
        rv, ri = reference("Kmin_argKmin", dense, over, 3)
        assert_same(vals, rv, 1e-12)
        assert_same(idx, ri, 0)
    # the all -inf row: -inf exactly, not NaN
    assert f.logsumexp(1)[0, 0].item() == f.max(1)[0, 0].item() == f.sum(1)[0, 0].item() == -INF
    assert f.logsumexp(1)[2, 1].item() == INF


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [6, 40, 1030])
def test_nan_propagates_to_exactly_the_affected_outputs(device, backend, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(21, 3, generator=g, dtype=torch.float64)
    y = torch.randn(n, 3, generator=g, dtype=torch.float64)
    x[2, 1] = NAN  # row 2, component 1
    y[3, 0] = NAN  # column 3, component 0
    y[n - 2, 0] = NAN  # a second NaN in component 0 (the first one must be the argmax)
    x, y = x.to(device), y.to(device)
    f = Vi(x) - Vj(y)
    dense = x[:, None, :] - y[None, :, :]
    for over, dim in (("j", 1), ("i", 0)):
        for name in ("sum", "logsumexp", "max", "min"):
            ref = reference(name, dense, over)
            assert torch.isnan(ref).any() and not torch.isnan(ref).all()
            assert_same(
                getattr(f, name)(dim), ref, 1e-12, scale=_inner_last(dense, over).nan_to_num().abs().sum(-2) + 1
            )
        for name in ("max_argmax", "min_argmin", "Kmin_argKmin", "Kmax_argKmax"):
            got = _lazy_call(f, name, {"dim": dim}, 2)
            ref = reference(name, dense, over, 2)
            assert_same(got[0], ref[0], 1e-12)
            assert_same(got[1], ref[1], 0)


# ---------------------------------------------------------------- reduced precision inputs

TOL = {torch.float32: 2e-6, torch.float16: 1.5e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("m", "n"), [(17, 33), (3, 5000), (1030, 255)])
@settings(max_examples=2, deadline=None)
@given(seed=SEEDS)
def test_reduced_precision_inputs_against_float64(device, backend, dtype, m, n, seed):
    """16-bit inputs are computed in float32 and returned in their dtype: values against float64 of the
    rounded inputs; max / min and the indices exactly as torch computes them in float32."""
    x, y = _points(m, n, seed, dtype=dtype, device=device)
    f = Vi(x) - Vj(y)
    d64 = x.double()[:, None, :] - y.double()[None, :, :]
    d32 = x.float()[:, None, :] - y.float()[None, :, :]  # the kernels' compute dtype, the same roundings
    tol = TOL[dtype]
    for over, dim in (("j", 1), ("i", 0)):
        inner = _inner_last(d64, over)
        assert_same(f.sum(dim), reference("sum", d64, over), tol, scale=inner.abs().sum(-2), dtype=dtype)
        assert_same(f.logsumexp(dim), reference("logsumexp", d64, over), tol, dtype=dtype)
        for name in ("max_argmax", "min_argmin", "Kmin_argKmin", "Kmax_argKmax"):
            vals, idx = _lazy_call(f, name, {"dim": dim}, 3)
            rv, ri = reference(name, d32, over, 3)
            assert vals.dtype == dtype
            assert torch.equal(vals.cpu(), rv.to(dtype).cpu()), name
            assert_same(idx, ri, 0)
        # a scalar formula through exp: the float32 exp is 2^(x log2 e), relative error ~1e-7 |x|
        k = (-Vi(x).sqdist(Vj(y)) / 4).exp()
        dd = ((x.double()[:, None, :] - y.double()[None, :, :]) ** 2).sum(-1, keepdim=True)
        assert_same(k.sum(dim), reference("sum", torch.exp(-dd / 4), over), 4 * tol, scale=None, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("large", [False, True], ids=["vectorised", "scalar-loop"])
def test_float32_sums_over_a_million_terms_are_block_sums(device, compiled, large, monkeypatch):
    """KeOps' default sum_scheme, block_sum: a float32 sum of 2^20 positive terms (KeOps' plot_multi_gpu kernel)
    within 2e-6 of the float64 sum, where one running float32 sum per lane or thread drifts by ~1e-5 to 1e-4;
    the scalar j loop of large formulas (codegen.CPU_SCALAR_NODES forced to 0) flushes its blocks too."""
    from semiring_ops.lazy import codegen

    if large:
        monkeypatch.setattr(codegen, "CPU_SCALAR_NODES", 0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, generator=gen) * 0.1
    y = torch.randn(1 << 20, 3, generator=gen)
    got = (-Vi(x.to(device)).sqdist(Vj(y.to(device)))).exp().sum(1).cpu().double()
    want = torch.exp(-torch.cdist(x.double(), y.double()).square()).sum(1, keepdim=True)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)
