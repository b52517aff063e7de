"""Wide sums on CUDA in chunks of components (semiring_ops/lazy/wide_chunks.py): sums of more than
formula.WIDE_COMPONENTS components that are not inner products (an L1 distance, weighted, exponentials of
differences), a tile of j at a time.

The layout and the generated source are checked everywhere (which variables are staged by chunks, the shared
memory it takes, a source that does not grow with D); on a GPU, every reduction kind against float64 torch on the
dense matrix at sizes that straddle the tiles and the chunks (hypothesis), misaligned rows (the scalar loads),
batches, block-sparse ranges, two sums of different widths, a variable read inside and outside its sum, and the
gradients (gradcheck in float64).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import HAS_CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import Pm, Vi, Vj
from semiring_ops.lazy.cluster import from_matrix
from semiring_ops.lazy.codegen import chunk_layout, cpu_source, cuda_config, cuda_source, cuda_tile, inner_layout
from semiring_ops.lazy.formula import canonicalize
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import kbest, semiring_reduction
from semiring_ops.lazy.wide_chunks import WIDE_CHUNK, WIDE_TILE

F64 = torch.float64
cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")


def _plan(formula, reduction=None) -> Plan:
    canon, tv = canonicalize(formula.formula)
    reduction = reduction or semiring_reduction("std")
    return Plan(canon, tuple(v.cat for v in tv), tuple(v.dim for v in tv), reduction, "i", False)


def _l1(d: int):
    return (Vi(torch.randn(5, d)) - Vj(torch.randn(6, d))).abs().sum(-1)


def _shared_bytes(plan: Plan, dtype_name: str) -> int:
    """The static shared memory of the plan's CUDA kernel, from its layout (tile, chunks, running sums)."""
    cfg = cuda_config(plan, dtype_name)
    tile = cuda_tile(plan, dtype_name, cfg)
    _, stride = inner_layout(plan, dtype_name)
    layout = chunk_layout(plan)
    size = 8 if dtype_name == "float64" else 4
    sums = len(layout.terms) * tile * cfg.rows * cfg.block if layout else 0
    chunks = len(layout.chunked) * tile * WIDE_CHUNK if layout else 0
    return size * (tile * stride + chunks + sums)


def test_layout_stages_variables_read_only_by_the_sums_in_chunks():
    narrow = _plan(_l1(64))
    assert chunk_layout(narrow) is None  # up to WIDE_COMPONENTS: the unrolled cell, unchanged
    l1 = _plan(_l1(100))
    layout = chunk_layout(l1)
    assert layout is not None and len(layout.terms) == 1 and layout.terms[0].dim == 100
    inner = [k for k in range(len(l1.arg_cats)) if l1.role(k) == "inner"]
    assert layout.chunked == tuple(inner)
    assert inner_layout(l1, "float32")[0] == {}  # nothing else staged whole
    # the CPU: a pass over a tile of rows (codegen._cpu_tiled_rows) for the same plans, the narrow one unchanged
    assert "wbuf" in cpu_source(l1, "float32") and "wbuf" not in cpu_source(narrow, "float32")
    # y_j also read outside its sum (the gradient's shape): staged whole, the tile shrinks to fit 48 KiB
    x, y = Vi(torch.randn(5, 700)), Vj(torch.randn(6, 700))
    both = _plan((x - y).abs().sum(-1).exp() * y)
    assert chunk_layout(both).chunked == ()
    for dtype_name in ("float32", "float64"):
        assert _shared_bytes(both, dtype_name) <= 48 * 1024
        assert cuda_tile(both, dtype_name, cuda_config(both, dtype_name)) >= 1


def test_shared_memory_fits_with_several_sums_and_float64():
    x1, y1 = Vi(torch.randn(5, 300)), Vj(torch.randn(6, 300))
    x2, y2 = Vi(torch.randn(5, 97)), Vj(torch.randn(6, 97))
    w = Pm(torch.rand(300))
    f = (x1 - y1).abs().sum(-1) + ((x1 - y1).exp() * w).sum(-1) + (x2 - y2).abs().sum(-1).sqrt()
    for reduction in (semiring_reduction("std"), semiring_reduction("log"), kbest(5, False)):
        plan = _plan(f, reduction)
        assert len(chunk_layout(plan).terms) == 3
        for dtype_name in ("float32", "float64"):
            assert _shared_bytes(plan, dtype_name) <= 48 * 1024, (reduction, dtype_name)
            assert cuda_tile(plan, dtype_name, cuda_config(plan, dtype_name)) <= WIDE_TILE


def test_source_is_a_loop_over_chunks_whatever_d():
    small, large = (cuda_source(p, "float32", cuda_config(p, "float32")) for p in (_plan(_l1(128)), _plan(_l1(4096))))
    assert "for (int d0 = 0; d0 < 128; d0 += 16)" in small and "for (int d0 = 0; d0 < 4096; d0 += 16)" in large
    assert abs(len(large) - len(small)) < 100  # the same statements, other constants
    tail = cuda_source(_plan(_l1(97)), "float64", cuda_config(_plan(_l1(97)), "float64"))
    assert "const int d0 = 96;" in tail  # the last component, a chunk of its own
    assert "xal" in small and "double2" not in small and "float4" in small


@pytest.mark.parametrize(("batch", "m", "n", "d"), [(2, 37, 1100, 70), (1, 5, 70_001, 65), (1, 17, 15, 130)])
def test_cpu_tiles_of_rows(compiled, monkeypatch, batch, m, n, d):
    """The CPU's wide pass over tiles of rows (codegen._cpu_tiled_rows): tiles straddling the rows (16 + 16 + 5)
    and the batches, panels of j straddling n (512 + 512 + 76, then the lanes' tail), a buffer budget that
    leaves 3 rows per tile (n = 70,001), fewer terms than a group of lanes; every reduction against float64."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "off")
    g = torch.Generator().manual_seed(m * n)
    x, y = torch.randn(batch, m, d, generator=g, dtype=F64), torch.randn(batch, n, d, generator=g, dtype=F64)
    w = torch.rand(d, generator=g, dtype=F64)
    xi, yj = (Vi(x), Vj(y)) if batch > 1 else (Vi(x[0]), Vj(y[0]))
    lazy = FORMS["weighted"](xi, yj, Pm(w)) + (xi - yj).abs().sum(-1).sqrt()
    dense = FORMS["weighted"](x[:, :, None], y[:, None], w) + (x[:, :, None] - y[:, None]).abs().sum(-1).sqrt()
    dense = dense if batch > 1 else dense[0]
    axis = dense.dim() - 1
    torch.testing.assert_close(lazy.sum(axis), dense.sum(axis, keepdim=True), rtol=1e-10, atol=1e-9)
    torch.testing.assert_close((-lazy / d).logsumexp(axis), (-dense / d).logsumexp(axis, keepdim=True))
    vals, idx = lazy.min_argmin(axis)
    torch.testing.assert_close(vals[..., 0], dense.amin(axis))
    assert torch.equal(idx[..., 0], dense.argmin(axis))
    k = min(3, n)
    vals, idx = lazy.Kmin_argKmin(k, axis)
    want = dense.topk(k, axis, largest=False)
    torch.testing.assert_close(vals, want.values)
    assert torch.equal(idx, want.indices)


# ---------------------------------------------------------------- on a GPU

FORMS = {
    "l1": lambda x, y, w: (x - y).abs().sum(-1),
    "weighted": lambda x, y, w: ((x - y).abs() * w + 0.25).sum(-1),
    "exp": lambda x, y, w: (-(x - y).exp() / 4).sum(-1),
}


def _lazy_and_dense(form: str, x, y, w):
    """(lazy formula, dense (m, n) float64 matrix) of one of FORMS."""
    lazy = FORMS[form](Vi(x), Vj(y), Pm(w))
    dense = FORMS[form](x.double()[:, None], y.double()[None], w.double())
    return lazy, dense


@pytest.fixture
def plain(monkeypatch, compiled):
    """The generated kernels, with the matrix-unit route off (every sum of these tests runs in chunks)."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "off")


@pytest.mark.cuda
@cuda
@settings(max_examples=25)
@given(
    d=st.integers(65, 300),
    m=st.integers(1, 140),
    n=st.integers(1, 140),
    form=st.sampled_from(sorted(FORMS)),
    seed=st.integers(0, 2**16),
)
def test_every_reduction_against_float64(plain, d, m, n, form, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, d, generator=g, dtype=F64), torch.randn(n, d, generator=g, dtype=F64)
    w = torch.rand(d, generator=g, dtype=F64)
    lazy, dense = _lazy_and_dense(form, x.cuda(), y.cuda(), w.cuda())
    b = torch.randn(n, 3, generator=g, dtype=F64).cuda()
    torch.testing.assert_close(lazy.sum(1), dense.sum(1, keepdim=True), rtol=1e-10, atol=1e-9)
    torch.testing.assert_close((-lazy / d).exp() @ b, (-dense / d).exp() @ b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close((-lazy).logsumexp(1), (-dense).logsumexp(1, keepdim=True), rtol=1e-10, atol=1e-9)
    vals, idx = lazy.min_argmin(1)
    torch.testing.assert_close(vals[:, 0], dense.amin(1))
    assert torch.equal(idx[:, 0], dense.argmin(1))
    k = min(3, n)
    vals, idx = lazy.Kmin_argKmin(k, 1)
    want = dense.topk(k, 1, largest=False)
    torch.testing.assert_close(vals, want.values)
    assert torch.equal(idx, want.indices)
    torch.testing.assert_close(lazy.max(0), dense.amax(0)[:, None])  # the other side (x staged by chunks)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("d", [128, 784, 2048])
def test_float32_at_embedding_widths(plain, d, aligned):
    """float32 against float64 at the widths of embeddings; rows whose start is not 16-byte aligned take the
    scalar loads (the storage offset by one float)."""
    g = torch.Generator().manual_seed(d)
    m, n = 301, 517
    x = torch.randn(m * d + 1, generator=g).cuda()[(0 if aligned else 1) :][: m * d].view(m, d)
    assert (x.data_ptr() % 16 == 0) == aligned
    y = torch.randn(n, d, generator=g).cuda()
    w = torch.rand(d, generator=g).cuda()
    for form in FORMS:
        lazy, dense = _lazy_and_dense(form, x, y, w)
        scale = dense.abs().amax().item()
        torch.testing.assert_close(lazy.sum(1).double(), dense.sum(1, keepdim=True), rtol=1e-5, atol=1e-5 * n * scale)
        vals, idx = lazy.Kmin_argKmin(10, 1)
        torch.testing.assert_close(vals.double(), dense.topk(10, 1, largest=False).values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dense.gather(1, idx), vals.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@cuda
def test_batches_ranges_and_two_widths(plain):
    g = torch.Generator().manual_seed(3)
    x1, y1 = torch.randn(2, 70, 130, generator=g, dtype=F64), torch.randn(2, 90, 130, generator=g, dtype=F64)
    x2, y2 = torch.randn(2, 70, 77, generator=g, dtype=F64), torch.randn(2, 90, 77, generator=g, dtype=F64)
    x1, y1, x2, y2 = (t.cuda() for t in (x1, y1, x2, y2))
    f = (Vi(x1) - Vj(y1)).abs().sum(-1) + ((Vi(x2) - Vj(y2)).exp() / 8).sum(-1).sqrt()
    dense = (x1[:, :, None] - y1[:, None]).abs().sum(-1) + ((x2[:, :, None] - y2[:, None]).exp() / 8).sum(-1).sqrt()
    torch.testing.assert_close(f.sum(2), dense.sum(2, keepdim=True), rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(f.min(2), dense.amin(2, keepdim=True))
    # block-sparse ranges (one batch): the chunks read the rows of the tile's terms
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    keep = torch.tensor([[True, False, True], [False, True, True]])
    ranges = from_matrix(i64([0, 33], [33, 70]), i64([0, 5], [5, 60], [60, 90]), keep)
    mask = torch.zeros(70, 90, dtype=F64, device="cuda")
    for a, (r0, r1) in enumerate([(0, 33), (33, 70)]):
        for c, (c0, c1) in enumerate([(0, 5), (5, 60), (60, 90)]):
            mask[r0:r1, c0:c1] = float(keep[a, c])
    single = (Vi(x1[0]) - Vj(y1[0])).abs().sum(-1)
    dense0 = dense_l1 = (x1[0][:, None] - y1[0][None]).abs().sum(-1)
    torch.testing.assert_close(single.sum(1, ranges=ranges), (dense_l1 * mask).sum(1, keepdim=True))
    masked = torch.where(mask > 0, dense0, math.inf)
    vals, idx = single.Kmin_argKmin(2, 1, ranges=ranges)
    want = masked.topk(2, 1, largest=False)
    torch.testing.assert_close(vals, want.values)
    assert torch.equal(idx, want.indices)


@pytest.mark.cuda
@cuda
def test_gradients(plain):
    """The backward's formulas read x_i - y_j inside the sum and out of it (the sign): y is staged whole there."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 150, generator=g, dtype=F64).cuda().requires_grad_()
    y = torch.randn(57, 150, generator=g, dtype=F64).cuda().requires_grad_()
    b = torch.randn(57, 2, generator=g, dtype=F64).cuda()
    got = (-(Vi(x) - Vj(y)).abs().sum(-1) / 150).exp() @ b
    want = (-(x[:, None] - y[None]).abs().sum(-1) / 150).exp() @ b
    cot = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad(got, [x, y], cot), torch.autograd.grad(want, [x, y], cot), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    xs, ys = x[:6, :70].detach().requires_grad_(), y[:7, :70].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c: (-(Vi(a) - Vj(c)).abs().sum(-1) / 70).exp().sum(1), (xs, ys))
