// The fused log gradient's launcher (log_grads_kernels.cu), called by bmm_cuda.cpp's log_bmm_grads. ATen-free
// (launch_status.h).
#pragma once

#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

// A block's tile of grad_a: rows i x columns k (the grid is B x ceil(n / rows) x ceil(K / cols) blocks).
constexpr int kLogGradsRows = 64, kLogGradsCols = 128;

// One float32 operand of (B, rows, cols) with its element strides.
struct GradsOperand {
  const float* data;
  int64_t s0, s1, s2;
};

// Both gradients of c = logbmm(a, b) given g = dL/dc, in one pass over the cells (each exponential once):
//   w[p, i, k, j] = g[p, i, j] * exp(a[p, i, k] + b[p, k, j] - c[p, i, j])  (0 where c is -inf)
//   grad_a[p, i, k] = sum_j w  (written),   grad_b[p, k, j] += sum_i w  (added: zero it first).
// a (B, n, K), b (B, K, m), c and g (B, n, m), any strides; grad_a (B, n, K) and grad_b (B, K, m) contiguous.
struct LogGradsParams {
  GradsOperand a, b, c, g;
  float* grad_a;
  float* grad_b;
  int64_t batch, n, k, m;
};

#if !defined(__CUDACC_RTC__)
// grad_b's sums over i are added with global float atomics (their order varies: not bitwise deterministic; the
// caller takes the two-contraction path under torch.use_deterministic_algorithms). Needs B n K m > 0; refuses
// shapes whose grid does not fit (B > 65535).
LaunchStatus launch_log_bmm_grads_fused(const LogGradsParams& p, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
