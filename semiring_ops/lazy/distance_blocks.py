"""The CPU's blocks of squared distances in C++, for the GEMM route (gemm_route.block_gram): a block (rows, n_inner)
of sum_d w_d (x_id - y_jd)^2.

- Few components (D <= DIRECT_MAX_DIM): the distances summed directly, in increasing d, each row's cells in one
  vectorised pass per component over a row that stays in L1 (y transposed, so its lanes read consecutive j).
  Exact as the formula is written; no GEMM and nothing to cancel. At D = 3 on 2 cores this is faster than the
  GEMM (of depth D + 2 then) with the pass below (measurements in DIRECT_MAX_DIM's comment).
- Otherwise gemm_route's GEMM gives -2 x.y (the points shifted by the inner terms' mean), and complete_distances
  adds |x|^2 + |y|^2 in one vectorised pass per row (a GEMM of depth D, not D + 2 with the norms folded in: 0.2-0.9
  ms of a 4,000 x 2,000 one on 2 cores at D = 64-256). Where the sum is below 1 / GRAM_CANCEL of |x|^2 + |y|^2 it
  has lost its digits, and the cell is summed again from the unshifted variables, as the plain kernel sums it (the
  rule the generated kernels apply inline, codegen._gram_cells): the same pass ORs the flags of a group of lanes,
  then the rare cells are summed again in place. Done with torch, finding those cells took a compare, a nonzero
  and a gather over the whole block: half of a 4,000 x 2,000 Gaussian K @ b at D = 3 (nonzero alone 6.4 of 22 ms).
- A Gaussian cell exp(a d) (linear_route's K @ b) is made in the same pass, group by group after the re-summation,
  by a vectorised exp (float32: within 1 ulp; the library's in float64): the block is not read again for the cell.
  4,000 x 2,000, b of 16-64 columns, 2 cores: torch form / ours 0.81-1.00 before, 1.06-1.17 after at D = 64-128
  (docs/benchmarks.md).

Rows are spread over OpenMP threads. The library is compiled once per machine by the lazy kernels' host compiler
(host_compiler.py, ~0.65 s) and cached with them.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from .codegen import GRAM_CANCEL
from .cpu_kernels import cpu_threads
from .host_compiler import HostFunction, compile_host_library

__all__ = ["DIRECT_MAX_DIM", "complete_distances", "squared_distances"]

_SOURCE = r"""
#include <cstdint>
#include <cstring>

namespace {

constexpr int kLanes = 16;

// 2^k for an integer k in [-126, 127], as a float's bits
inline float pow2(int32_t k) {
  const uint32_t bits = uint32_t(k + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// exp(x) in float32, branch-free (selects), so that a group's loop vectorises: x = n ln 2 + f with n an integer
// and |f| <= ln(2) / 2, f reduced by two constants (Cody and Waite: exact to the float's rounding for every x here),
// e^f by its Taylor series to degree 7 (remainder below 6e-9 relative), times 2^n as two factors 2^(n/2) so that the
// subnormal results and the overflow to inf come out right (x is clamped to [-110, 90], past which the result is 0
// or inf anyway). NaN stays NaN.
inline float exp_cell(float x) {
  const float xc = x < -110.f ? -110.f : (x > 90.f ? 90.f : x);                   // (NaN passes unchanged)
  const float r = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;          // n: to nearest (1.5 * 2^23)
  float f = __builtin_fmaf(r, -0.693145751953125f, xc);                          // ln 2's leading bits: r ln2_hi exact
  f = __builtin_fmaf(r, -1.428606765330187045e-06f, f);
  float p = 1.f / 5040.f;
  p = __builtin_fmaf(p, f, 1.f / 720.f);
  p = __builtin_fmaf(p, f, 1.f / 120.f);
  p = __builtin_fmaf(p, f, 1.f / 24.f);
  p = __builtin_fmaf(p, f, 1.f / 6.f);
  p = __builtin_fmaf(p, f, 0.5f);
  p = __builtin_fmaf(p, f, 1.f);
  p = __builtin_fmaf(p, f, 1.f);
  const int32_t n = int32_t(r == r ? r : 0.f), half = n / 2;
  return p * pow2(half) * pow2(n - half);
}
inline double exp_cell(double x) { return __builtin_exp(x); }

// complete's rare cells of a group [j0, j0 + lanes) of row i: those whose sum cancelled, summed again from the
// variables
template <typename T>
void resum(T* row, const T* xi, const T* y, T nxi, const T* ny, const T* w, int64_t j0, int64_t lanes, int64_t dim,
           T ratio) {
  for (int64_t l = 0; l < lanes; ++l) {
    const int64_t j = j0 + l;
    if (row[j] >= ratio * (nxi + ny[j])) continue;
    const T* yj = y + j * dim;
    T s = T(0);
    for (int64_t d = 0; d < dim; ++d) {
      const T diff = xi[d] - yj[d];
      s += w ? w[d] * (diff * diff) : diff * diff;
    }
    row[j] = s;
  }
}

// values (rows, cols) row-major, the GEMM's -2 w x.y of the shifted variables, made nx + ny + that in place; x
// (rows, dim) and y (cols, dim) the unshifted variables, row-major; nx (rows), ny (cols) the shifted squared norms;
// w (dim) the weights or null. A cell v is summed again where !(v >= ratio * (nx + ny)) (NaN included). With
// apply_exp, each finished group of cells d is then made exp(scale d) in place (a Gaussian cell: no second pass).
template <typename T>
void complete(T* values, const T* x, const T* y, const T* nx, const T* ny, const T* w, int64_t rows, int64_t cols,
              int64_t dim, double ratio_in, int apply_exp, double scale_in, int threads) {
  const T ratio = T(ratio_in), scale = T(scale_in);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    T* row = values + i * cols;
    const T nxi = nx[i];
    const T* xi = x + i * dim;
    for (int64_t j0 = 0; j0 < cols; j0 += kLanes) {
      const int64_t lanes = cols - j0 < kLanes ? cols - j0 : kLanes;
      int bad = 0;  // (one loop for every group: a fixed count of 16 is unrolled whole and not vectorised)
      for (int64_t l = 0; l < lanes; ++l) {
        const T total = nxi + ny[j0 + l];
        row[j0 + l] += total;
        bad |= !(row[j0 + l] >= ratio * total);
      }
      if (bad) resum(row, xi, y, nxi, ny, w, j0, lanes, dim, ratio);
      if (apply_exp)
        for (int64_t l = 0; l < lanes; ++l) row[j0 + l] = exp_cell(scale * row[j0 + l]);
    }
  }
}

// out (rows, cols) = sum_d w_d (x_id - y_jd)^2, x (rows, dim) and yt (dim, cols) row-major, w (dim) or null
template <typename T>
void sqdist(T* out, const T* x, const T* yt, const T* w, int64_t rows, int64_t cols, int64_t dim, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    T* row = out + i * cols;
    const T* xi = x + i * dim;
    for (int64_t j = 0; j < cols; ++j) row[j] = T(0);
    for (int64_t d = 0; d < dim; ++d) {
      const T xv = xi[d];
      const T wv = w ? w[d] : T(1);
      const T* yd = yt + d * cols;
      for (int64_t j = 0; j < cols; ++j) {
        const T diff = xv - yd[j];
        row[j] += wv * (diff * diff);
      }
    }
  }
}

}  // namespace

extern "C" void sqdist_float(float* out, const float* x, const float* yt, const float* w, int64_t rows, int64_t cols,
                             int64_t dim, int threads) {
  sqdist<float>(out, x, yt, w, rows, cols, dim, threads);
}

extern "C" void sqdist_double(double* out, const double* x, const double* yt, const double* w, int64_t rows,
                              int64_t cols, int64_t dim, int threads) {
  sqdist<double>(out, x, yt, w, rows, cols, dim, threads);
}

extern "C" void complete_float(float* v, const float* x, const float* y, const float* nx, const float* ny,
                               const float* w, int64_t rows, int64_t cols, int64_t dim, double ratio, int apply_exp,
                               double scale, int threads) {
  complete<float>(v, x, y, nx, ny, w, rows, cols, dim, ratio, apply_exp, scale, threads);
}

extern "C" void complete_double(double* v, const double* x, const double* y, const double* nx, const double* ny,
                                const double* w, int64_t rows, int64_t cols, int64_t dim, double ratio, int apply_exp,
                                double scale, int threads) {
  complete<double>(v, x, y, nx, ny, w, rows, cols, dim, ratio, apply_exp, scale, threads);
}
"""

# squared distances of at most this many components are summed directly (squared_distances), not read from a GEMM:
# 4,000 x 2,000 Gaussian K @ b of 16 columns on the 2-core machine (2026-11-30, timed alternately), directly / by
# the GEMM / the torch form: D = 3 10.6 / 11.3 / 11.3 ms, D = 4 9.9 / 10.9 / 11.3, D = 8 10.4 / 11.0 / 11.0,
# D = 12 11.5 / 11.6 / 11.7, D = 16 12.3 / 11.8 / 11.2
DIRECT_MAX_DIM = 8
_EXPORTS = ["complete_float", "complete_double", "sqdist_float", "sqdist_double"]
# values, x, y, nx, ny, w; rows, cols, dim; ratio, apply_exp, scale, threads
_COMPLETE_ARGS = (
    [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_double, ctypes.c_int, ctypes.c_double, ctypes.c_int]
)
_SQDIST_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
_functions: dict[tuple[str, torch.dtype], HostFunction] = {}
_lock = threading.Lock()


def _function(name: str, dtype: torch.dtype) -> HostFunction:
    """The library's ``name``_float or ``name``_double."""
    key = (name, dtype)
    fn = _functions.get(key)
    if fn is None:
        with _lock:
            fn = _functions.get(key)
            if fn is None:
                lib = compile_host_library(_SOURCE, _EXPORTS, "the CPU's distance blocks")
                suffix = "float" if dtype == torch.float32 else "double"
                fn = lib.function(f"{name}_{suffix}", _SQDIST_ARGS if name == "sqdist" else _COMPLETE_ARGS)
                _functions[key] = fn
    return fn


def squared_distances(
    x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(rows, cols) sum_d w_d (x_id - y_jd)^2 of x (rows, D) and y (cols, D), summed directly in increasing d (module
    docstring), into ``out`` (contiguous, (rows, cols)) when given. CPU, float32 or float64."""
    if x.dtype not in (torch.float32, torch.float64) or y.dtype != x.dtype:
        raise ValueError(f"squared_distances: x and y must be float32 / float64 alike, got {x.dtype}, {y.dtype}")
    rows, cols = x.shape[0], y.shape[0]
    if out is None:
        out = torch.empty(rows, cols, dtype=x.dtype)
    elif out.shape != (rows, cols) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"squared_distances: out must be contiguous {x.dtype} of shape {(rows, cols)}")
    if rows == 0 or cols == 0:
        return out
    x, yt = x.contiguous(), y.t().contiguous()
    w = weights.to(x.dtype).contiguous() if weights is not None else None
    _function("sqdist", x.dtype).call(
        out.data_ptr(),
        x.data_ptr(),
        yt.data_ptr(),
        w.data_ptr() if w is not None else None,
        rows,
        cols,
        x.shape[1],
        cpu_threads(rows, cols),
    )
    return out


def complete_distances(
    values: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    nx: torch.Tensor,
    ny: torch.Tensor,
    weights: torch.Tensor | None,
    exp_scale: float | None = None,
) -> None:
    """In place: ``values`` (rows, cols), the GEMM's -2 sum_d w_d xs_id ys_jd of the shifted variables, made the
    squared distances nx + ny + that, and the cells that cancel (module docstring) summed again from ``x`` (rows, D)
    and ``y`` (cols, D), in one pass. ``nx`` (rows,) and ``ny`` (cols,) are the shifted squared norms, ``weights``
    (D,) a weighted distance's or None. ``exp_scale``: each distance d then made exp(exp_scale d) in the same pass
    (float32: a vectorised exp of ~1-2 ulp, subnormals and inf as torch.exp gives them; float64: the library's).
    CPU, float32 or float64, values contiguous; the others are made contiguous here."""
    if values.dtype not in (torch.float32, torch.float64) or not values.is_contiguous():
        raise ValueError(f"complete_distances: values must be contiguous float32 / float64, got {values.dtype}")
    rows, cols = values.shape
    if rows == 0 or cols == 0:
        return
    x, y, nx, ny = (t.to(values.dtype).contiguous() for t in (x, y, nx.reshape(-1), ny.reshape(-1)))
    w = weights.to(values.dtype).contiguous() if weights is not None else None
    _function("complete", values.dtype).call(
        values.data_ptr(),
        x.data_ptr(),
        y.data_ptr(),
        nx.data_ptr(),
        ny.data_ptr(),
        w.data_ptr() if w is not None else None,
        rows,
        cols,
        x.shape[1],
        1.0 / GRAM_CANCEL,
        int(exp_scale is not None),
        float(exp_scale) if exp_scale is not None else 0.0,
        cpu_threads(rows, cols),
    )
