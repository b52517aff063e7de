// semiring_ops::log_bmm_grads for CPU tensors (contract in ops.h): both gradients of c = logbmm(a, b),
//   grad_a[p, i, k] = sum_j w[p, i, k, j],   grad_b[p, k, j] = sum_i w[p, i, k, j],
//   w = g[p, i, j] * exp(a[p, i, k] + b[p, k, j] - c[p, i, j]),
// from one exponential per cell (two log_contract calls, one per gradient, compute each cell's exponential
// twice, and the exponential is the cost: 8 x 256^3, float32, 2 cores: 134 -> ~70 ms).
//
// Work split: a task owns a block of kBlockK rows of b (so the rows of grad_b and the columns of grad_a it
// writes are its own) and a range of rows i. It walks the columns j in chunks of kChunkCols: the chunk of
// its b rows and their grad_b accumulators stay in L1 while the rows i of c and g stream past, each row's
// -c staged once for the kBlockK rows of b. When there are too few (batch, k block) tasks to fill the
// threads, the rows i are split too, each range summing its own partial grad_b, added up afterwards.
//
// The exponent is formed in base 2 (LogWeight::to_kernel on each term), each cell costs one
// LogWeight::weight (the vectorised fast_exp2), and the hot loop is plain scalar code over a tile of kCols
// columns that GCC vectorises (see cpu_common.h), with kCols partial sums for grad_a's row sum.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")  // lets GCC vectorise the selects of semiring.h; see cpu_common.h
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <limits>

#include "checks.h"
#include "cpu_common.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace {

using cpu::Strided3;

// Rows of b per task: -c and g of a row i are staged once per chunk for this many rows of b.
constexpr int64_t kBlockK = 8;

template <class T> struct Tiles {
  static constexpr int kCols = cpu::kTileCols<T>;  // columns per vectorised tile (cpu_common.h)
  static constexpr int64_t kChunkCols = 8 * kCols;  // columns per chunk: 8 x 256 floats of b and grad_b in L1
};

// One task: batch p, rows i0 .. i1 - 1, rows k0 .. k0 + nk - 1 of b. Adds into ga (B, n, K contiguous) and
// writes gb_part (B, K, m contiguous, this row range's partial sum).
template <class T, bool kNeedA, bool kNeedB>
void grads_task(const Strided3<T>& A, const Strided3<T>& Bm, const Strided3<T>& C, const Strided3<T>& G,
                int64_t n, int64_t K, int64_t m, int64_t p, int64_t i0, int64_t i1, int64_t k0, int64_t nk,
                T* ga, T* gb_part) {
  constexpr int kCols = Tiles<T>::kCols;
  constexpr int64_t kChunkCols = Tiles<T>::kChunkCols;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  alignas(64) T b_k[kBlockK][kChunkCols];    // b rows, kernel domain; 0 past the last column
  alignas(64) T gb_acc[kBlockK][kChunkCols];  // grad_b's partial sums for this chunk
  alignas(64) T negc_k[kChunkCols];           // -c of row i, kernel domain; -inf past the last column
  alignas(64) T g_row[kChunkCols];            // g of row i; 0 past the last column

  for (int64_t j0 = 0; j0 < m; j0 += kChunkCols) {
    const int64_t nj = std::min(kChunkCols, m - j0);
    const int64_t tiles = (nj + kCols - 1) / kCols, padded = tiles * kCols;
    for (int64_t kk = 0; kk < nk; ++kk) {
      const T* src = Bm.at(p, k0 + kk, j0);
      for (int64_t j = 0; j < padded; ++j) {
        b_k[kk][j] = j < nj ? LogWeight::to_kernel(src[j * Bm.sc]) : T(0);
        gb_acc[kk][j] = T(0);
      }
    }
    for (int64_t i = i0; i < i1; ++i) {
      const T* c_src = C.at(p, i, j0);
      const T* g_src = G.at(p, i, j0);
      for (int64_t j = 0; j < padded; ++j) {
        // A padded column weighs exp(-inf) * 0 = 0. So does a cell whose c is -inf: every term of that
        // output was 0, and no gradient flows through it.
        const T c = j < nj ? c_src[j * C.sc] : kNegInf;
        negc_k[j] = c == kNegInf ? kNegInf : LogWeight::to_kernel(-c);
        g_row[j] = j < nj ? g_src[j * G.sc] : T(0);
      }
      for (int64_t kk = 0; kk < nk; ++kk) {
        const T a_k = LogWeight::to_kernel(*A.at(p, i, k0 + kk));
        T part[kCols] = {};
        for (int64_t t = 0; t < tiles; ++t) {
          const T* b_t = b_k[kk] + t * kCols;
          const T* c_t = negc_k + t * kCols;
          const T* g_t = g_row + t * kCols;
          T* acc_t = gb_acc[kk] + t * kCols;
          for (int j = 0; j < kCols; ++j) {
            const T w = g_t[j] * LogWeight::weight(a_k + b_t[j] + c_t[j]);
            if constexpr (kNeedB) acc_t[j] += w;
            if constexpr (kNeedA) part[j] += w;
          }
        }
        if constexpr (kNeedA) {
          T s = T(0);
          for (int j = 0; j < kCols; ++j) s += part[j];
          ga[(p * n + i) * K + k0 + kk] += s;
        }
      }
    }
    if constexpr (kNeedB) {
      for (int64_t kk = 0; kk < nk; ++kk) {
        T* dst = gb_part + (p * K + k0 + kk) * m + j0;
        for (int64_t j = 0; j < nj; ++j) dst[j] = gb_acc[kk][j];
      }
    }
  }
}

template <class T, bool kNeedA, bool kNeedB>
void fused_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& g,
                 at::Tensor& ga, at::Tensor& gb) {
  const int64_t B = a.size(0), n = a.size(1), K = a.size(2), m = b.size(2);
  const Strided3<T> A = cpu::strided3<T>(a), Bm = cpu::strided3<T>(b), C = cpu::strided3<T>(c),
                    G = cpu::strided3<T>(g);
  // Enough tasks for every thread: shrink the k blocks, then split the rows i (not for work too small to
  // share, which runs as one task).
  const int64_t want = B * n * K * m < (int64_t{1} << 18) ? 1 : 4 * static_cast<int64_t>(at::get_num_threads());
  const int64_t block_k = std::clamp<int64_t>(B * K / want, 1, kBlockK);
  const int64_t k_blocks = (K + block_k - 1) / block_k;
  const int64_t row_splits = std::clamp<int64_t>((want + B * k_blocks - 1) / (B * k_blocks), 1, n);
  const int64_t rows_per_split = (n + row_splits - 1) / row_splits;

  T* const ga_ptr = kNeedA ? ga.data_ptr<T>() : nullptr;
  at::Tensor gb_parts;
  T* gb_ptr = nullptr;
  if constexpr (kNeedB) {
    gb_parts = row_splits > 1 ? gb.new_empty({row_splits, B, K, m}) : gb;
    gb_ptr = gb_parts.data_ptr<T>();
  }
  const int64_t tasks = row_splits * B * k_blocks;
  const int64_t cells_per_task = std::max<int64_t>(1, rows_per_split * block_k * m);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / cells_per_task);
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t kb = index % k_blocks, p = (index / k_blocks) % B, split = index / k_blocks / B;
      const int64_t i0 = split * rows_per_split, i1 = std::min(n, i0 + rows_per_split);
      const int64_t k0 = kb * block_k, nk = std::min(block_k, K - k0);
      T* gb_part = kNeedB ? gb_ptr + split * B * K * m : nullptr;
      grads_task<T, kNeedA, kNeedB>(A, Bm, C, G, n, K, m, p, i0, i1, k0, nk, ga_ptr, gb_part);
    }
  });
  if (kNeedB && row_splits > 1) gb.copy_(gb_parts.sum(0));
}

}  // namespace

std::vector<at::Tensor> log_bmm_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                      const at::Tensor& g, bool need_a, bool need_b) {
  check_log_bmm_grads_args(a, b, c, g);
  TORCH_CHECK(a.device().is_cpu(), "log_bmm_grads (CPU): CPU tensors only, got a ", describe(a));
  const int64_t B = a.size(0), n = a.size(1), K = a.size(2), m = b.size(2);
  // Contiguous outputs, zeroed: every task adds into grad_a, and a row range with no rows (n = 0) or a
  // batch with no columns (m = 0) leaves its gradient 0.
  at::Tensor ga = need_a ? a.new_zeros({B, n, K}) : a.new_empty({0});
  at::Tensor gb = need_b ? a.new_zeros({B, K, m}) : a.new_empty({0});
  if (B * n * K * m == 0 || !(need_a || need_b)) return {ga, gb};
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "semiring_log_bmm_grads_cpu", [&] {
    if (need_a && need_b) {
      fused_grads<scalar_t, true, true>(a, b, c, g, ga, gb);
    } else if (need_a) {
      fused_grads<scalar_t, true, false>(a, b, c, g, ga, gb);
    } else {
      fused_grads<scalar_t, false, true>(a, b, c, g, ga, gb);
    }
  });
  return {ga, gb};
}

}  // namespace semiring_ops
