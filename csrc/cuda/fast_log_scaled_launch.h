// The fast log's scaled tier, fused (fast_log_scaled_kernels.cu), called by fast_log_scaled_cuda.cpp: the
// launchers of the pass that turns a into its factors with their row scales, the two passes that do the same for
// b's columns, and the epilogue that turns the TF32 product of the factors into logs with their flags. The product
// itself is cuBLAS's (semiring_ops/ops/fast_log_scaled.py). ATen-free.
#pragma once

#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace fast_log_scaled {

// A scale's state, per row of a or column of b: its maximum was -inf (every term of its outputs is -inf: they are
// trusted as -inf), or NaN, +inf or beyond 2^125 in magnitude (its outputs are flagged). The scale is then 0.
constexpr uint8_t kEmpty = 1, kBad = 2;

constexpr int kColumns = 32;   // columns of b per block of the column passes (one warp across)
constexpr int kColumnRows = 8;  // rows of k per block of the column passes (the warps)
constexpr int kMaxColumnSplit = 64;  // the most parts the column maxima are cut into along k

template <class scalar_t>
struct RowArgs {
  const scalar_t* a;  // a[p, i, k] at a + p * sp + i * sr + k * sk
  float* factors;     // (B, n, k) contiguous: 2^(a log2 e - top)
  float* top;         // (B, n): the row maxima times log2 e (0 when empty or bad)
  uint8_t* state;     // (B, n): kEmpty, kBad or 0
  int64_t sp, sr, sk;
  int64_t rows;  // B n
  int64_t n, k;
};

template <class scalar_t>
struct ColumnArgs {
  const scalar_t* b;  // b[p, k, j] at b + p * sp + k * sk + j * sm
  float* partial;     // (B, split, m): each part's column maxima (natural units, NaN kept)
  float* factors;     // (B, k, m) contiguous: 2^(b log2 e - top)
  float* top;         // (B, m)
  uint8_t* state;     // (B, m)
  int64_t sp, sk, sm;
  int64_t batch, k, m;
  int32_t split;  // parts of k (<= kMaxColumnSplit), each of k_per_part rows
  int64_t k_per_part;
};

struct EpilogueArgs {
  float* out;               // (B, n, m) contiguous: the sums in, the log products out
  uint8_t* flags;           // (B, n, m) contiguous, bool: 1 where the output must be recomputed exactly
  unsigned long long* count;  // the flags set (added to)
  const float* row_top;     // (B, n)
  const uint8_t* row_state;
  const float* col_top;     // (B, m)
  const uint8_t* col_state;
  int64_t rows;  // B n
  int64_t n, m;
};

#if !defined(__CUDACC_RTC__)
template <class scalar_t>
LaunchStatus launch_row_factors(const RowArgs<scalar_t>& args, cudaStream_t stream);

// Both column passes: the parts' maxima, then the factors and scales.
template <class scalar_t>
LaunchStatus launch_column_factors(const ColumnArgs<scalar_t>& args, cudaStream_t stream);

LaunchStatus launch_epilogue(const EpilogueArgs& args, cudaStream_t stream);
#endif

}  // namespace fast_log_scaled
}  // namespace cuda
}  // namespace semiring_ops
