"""The log bmm's exponential on the FMA pipe (semiring.h exp2_poly) and its guarded tile path (semiring.h
LogSumExp2TileAccumulator, run by the CUDA tile engine; issue 29).

Host part (no GPU): semiring.h compiled for the host into a tiny shared library (the same SR_HD code the GPU runs,
with floor / std::fma in place of the rounding-mode add / __fmaf_rn: the same values), then
- exp2_poly's relative error against float64 over its whole domain, and at the ranges where it is weakest
  (f = x - floor(x) near 0 and near 1, results near the underflow and overflow edges), and its semantics
  (-inf, +inf, NaN, the clamps);
- the tile accumulator driven exactly as the engine drives it (first tile exact, later tiles on the fast path with
  a share of exp2_poly, the check, the exact redo, the partial tail) on adversarial term sequences, against float64.
Kernel part (CPU and CUDA kernels): the log bmm and its gradients at those ranges against float64, at the
tolerances of test_bmm_forward.py / test_bmm_backward.py.
"""

from __future__ import annotations

import ctypes
import math
import subprocess

import numpy as np
import pytest
import torch
from brute import bmm as brute_bmm
from test_bmm_forward import TOL, _assert_close

import semiring_ops as so
from semiring_ops.build import jit, toolkit

# exp2_poly's measured bound (semiring.h): 2^-22.5; ex2.approx.f32's is about 2^-22
POLY_MAX_REL = 1.68e-7

_HARNESS = r"""
#include "semiring.h"
using namespace semiring_ops;

extern "C" void exp2_poly_n(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = exp2_poly(x[i]);
}

// One output of the log bmm as the CUDA engine computes it with LogBmmPolicy (tile_engine.cuh, bmm_policy.cuh):
// tiles of 16 terms; the first full tile on the exact path (add_chunk<4>); each later full tile on the fast path,
// term t of the tile taking exp2_poly when in_share_of_16 says so for idx = 16 t + cell, then tile_ok ? commit :
// the exact path again; the partial last tile through add(). v: the terms in base 2. Returns the number of
// full tiles after the first that took the exact path.
extern "C" int lse_tiles(const float* v, int k, int cell, int poly_per_16, float* out) {
  LogSumExp2TileAccumulator st;
  st.init();
  int redone = 0;
  for (int k0 = 0; k0 < k; k0 += 16) {
    if (k - k0 < 16) {
      for (int t = k0; t < k; ++t) st.add(v[t], t);
      break;
    }
    bool exact = k0 == 0;
    if (!exact) {
      for (int t = 0; t < 16; ++t) {
        const int idx = 16 * t + cell;
        st.add_fast(v[k0 + t], t == 0, ((idx + 5 * (idx >> 4)) & 15) < poly_per_16);
      }
      if (st.tile_ok()) {
        st.tile_commit();
      } else {
        exact = true;
        ++redone;
      }
    }
    if (exact)
      for (int t = 0; t < 16; t += 4) st.add_chunk<4>(v + k0 + t);
  }
  *out = st.result();
  return redone;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """semiring.h's exp2_poly and LogSumExp2TileAccumulator, compiled for the host (ctypes)."""
    cxx = toolkit.cxx_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("exp2_poly")
    (d / "harness.cpp").write_text(_HARNESS)
    lib = d / "harness.so"
    cmd = [cxx, "-O2", "-std=c++17", "-fPIC", "-shared", f"-I{jit.source_root()}", str(d / "harness.cpp"), "-o"]
    subprocess.run([*cmd, str(lib)], check=True, capture_output=True)
    h = ctypes.CDLL(str(lib))
    fp = ctypes.POINTER(ctypes.c_float)
    h.exp2_poly_n.argtypes = [fp, fp, ctypes.c_long]
    h.lse_tiles.argtypes = [fp, ctypes.c_int, ctypes.c_int, ctypes.c_int, fp]
    h.lse_tiles.restype = ctypes.c_int
    return h


def _exp2_poly(h, x) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    fp = ctypes.POINTER(ctypes.c_float)
    h.exp2_poly_n(x.ctypes.data_as(fp), y.ctypes.data_as(fp), x.size)
    return y


def _max_rel_err(h, x) -> float:
    x = np.asarray(x, dtype=np.float32)
    y = _exp2_poly(h, x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    return float(np.max(np.abs(y - ref) / ref))


def test_exp2_poly_error_over_the_reduced_range(harness):
    """Every float32 f in [0, 1) with its last 8 bits zero (2^22 points), plus f near 0 and near 1 one ulp at a time:
    the polynomial's whole range. 2^(n + f) differs only by the exact scale 2^n, so this is the error everywhere."""
    bits = np.arange(0, np.float32(1.0).view(np.uint32), 256, dtype=np.uint32)
    f = bits.view(np.float32)
    near0 = np.arange(1, 1 << 16, dtype=np.uint32).view(np.float32)  # subnormal and tiny f
    near1 = (np.float32(1.0).view(np.uint32) - np.arange(1, 1 << 16, dtype=np.uint32)).view(np.float32)
    err = _max_rel_err(harness, np.concatenate([f, near0, near1]))
    assert err <= POLY_MAX_REL, f"max relative error {err:.4g} > {POLY_MAX_REL:.4g}"
    assert err > 1.0e-7  # the measured bound is tight: a better one would mean the test no longer sees f near 1


@pytest.mark.parametrize("n", [-126, -125, -64, -1, 0, 1, 63, 64, 126, 127])
def test_exp2_poly_error_at_every_scale(harness, n):
    """x = n + f for f spread over [0, 1): the same relative error at the underflow edge (n = -126: results
    2^-126 .. 2^-125, the smallest normal floats), the overflow edge (n = 127) and in between."""
    f = np.random.default_rng(n + 200).random(1 << 15).astype(np.float32)
    x = np.float32(n) + f  # exact for these n
    x = x[(x - np.float32(n)) == f]
    assert _max_rel_err(harness, x) <= POLY_MAX_REL


def test_exp2_poly_special_values_match_ex2_approx_ftz(harness):
    """The GPU's ex2.approx.ftz: results below 2^-126 flush to +0, 2^128 and above overflow to +inf, -inf -> 0,
    +inf -> inf, NaN -> NaN; integers give exact powers of two."""
    fmax = np.finfo(np.float32).max
    x = np.array([-np.inf, -fmax, -1e30, -200.0, -127.0, -126.999, -126.5, -126.0001, np.inf, fmax, 1e30, 128.0],
                 dtype=np.float32)  # fmt: skip
    y = _exp2_poly(harness, x)
    assert np.array_equal(y, [0.0] * 8 + [np.inf] * 4)
    assert np.all(np.signbit(y[:8]) == 0)  # +0
    assert np.isnan(_exp2_poly(harness, np.array([np.nan], dtype=np.float32))).all()
    ints = np.arange(-126, 128, dtype=np.float32)
    assert np.array_equal(_exp2_poly(harness, ints), np.exp2(ints.astype(np.float64)).astype(np.float32))
    below = np.nextafter(np.float32(128.0), np.float32(0.0))  # 2^127.99999: finite, as ex2.approx gives
    assert np.isfinite(_exp2_poly(harness, np.array([below, 127.5], dtype=np.float32))).all()
    assert _exp2_poly(harness, np.array([-126.0], dtype=np.float32))[0] == np.float32(2.0**-126)


def _lse_tiles(h, v: np.ndarray, cell: int = 0, poly_per_16: int = 3) -> tuple[float, int]:
    v = np.ascontiguousarray(v, dtype=np.float32)
    out = ctypes.c_float()
    fp = ctypes.POINTER(ctypes.c_float)
    redone = h.lse_tiles(v.ctypes.data_as(fp), v.size, cell, poly_per_16, ctypes.byref(out))
    return out.value, redone


def _lse_ref(v: np.ndarray) -> float:
    """float64 log(sum(exp(x))) of terms given in base 2 (x = v ln 2)."""
    v = v.astype(np.float64)
    if np.isnan(v).any():
        return math.nan
    if (v == np.inf).any():
        return math.inf
    m = v.max()
    if m == -np.inf:
        return -math.inf
    return float((m + np.log2(np.exp2(v - m).sum())) * math.log(2.0))


def _close(got: float, ref: float) -> bool:
    """got within test_bmm_forward's float32 tolerance of ref; non-finite values must match exactly."""
    if not math.isfinite(ref):
        return got == ref or (math.isnan(got) and math.isnan(ref))
    return abs(got - ref) <= TOL[torch.float32] * max(1.0, abs(ref))


def _rng_terms(seed: int, k: int, scale: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(k) * scale).astype(np.float32)


def _ramp(k: int, step: float) -> np.ndarray:
    return (np.arange(k) * step).astype(np.float32)


def _spikes(k: int) -> np.ndarray:
    v = _rng_terms(3, k, 2.0)
    at = np.array([20, 77, 150])  # > 64 above the running maximum, inside fast tiles
    v[at[at < k]] = np.array([90.0, 300.0, 1e6], dtype=np.float32)[at < k]
    return v


def _clamp_edge(k: int) -> np.ndarray:
    v = np.full(k, -126.5, dtype=np.float32)  # 2^(x - m) below 2^-126 relative to the maximum: flushed
    v[min(40, k - 1)] = 0.0
    v[41:60] = np.float32(-125.9)  # just above the edge: kept (and negligible)
    return v


def _near_integers(k: int) -> np.ndarray:
    # x = v - m with f = x - floor(x) one ulp above 0 and one ulp below 1: the polynomial's ends
    v = np.zeros(k, dtype=np.float32)
    v[:16] = 3.0  # m = 3 after the first tile
    n = np.arange(k - 16) % 5
    up = np.nextafter(n.astype(np.float32), np.float32(10.0))
    down = np.nextafter(n.astype(np.float32), np.float32(-10.0))
    v[16:] = np.where(np.arange(k - 16) % 2 == 0, up, down) - np.float32(2.0)
    return v


CASES = {
    "randn": lambda k: _rng_terms(0, k, 3.0),
    "wide": lambda k: _rng_terms(1, k, 200.0),  # huge dynamic range: most terms flush, the maximum moves
    "offset": lambda k: _rng_terms(2, k, 3.0) - np.float32(1e4),  # every term far below 0
    "ramp_up": lambda k: _ramp(k, 7.0),  # the maximum grows every term: the check fails again and again
    "ramp_down": lambda k: _ramp(k, -7.0),
    "slow_ramp": lambda k: _ramp(k, 0.3),  # grows by < 64 per tile: kept on the fast path, s grows large
    "spikes": _spikes,
    "clamp_edge": _clamp_edge,
    "near_integers": _near_integers,
    "first_tile_neg_inf": lambda k: np.where(np.arange(k) < 16, -np.inf, _rng_terms(4, k, 3.0)).astype(np.float32),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("k", [16, 40, 160, 333])
@pytest.mark.parametrize("poly_per_16", [0, 3, 16])
def test_tile_accumulator_matches_float64(harness, case, k, poly_per_16):
    v = CASES[case](k)
    for cell in (0, 7):
        got, _ = _lse_tiles(harness, v, cell, poly_per_16)
        assert _close(got, _lse_ref(v)), (got, _lse_ref(v))


def test_tile_accumulator_takes_both_paths(harness):
    """The cases above do exercise the redo: a ramp redoes every tile, randn none, spikes exactly theirs."""
    assert _lse_tiles(harness, CASES["randn"](160))[1] == 0
    assert _lse_tiles(harness, CASES["ramp_up"](160))[1] == 9
    assert _lse_tiles(harness, CASES["slow_ramp"](160))[1] == 0
    assert _lse_tiles(harness, _spikes(160))[1] == 3


@pytest.mark.parametrize(
    "special, want",
    [(-np.inf, "finite"), (np.inf, math.inf), (np.nan, math.nan)],
    ids=["neg_inf", "pos_inf", "nan"],
)
@pytest.mark.parametrize("at", [3, 20, 47, 70])  # the exact first tile, fast tiles, the partial tail
def test_tile_accumulator_special_terms(harness, special, want, at):
    v = _rng_terms(5, 75, 3.0)
    v[at] = special
    got, _ = _lse_tiles(harness, v)
    if want == "finite":
        assert _close(got, _lse_ref(v))
    elif math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want


def test_tile_accumulator_all_neg_inf_and_nan_after_inf(harness):
    assert _lse_tiles(harness, np.full(70, -np.inf, dtype=np.float32))[0] == -math.inf
    v = _rng_terms(6, 70, 3.0)
    v[20], v[50] = np.inf, np.nan
    assert math.isnan(_lse_tiles(harness, v)[0])
    v = _rng_terms(7, 70, 3.0)
    v[20], v[21] = np.inf, -np.inf
    assert _lse_tiles(harness, v)[0] == math.inf


# ---------------------------------------------------------------- the kernels (CPU and CUDA)


# (a, b) generators in natural-log units; k spans several 16-deep tiles so that the fast path and its polynomial
# share run (the first tile is always exact), with a partial last tile
def _adversarial(kind: str, device: str, k: int = 83, wide: float = 300.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(len(kind) * 1000 + k)
    a = torch.randn(2, 37, k, generator=g, dtype=torch.float64)
    b = torch.randn(2, k, 70, generator=g, dtype=torch.float64)
    if kind == "wide":  # terms spread over hundreds of nats: most underflow, the maximum jumps
        a, b = a * wide, b * wide
    elif kind == "ramp":  # the maximum grows along k faster than the fast path allows: the exact redo every tile
        a = a + torch.arange(k, dtype=torch.float64) * 6.0
    elif kind == "slow_ramp":  # grows slowly: the fast path keeps m, the sum grows to ~2^60
        a = a + torch.arange(k, dtype=torch.float64) * 0.5
    elif kind == "clamp_edge":  # every term but the first ~87 nats (2^-126) below the maximum, or just above
        a = torch.full_like(a, -87.5)
        a[..., 0] = 0.0
        a[..., 30:50] = -87.0
        b = torch.zeros_like(b)
    elif kind == "near_integers":  # x = v - m one ulp from integers in base 2: f near 0 and near 1
        n = torch.arange(k, dtype=torch.float64) % 7
        a = (n + torch.where(torch.arange(k) % 2 == 0, 1e-7, -1e-7)) * math.log(2.0) + torch.zeros(2, 37, 1)
        a[..., :16] = 8 * math.log(2.0)
        b = torch.zeros_like(b)
    elif kind == "offset":
        a = a - 5000.0
    else:
        assert kind == "randn"
    return a.float().to(device), b.float().to(device)


KINDS = ["randn", "wide", "ramp", "slow_ramp", "clamp_edge", "near_integers", "offset"]


@pytest.mark.parametrize("kind", KINDS)
def test_log_bmm_at_the_polynomials_weak_ranges(device, kind):
    a, b = _adversarial(kind, device)
    out = so.logbmm(a, b)
    _assert_close(out, brute_bmm(a, b, "log"), torch.float32)


def test_log_bmm_special_values_inside_fast_tiles(device):
    """-inf rows and columns, +inf and NaN placed in the tiles after the first (the guarded fast path)."""
    a = torch.randn(2, 70, 90, device=device)
    b = torch.randn(2, 90, 66, device=device)
    a[0, 3, :] = -math.inf
    b[1, :, 65] = -math.inf
    a[0, 5, 40] = math.inf  # row 5 of batch 0: +inf unless NaN
    a[1, 7, 33] = math.nan
    b[0, 60, 9] = math.nan  # column 9 of batch 0: NaN (row 5 too: NaN wins over +inf)
    a[1, 9, 20] = -math.inf  # one -inf term among finite ones
    out = so.logbmm(a, b)
    ref = brute_bmm(a, b, "log").cpu()
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    _assert_close(out.cpu()[keep], ref[keep], torch.float32)


@pytest.mark.parametrize("kind", ["randn", "wide", "clamp_edge", "near_integers"])
def test_log_gradients_at_the_polynomials_weak_ranges(device, kind):
    """The gradients' exponentials (log_contract: exp(a + b - c), a share of them by exp2_poly) at those ranges.
    ("wide" at a smaller scale than the forward's: exp(a + b - c) in float32 loses ulp(|a| + |b| + |c|) of its
    exponent, which at hundreds of nats is beyond the gradients' tolerance on any float32 kernel.)"""
    a, b = _adversarial(kind, device, k=50, wide=25.0)
    a.requires_grad_()
    b.requires_grad_()
    g = torch.randn(2, 37, 70, device=device)
    ga, gb = torch.autograd.grad(so.logbmm(a, b), (a, b), g)
    a64 = a.detach().double().cpu().requires_grad_()
    b64 = b.detach().double().cpu().requires_grad_()
    ra, rb = torch.autograd.grad(brute_bmm(a64, b64, "log"), (a64, b64), g.double().cpu())
    scale = max(1.0, g.abs().max().item())
    torch.testing.assert_close(ga.double().cpu(), ra, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(gb.double().cpu(), rb, rtol=1e-4, atol=1e-4 * scale)
