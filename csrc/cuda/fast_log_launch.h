// The fast log family's launcher (log_bmm_fast_kernels.cu), called by log_bmm_fast_cuda.cpp: the kernel's shape
// (which the host's padding and tile maxima follow) and its arguments. ATen-free.
#pragma once

#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace fast_log {

// Beyond this magnitude (or NaN, +inf) a row's or column's maximum sends its outputs to the exact path: both tiers'
// guard (sums of terms near 2^125 could overflow float32).
constexpr double kBadMagnitude = 4.253529586511730793e+37;  // 2^125
constexpr int kKT = 32;                                  // k-tile: one alpha / beta per kKT terms
constexpr int kWarpsM = 2, kWarpsN = 2;                  // warps per block, along rows and columns
constexpr int kWarpM = 32, kWarpN = 32;                  // one warp's output tile
constexpr int kBM = kWarpsM * kWarpM, kBN = kWarpsN * kWarpN;  // a block's output tile

template <class scalar_t>
struct Args {
  const scalar_t* a;  // a[p, i, k] at a + p * a_sp + i * a_sr + k
  const scalar_t* b;  // b[p, k, j] at b + p * b_sp + k * b_sr + j
  const float* rmax;  // (B or 1, num_kt, n_pad): row maxima of each k-tile, natural units (NaN: bad row)
  const float* cmax;  // (B or 1, num_kt, m_pad): column maxima
  float* out;         // (B, n, m) contiguous
  uint8_t* flags;     // (B, n, m) contiguous: 1 = not trusted, recompute
  unsigned long long* count;  // number of flags set
  int64_t a_sp, a_sr, b_sp, b_sr, rmax_sp, cmax_sp;
  int64_t batch;
  int32_t n, k, m, n_pad, m_pad, tiles_m, tiles_n, num_kt;
};

#if !defined(__CUDACC_RTC__)
// Launches the kernel for scalar_t in {c10::Half, c10::BFloat16, float} with kPasses 1 or 3 (log_bmm_fast_kernels.cu);
// the host has filled every argument. Needs a GPU of compute capability 8.0+.
template <class scalar_t, int kPasses>
LaunchStatus launch_fast_log(const Args<scalar_t>& args, cudaStream_t stream);
#endif

}  // namespace fast_log
}  // namespace cuda
}  // namespace semiring_ops
