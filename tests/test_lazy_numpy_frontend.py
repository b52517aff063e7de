"""The NumPy front end (semiring_ops.lazy.numpy) against KeOps's ``pykeops.numpy`` interface.

What pykeops.numpy shows of a LazyTensor (dtype, shape, _shape, ndim, dim(), backend) and what its reductions
return (NumPy arrays: values in the inputs' dtype, indices int64, KeOps's shapes), checked against float64
NumPy brute force; scipy.sparse.linalg on ``aslinearoperator(K)``; solve with arrays; block-sparse ``ranges``
of arrays; the NumPy cluster helpers. test_attributes_match_pykeops compares the attributes with pykeops.numpy
itself (in a subprocess, nothing compiled); test_reductions_match_pykeops (slow: pykeops compiles each
reduction, ~25 s apiece on 2 cores) compares the reductions' values, shapes and dtypes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from semiring_ops.lazy import dispatch as lazy_dispatch
from semiring_ops.lazy.numpy import LazyTensor, Pm, Vi, Vj
from semiring_ops.lazy.numpy.cluster import (
    cluster_centroids,
    cluster_ranges,
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
    swap_axes,
)

scipy_linalg = pytest.importorskip("scipy.sparse.linalg")

DTYPES = ["float32", "float64"]
RTOL = {"float32": 2e-5, "float64": 1e-12}
HAS_PYKEOPS = importlib.util.find_spec("pykeops") is not None


def _data(dtype: str, m: int = 7, n: int = 5, d: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((m, d)).astype(dtype), rng.random((n, d)).astype(dtype), rng.standard_normal((n, 3)).astype(dtype)


def _gauss(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """exp(-|x_i - y_j|^2) in float64: (M, N)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return np.exp(-((x[:, None] - y[None]) ** 2).sum(-1))


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype), (type(got), getattr(got, "dtype", None))
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_shape_ndim_backend(dtype):
    x, y, _ = _data(dtype)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    assert K.dtype == np.dtype(dtype) and K.dtype == dtype and K.dtype == getattr(np, dtype)
    assert K.shape == (7, 5) and K._shape == (7, 5, 1) and K.ndim == 1 and K.dim() == 3 and K.nbatchdims == 0
    V = Vi(x) - Vj(y)  # vector dimension 2: shape keeps it
    assert V.shape == V._shape == (7, 5, 2) and V.ndim == 2
    assert K.T.shape == (5, 7) and Vi(x).shape == (7, 1, 2) and Vj(y).shape == (1, 5, 2)
    assert Pm(2.0).dtype is None and Pm(2.0).shape == (1, 1) and (Pm(2.0) * Vi(x)).dtype == dtype
    assert LazyTensor(np.float32(2.0)).dtype is None and Pm([1.0, 2.0]).shape == (1, 1, 2)
    B = LazyTensor(x.reshape(1, 7, 1, 2)) - LazyTensor(np.stack([y, y + 1])[:, None])  # batch (2,)
    assert B.shape == (2, 7, 5, 2) and B.nbatchdims == 1 and B.dim() == 4
    assert K.backend is None
    K.backend = "CPU"
    assert (2 * K).backend == (K * Vj(y[:, :1])).backend == K.T.backend == "CPU"  # results keep it, as KeOps's
    assert (Vj(y[:, :1]) * K).backend == "CPU"  # from either operand
    G = (-Vi(x).sqdist(Vj(y))).exp()
    G.backend = "auto"
    with pytest.raises(ValueError, match="different backend"):
        K + G
    _close(K.sum(1), _gauss(x, y).sum(1, keepdims=True), dtype)  # reduced with backend="CPU"
    with pytest.raises(ValueError, match="backend"):
        K.backend = "TPU"
    assert "shape (7, 5)" in repr(K) and dtype in repr(K)


@pytest.mark.parametrize(
    ("dtype", "kind"),
    [
        *((dtype, "torch") for dtype in DTYPES),
        *(pytest.param(d, "compiled", marks=pytest.mark.extended) for d in DTYPES),
    ],
)
def test_reductions_return_arrays_of_keops_shapes(dtype, kind, monkeypatch):
    """Every reduction, on the PyTorch fallback; on the compiled kernels too, slow (about 20 kernels of each dtype
    to compile: CI's budget; the front end is the same on both, and test_lazy_reductions compares the two)."""
    monkeypatch.setattr(lazy_dispatch, "_choice", {"cpu": (kind, "test"), "cuda": (kind, "test")})
    x, y, b = _data(dtype)
    D = Vi(x).sqdist(Vj(y))
    d = ((x.astype(np.float64)[:, None] - y.astype(np.float64)[None]) ** 2).sum(-1)  # (M, N)
    for axis, dd in ((1, d), (0, d.T)):
        _close(D.sum(axis=axis), dd.sum(1, keepdims=True), dtype)
        _close(D.logsumexp(axis), np.log(np.exp(dd).sum(1, keepdims=True)), dtype)
        _close(D.min(axis=axis), dd.min(1, keepdims=True), dtype)
        _close(D.max(dim=axis), dd.max(1, keepdims=True), dtype)
        for got in (D.argmin(axis=axis), D.min_argmin(axis=axis)[1], D.argKmin(1, axis=axis)):
            assert got.dtype == np.int64 and got.shape == (len(dd), 1)
            np.testing.assert_array_equal(got[:, 0], dd.argmin(1))
        np.testing.assert_array_equal(D.argmax(axis=axis)[:, 0], dd.argmax(1))
        order = np.argsort(dd, 1, kind="stable")
        values, indices = D.Kmin_argKmin(3, axis=axis)
        _close(values, np.take_along_axis(dd, order, 1)[:, :3], dtype)
        assert indices.dtype == np.int64 and indices.shape == (len(dd), 3)
        np.testing.assert_array_equal(indices, order[:, :3])
        _close(D.Kmin(2, axis=axis), np.take_along_axis(dd, order, 1)[:, :2], dtype)
        _close(D.Kmax(2, axis=axis), -np.sort(-dd, 1)[:, :2], dtype)
    values, indices = D.max_argmax(axis=1)
    _close(values, d.max(1, keepdims=True), dtype)
    assert indices.dtype == np.int64
    K = (-D).exp()
    _close(K @ b, _gauss(x, y) @ b, dtype)  # (M, E)
    _close(K @ b[:, 0], _gauss(x, y) @ b[:, 0], dtype)  # (N,) -> (M,)
    _close(K.T @ np.ascontiguousarray(x), _gauss(x, y).T @ x, dtype)
    soft = np.exp(-d - (-d).max(1, keepdims=True))
    _close(LazyTensor.sumsoftmaxweight(-D, Vj(b), axis=1), soft @ b / soft.sum(1, keepdims=True), dtype)
    out = np.empty((7, 3), dtype=dtype)
    assert K.__matmul__(b, out=out) is out
    _close(out, _gauss(x, y) @ b, dtype)
    # no axis: sum / min / max reduce the vector dimension, to a LazyTensor (KeOps's default axis=-1)
    S = LazyTensor.sum(Vi(x) - Vj(y))
    assert isinstance(S, LazyTensor) and S.shape == (7, 5)
    _close(S.sum(1), (x.astype(np.float64)[:, None] - y[None]).sum(-1).sum(1, keepdims=True), dtype)
    assert isinstance((Vi(x) - Vj(y)).max(), LazyTensor)
    assert isinstance(K.dense(), np.ndarray) and K.dense().shape == (7, 5, 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scipy_linear_operator(dtype):
    rng = np.random.default_rng(1)
    x = rng.random((40, 2)).astype(dtype)
    K = (-Vi(x).sqdist(Vj(x)) * 4).exp()
    dense = _gauss(2 * x, 2 * x)
    A = scipy_linalg.aslinearoperator(K)
    assert A.shape == (40, 40) and A.dtype == np.dtype(dtype)
    v = rng.standard_normal(40).astype(dtype)
    _close(A.matvec(v), dense @ v, dtype)
    _close(A @ v[:, None], dense @ v[:, None], dtype)
    _close(A.matmat(np.stack([v, 2 * v], 1)), dense @ np.stack([v, 2 * v], 1), dtype)
    rtol = 1e-4 if dtype == "float32" else 1e-9
    values = scipy_linalg.eigsh(A, k=3, which="LM")[0]
    np.testing.assert_allclose(np.sort(values), np.linalg.eigvalsh(dense)[-3:], rtol=rtol)
    M = scipy_linalg.aslinearoperator(np.eye(40, dtype=dtype) * 0.5) + A
    b = rng.standard_normal(40).astype(dtype)
    got, info = scipy_linalg.cg(M, b, rtol=1e-10 if dtype == "float64" else 1e-6, atol=0.0)
    assert info == 0
    np.testing.assert_allclose(got, np.linalg.solve(dense + 0.5 * np.eye(40), b), rtol=100 * rtol, atol=100 * rtol)
    # rmatvec: the transpose of a rectangular K
    y = rng.random((30, 2)).astype(dtype)
    R = scipy_linalg.aslinearoperator((-Vi(x).sqdist(Vj(y))).exp())
    assert R.shape == (40, 30)
    _close(R.rmatvec(v), _gauss(x, y).T @ v, dtype)
    with pytest.raises(TypeError, match=r"is float64.*float32|is float32.*float64"):
        K @ v.astype("float64" if dtype == "float32" else "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_takes_arrays(dtype):
    rng = np.random.default_rng(2)
    x, b = rng.random((30, 2)).astype(dtype), rng.standard_normal((30, 2)).astype(dtype)
    K = (-Vi(x).sqdist(Vj(x)) * 10).exp()
    want = np.linalg.solve(_gauss(np.sqrt(10) * x, np.sqrt(10) * x) + 0.5 * np.eye(30), b.astype(np.float64))
    eps = 1e-6 if dtype == "float32" else 1e-12
    rtol = 1e-4 if dtype == "float32" else 1e-9
    for got in (K.solve(b, alpha=0.5, eps=eps), K.solve(Vi(b), alpha=0.5, eps=eps)):
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype) and got.shape == (30, 2)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    column = K.solve(b[:, 0], alpha=0.5, eps=eps)
    assert column.shape == (30,)
    np.testing.assert_allclose(column, want[:, 0], rtol=rtol, atol=rtol)
    out = np.empty((30, 2), dtype=dtype)
    assert K.solve(b, alpha=0.5, eps=eps, out=out) is out


def test_block_sparse_ranges_of_arrays():
    rng = np.random.default_rng(3)
    x, y, b = rng.random((60, 2)), rng.random((50, 2)), rng.standard_normal((50, 1))
    x_lab, y_lab = grid_cluster(x, 0.3), grid_cluster(y, 0.3)
    x_ranges, x_c, _ = cluster_ranges_centroids(x, x_lab)
    y_ranges, y_c, _ = cluster_ranges_centroids(y, y_lab)
    x, x_lab = sort_clusters(x, x_lab)
    y, y_lab = sort_clusters(y, y_lab)
    keep = ((x_c[:, None] - y_c[None]) ** 2).sum(-1) < 0.3**2
    ranges = from_matrix(x_ranges, y_ranges, keep)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    K.ranges = ranges
    assert all(isinstance(r, np.ndarray) and r.dtype == np.int64 for r in K.ranges)
    mask = keep[x_lab][:, y_lab]  # pairs of points in kept pairs of clusters
    dense = _gauss(x, y) * mask
    np.testing.assert_allclose(K @ b, dense @ b, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(K.sum(0), dense.sum(0)[:, None], rtol=1e-12, atol=1e-15)  # over i: ranges[3:6]
    np.testing.assert_allclose(K.T @ x, dense.T @ x, rtol=1e-12, atol=1e-15)  # .T swaps the halves
    # operations keep the ranges (KeOps's rule): K * b_j, its sum over j, its vector sum
    np.testing.assert_allclose((K * Vj(b)).sum(1), dense @ b, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose((K * Vj(b)).sum().sum(1), dense @ b, rtol=1e-12, atol=1e-15)
    other = (-Vi(x).sqdist(Vj(y))).exp()
    other.ranges = tuple(r.copy() for r in ranges)  # equal arrays: no conflict
    np.testing.assert_allclose((K + other).sum(1), 2 * dense.sum(1)[:, None], rtol=1e-12, atol=1e-15)
    other.ranges = from_matrix(x_ranges, y_ranges, ~keep)
    with pytest.raises(ValueError, match="different ranges"):
        K + other
    K.ranges = None
    np.testing.assert_allclose(K @ b, _gauss(x, y) @ b, rtol=1e-12)
    np.testing.assert_allclose(K.sum(1, ranges=ranges), dense.sum(1)[:, None], rtol=1e-12, atol=1e-15)
    assert [r.shape for r in swap_axes(ranges)] == [r.shape for r in (*ranges[3:], *ranges[:3])]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cluster_helpers_match_keops_numpy(dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((200, 2)) + 0.3).astype(dtype)
    labels = grid_cluster(x, 0.25)
    cells = np.floor(x / 0.25)  # KeOps's NumPy grid: cells anchored at 0, numbered lexicographically
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, np.unique(cells, axis=0, return_inverse=True)[1].reshape(-1))
    ranges, centroids, weights = cluster_ranges_centroids(x, labels)
    counts = np.bincount(labels)
    assert ranges.dtype == np.int64 and centroids.dtype == np.dtype(dtype) and weights.dtype == np.float64
    np.testing.assert_array_equal(ranges, np.stack([np.cumsum(counts) - counts, np.cumsum(counts)], 1))
    want = np.stack([np.bincount(labels, weights=x[:, k]) / counts for k in range(2)], 1).astype(dtype)
    np.testing.assert_array_equal(centroids, want)  # float64 sums rounded once, as NumPy's bincount
    np.testing.assert_array_equal(weights, counts)
    w = rng.random(200)
    w[0] = 0.0  # not clamped (KeOps's NumPy helper takes no min_weight)
    _, wc, wt = cluster_ranges_centroids(x, labels, weights=w)
    np.testing.assert_array_equal(wt, np.bincount(labels, weights=w))
    want = np.stack([np.bincount(labels, weights=x[:, k] * w) / wt for k in range(2)], 1).astype(dtype)
    np.testing.assert_array_equal(wc, want)
    np.testing.assert_array_equal(cluster_centroids(x, labels), centroids)
    np.testing.assert_array_equal(cluster_ranges(labels), ranges)
    (xs, ws), lab_sorted = sort_clusters((x, w), labels)
    order = np.argsort(labels)  # KeOps's NumPy order (not stable): later draws meet the rows in this order
    np.testing.assert_array_equal(xs, x[order])
    np.testing.assert_array_equal(ws, w[order])
    assert sorted(ws.tolist()) == sorted(w.tolist())
    assert np.all(np.diff(lab_sorted) >= 0) and lab_sorted.dtype == labels.dtype
    for k in range(len(counts)):  # each cluster holds its points (in some order)
        a, e = ranges[k]
        assert sorted(map(tuple, xs[a:e].tolist())) == sorted(map(tuple, x[labels == k].tolist()))
    ranges_i = np.array([[2, 5], [7, 12]])
    ranges_j = np.array([[1, 4], [4, 9], [20, 30]])
    got = from_matrix(ranges_i, ranges_j, np.array([[True, True, False], [False, True, False]]))
    assert all(r.dtype == np.int64 for r in got)  # KeOps's docstring example
    wanted = ([[2, 5], [7, 12]], [2, 3], [[1, 4], [4, 9], [4, 9]], ranges_j, [1, 3, 3], [[2, 5], [2, 5], [7, 12]])
    for r, want in zip(got, wanted, strict=True):
        np.testing.assert_array_equal(r, want)


def test_symbolic_variables_and_call_false_take_arrays():
    x, y, b = _data("float64")
    f = ((-Vi(0, 2).sqdist(Vj(1, 2))).exp() * Vj(2, 3)).sum(axis=1)  # KeOps's callable LazyTensor
    assert f.symbolic_variables == ((0, 2, 0), (1, 2, 1), (2, 3, 1)) and f.nargs == 3
    got = f(x, y, b)
    assert isinstance(got, np.ndarray) and got.shape == (7, 3)
    np.testing.assert_allclose(got, _gauss(x, y) @ b, rtol=1e-12)
    assert LazyTensor((0, 2, 0)).dtype is None and LazyTensor((0, 2, 0))._shape == (1, 1, 2)
    g = (Vi(x) * Vj(y)).sum(axis=1, call=False)
    assert all(isinstance(v, np.ndarray) for v in g.variables)
    np.testing.assert_allclose(g(), (x[:, None] * y[None]).sum(1), rtol=1e-12)
    K = (-Vi(x).sqdist(Vj(x)) * 10).exp()
    solve = K.solve(Vi(0, 3), alpha=0.5, eps=1e-12)
    rhs = np.random.default_rng(5).standard_normal((7, 3))
    np.testing.assert_allclose(
        solve(rhs), np.linalg.solve(_gauss(np.sqrt(10) * x, np.sqrt(10) * x) + 0.5 * np.eye(7), rhs)
    )


def test_arrays_are_shared_and_bad_input_is_named():
    x, y, b = _data("float64")
    K = (-Vi(x).sqdist(Vj(y))).exp()
    before = K @ b
    y += 1.0  # the LazyTensor reads the array itself, as KeOps's
    np.testing.assert_allclose(K @ b, _gauss(x, y) @ b, rtol=1e-12)
    assert not np.allclose(before, K @ b)
    read_only = np.broadcast_to(x[:1], (4, 2))  # no copy, no warning
    np.testing.assert_allclose(Vi(read_only).sqdist(Vj(y)).sum(1)[:, 0], ((x[0] - y) ** 2).sum())
    with pytest.raises(TypeError, match=r"NumPy arrays.*torch Tensor"):
        Vi(torch.zeros(3, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch Tensor"):
        K * torch.ones(1, dtype=torch.float64)
    with pytest.raises(TypeError, match="right operand must be a NumPy array"):
        K @ [1.0] * 5
    assert LazyTensor(x[:, None], is_complex=True).is_complex and not LazyTensor(x[:, None]).is_complex
    with pytest.raises(TypeError, match="ranges"):
        K.ranges = (np.zeros((1, 2), dtype=np.int64),)
    with pytest.raises(TypeError, match="list makes a parameter vector of numbers"):
        Pm(["a"])
    with pytest.raises(TypeError, match="grid_cluster: x must be an"):
        grid_cluster(np.arange(4), 1.0)


_PYKEOPS_ATTRIBUTES = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from {module} import LazyTensor, Pm, Vi, Vj

    out = {{}}
    for dtype in ("float32", "float64"):
        x, y = np.ones((7, 2), dtype), np.ones((5, 2), dtype)
        K = (-Vi(x).sqdist(Vj(y))).exp()
        lazies = {{"K": K, "V": Vi(x) - Vj(y), "KT": K.T, "P": Pm(2.0), "PK": Pm(2.0) * K, "L": LazyTensor([1.0, 2.0]),
                  "B": LazyTensor(np.ones((2, 7, 1, 2), dtype)) - LazyTensor(np.ones((1, 5, 2), dtype))}}
        for name, lazy in lazies.items():
            out[dtype + name] = [None if lazy.dtype is None else str(lazy.dtype), list(lazy.shape), list(lazy._shape),
                                 lazy.ndim, lazy.dim(), lazy.nbatchdims, lazy.backend]
    print(json.dumps(out))
    """
)


def _attributes(module: str, in_process: bool = False) -> dict:
    """The attributes _PYKEOPS_ATTRIBUTES lists, of LazyTensors of ``module`` (pykeops: in a subprocess, CUDA hidden,
    so that its import compiles nothing)."""
    code = _PYKEOPS_ATTRIBUTES.format(module=module)
    if in_process:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, {})
        return json.loads(printed.getvalue())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not HAS_PYKEOPS, reason="pykeops is not installed")
def test_attributes_match_pykeops():
    assert _attributes("semiring_ops.lazy.numpy", in_process=True) == _attributes("pykeops.numpy")


_PYKEOPS_REDUCTIONS = textwrap.dedent(
    """
    import sys
    import numpy as np
    from {module} import LazyTensor, Vi, Vj

    rng = np.random.default_rng(0)
    results = {{}}
    for dtype in ("float32", "float64"):
        x, y, b = rng.random((9, 2)).astype(dtype), rng.random((6, 2)).astype(dtype), rng.random((6, 2)).astype(dtype)
        D = Vi(x).sqdist(Vj(y))
        K = (-D).exp()
        got = {{"sum": D.sum(1), "lse": D.logsumexp(0), "min": D.min(1), "argmin": D.argmin(0), "argmax": D.argmax(1),
               "Kmin": D.Kmin(2, axis=1), "argKmin": D.argKmin(3, axis=0), "mm": K @ b, "mv": K @ b[:, 0],
               "rmv": K.rmatvec(np.ones(9, dtype)), "ssw": (-D).sumsoftmaxweight(Vj(b), axis=1),
               "solve": (-Vi(x).sqdist(Vj(x))).exp().solve(x, alpha=0.5)}}
        got["minargmin0"], got["minargmin1"] = D.min_argmin(axis=1)
        got["KminargKmin0"], got["KminargKmin1"] = D.Kmin_argKmin(2, axis=0)
        for name, value in got.items():
            results[dtype + name] = value
    np.savez(sys.argv[1], **results)
    """
)


@pytest.mark.extended
@pytest.mark.skipif(not HAS_PYKEOPS, reason="pykeops is not installed")
def test_reductions_match_pykeops(tmp_path):
    found = {}
    for module in ("semiring_ops.lazy.numpy", "pykeops.numpy"):
        path = tmp_path / f"{module}.npz"
        code = _PYKEOPS_REDUCTIONS.format(module=module)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        command = [sys.executable, "-c", code, str(path)]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[module] = dict(np.load(path))
    ours, theirs = found["semiring_ops.lazy.numpy"], found["pykeops.numpy"]
    assert sorted(ours) == sorted(theirs)
    for name, want in theirs.items():
        got = ours[name]
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.dtype, want.shape)
        tol = 1e-5 if "float32" in name else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
