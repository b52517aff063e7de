"""The log fast mode's scaled tier (semiring_ops/ops/fast_log_scaled.py: one scale per row and column over all
of k, one TF32 product) and the choice between it and the tile kernel (semiring_ops/ops/fast_log.py).

CPU: the tier's arithmetic (torch ops; on the CPU the product is a float32 matmul of the same TF32-rounded
factors, so the same values up to summation order) against float64 brute force, its guard (what it trusts,
flags and writes for -inf, +inf, NaN, huge and misaligned inputs), with the real host-side repair.
CUDA: the tier on cuBLAS against float64 brute force and the exact kernel, in every dtype and layout; its fused
passes (csrc/cuda/fast_log_scaled_kernels.cu) against its ATen passes, special values included, poisoned; few
flags are gathered, many send the product to the tile kernel; gradients; the caller's TF32 setting and cuBLAS's
rounding. (torch.compile: tests/test_bmm_fast.py, both tiers.)"""

from __future__ import annotations

import math

import pytest
import torch
from brute import bmm as brute_bmm
from brute import layout_view
from conftest import HAS_CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bmm_fast import _assert_matches, _misaligned, _tolerance, cuda_case

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.ops import fast_log, fast_log_scaled
from semiring_ops.ops.fast_log_scaled import scaled_product


def cuda_test(fn):
    return pytest.mark.cuda(pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")(fn))


@pytest.fixture(autouse=True)
def _fast_mode_at_every_size(monkeypatch):
    monkeypatch.setattr(fast_log, "MIN_CELLS", 0)
    monkeypatch.setattr(fast_log, "SCALED_TIER", True)


def _repaired(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tier's output with its flagged outputs recomputed by fast_log.repair, and the flag count."""
    out, flags, count = scaled_product(a, b)
    flagged = int(count)
    assert flags.dtype == torch.bool and flagged == int(flags.sum())
    return (fast_log.repair(a.float(), b.float(), out, flags, flagged) if flagged else out), flagged


# ---------------------------------------------------------------- the arithmetic (CPU)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 40),
    k=st.integers(1, 70),
    m=st.integers(1, 40),
    batch=st.integers(1, 3),
    scale=st.sampled_from([0.1, 1.0, 5.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_scaled_tier_meets_the_error_bound(n, k, m, batch, scale, seed):
    g = torch.Generator().manual_seed(seed)
    a = scale * torch.randn(batch, n, k, generator=g)
    b = scale * torch.randn(batch, k, m, generator=g)
    out, _ = _repaired(a, b)
    assert out.dtype == torch.float32 and out.shape == (batch, n, m)
    ref = brute_bmm(a, b, "log")
    _assert_matches(out, ref, _tolerance(1, a, b, ref))


def _fused() -> object:
    """The fast_log family's module (its fused passes), built on first use."""
    kernels = backend_for(torch.device("cuda")).family("fast_log")
    assert hasattr(kernels, "log_bmm_fast_scales"), "the fast_log CUDA kernels did not build"
    return kernels


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_scaled_tier_special_values(device):
    if device == "cuda" and not HAS_CUDA:
        pytest.skip("no CUDA GPU")
    kernels = _fused() if device == "cuda" else None
    a = torch.randn(2, 30, 45)  # sizes at which the 70 flagged outputs are gathered (under 1/16 of 2,400)
    b = torch.randn(2, 45, 40)
    a[0, 1] = -math.inf  # an all -inf row: -inf outputs, trusted
    b[1, :, 2] = -math.inf  # an all -inf column
    a[0, 2, 40] = math.inf  # +inf: its row is flagged (+inf, or NaN against a -inf term)
    b[1, 3, 4] = math.nan  # NaN: its column is flagged
    a[1, 4, :33] = -math.inf  # -inf terms, not a whole row
    b[0, 5, 6] = -math.inf  # a single -inf term
    b[0, :, 5] = -math.inf  # an all -inf column against the +inf row: NaN, flagged
    a, b = a.to(device), b.to(device)
    out, flags, count = scaled_product(a, b, kernels)
    assert torch.all(out[0, 1] == -math.inf) and not flags[0, 1].any()
    assert torch.all(out[1, :, 2] == -math.inf) and not flags[1, :, 2].any()
    assert flags[0, 2].all() and flags[1, :, 4].all()
    assert int(count) == int(flags.sum()) == 40 + 30
    fixed = fast_log.repair(a, b, out, flags, int(count))
    _assert_matches(fixed, brute_bmm(a, b, "log").to(device), 1e-3 + 1e-5)


def test_scaled_tier_flags_misaligned_maxima_and_huge_values(monkeypatch):
    monkeypatch.setattr(fast_log, "FULL_RECOMPUTE_FRACTION", 1.0)  # the repair gathers them all (no exact kernel)
    a, b = _misaligned(1, 5, 40, 6)  # every row peaks at k = 0, every column at k = 39: every sum underflows
    _, flags, count = scaled_product(a, b)
    assert int(count) == 30 and flags.all()
    fixed, _ = _repaired(a, b)
    _assert_matches(fixed, brute_bmm(a, b, "log"), _tolerance(1, a, b, brute_bmm(a, b, "log")))
    a, b = torch.randn(1, 4, 9), torch.randn(1, 9, 3)
    a[0, 2, 5] = 1e38  # beyond 2^125: the row is recomputed exactly
    b[0, 1, 1] = -1e38  # a huge negative term is only a zero term
    _, flags, count = scaled_product(a, b)
    assert int(count) == 3 and flags[0, 2].all()
    fixed, _ = _repaired(a, b)
    torch.testing.assert_close(fixed.double(), brute_bmm(a, b, "log"), rtol=1e-6, atol=2e-3)


def test_scaled_tier_trusts_terms_far_below_the_maxima():
    """A sum of 2^-60 in units of 2^(M + N) is trusted (over 2^-64); the lost terms under 2^-126 are nothing."""
    a = torch.zeros(1, 1, 3)
    b = torch.zeros(1, 3, 1)
    a[0, 0] = torch.tensor([0.0, -30.0 * math.log(2), -200.0])  # row maximum 0 at k = 0
    b[0, :, 0] = torch.tensor([-200.0, -30.0 * math.log(2), 0.0])  # column maximum 0 at k = 2
    out, _, count = scaled_product(a, b)
    assert int(count) == 0
    torch.testing.assert_close(out.double(), brute_bmm(a, b, "log"), rtol=0, atol=1e-3)


def test_the_tier_steps_aside_near_the_memory_limit(monkeypatch):
    """fits: the factor tensors, the result and the flags must take at most half the free device memory (the
    caching allocator's free blocks counted)."""
    a, b = torch.empty(2, 100, 300), torch.empty(2, 300, 50)
    need = 2 * (4 * (100 * 300 + 300 * 50 + 100 * 50) + 100 * 50)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 600)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * need - 400, 10**12))
    assert fast_log_scaled.fits(a, b)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * need - 401, 10**12))
    assert not fast_log_scaled.fits(a, b)


def test_empty_dimensions_are_left_to_the_tile_kernel():
    assert scaled_product(torch.randn(2, 3, 0), torch.randn(2, 0, 4)) is None
    assert scaled_product(torch.randn(2, 0, 5), torch.randn(2, 5, 3)) is None


# ---------------------------------------------------------------- the tier on CUDA

_SPECIALS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from([-math.inf, math.inf, math.nan, 1e38, -1e38, "-inf line"]),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
    ),
    max_size=4,
)


def _inject(a: torch.Tensor, b: torch.Tensor, specials) -> None:
    """Special values at drawn places of a (B, n, k) and b (B, k, m): single terms, or a whole row of a / column
    of b of -inf ("-inf line")."""
    for which, value, p, r, c in specials:
        t = a if which == "a" else b
        p, r, c = p % t.shape[0], r % t.shape[1], c % t.shape[2]
        if value == "-inf line":
            if which == "a":
                t[p, r] = -math.inf
            else:
                t[p, :, c] = -math.inf
        else:
            t[p, r, c] = value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@cuda_test
@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([1, 3, 64, 130]),
    k=st.sampled_from([1, 7, 33, 300, 1100]),
    m=st.sampled_from([1, 6, 8, 37, 260]),
    batch=st.sampled_from([(1, False), (3, False), (3, True)]),
    layout=st.sampled_from(["contiguous", "transposed", "strided", "offset"]),
    scale=st.sampled_from([1.0, 20.0]),
    specials=_SPECIALS,
    seed=st.integers(0, 2**31 - 1),
)
def test_cuda_fused_passes_match_the_aten_passes(dtype, n, k, m, batch, layout, scale, specials, seed):
    """The fused passes' scales, flags and values are the ATen passes' (both feed cuBLAS the same factors up to an
    ulp), at sizes straddling their blocks (k across the row blocks and the column parts; m on and off the
    epilogue's 4-wide rows), stride-0 batches, every layout, special values; outputs poisoned (conftest)."""
    g = torch.Generator().manual_seed(seed)
    size, broadcast = batch
    a = scale * torch.randn(size, n, k, generator=g)
    b = scale * torch.randn(1 if broadcast else size, k, m, generator=g)
    _inject(a, b, specials)
    a = layout_view(a.to(dtype).cuda(), layout)
    b = layout_view(b.to(dtype).cuda(), layout).expand(size, k, m)
    out, flags, count = scaled_product(a, b, _fused())
    want, want_flags, want_count = scaled_product(a, b)  # the ATen passes
    assert out.dtype == torch.float32 and flags.dtype == torch.bool and out.shape == flags.shape == (size, n, m)
    assert torch.equal(flags, want_flags) and int(count) == int(want_count) == int(flags.sum())
    trusted = ~flags
    torch.testing.assert_close(out[trusted], want[trusted], rtol=1e-5, atol=1e-5)
    fixed = fast_log.repair(a.float(), b.float(), out, flags, int(count)) if int(count) else out
    ref = brute_bmm(a, b, "log")
    _assert_matches(fixed, ref, _tolerance(1, a.float(), b.float(), ref))


@cuda_test
def test_cuda_fused_passes_refuse_bad_arguments():
    kernels = _fused()
    a, b = torch.randn(2, 5, 7, device="cuda"), torch.randn(2, 7, 3, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA tensors only"):
        kernels.log_bmm_fast_scales(a.cpu(), b.cpu())
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        kernels.log_bmm_fast_scales(a.double(), b.double())
    with pytest.raises(RuntimeError, match="disagree"):
        kernels.log_bmm_fast_scales(a, b[:, :6])
    _, _, row_top, row_state, col_top, col_state = kernels.log_bmm_fast_scales(a, b)
    sums = torch.rand(2, 5, 3, device="cuda")
    with pytest.raises(RuntimeError, match=r"col_top must be a contiguous \(2, 3\) Float"):
        kernels.log_bmm_fast_finish(sums, row_top, row_state, row_top, col_state)
    with pytest.raises(RuntimeError, match="sums must be a contiguous"):
        kernels.log_bmm_fast_finish(
            sums.transpose(1, 2).contiguous().transpose(1, 2), row_top, row_state, col_top, col_state
        )
    flags, count = kernels.log_bmm_fast_finish(sums, row_top, row_state, col_top, col_state)
    assert flags.shape == (2, 5, 3) and int(count) == int(flags.sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@cuda_test
@given(
    n=st.sampled_from([1, 7, 33, 64, 129]),
    k=st.sampled_from([1, 5, 32, 65, 200]),
    m=st.sampled_from([1, 9, 31, 64, 100]),
    batch=st.sampled_from([((), ()), ((3,), (3,)), ((2,), ()), ((2, 1), (1, 3))]),
    layout=st.sampled_from(["contiguous", "transposed", "strided", "offset"]),
)
def test_cuda_scaled_tier_matches_float64_brute_force(dtype, n, k, m, batch, layout):
    a, b, ref, a3, b3 = cuda_case(dtype, n, k, m, batch, layout)
    out = fast_log.log_bmm_fast(a3, b3)
    assert fast_log.stats["scaled"] == 1 and fast_log.stats["tiled"] == 0 and out.dtype == torch.float32
    _assert_matches(out.reshape(ref.shape), ref, _tolerance(1, a3.float(), b3.float(), ref))
    public = so.semiring_matmul(a, b, "log", precision="fast")  # the public entry: the same, in the input dtype
    assert public.dtype == dtype and torch.equal(public, out.reshape(ref.shape).to(dtype))


@cuda_test
def test_cuda_scaled_tier_agrees_with_the_exact_kernel_at_size():
    torch.manual_seed(0)
    a = 3 * torch.randn(2, 300, 1000, device="cuda")
    b = 3 * torch.randn(1, 1000, 257, device="cuda").expand(2, -1, -1)  # a stride-0 batch
    fast_log.reset_stats()
    fast = fast_log.log_bmm_fast(a, b)
    assert fast_log.stats["scaled"] == 1
    _assert_matches(fast, so.logbmm(a, b), 1e-3 + 2e-5)


@cuda_test
def test_cuda_few_flags_are_gathered_many_go_to_the_tile_kernel():
    a = torch.randn(1, 256, 64, device="cuda")
    b = torch.randn(1, 64, 256, device="cuda")
    a[0, 3] = -200.0
    a[0, 3, 0] = 0.0  # row 3 peaks at k = 0
    b[0, :, 5] = -200.0
    b[0, -1, 5] = 0.0  # column 5 at k = 63: output (3, 5) underflows, nothing else does
    fast_log.reset_stats()
    out = fast_log.log_bmm_fast(a, b)
    assert fast_log.stats["scaled"] == 1 and fast_log.stats["gathered"] == 1 and fast_log.stats["flagged"] == 1
    _assert_matches(out, brute_bmm(a, b, "log"), _tolerance(1, a, b, out))
    a, b = _misaligned(1, 64, 96, 64, device="cuda")  # every output of the scaled tier underflows
    fast_log.reset_stats()
    out = fast_log.log_bmm_fast(a, b)
    assert fast_log.stats["scaled"] == 0 and fast_log.stats["tiled"] == 1
    _assert_matches(out, brute_bmm(a, b, "log"), _tolerance(1, a, b, out))
    fast_log.reset_stats()
    fast_log.log_bmm_fast(torch.randn(1, 64, 96, device="cuda"), torch.randn(1, 96, 64, device="cuda"), passes=3)
    assert fast_log.stats["tiled"] == 1  # 3xTF32 is the tile kernel's


@cuda_test
def test_cuda_scaled_tier_special_values_and_gradients():
    a = torch.randn(2, 60, 80, device="cuda")
    b = torch.randn(2, 80, 70, device="cuda")
    a[0, 1] = -math.inf
    b[1, :, 4] = -math.inf
    a[0, 3, 5] = math.nan  # (in batch 0: its NaN reaches every gradient of b[0], by the exact backward)
    a.requires_grad_()
    b.requires_grad_()
    out = so.logbmm(a, b, precision="fast")
    _assert_matches(out.detach(), so.logbmm(a.detach(), b.detach()), 1e-3 + 1e-5)
    g = torch.randn_like(out)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    assert torch.all(ga[0, 1] == 0) and torch.all(gb[1, :, 4] == 0)


@cuda_test
def test_cuda_cublas_rounds_tf32_operands_to_nearest():
    """The scaled tier's error bound assumes cuBLAS's TF32 matmul rounds its float32 operands to nearest (2^-11
    relative each), not toward zero (2^-10): over products of uniform factors, to nearest gives a mean relative
    error of ~2e-5, truncation ~6.5e-4 (H100, CUDA 13.0)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    fa = torch.rand(1, 512, 512, device="cuda", generator=g)
    fb = torch.rand(1, 512, 512, device="cuda", generator=g)
    with fast_log_scaled.tf32_matmul():
        got = torch.bmm(fa, fb)
    ref = torch.bmm(fa.double(), fb.double())
    rel = ((got.double() - ref) / ref).abs()
    assert rel.mean().item() < 1e-4 and rel.max().item() < 2.0**-10


_MATMUL = torch.backends.cuda.matmul
_PRECISION = "fp32_precision" if hasattr(_MATMUL, "fp32_precision") else "allow_tf32"  # torch 2.9 on: the first


@pytest.fixture
def matmul_setting():
    """The process's cuBLAS float32 setting, restored as it was after the test (by the API that reads it
    without error on this torch: monkeypatch's undo of allow_tf32 raised AttributeError on torch 2.11)."""
    saved = getattr(_MATMUL, _PRECISION)
    yield
    setattr(_MATMUL, _PRECISION, saved)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("setting", ["none", "ieee", "tf32", False, True])
def test_tf32_matmul_restores_every_setting(setting, on, matmul_setting):
    """tf32_matmul enables TF32 inside (on=False: IEEE float32, whatever the caller set) and leaves the setting as it
    found it: fp32_precision's "none" (follow the global setting) stays "none", not "ieee" as a round trip through
    allow_tf32 leaves it; a setting made through the legacy allow_tf32 can still be read through it afterwards."""
    if isinstance(setting, bool):
        _MATMUL.allow_tf32 = setting
    elif _PRECISION == "fp32_precision":
        _MATMUL.fp32_precision = setting
    else:
        pytest.skip("this torch has no fp32_precision")
    before = getattr(_MATMUL, _PRECISION)
    with fast_log_scaled.tf32_matmul(on):
        assert getattr(_MATMUL, _PRECISION) in (("tf32", True) if on else ("ieee", False))
    assert getattr(_MATMUL, _PRECISION) == before
    if isinstance(setting, bool):
        assert _MATMUL.allow_tf32 is setting


@pytest.mark.parametrize("setting", [False, True])
@cuda_test
def test_cuda_scaled_tier_restores_the_callers_tf32_setting(setting, matmul_setting):
    _MATMUL.allow_tf32 = setting
    fast_log.reset_stats()
    fast_log.log_bmm_fast(torch.randn(1, 64, 64, device="cuda"), torch.randn(1, 64, 64, device="cuda"))
    assert fast_log.stats["scaled"] == 1 and _MATMUL.allow_tf32 is setting
