"""The CPU GEMM route's cancellation rule applied to a block of squared distances in one pass of C++.

gemm_route.block_gram reads a block of squared distances (rows, n_inner) from one GEMM as |x|^2 + |y|^2 - 2 x.y
(the points shifted by the inner terms' mean). Where that is below 1 / GRAM_CANCEL of |x|^2 + |y|^2 it has lost
its digits, and the cell is summed again from the unshifted variables, as the plain kernel sums it (the rule the
generated kernels apply inline, codegen._gram_cells). Done with torch, finding those cells took a compare, a
nonzero and a gather over the whole block: half of a 4,000 x 2,000 Gaussian K @ b at D = 3 on 2 cores (nonzero
alone 6.4 of 22 ms). Here each row is one vectorised compare pass that ORs the flags of a group of lanes, then
the rare cells summed again in place, rows spread over OpenMP threads. The library is compiled once per machine
by the lazy kernels' host compiler (host_compiler.py) and cached with them.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from .codegen import GRAM_CANCEL
from .cpu_kernels import cpu_threads
from .host_compiler import HostFunction, compile_host_library

__all__ = ["resum_cancelled"]

_SOURCE = r"""
#include <cstdint>

namespace {

constexpr int kLanes = 16;

// values (rows, cols) row-major; x (rows, dim) and y (cols, dim) the unshifted variables, row-major; nx (rows),
// ny (cols) the shifted squared norms; w (dim) the weights or null. A cell v is summed again where
// !(v >= ratio * (nx + ny)) (NaN included).
template <typename T>
void resum(T* values, const T* x, const T* y, const T* nx, const T* ny, const T* w, int64_t rows, int64_t cols,
           int64_t dim, double ratio_in, int threads) {
  const T ratio = T(ratio_in);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    T* row = values + i * cols;
    const T nxi = nx[i];
    const T* xi = x + i * dim;
    for (int64_t j0 = 0; j0 < cols; j0 += kLanes) {
      const int64_t lanes = cols - j0 < kLanes ? cols - j0 : kLanes;
      int bad = 0;  // (one loop for every group: a fixed count of 16 is unrolled whole and not vectorised)
      for (int64_t l = 0; l < lanes; ++l) bad |= !(row[j0 + l] >= ratio * (nxi + ny[j0 + l]));
      if (!bad) continue;
      for (int l = 0; l < lanes; ++l) {
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
  }
}

}  // namespace

extern "C" void resum_float(float* v, const float* x, const float* y, const float* nx, const float* ny,
                            const float* w, int64_t rows, int64_t cols, int64_t dim, double ratio, int threads) {
  resum<float>(v, x, y, nx, ny, w, rows, cols, dim, ratio, threads);
}

extern "C" void resum_double(double* v, const double* x, const double* y, const double* nx, const double* ny,
                             const double* w, int64_t rows, int64_t cols, int64_t dim, double ratio, int threads) {
  resum<double>(v, x, y, nx, ny, w, rows, cols, dim, ratio, threads);
}
"""

_ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_double, ctypes.c_int]
_functions: dict[torch.dtype, HostFunction] = {}
_lock = threading.Lock()


def _function(dtype: torch.dtype) -> HostFunction:
    fn = _functions.get(dtype)
    if fn is None:
        with _lock:
            fn = _functions.get(dtype)
            if fn is None:
                name = "resum_float" if dtype == torch.float32 else "resum_double"
                fn = _functions[dtype] = compile_host_library(
                    _SOURCE, ["resum_float", "resum_double"], "the GEMM route's cancellation pass"
                ).function(name, _ARGTYPES)
    return fn


def resum_cancelled(
    values: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    nx: torch.Tensor,
    ny: torch.Tensor,
    weights: torch.Tensor | None,
) -> None:
    """In place: the cells of ``values`` (rows, cols), squared distances read from the shifted GEMM, that cancel
    (module docstring) summed again from ``x`` (rows, D) and ``y`` (cols, D). ``nx`` (rows,) and ``ny`` (cols,) are
    the shifted squared norms, ``weights`` (D,) a weighted distance's or None. CPU, float32 or float64, values
    contiguous; the others are made contiguous here."""
    if values.dtype not in (torch.float32, torch.float64) or not values.is_contiguous():
        raise ValueError(f"resum_cancelled: values must be contiguous float32 / float64, got {values.dtype}")
    rows, cols = values.shape
    if rows == 0 or cols == 0:
        return
    x, y, nx, ny = (t.to(values.dtype).contiguous() for t in (x, y, nx.reshape(-1), ny.reshape(-1)))
    w = weights.to(values.dtype).contiguous() if weights is not None else None
    _function(values.dtype).call(
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
        cpu_threads(rows, cols),
    )
