// The log semiring's two gradients in one pass (launcher and contract in log_grads_launch.h): each cell's exponential
// once, where two log_contracts (grad_a: reduction over j; grad_b: over i) compute it twice. The exponential bounds
// both (MUFU.EX2; docs/perf_notes.md, "Fused log backward").
//
// A block owns a tile of kRows rows i x kCols columns k of grad_a and walks j in chunks of kChunk: a thread holds
// kTI x kTK of a (scaled by log2 e) and the matching grad_a sums in registers for the whole walk; per column j it
// reads its kTI values of -c and g and kTK values of b from shared memory (staged one chunk ahead through
// registers), and for each of its cells forms w = g * 2^(a + b - c), adding w to its grad_a sum and to a partial
// sum over its rows for grad_b[k, j]. The partials of a chunk (one per row group) go to shared memory and are
// summed there, then added to grad_b with one global atomic per (k, j) and row tile. As in the forward, a fixed
// share of the exponentials take exp2_poly on the FMA pipe (semiring.h).
#include "cuda/kernel_ref.h"
#include "cuda/log_grads_launch.h"
#if SEMIRING_OPS_DEVICE_PASS
#include "cuda/tile_engine.cuh"  // in_share_of_16
#include "semiring.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace log_grads {  // named, so that NVRTC can name the kernel

constexpr int kThreads = 256;
constexpr int kTI = 8, kTK = 4;                   // a thread's rows i and columns k
constexpr int kRowGroups = 8, kColGroups = 32;    // kRowGroups * kColGroups = kThreads; a warp is one row group
constexpr int kRows = kRowGroups * kTI;           // 64 rows i per block
constexpr int kCols = kColGroups * kTK;           // 128 columns k per block
static_assert(kRows == kLogGradsRows && kCols == kLogGradsCols, "log_grads_launch.h states the tile");
constexpr int kChunk = 8;                         // columns j per chunk
constexpr int kRowPitch = kRows + 4;              // shared-memory pitches: 16-byte rows, no bank conflicts on
constexpr int kColPitch = kCols + 4;              // the staging stores (see load_chunk)
constexpr int kPolyPer16 = 2;                     // exponentials on the FMA pipe, per 16 (as the forward's)
constexpr int kLeftLoads = kRows * kChunk / kThreads;   // -c and g values a thread stages per chunk: 2
constexpr int kRightLoads = kCols * kChunk / kThreads;  // b values: 4
constexpr int kSums = kCols * kChunk / kThreads;        // grad_b sums a thread finishes per chunk: 4

#if SEMIRING_OPS_DEVICE_PASS
struct Staged {
  float negc[kLeftLoads], g[kLeftLoads], b[kRightLoads];
};

__device__ __forceinline__ float load(const GradsOperand& x, int64_t p, int64_t r, int64_t s) {
  return __ldg(x.data + p * x.s0 + r * x.s1 + s * x.s2);
}

// One chunk's -c, g (rows i0.., columns j0..) and b (rows k0.., columns j0..) into registers, scaled by log2 e;
// padding: -c = -inf, g = 0, a and b = 0, so a padded cell weighs 0, or NaN only where a true cell of the same
// sum is NaN already (an a of +inf: its c is +inf, so inf - inf in every true column j too).
__device__ __forceinline__ void load_chunk(const LogGradsParams& p, int64_t batch, int64_t i0, int64_t k0,
                                           int64_t j0, Staged& st) {
  const int t = threadIdx.x;
#pragma unroll
  for (int q = 0; q < kLeftLoads; ++q) {
    const int idx = t + q * kThreads, ii = idx / kChunk, jj = idx % kChunk;
    const int64_t i = i0 + ii, j = j0 + jj;
    const bool in = i < p.n && j < p.m;
    const float c = in ? load(p.c, batch, i, j) : 0.f;
    // -c, except -inf where c is -inf: a fully -inf output then weighs every term by 2^-inf = 0
    st.negc[q] = !in ? -pos_inf<float>() : (c == -pos_inf<float>() ? c : -c * float(kLog2e));
    st.g[q] = in ? load(p.g, batch, i, j) : 0.f;
  }
#pragma unroll
  for (int q = 0; q < kRightLoads; ++q) {
    const int idx = t + q * kThreads, kk = idx / kChunk, jj = idx % kChunk;
    const int64_t k = k0 + kk, j = j0 + jj;
    st.b[q] = (k < p.k && j < p.m) ? load(p.b, batch, k, j) * float(kLog2e) : 0.f;
  }
}

__global__ void __launch_bounds__(kThreads, 2) log_bmm_grads_fused_kernel(const LogGradsParams p) {
  __shared__ __align__(16) float s_negc[kChunk][kRowPitch];
  __shared__ __align__(16) float s_g[kChunk][kRowPitch];
  __shared__ __align__(16) float s_b[kChunk][kColPitch];
  __shared__ __align__(16) float s_part[kRowGroups][kChunk][kColPitch];

  const int t = threadIdx.x;
  const int row_group = t / kColGroups, col_group = t % kColGroups;
  const int64_t batch = blockIdx.z;
  const int64_t i0 = int64_t(blockIdx.y) * kRows, k0 = int64_t(blockIdx.x) * kCols;
  const int64_t my_i = i0 + row_group * kTI, my_k = k0 + col_group * kTK;

  float a2[kTI][kTK], acc[kTI][kTK];
#pragma unroll
  for (int ii = 0; ii < kTI; ++ii)
#pragma unroll
    for (int kk = 0; kk < kTK; ++kk) {
      const bool in = my_i + ii < p.n && my_k + kk < p.k;
      a2[ii][kk] = in ? load(p.a, batch, my_i + ii, my_k + kk) * float(kLog2e) : 0.f;
      acc[ii][kk] = 0.f;
    }

  Staged st;
  load_chunk(p, batch, i0, k0, 0, st);
  for (int64_t j0 = 0; j0 < p.m; j0 += kChunk) {
#pragma unroll
    for (int q = 0; q < kLeftLoads; ++q) {
      const int idx = t + q * kThreads;
      s_negc[idx % kChunk][idx / kChunk] = st.negc[q];
      s_g[idx % kChunk][idx / kChunk] = st.g[q];
    }
#pragma unroll
    for (int q = 0; q < kRightLoads; ++q) {
      const int idx = t + q * kThreads;
      s_b[idx % kChunk][idx / kChunk] = st.b[q];
    }
    __syncthreads();
    if (j0 + kChunk < p.m) load_chunk(p, batch, i0, k0, j0 + kChunk, st);  // in flight during the chunk

#pragma unroll 2
    for (int jj = 0; jj < kChunk; ++jj) {
      float nc[kTI], gg[kTI], bb[kTK], part[kTK];
#pragma unroll
      for (int ii = 0; ii < kTI; ii += 4) {
        const float4 n4 = *reinterpret_cast<const float4*>(&s_negc[jj][row_group * kTI + ii]);
        const float4 g4 = *reinterpret_cast<const float4*>(&s_g[jj][row_group * kTI + ii]);
        nc[ii] = n4.x, nc[ii + 1] = n4.y, nc[ii + 2] = n4.z, nc[ii + 3] = n4.w;
        gg[ii] = g4.x, gg[ii + 1] = g4.y, gg[ii + 2] = g4.z, gg[ii + 3] = g4.w;
      }
      const float4 b4 = *reinterpret_cast<const float4*>(&s_b[jj][col_group * kTK]);
      bb[0] = b4.x, bb[1] = b4.y, bb[2] = b4.z, bb[3] = b4.w;
#pragma unroll
      for (int kk = 0; kk < kTK; ++kk) part[kk] = 0.f;
#pragma unroll
      for (int ii = 0; ii < kTI; ++ii)
#pragma unroll
        for (int kk = 0; kk < kTK; ++kk) {
          const float x = a2[ii][kk] + bb[kk] + nc[ii];
          const float w = in_share_of_16<kPolyPer16>(ii * kTK + kk) ? exp2_poly(x) : fast_exp2(x);
          acc[ii][kk] = fma_f32(gg[ii], w, acc[ii][kk]);
          part[kk] = fma_f32(gg[ii], w, part[kk]);
        }
      *reinterpret_cast<float4*>(&s_part[row_group][jj][col_group * kTK]) = make_float4(part[0], part[1], part[2], part[3]);
    }
    __syncthreads();
    // the chunk's grad_b sums: consecutive threads take consecutive j of one k (32-byte sectors for the atomics)
#pragma unroll
    for (int q = 0; q < kSums; ++q) {
      const int idx = t + q * kThreads, kk = idx / kChunk, jj = idx % kChunk;
      const int64_t k = k0 + kk, j = j0 + jj;
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < kRowGroups; ++r) sum += s_part[r][jj][kk];
      if (k < p.k && j < p.m) atomicAdd(p.grad_b + (batch * p.k + k) * p.m + j, sum);
    }
  }

#pragma unroll
  for (int ii = 0; ii < kTI; ++ii)
#pragma unroll
    for (int kk = 0; kk < kTK; ++kk)
      if (my_i + ii < p.n && my_k + kk < p.k) p.grad_a[(batch * p.n + my_i + ii) * p.k + my_k + kk] = acc[ii][kk];
}

#endif  // SEMIRING_OPS_DEVICE_PASS
}  // namespace log_grads

#if !defined(__CUDACC_RTC__)
LaunchStatus launch_log_bmm_grads_fused(const LogGradsParams& p, cudaStream_t stream) {
  using namespace log_grads;
  if (p.batch > 65535) return refused("batch above 65535 (the grid's z)");
  const int64_t row_tiles = (p.n + kRows - 1) / kRows, col_tiles = (p.k + kCols - 1) / kCols;
  if (row_tiles > 65535 || col_tiles > 0x7fffffff) return refused("rows or columns beyond the grid");
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles), static_cast<unsigned>(p.batch));
  const void* kernel = SEMIRING_OPS_KERNEL("cuda/log_grads_kernels.cu", log_grads::log_bmm_grads_fused_kernel);
  void* params[] = {const_cast<LogGradsParams*>(&p)};
  SEMIRING_OPS_CUDA_TRY(cudaLaunchKernel(kernel, grid, dim3(kThreads), params, 0, stream));
  return last_launch();
}
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
