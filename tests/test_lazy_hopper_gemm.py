"""The route's promoted 3xTF32 GEMM on Hopper (semiring_ops/lazy/hopper_gemm.py, csrc/lazy/tf32x3_gemm.cuh) against
float64: random sizes that straddle its 128 x 128 x 32 tiles, a depth that is no multiple of 4 (padded for TMA),
near-neighbour embeddings (where it must beat the SGEMM, as documented), every output cell written, NaN propagated,
bad arguments named; and the route's choice of product where it is not available (the CPU, other GPUs)."""

from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import HAS_CUDA, counted_calls, nvrtc_compiles
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import LazyTensor, Vi, Vj, gemm_route, hopper_gemm, nvrtc

HOPPER = HAS_CUDA and hopper_gemm.available(torch.device("cuda"))
needs_hopper = [pytest.mark.cuda, pytest.mark.skipif(not HOPPER, reason="no sm_90 GPU with NVRTC for sm_90a")]


def split_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T by the promoted kernel, from the route's 3xTF32 operands."""
    return hopper_gemm.mm_nt(gemm_route._three_tf32(a, small_first=True), gemm_route._three_tf32(b, small_first=False))


def test_promoted_runs_as_the_ieee_product_where_not_available(monkeypatch):
    assert gemm_route.runnable_mode(gemm_route.PROMOTED, torch.device("cpu")) == gemm_route.IEEE
    assert gemm_route.runnable_mode(gemm_route.THREE_TF32, torch.device("cpu")) == gemm_route.THREE_TF32
    assert not hopper_gemm.available(torch.device("cpu"))
    if HAS_CUDA:
        monkeypatch.setenv("SEMIRING_OPS_LAZY_WGMMA", "0")
        assert gemm_route.runnable_mode(gemm_route.PROMOTED, torch.device("cuda")) == gemm_route.IEEE


def test_a_structure_passed_by_value_packs_as_bytes():
    """The tensor maps go to the kernel as 128-byte parameters (nvrtc._struct_code), other types as before."""
    assert nvrtc._struct_code(ctypes.c_char * 128) == "128s"
    assert nvrtc._struct_code(ctypes.c_int) == "i"
    assert nvrtc._struct_code(ctypes.c_void_p) == "P"
    assert nvrtc._struct_code(ctypes.c_int * 4) is None


KBEST_SOURCES = [hopper_gemm.KBEST_SOURCE.format(k=k, largest=largest) for k, largest in ((1, 0), (10, 0), (16, 1))]


@pytest.mark.parametrize("source", [hopper_gemm.SOURCE, *KBEST_SOURCES])
def test_the_sources_compile_with_nvrtc_for_sm90a(source):
    """The runtime's own compiler (libnvrtc, no GPU needed) accepts the Hopper sources, to sm_90a cubins: CI, with no
    GPU, still proves the wgmma, TMA and mbarrier code compiles as users' first calls compile it."""
    assert nvrtc_compiles(source, "sm_90a", "test_hopper")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), d=st.integers(1, 150), seed=st.integers(0, 2**31 - 1))
def test_against_float64_at_sizes_that_straddle_tiles(device, m, n, d, seed):
    """Every cell within 2^-19 of sum |a||b| (H200: up to 2^-21.4 seen, as the SGEMM's and cuBLAS 3xTF32's): the TF32
    operands' truncation of lo (2^-22 of a product each) and the truncating accumulation of one 32-deep tile
    (promotion keeps it to one tile). A wrong tile, swizzle or fragment layout is off by O(1) of it."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, d, device=device, generator=g) * 3
    b = torch.randn(n, d, device=device, generator=g)
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T + 1e-30
    out = split_product(a, b)
    assert out.shape == (m, n) and out.dtype == torch.float32
    worst = ((out.double() - ref).abs() / scale).max().item()
    assert worst <= 2.0**-19, worst


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_every_cell_is_written(device):
    """The output comes from the caching allocator: blocks of NaN freed just before are what it gets, so a cell the
    kernel skipped would stay NaN. Sizes one past a tile, and a depth past a TMA box."""
    for m, n, d in ((129, 257, 33), (128, 128, 32), (1, 385, 11), (700, 3, 64)):
        poison = torch.full((m * n + 4096,), float("nan"), device=device)
        del poison
        a, b = torch.randn(m, d, device=device), torch.randn(n, d, device=device)
        out = split_product(a, b)
        assert not out.isnan().any(), (m, n, d)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_near_neighbours_beat_the_sgemm(device):
    """Unit-norm embeddings in clusters, cosine ~0.96 (benchmarks/wgmma_probe.py's data), D = 768: x.y's max error
    below the SGEMM's (H200: 3.6e-7 against 1.6e-6; cuBLAS's unpromoted 3xTF32 5.2e-6)."""
    g = torch.Generator(device=device).manual_seed(3)
    c = torch.randn(16, 768, device=device, generator=g)
    y = c.repeat_interleave(64, 0) + 0.2 * torch.randn(1024, 768, device=device, generator=g) / 768**0.5
    y /= y.norm(dim=1, keepdim=True)
    x = y[:512] + 0.05 * torch.randn(512, 768, device=device, generator=g) / 768**0.5
    x /= x.norm(dim=1, keepdim=True)
    ref = x.double() @ y.double().T
    ours = (split_product(x, y).double() - ref).abs().max().item()
    sgemm = (gemm_route.route_mm(x, y.T, gemm_route.IEEE).double() - ref).abs().max().item()
    unpromoted = (gemm_route.route_mm(x, y.T, gemm_route.THREE_TF32).double() - ref).abs().max().item()
    assert ours < sgemm and 3 * ours < unpromoted


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_nan_and_inf_propagate(device):
    a, b = torch.randn(200, 40, device=device), torch.randn(150, 40, device=device)
    a[3, 5] = float("nan")
    b[7, 0] = float("inf")
    out = split_product(a, b)
    assert out[3].isnan().all()
    assert not out[:, 7].isfinite().any()  # inf, or NaN where the split's inf - inf meets it
    mask = torch.ones_like(out, dtype=torch.bool)
    mask[3], mask[:, 7] = False, False
    assert out[mask].isfinite().all()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_bad_arguments_are_named(device):
    a = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="float32"):
        hopper_gemm.mm_nt(a.double(), a.double())
    with pytest.raises(ValueError, match=r"\(4, 8\) and \(4, 7\)"):
        hopper_gemm.mm_nt(a, a[:, :7])
    with pytest.raises(ValueError, match="sm_90"):
        hopper_gemm.mm_nt(a, a.cpu())
    assert hopper_gemm.mm_nt(a[:0], a).shape == (0, 4)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_the_route_sums_with_it_by_default(device, compiled, monkeypatch):
    """A Gaussian sum at D = 256 on near-neighbour embeddings: the default (promoted) at least as accurate as the
    SGEMM (SEMIRING_OPS_LAZY_WGMMA=0) and both well within the documented 2e-5."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    g = torch.Generator(device=device).manual_seed(5)
    c = torch.randn(20, 256, device=device, generator=g)
    y = c.repeat_interleave(100, 0) + 0.2 * torch.randn(2000, 256, device=device, generator=g) / 16
    y /= y.norm(dim=1, keepdim=True)
    x = y[torch.randperm(2000, device=device, generator=g)[:700]] + 0.05 * torch.randn(700, 256, device=device) / 16
    x /= x.norm(dim=1, keepdim=True)
    b = torch.randn(2000, 3, device=device, generator=g)
    ref = (-20 * torch.cdist(x.double(), y.double()).square()).exp() @ b.double()

    def error() -> float:
        out = (-20 * ((Vi(x) - Vj(y)) ** 2).sum(-1)).exp() @ b
        return ((out.double() - ref).abs().amax(1) / ref.abs().amax(1)).median().item()

    promoted = error()
    monkeypatch.setenv("SEMIRING_OPS_LAZY_WGMMA", "0")
    sgemm = error()
    assert promoted <= 1.2 * sgemm and sgemm <= 2e-5


def kbest_keys(x: torch.Tensor, y: torch.Tensor, dot: bool) -> tuple[torch.Tensor, hopper_gemm.Distance | None]:
    """float64 keys (M, N), x.y or |x - y|^2, and kbest_nt's Distance for the latter (no shift, no weights)."""
    if dot:
        return x.double() @ y.double().T, None
    keys = torch.cdist(x.double(), y.double()).square()
    return keys, hopper_gemm.Distance((x * x).sum(1), (y * y).sum(1), x, y, None, 1 / 64)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 400),
    d=st.integers(1, 80),
    k=st.sampled_from([1, 3, 10, 16]),
    dot=st.booleans(),
    largest=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_kbest_against_float64(device, m, n, d, k, dot, largest, seed):
    """The k best keys (a squared distance or a dot product, the smallest or the largest) at sizes that straddle the
    tiles and the column parts: the selected keys are float64's k best up to the 3xTF32 error, each index once, -1
    exactly past the n columns."""
    g = torch.Generator(device=device).manual_seed(seed)
    x, y = torch.randn(m, d, device=device, generator=g), torch.randn(n, d, device=device, generator=g)
    ref, distance = kbest_keys(x, y, dot)
    split = gemm_route._three_tf32
    got = hopper_gemm.kbest_nt(split(x, True), split(y, False), k, largest, distance)
    assert got.shape == (m, k) and got.dtype == torch.int64
    filled = min(k, n)
    assert (got[:, filled:] == -1).all() and (got[:, :filled] >= 0).all() and (got[:, :filled] < n).all()
    assert all(len(set(row.tolist())) == filled for row in got[:, :filled])
    want = ref.topk(filled, dim=1, largest=largest).values
    have = ref.gather(1, got[:, :filled]).sort(dim=1, descending=largest).values
    tol = 1e-5 * (x.double().norm(dim=1, keepdim=True) * y.double().norm(dim=1).max() + 1)
    assert ((have - want).abs() <= tol).all()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_kbest_over_many_column_parts(device):
    """20,000 x 30,000 at D = 40: 157 row tiles x 16 column parts, merged by topk; against float64 on 300 rows."""
    g = torch.Generator(device=device).manual_seed(11)
    x, y = torch.randn(20000, 40, device=device, generator=g), torch.randn(30000, 40, device=device, generator=g)
    split = gemm_route._three_tf32
    distance = hopper_gemm.Distance((x * x).sum(1), (y * y).sum(1), x, y, None, 1 / 64)
    got = hopper_gemm.kbest_nt(split(x, True), split(y, False), 10, False, distance)
    rows = torch.arange(0, 20000, 67, device=device)
    ref = torch.cdist(x[rows].double(), y.double()).square()
    want = ref.topk(10, dim=1, largest=False).values
    assert (ref.gather(1, got[rows]).sort(dim=1).values - want).abs().max() <= 1e-4


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
@pytest.mark.parametrize("largest", [False, True])
def test_kbest_when_every_tile_brings_better_keys(device, largest):
    """Integer x and y_j = (N + j) v, so every dot product is exact: each row's keys grow along j (x.v > 0), shrink
    (x.v < 0) or tie at 0. Where they improve along j, every later tile's keys all beat the list (each tile's
    candidates overflow the buffers and are scanned from shared memory); where they worsen, the filter passes
    nothing; ties go to the lower j."""
    g = torch.Generator(device=device).manual_seed(5)
    n = 20000
    x = torch.randint(-2, 3, (300, 24), device=device, generator=g).float()
    v = torch.randint(-2, 3, (24,), device=device, generator=g).float()
    y = (n + torch.arange(n, device=device, dtype=torch.float32))[:, None] * v
    split = gemm_route._three_tf32
    got = hopper_gemm.kbest_nt(split(x, True), split(y, False), 10, largest)
    first, last = torch.arange(10, device=device), torch.arange(n - 1, n - 11, -1, device=device)
    grows = (x @ v > 0)[:, None]
    want = torch.where((x @ v == 0)[:, None], first, torch.where(grows == largest, last, first))
    assert (x @ v > 0).any() and (x @ v < 0).any()
    assert (got == want).all()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_kbest_near_duplicates_are_summed_again(device):
    """Three near duplicates of each row (noise 1e-3, 2e-3, 4e-3) among 20,000 points of norm ~800, at random columns
    (most past a part's first tile: the filter's path): their |x|^2 + |y|^2 - 2 x.y cancels (error ~1 against
    distances of 6e-5..1e-3), so only the re-summation orders them; they come first, in order."""
    g = torch.Generator(device=device).manual_seed(9)
    x = torch.randn(200, 64, device=device, generator=g) + 100
    y = 30 * torch.randn(20000, 64, device=device, generator=g) + 100  # (the others: far, no cancelling)
    where = torch.randperm(20000, device=device, generator=g)[:600].view(200, 3)
    for i, scale in enumerate((1e-3, 2e-3, 4e-3)):
        y[where[:, i]] = x + scale * torch.randn(200, 64, device=device, generator=g)
    split = gemm_route._three_tf32
    distance = hopper_gemm.Distance((x * x).sum(1), (y * y).sum(1), x, y, None, 1 / 64)
    got = hopper_gemm.kbest_nt(split(x, True), split(y, False), 5, False, distance)
    assert (got[:, :3] == where).all()
    ref = torch.cdist(x.double(), y.double()).square()
    assert (got[:, 3:] == ref.topk(5, dim=1, largest=False).indices[:, 3:]).float().mean() >= 0.99


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_kbest_orders_nan_as_the_plain_kernel(device):
    """A NaN row's keys are all NaN: its candidates are the first k columns (ties by the lower j). A NaN column is
    the last for the smallest (never chosen here: its distances are summed again, NaN) and the first for the
    largest."""
    x, y = torch.randn(130, 16, device=device), torch.randn(300, 16, device=device)
    x[5] = float("nan")
    y[77] = float("nan")
    split = gemm_route._three_tf32
    distance = hopper_gemm.Distance((x * x).sum(1), (y * y).sum(1), x, y, None, 1 / 64)
    smallest = hopper_gemm.kbest_nt(split(x, True), split(y, False), 4, False, distance)
    largest = hopper_gemm.kbest_nt(split(x, True), split(y, False), 4, True)
    assert smallest[5].tolist() == [0, 1, 2, 3] and largest[5].tolist() == [0, 1, 2, 3]
    others = torch.arange(130, device=device) != 5
    assert not (smallest[others] == 77).any()
    assert (largest[others, 0] == 77).all()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_kbest_bad_arguments_are_named(device):
    a = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="k must be"):
        hopper_gemm.kbest_nt(a, a, hopper_gemm.KBEST_MAX + 1, True)
    bad = hopper_gemm.Distance(torch.ones(3, device=device), a[:, 0], a, a, None, 1 / 64)
    with pytest.raises(ValueError, match="row_norms"):
        hopper_gemm.kbest_nt(a, a, 2, False, bad)
    assert hopper_gemm.kbest_nt(a, a[:0], 2, True).tolist() == [[-1, -1]] * 4


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
def test_the_route_selects_with_it(device, compiled, monkeypatch):
    """k-NN (K-best of a squared distance, weighted or not, with or without indices) and maximum inner product
    search take the fused kernel (forced on at every D); a longer list or another formula does not; all give float64's
    selection."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    monkeypatch.setenv("SEMIRING_OPS_LAZY_FUSED_KBEST", "1")
    calls = counted_calls(monkeypatch, hopper_gemm, "kbest_nt")
    g = torch.Generator(device=device).manual_seed(2)
    x, y = torch.randn(500, 64, device=device, generator=g), torch.randn(3000, 64, device=device, generator=g)
    w = torch.rand(64, device=device, generator=g) + 0.5
    d2 = torch.cdist(x.double(), y.double()).square()
    dw = ((x.double()[:, None] - y.double()[None]) ** 2 * w.double()).sum(-1)
    dot = x.double() @ y.double().T
    D = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    weighted = Vi(x).weightedsqdist(Vj(y), LazyTensor(w))
    cases = [
        (lambda: D.argKmin(10, dim=1), d2.topk(10, dim=1, largest=False).indices, True),
        (lambda: D.Kmin(5, dim=1), d2.topk(5, dim=1, largest=False).values, True),
        (lambda: weighted.argKmin(3, dim=1), dw.topk(3, dim=1, largest=False).indices, True),
        (lambda: (Vi(x) | Vj(y)).argKmax(7, dim=1), dot.topk(7, dim=1).indices, True),
        (lambda: D.argKmin(20, dim=1), d2.topk(20, dim=1, largest=False).indices, False),
        (lambda: (D + 1.0).argKmin(4, dim=1), d2.topk(4, dim=1, largest=False).indices, False),
    ]
    for run, want, fused in cases:
        before = calls["n"]
        got = run()
        assert (calls["n"] > before) == fused
        if got.dtype == torch.int64:
            assert (got == want).float().mean() >= 0.999
        else:
            assert ((got.double() - want).abs() / want.abs()).max() <= 1e-6


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_hopper)])
@pytest.mark.parametrize("setting", ["auto", "0", "1"])
def test_the_route_fuses_by_default_within_its_dimensions(device, compiled, monkeypatch, setting):
    """SEMIRING_OPS_LAZY_FUSED_KBEST: auto fuses a k-NN of FUSED_KBEST_DIMS components (not outside them), 1 at every
    D, 0 never; every path gives float64's neighbours."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    monkeypatch.setenv("SEMIRING_OPS_LAZY_FUSED_KBEST", setting)
    calls = counted_calls(monkeypatch, hopper_gemm, "kbest_nt")
    g = torch.Generator(device=device).manual_seed(4)
    low, high = gemm_route.FUSED_KBEST_DIMS
    for dim in (low - 1, low, high, high + 1):
        x, y = torch.randn(300, dim, device=device, generator=g), torch.randn(2000, dim, device=device, generator=g)
        before = calls["n"]
        got = ((Vi(x) - Vj(y)) ** 2).sum(-1).argKmin(5, dim=1)
        fused = setting == "1" or (setting == "auto" and low <= dim <= high)
        assert (calls["n"] > before) == fused
        want = torch.cdist(x.double(), y.double()).topk(5, dim=1, largest=False).indices
        assert (got == want).float().mean() >= 0.999
