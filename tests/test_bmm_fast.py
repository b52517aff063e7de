"""The log semiring's fast mode (precision="fast"), its tile kernel: tensor-core TF32 products of per-k-tile
scaled exponentials with an underflow guard (csrc/cuda/log_bmm_fast_kernels.cu, semiring_ops/ops/fast_log.py).
The scaled tier that passes=1 tries first is turned off here (tests/test_bmm_fast_scaled.py).

CPU: the argument checks, "fast" = exact off the GPU, and a NumPy model of the kernel (tests/fast_log_model.py):
its thread / shared-memory / mma-fragment index mapping against the PTX and CuTe layouts, and its arithmetic
(with the real host-side repair) against float64 brute force, including the adversarial cases.
CUDA: the kernel itself against float64 brute force, the exact kernel and the model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from brute import bmm as brute_bmm
from brute import layout_view
from conftest import HAS_CUDA
from fast_log_model import (
    BM,
    BN,
    GROUP_M,
    KT,
    LOADS_A,
    LOADS_B,
    PITCH_A,
    PITCH_B,
    THREADS,
    TILES_M,
    TILES_N,
    block_product,
    cute_a,
    cute_b,
    cute_c,
    fragment_words,
    kernel_constants,
    maxima_of,
    model_log_bmm_fast,
    output_of,
    ptx_a,
    ptx_b,
    ptx_c,
    tile_of_block,
    transform_writes,
)
from hypothesis import given
from hypothesis import strategies as st

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.ops import fast_log, registry


def cuda_test(fn):
    """Marks a test cuda (pytest -m cuda) and skips it without a GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")(fn))


PASS_TOL = {1: 1e-3, 3: 1e-5}  # the fast mode's own error (docs/semiring_matmul.md)
EPS32 = 2.0**-24


def _tolerance(passes: int, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor) -> float:
    """The fast mode's error bound plus the float32 rounding of the values the exact kernel has too
    (inputs times log2 e, the maxima, their sums): a few ulps of the largest magnitudes involved."""
    finite = lambda t: t[torch.isfinite(t)].abs().max().item() if torch.isfinite(t).any() else 0.0  # noqa: E731
    return PASS_TOL[passes] + 8 * EPS32 * (finite(a.double()) + finite(b.double()) + finite(ref.double()))


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Same non-finite values (pattern and value) and |out - ref| <= tol on the finite ones."""
    o, r = out.double().cpu(), ref.double().cpu()
    assert o.shape == r.shape
    assert torch.equal(torch.isnan(o), torch.isnan(r)), "NaN pattern differs"
    finite = torch.isfinite(r)
    assert torch.equal(torch.isfinite(o), finite), "finite pattern differs"
    assert torch.equal(o[torch.isinf(r)], r[torch.isinf(r)]), "infinite values differ"
    err = (o[finite] - r[finite]).abs().max().item() if finite.any() else 0.0
    assert err <= tol, f"max abs error {err:.3g} > {tol:.3g}"


def _model(a: torch.Tensor, b: torch.Tensor, passes: int) -> torch.Tensor:
    """The modelled kernel plus the real host-side repair of the flagged outputs (on CPU tensors)."""
    out, flags, count = model_log_bmm_fast(a, b, passes)
    flagged = int(count.item())
    return fast_log.repair(a.float(), b.float(), out, flags, flagged) if flagged else out


def _misaligned(B: int, n: int, k: int, m: int, device="cpu", low=-200.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row of a peaks at k = 0 and every column of b at k = last (others `low`): in the tile holding
    both, the scaled product 2^(a - alpha) 2^(b - beta) underflows everywhere, though the exact value is finite."""
    a = torch.full((B, n, k), low, device=device) + 0.1 * torch.rand(B, n, k, device=device)
    b = torch.full((B, k, m), low, device=device) + 0.1 * torch.rand(B, k, m, device=device)
    a[..., 0] = torch.randn(B, n, device=device)
    b[..., -1, :] = torch.randn(B, m, device=device)
    return a, b


# ---------------------------------------------------------------- API (CPU)


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@pytest.mark.parametrize("precision", ["", "FAST", "approx", None, 1])
def test_precision_must_be_exact_or_fast(semiring, precision):
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    with pytest.raises(ValueError, match="precision must be one of"):
        so.semiring_matmul(a, b, semiring, precision=precision)


def test_logbmm_takes_precision_and_passes_are_checked():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.raises(ValueError, match="precision"):
        so.logbmm(a, b, precision="quick")
    with pytest.raises(ValueError, match="passes must be 1 or 3"):
        fast_log.log_bmm_fast(a[None], b[None], passes=2)


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_fast_off_the_gpu_is_the_exact_path(semiring, dtype):
    a = torch.randn(2, 1, 7, 33, dtype=dtype)
    b = torch.randn(3, 33, 5, dtype=dtype)
    fast_log.reset_stats()
    fast = so.semiring_matmul(a, b, semiring, precision="fast")
    assert torch.equal(fast, so.semiring_matmul(a, b, semiring))
    assert fast_log.stats["kernel"] == 0


def test_fast_op_on_cpu_falls_back_to_exact_with_gradients():
    a = torch.randn(2, 5, 40, requires_grad=True)
    b = torch.randn(2, 40, 6, requires_grad=True)
    out = fast_log.log_bmm_fast(a, b)
    ref = so.logbmm(a, b)
    assert torch.equal(out, ref)
    g = torch.randn_like(out)
    for x, y in zip(torch.autograd.grad(out, (a, b), g), torch.autograd.grad(ref, (a, b), g), strict=True):
        torch.testing.assert_close(x, y)


def test_meta_tensors_give_the_fast_ops_shape():
    a = torch.empty(3, 5, 6, device="meta", dtype=torch.bfloat16)
    b = torch.empty(3, 6, 4, device="meta", dtype=torch.bfloat16)
    out = fast_log.log_bmm_fast_op(a, b, 1)
    assert out.shape == (3, 5, 4) and out.dtype == torch.float32


# ---------------------------------------------------------------- the kernel's index mapping (CPU model)


def test_kernel_constants_match_the_model():
    c = kernel_constants()
    assert c["kKT"] == str(KT)
    assert (c["kWarpsM"], c["kWarpsN"], c["kWarpM"], c["kWarpN"]) == ("2", "2", "32", "32")
    assert (c["kMmaM"], c["kMmaN"], c["kMmaK"]) == ("16", "8", "8")
    assert (c["kPitchA"], c["kPitchB"]) == ("kKT + 4", "kBN + 8")
    assert c["kGroupM"] == str(GROUP_M)
    assert (PITCH_A, PITCH_B, THREADS, BM, BN) == (36, 72, 128, 64, 64)


def test_ptx_fragment_layouts_match_cutlass_cute_layouts():
    for lane in range(32):
        for i in range(4):
            assert ptx_a(lane, i) == cute_a(lane, i)
            assert ptx_c(lane, i) == cute_c(lane, i)
        for i in range(2):
            assert ptx_b(lane, i) == cute_b(lane, i)
    # the layouts the brief / PTX table give, spelled out for lane 13 (g = 3, t = 1)
    assert [ptx_a(13, i) for i in range(4)] == [(3, 1), (11, 1), (3, 5), (11, 5)]
    assert [ptx_b(13, i) for i in range(2)] == [(1, 3), (5, 3)]
    assert [ptx_c(13, i) for i in range(4)] == [(3, 2), (3, 3), (11, 2), (11, 3)]


def test_staging_writes_every_hat_element_once():
    seen = {"A": set(), "B": set()}
    words = {"A": set(), "B": set()}
    for tid in range(THREADS):
        for which, r, c, word in transform_writes(tid):
            assert (r, c) not in seen[which]
            seen[which].add((r, c))
            words[which].add(word)
    assert seen["A"] == {(r, c) for r in range(BM) for c in range(KT)}
    assert seen["B"] == {(r, c) for r in range(KT) for c in range(BN)}
    assert len(words["A"]) == BM * KT and len(words["B"]) == KT * BN
    assert LOADS_A * 4 * THREADS == BM * KT and LOADS_B * 4 * THREADS == KT * BN


def test_block_product_through_the_kernels_data_path_is_the_matrix_product():
    rng = np.random.default_rng(0)
    a_hat = rng.integers(-8, 9, size=(BM, KT)).astype(np.float64)  # small integers: exact sums
    b_hat = rng.integers(-8, 9, size=(KT, BN)).astype(np.float64)
    np.testing.assert_array_equal(block_product(a_hat, b_hat), a_hat @ b_hat)


def test_combine_pairs_each_output_with_its_own_row_and_column_maxima():
    for tid in range(THREADS):
        for mt in range(TILES_M):
            for nt in range(TILES_N):
                for c in range(4):
                    assert maxima_of(tid, mt, nt, c) == output_of(tid, mt, nt, c)


def test_fragment_loads_are_free_of_bank_conflicts():
    for warp in range(THREADS // 32):
        tids = range(32 * warp, 32 * warp + 32)
        for mt in range(TILES_M):
            for nt in range(TILES_N):
                for ks in range(KT // 8):
                    words = [fragment_words(tid, mt, nt, ks) for tid in tids]
                    for i in range(4):
                        assert len({wa[i] % 32 for wa, _ in words}) == 32
                    for i in range(2):
                        assert len({wb[i] % 32 for _, wb in words}) == 32


def test_hat_stores_are_free_of_bank_conflicts():
    # a 16-byte store is served a quarter warp (8 lanes) at a time: their 4-word chunks must hit 32 banks
    for which in ("A", "B"):
        per_thread = {tid: [w for x, _, _, w in transform_writes(tid) if x == which] for tid in range(THREADS)}
        for store in range(len(per_thread[0]) // 4):
            for q in range(0, THREADS, 8):
                banks = [w % 32 for tid in range(q, q + 8) for w in per_thread[tid][4 * store : 4 * store + 4]]
                assert len(set(banks)) == 32, (which, store, q)


@pytest.mark.parametrize("tiles", [(1, 1), (3, 5), (8, 2), (9, 7), (17, 1), (1, 19), (64, 64)])
def test_rasterisation_visits_every_tile_once(tiles):
    tm, tn = tiles
    assert sorted(tile_of_block(pid, tm, tn) for pid in range(tm * tn)) == [
        (i, j) for i in range(tm) for j in range(tn)
    ]


# ---------------------------------------------------------------- the kernel's arithmetic (CPU model)

SIZES = st.one_of(st.integers(1, 9), st.sampled_from([16, 31, 32, 33, 63, 64, 65, 97, 129]))
BATCHES = st.sampled_from([((), ()), ((2,), (2,)), ((2,), ()), ((), (2,)), ((2, 1), (1, 2))])


@pytest.mark.parametrize("passes", [1, 3])
@given(n=SIZES, k=SIZES, m=SIZES, batch=BATCHES, scale=st.sampled_from([0.3, 1.0, 4.0]))
def test_model_meets_the_error_bound(passes, n, k, m, batch, scale):
    a = torch.randn(*batch[0], n, k) * scale
    b = torch.randn(*batch[1], k, m) * scale
    shape = torch.broadcast_shapes(batch[0], batch[1])
    a3, b3 = a.expand(*shape, n, k).reshape(-1, n, k), b.expand(*shape, k, m).reshape(-1, k, m)
    ref = brute_bmm(a3, b3, "log")
    _assert_matches(_model(a3, b3, passes), ref, _tolerance(passes, a3, b3, ref))


@pytest.mark.parametrize("passes", [1, 3])
def test_model_flags_underflowing_tiles_and_the_repair_makes_them_exact(passes):
    for k in (1, 2, 20, 32):  # row and column maxima in one tile
        a, b = _misaligned(2, 5, k, 6)
        _out, flags, count = model_log_bmm_fast(a, b, passes)
        ref = brute_bmm(a, b, "log")
        assert torch.isfinite(ref).all()
        if k > 1:
            assert flags.all() and int(count) == flags.numel()  # everything underflowed
        _assert_matches(_model(a, b, passes), ref, _tolerance(passes, a, b, ref))


def test_model_trusts_misaligned_maxima_in_different_tiles():
    # the maxima sit in different k-tiles: each tile's own scaled product is fine, no flag
    a, b = _misaligned(1, 4, 64, 5, low=-5.0)
    a[..., 0], b[..., -1, :] = 3.0, 3.0
    out, _flags, count = model_log_bmm_fast(a, b, 1)
    assert int(count) == 0
    _assert_matches(out, brute_bmm(a, b, "log"), 1e-3 + 1e-5)


def test_model_wide_dynamic_range():
    torch.manual_seed(1)
    a = 50 * torch.randn(2, 37, 70) - 1e3 * (torch.rand(2, 37, 70) < 0.3)
    b = 50 * torch.randn(2, 70, 41) + 1e3 * (torch.rand(2, 70, 41) < 0.1)
    ref = brute_bmm(a, b, "log")
    for passes in (1, 3):
        _assert_matches(_model(a, b, passes), ref, _tolerance(passes, a, b, ref))


def test_model_special_values():
    a = torch.randn(2, 6, 45)
    b = torch.randn(2, 45, 7)
    a[0, 1] = -math.inf  # an all -inf row: -inf outputs, trusted
    b[1, :, 2] = -math.inf  # an all -inf column
    a[0, 2, 40] = math.inf  # +inf: its row is +inf (or NaN against a -inf term)
    b[1, 3, 4] = math.nan  # NaN: its column is NaN
    a[1, 4, :33] = -math.inf  # -inf in a whole k-tile only
    b[0, 5, 6] = -math.inf  # a single -inf term
    out, flags, _ = model_log_bmm_fast(a, b, 1)
    assert torch.all(out[0, 1] == -math.inf) and not flags[0, 1].any()
    assert torch.all(out[1, :, 2] == -math.inf) and not flags[1, :, 2].any()
    assert flags[0, 2].all() and flags[1, :, 4].all()
    ref = brute_bmm(a, b, "log")
    _assert_matches(_model(a, b, 1), ref, _tolerance(1, a, b, ref))


def test_model_huge_magnitudes_go_to_the_exact_path():
    a = torch.randn(1, 3, 10)
    b = torch.randn(1, 10, 4)
    a[0, 1, 3] = 1e38  # a tile maximum beyond 2^125: its row goes to the exact path
    b[0, 7, 2] = -1e38  # a huge negative non-maximum is just a zero term: no flag
    _out, flags, _ = model_log_bmm_fast(a, b, 1)
    assert flags[0, 1].all() and int(flags.sum()) == 4
    ref = brute_bmm(a, b, "log")
    _assert_matches(_model(a, b, 1), ref, _tolerance(1, a, b, ref))


def test_repair_switches_to_the_exact_kernel_when_many_are_flagged():
    a, b = _misaligned(1, 8, 32, 8)
    fast_log.reset_stats()
    _model(a, b, 1)
    assert fast_log.stats["full_exact"] == 1 and fast_log.stats["gathered"] == 0
    a2 = torch.randn(1, 40, 32)
    b2 = torch.randn(1, 32, 40)
    a2[0, 3] = a[0, 0, :32]  # one misaligned row against one misaligned column
    b2[0, :, 5] = b[0, :32, 0]
    fast_log.reset_stats()
    out = _model(a2, b2, 1)
    assert fast_log.stats["gathered"] == 1 and fast_log.stats["flagged"] >= 1
    _assert_matches(out, brute_bmm(a2, b2, "log"), 2e-3)


# ---------------------------------------------------------------- the CUDA kernel

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CUDA_SIZES = st.one_of(st.integers(1, 9), st.sampled_from([15, 31, 32, 33, 63, 64, 65, 100, 127, 129, 200]))
CUDA_BATCHES = st.sampled_from([((), ()), ((3,), (3,)), ((2,), ()), ((), (2,)), ((2, 1), (1, 3)), ((1,), (4,))])


def cuda_case(dtype, n, k, m, batch, layout):
    """Random CUDA operands of the drawn batch shapes (batch = (a's, b's)) in the drawn layout, their float64 log
    product, and their 3-D broadcast forms (B, n, k) / (B, k, m), which fast_log takes; the stats reset."""
    a = layout_view(torch.randn(*batch[0], n, k).to(dtype).cuda(), layout)
    b = layout_view(torch.randn(*batch[1], k, m).to(dtype).cuda(), layout)
    shape = torch.broadcast_shapes(batch[0], batch[1])
    a3, b3 = a.expand(*shape, n, k).reshape(-1, n, k), b.expand(*shape, k, m).reshape(-1, k, m)
    fast_log.reset_stats()
    return a, b, brute_bmm(a, b, "log"), a3, b3


@pytest.mark.parametrize("passes", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@cuda_test
@given(
    n=CUDA_SIZES,
    k=CUDA_SIZES,
    m=CUDA_SIZES,
    batch=CUDA_BATCHES,
    layout=st.sampled_from(["contiguous", "transposed", "strided", "offset"]),
)
def test_cuda_fast_matches_float64_brute_force(passes, dtype, n, k, m, batch, layout):
    a, b, ref, a3, b3 = cuda_case(dtype, n, k, m, batch, layout)
    out = fast_log.log_bmm_fast(a3, b3, passes)
    assert fast_log.stats["kernel"] == 1 and out.dtype == torch.float32
    _assert_matches(out.reshape(ref.shape), ref, _tolerance(passes, a3.float(), b3.float(), ref))
    if passes == fast_log.DEFAULT_PASSES:  # the public entry: same numbers, in the input dtype
        public = so.semiring_matmul(a, b, "log", precision="fast")
        assert public.dtype == dtype
        assert torch.equal(public, out.reshape(ref.shape).to(dtype))


@pytest.mark.parametrize("passes", [1, 3])
@cuda_test
def test_cuda_fast_agrees_with_the_exact_kernel_at_size(passes):
    torch.manual_seed(0)
    a = torch.randn(2, 300, 1000, device="cuda")
    b = torch.randn(1, 1000, 257, device="cuda").expand(2, -1, -1)  # a stride-0 batch
    exact = so.logbmm(a, b)
    fast = fast_log.log_bmm_fast(a, b, passes)
    _assert_matches(fast, exact, PASS_TOL[passes] + 2e-5)


@cuda_test
def test_cuda_kernel_matches_the_numpy_model():
    torch.manual_seed(3)
    a = torch.randn(2, 70, 90, device="cuda") * 3
    b = torch.randn(2, 90, 66, device="cuda") * 3
    a[0, 5] = -math.inf
    a[1, 7, 3] = math.nan
    b[0, :, 9] = -math.inf
    b[1, 50:, 4] = 40.0  # a column whose maximum is far from most rows' maxima in the last tiles
    for passes in (1, 3):
        out, flags, count = backend_for(a.device).family("fast_log").log_bmm_fast(a, b, passes)
        m_out, m_flags, m_count = model_log_bmm_fast(a.cpu(), b.cpu(), passes)
        assert torch.equal(flags.cpu(), m_flags), "flags differ from the model's"
        assert int(count) == int(m_count)
        keep = m_flags == 0
        _assert_matches(out.cpu()[keep], m_out[keep], 2 * PASS_TOL[passes])


@pytest.mark.parametrize("passes", [1, 3])
@pytest.mark.parametrize("k", [1, 7, 20, 32, 64, 100])
@cuda_test
def test_cuda_misaligned_maxima_are_flagged_and_recomputed(passes, k):
    a, b = _misaligned(2, 33, k, 65, device="cuda")
    if k >= 64:  # both maxima in the last k-tile (k - 2 and k - 1), the tiles before it a -200 plateau
        a[..., 0], a[..., k - 2] = a[..., k - 2].clone(), a[..., 0].clone()
    ref = brute_bmm(a, b, "log")
    assert torch.isfinite(ref).all()
    fast_log.reset_stats()
    out = fast_log.log_bmm_fast(a, b, passes)
    assert torch.isfinite(out).all()
    if k > 1:
        assert fast_log.stats["flagged"] > 0 and fast_log.stats["gathered"] + fast_log.stats["full_exact"] == 1
    _assert_matches(out, ref, _tolerance(passes, a, b, ref))


@cuda_test
def test_cuda_few_flags_are_gathered_many_rerun_exact():
    a = torch.randn(1, 200, 32, device="cuda")  # one k-tile
    b = torch.randn(1, 32, 200, device="cuda")
    am, bm = _misaligned(1, 3, 32, 2, device="cuda")
    a[0, 10:13], b[0, :, 7:9] = am[0], bm[0]  # 3 x 2 underflowing outputs (against normal ones: fine)
    fast_log.reset_stats()
    out = fast_log.log_bmm_fast(a, b)
    assert fast_log.stats["gathered"] == 1 and fast_log.stats["full_exact"] == 0
    assert fast_log.stats["flagged"] == 6
    _assert_matches(out, brute_bmm(a, b, "log"), 2e-3)
    a, b = _misaligned(1, 64, 32, 64, device="cuda")
    fast_log.reset_stats()
    out = fast_log.log_bmm_fast(a, b)
    assert fast_log.stats["full_exact"] == 1
    _assert_matches(out, brute_bmm(a, b, "log"), _tolerance(1, a, b, out))


@pytest.mark.parametrize("passes", [1, 3])
@cuda_test
def test_cuda_wide_dynamic_range(passes):
    torch.manual_seed(1)
    a = 50 * torch.randn(2, 97, 130, device="cuda") - 1e3 * (torch.rand(2, 97, 130, device="cuda") < 0.3)
    b = 50 * torch.randn(2, 130, 71, device="cuda") + 1e3 * (torch.rand(2, 130, 71, device="cuda") < 0.1)
    ref = brute_bmm(a, b, "log")
    _assert_matches(fast_log.log_bmm_fast(a, b, passes), ref, _tolerance(passes, a, b, ref))


@cuda_test
def test_cuda_neg_inf_rows_and_columns_give_neg_inf_and_zero_gradient():
    a = torch.randn(2, 5, 70, device="cuda")
    b = torch.randn(2, 70, 6, device="cuda")
    a[0, 1, :] = -math.inf
    b[1, :, 4] = -math.inf
    a.requires_grad_()
    b.requires_grad_()
    fast_log.reset_stats()
    out = so.logbmm(a, b, precision="fast")
    assert fast_log.stats["flagged"] == 0  # -inf outputs are trusted, not recomputed
    assert torch.all(out[0, 1] == -math.inf) and torch.all(out[1, :, 4] == -math.inf)
    ga, gb = torch.autograd.grad(out, (a, b), torch.randn_like(out))
    assert not torch.isnan(ga).any() and not torch.isnan(gb).any()
    assert torch.all(ga[0, 1] == 0) and torch.all(gb[1, :, 4] == 0)
    ref = brute_bmm(a.detach(), b.detach(), "log")
    _assert_matches(out.detach(), ref, _tolerance(1, a, b, ref))


@cuda_test
def test_cuda_inf_and_nan_inputs_match_the_exact_path():
    a = torch.randn(2, 60, 80, device="cuda")
    b = torch.randn(2, 80, 70, device="cuda")
    a[0, 2, 40] = math.inf
    a[1, 3, 5] = math.nan
    b[0, 7, 1] = math.inf
    b[1, 60, 8] = math.nan
    b[0, :, 3] = -math.inf  # against the +inf row: a NaN term
    fast_log.reset_stats()
    fast = so.logbmm(a, b, precision="fast")
    assert fast_log.stats["gathered"] == 1  # few enough (under 1/16) to be recomputed one by one
    _assert_matches(fast, so.logbmm(a, b), 1e-3 + 1e-5)


@cuda_test
def test_cuda_huge_finite_inputs_are_recomputed():
    a = torch.randn(1, 60, 80, device="cuda")
    b = torch.randn(1, 80, 70, device="cuda")
    a[0, 6, 10] = 1e38  # a tile maximum beyond 2^125: its row goes to the exact path
    b[0, 11, 5] = -1e38  # a huge negative non-maximum is a zero term
    fast_log.reset_stats()
    fast = so.logbmm(a, b, precision="fast")
    assert fast_log.stats["flagged"] == 70
    ref = brute_bmm(a, b, "log")
    torch.testing.assert_close(fast[0, 6].double(), ref[0, 6], rtol=1e-6, atol=0)
    keep = torch.ones_like(fast, dtype=torch.bool)
    keep[0, 6] = False
    _assert_matches(fast[keep], ref[keep], 1e-3 + 1e-5)


@cuda_test
def test_cuda_empty_k_and_empty_outputs():
    a = torch.randn(2, 3, 0, device="cuda", requires_grad=True)
    b = torch.randn(2, 0, 4, device="cuda", requires_grad=True)
    out = so.logbmm(a, b, precision="fast")
    assert out.shape == (2, 3, 4) and torch.all(out == -math.inf)
    ga, gb = torch.autograd.grad(out, (a, b), torch.randn_like(out))
    assert ga.shape == (2, 3, 0) and gb.shape == (2, 0, 4)
    assert so.logbmm(
        torch.randn(2, 0, 5, device="cuda"), torch.randn(2, 5, 3, device="cuda"), precision="fast"
    ).shape == (2, 0, 3)
    assert so.logbmm(
        torch.randn(0, 4, 5, device="cuda"), torch.randn(0, 5, 3, device="cuda"), precision="fast"
    ).shape == (0, 4, 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@cuda_test
def test_cuda_gradient_is_the_exact_backward_of_the_fast_output(dtype):
    a = torch.randn(3, 40, 75, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(75, 50, device="cuda").to(dtype).requires_grad_()
    b3 = b.expand(3, 75, 50)  # a stride-0 batch
    out = fast_log.log_bmm_fast(a, b3)  # float32, the output the backward sees
    g = torch.randn_like(out)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    want_a, want_b = registry.log_bmm_backward(a.detach(), b3.detach(), out.detach(), g, True, True)
    torch.testing.assert_close(ga, want_a.to(dtype), rtol=0, atol=0)
    # b's gradient: the batch sum of the per-entry gradients, which autograd adds in b's dtype
    scale = want_b.sum(0).abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gb.float(), want_b.sum(0), rtol=tol, atol=tol * scale)
    g_public = torch.autograd.grad(so.logbmm(a, b, precision="fast"), (a, b), g.to(dtype))
    g_exact = torch.autograd.grad(so.logbmm(a, b), (a, b), g.to(dtype))  # and close to the exact path's
    for x, y in zip(g_public, g_exact, strict=True):
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=5e-3)


@cuda_test
def test_cuda_float64_and_other_semirings_stay_exact():
    a = torch.randn(2, 9, 33, device="cuda", dtype=torch.float64)
    b = torch.randn(2, 33, 7, device="cuda", dtype=torch.float64)
    fast_log.reset_stats()
    assert torch.equal(so.logbmm(a, b, precision="fast"), so.logbmm(a, b))
    a, b = a.float(), b.float()
    assert torch.equal(so.maxbmm(a, b), so.semiring_matmul(a, b, "max", precision="fast"))
    assert fast_log.stats["calls"] == 0


@pytest.mark.parametrize("tier", ["tile kernel", "scaled tier"])
@cuda_test
def test_cuda_torch_compile_fullgraph(tier, monkeypatch):
    monkeypatch.setattr(fast_log, "SCALED_TIER", tier == "scaled tier")
    torch._dynamo.reset()

    def f(a, b):
        return so.logbmm(a, b, precision="fast").sum()

    a = torch.randn(2, 40, 50, device="cuda", requires_grad=True)
    b = torch.randn(2, 50, 30, device="cuda", requires_grad=True)
    eager = f(a, b)
    compiled = torch.compile(f, fullgraph=True)(a, b)
    torch.testing.assert_close(compiled, eager)
    for x, y in zip(torch.autograd.grad(compiled, (a, b)), torch.autograd.grad(eager, (a, b)), strict=True):
        torch.testing.assert_close(x, y)


@pytest.mark.slow
@cuda_test
def test_cuda_large_batch_beyond_the_grid_limit():
    a = torch.randn(70000, 3, 5, device="cuda")
    b = torch.randn(70000, 5, 2, device="cuda")
    _assert_matches(fast_log.log_bmm_fast(a, b), so.logbmm(a, b), 1e-3 + 1e-5)


@pytest.fixture(autouse=True)
def _fast_mode_at_every_size(monkeypatch, request):
    """The tests' small products take the fast kernel (semiring_matmul sends products under MIN_CELLS to the
    exact one, which is faster there), except in the test of that threshold; and the tile kernel, not the
    scaled tier that passes=1 tries first (tests/test_bmm_fast_scaled.py tests that one and the choice)."""
    if "min_cells" not in request.node.name:
        monkeypatch.setattr(fast_log, "MIN_CELLS", 0)
    monkeypatch.setattr(fast_log, "SCALED_TIER", False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_small_products_under_min_cells_run_exact():
    a, b = torch.randn(2, 30, 40, device="cuda"), torch.randn(2, 40, 20, device="cuda")
    fast_log.reset_stats()
    out = so.logbmm(a, b, precision="fast")
    assert fast_log.stats["kernel"] == 0 and torch.equal(out, so.logbmm(a, b))
