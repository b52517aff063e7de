// The fast log's scaled tier, fused: the passes around its one cuBLAS TF32 product (semiring_ops/ops/
// fast_log_scaled.py has the math and the guard). Before, they were eleven ATen passes over the operands and the
// output (0.71 ms of 1.16 at B = 1, n = k = m = 4096 on the H100, docs/perf_notes.md "Fast log: the scaled tier").
//
// - row_factors: one block per row of a. Its maximum, then the row read again (from L2: the rows in flight take
//   ~17 MB on an H100) and written as 2^(a log2 e - top). One read of a from memory, one write.
// - column_maxima, column_factors: b's columns, 32 per block (a warp across, coalesced), k cut into `split` parts
//   so that the blocks fill the GPU. The first pass writes each part's maxima; the second folds them and writes
//   the factors. Two reads of b, one write.
// - epilogue: one block per output row, float4 where the rows allow it: log of the sum, the two scales added,
//   the flag, the flags counted (a warp's count added once). One read of the output, one write, the flags.
//
// Maxima propagate NaN, as torch.amax does: a NaN anywhere flags the row or column.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>  // INFINITY
#include <cstdint>

#include "cuda/fast_log_launch.h"
#include "cuda/fast_log_scaled_launch.h"
#include "cuda/kernel_ref.h"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace fast_log_scaled {
namespace kernels {  // named (not anonymous), so that NVRTC can name them

constexpr float kLog2eF = static_cast<float>(kLog2e);
constexpr float kLn2F = static_cast<float>(kLn2);
constexpr float kLnTrust = static_cast<float>(-64.0 * kLn2);  // ln 2^-64: sums below it are flagged (the tile kernel's)
constexpr float kHuge = static_cast<float>(fast_log::kBadMagnitude);
constexpr int kThreads = 256;

#if SEMIRING_OPS_DEVICE_PASS
__device__ __forceinline__ float nan_max(float m, float x) { return (x > m || x != x) ? x : m; }

// The maximum over the block (NaN if any thread holds NaN), in every thread. blockDim.x: a multiple of 32, at most
// 1024. Ends with the block synchronised, so a caller may call it again.
__device__ float block_nan_max(float v) {
  __shared__ float warp_max[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

// The scale of a maximum (natural units) and its state: (m log2 e, 0), or (0, kEmpty / kBad).
__device__ __forceinline__ float scale_of(float maximum, uint8_t* state) {
  const float t = maximum * kLog2eF;
  const bool empty = t == -INFINITY;
  const bool bad = !(fabsf(t) <= kHuge) && !empty;
  *state = empty ? kEmpty : (bad ? kBad : 0);
  return (empty || bad) ? 0.f : t;
}

template <class T>
__global__ void __launch_bounds__(kThreads) row_factors(const RowArgs<T> args) {
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const int64_t p = row / args.n, i = row - p * args.n;
    const T* __restrict__ src = args.a + p * args.sp + i * args.sr;
    float m = -INFINITY;
#pragma unroll 4
    for (int64_t kk = threadIdx.x; kk < args.k; kk += blockDim.x) m = nan_max(m, static_cast<float>(src[kk * args.sk]));
    uint8_t state;
    const float t = scale_of(block_nan_max(m), &state);
    if (threadIdx.x == 0) {
      args.top[row] = t;
      args.state[row] = state;
    }
    float* __restrict__ dst = args.factors + row * args.k;
#pragma unroll 4
    for (int64_t kk = threadIdx.x; kk < args.k; kk += blockDim.x)
      dst[kk] = exp2f(fmaf(static_cast<float>(src[kk * args.sk]), kLog2eF, -t));
  }
}

// Block (kColumns, kColumnRows), grid (column blocks, split, batch entries): part blockIdx.y of k's rows.
template <class T>
__global__ void __launch_bounds__(kColumns* kColumnRows) column_maxima(const ColumnArgs<T> args) {
  __shared__ float part[kColumnRows][kColumns + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t k0 = blockIdx.y * args.k_per_part, k1 = min(args.k, k0 + args.k_per_part);
  for (int64_t p = blockIdx.z; p < args.batch; p += gridDim.z) {
    float m = -INFINITY;
    if (j < args.m) {
      const T* __restrict__ src = args.b + p * args.sp + j * args.sm;
#pragma unroll 4
      for (int64_t kk = k0 + threadIdx.y; kk < k1; kk += kColumnRows) m = nan_max(m, static_cast<float>(src[kk * args.sk]));
    }
    part[threadIdx.y][threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.y == 0 && j < args.m) {
#pragma unroll
      for (int r = 1; r < kColumnRows; ++r) m = nan_max(m, part[r][threadIdx.x]);
      args.partial[(p * args.split + blockIdx.y) * args.m + j] = m;
    }
    __syncthreads();
  }
}

template <class T>
__global__ void __launch_bounds__(kColumns* kColumnRows) column_factors(const ColumnArgs<T> args) {
  __shared__ float scale[kColumns];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t k0 = blockIdx.y * args.k_per_part, k1 = min(args.k, k0 + args.k_per_part);
  for (int64_t p = blockIdx.z; p < args.batch; p += gridDim.z) {
    if (threadIdx.y == 0 && j < args.m) {
      float m = -INFINITY;
      for (int s = 0; s < args.split; ++s) m = nan_max(m, args.partial[(p * args.split + s) * args.m + j]);
      uint8_t state;
      const float t = scale_of(m, &state);
      scale[threadIdx.x] = t;
      if (blockIdx.y == 0) {
        args.top[p * args.m + j] = t;
        args.state[p * args.m + j] = state;
      }
    }
    __syncthreads();
    if (j < args.m) {
      const float t = scale[threadIdx.x];
      const T* __restrict__ src = args.b + p * args.sp + j * args.sm;
      float* __restrict__ dst = args.factors + p * args.k * args.m + j;
#pragma unroll 4
      for (int64_t kk = k0 + threadIdx.y; kk < k1; kk += kColumnRows)
        dst[kk * args.m] = exp2f(fmaf(static_cast<float>(src[kk * args.sk]), kLog2eF, -t));
    }
    __syncthreads();
  }
}

// One output: the log of its sum with both scales added; returns its flag.
__device__ __forceinline__ bool finish(float& value, float row_shift, uint8_t row_state, float col_top,
                                       uint8_t col_state) {
  const float l = logf(value);
  const uint8_t s = row_state | col_state;
  value = (l + row_shift) + col_top * kLn2F;
  return (l < kLnTrust && !(s & kEmpty)) || (s & kBad);
}

template <bool kVector>
__global__ void __launch_bounds__(kThreads) epilogue(const EpilogueArgs args) {
  unsigned long long flagged = 0;
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const int64_t p = row / args.n;
    const float row_shift = args.row_top[row] * kLn2F;
    const uint8_t row_state = args.row_state[row];
    float* __restrict__ out = args.out + row * args.m;
    uint8_t* __restrict__ flags = args.flags + row * args.m;
    const float* __restrict__ col_top = args.col_top + p * args.m;
    const uint8_t* __restrict__ col_state = args.col_state + p * args.m;
    if constexpr (kVector) {  // m % 4 == 0: every row starts 16-byte aligned
      for (int64_t q = threadIdx.x; q < args.m / 4; q += blockDim.x) {
        float4 v = reinterpret_cast<float4*>(out)[q];
        const float4 t = reinterpret_cast<const float4*>(col_top)[q];
        const uchar4 s = reinterpret_cast<const uchar4*>(col_state)[q];
        uchar4 f;
        f.x = finish(v.x, row_shift, row_state, t.x, s.x);
        f.y = finish(v.y, row_shift, row_state, t.y, s.y);
        f.z = finish(v.z, row_shift, row_state, t.z, s.z);
        f.w = finish(v.w, row_shift, row_state, t.w, s.w);
        reinterpret_cast<float4*>(out)[q] = v;
        reinterpret_cast<uchar4*>(flags)[q] = f;
        flagged += f.x + f.y + f.z + f.w;
      }
    } else {
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < args.m; j += blockDim.x) {
        float v = out[j];
        const bool f = finish(v, row_shift, row_state, col_top[j], col_state[j]);
        out[j] = v;
        flags[j] = f;
        flagged += f;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) flagged += __shfl_xor_sync(0xffffffffu, flagged, o);
  if ((threadIdx.x & 31) == 0 && flagged) atomicAdd(args.count, flagged);
}

#endif  // SEMIRING_OPS_DEVICE_PASS
}  // namespace kernels

#if !defined(__CUDACC_RTC__)
using kernels::kThreads;

inline unsigned grid_of(int64_t blocks) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 30));
}

#define SEMIRING_OPS_SCALED_KERNEL(kernel, ...) \
  SEMIRING_OPS_KERNEL_OF("cuda/fast_log_scaled_kernels.cu", fast_log_scaled::kernels::kernel, __VA_ARGS__)

template <class T>
LaunchStatus launch_row_factors(const RowArgs<T>& args, cudaStream_t stream) {
  if (args.rows == 0 || args.k == 0) return {};
  // a block of at most kThreads, no wider than the row (rounded up to a warp)
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (args.k + 31) / 32 * 32));
  SEMIRING_OPS_CUDA_TRY(
      launch_kernel(SEMIRING_OPS_SCALED_KERNEL(row_factors, T), dim3(grid_of(args.rows)), dim3(threads), 0, stream, args));
  return last_launch();
}

template <class T>
LaunchStatus launch_column_factors(const ColumnArgs<T>& args, cudaStream_t stream) {
  if (args.batch == 0 || args.k == 0 || args.m == 0) return {};
  if (args.split < 1 || args.split > kMaxColumnSplit) return refused("the column maxima's split must be in 1..64");
  const dim3 grid(grid_of((args.m + kColumns - 1) / kColumns), static_cast<unsigned>(args.split),
                  static_cast<unsigned>(std::min<int64_t>(args.batch, 65535)));
  const dim3 block(kColumns, kColumnRows);
  SEMIRING_OPS_CUDA_TRY(launch_kernel(SEMIRING_OPS_SCALED_KERNEL(column_maxima, T), grid, block, 0, stream, args));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(SEMIRING_OPS_SCALED_KERNEL(column_factors, T), grid, block, 0, stream, args));
  return last_launch();
}

LaunchStatus launch_epilogue(const EpilogueArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.m == 0) return {};
  const bool vector = args.m % 4 == 0;
  const int64_t per_row = vector ? args.m / 4 : args.m;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (per_row + 31) / 32 * 32));
  const void* kernel = vector ? SEMIRING_OPS_SCALED_KERNEL(epilogue, SEMIRING_OPS_VALUE(true))
                              : SEMIRING_OPS_SCALED_KERNEL(epilogue, SEMIRING_OPS_VALUE(false));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, dim3(grid_of(args.rows)), dim3(threads), 0, stream, args));
  return last_launch();
}

#define SEMIRING_OPS_FAST_LOG_SCALED(T)                                                    \
  template LaunchStatus launch_row_factors<T>(const RowArgs<T>&, cudaStream_t);          \
  template LaunchStatus launch_column_factors<T>(const ColumnArgs<T>&, cudaStream_t);
SEMIRING_OPS_FAST_LOG_SCALED(float)
SEMIRING_OPS_FAST_LOG_SCALED(c10::Half)
SEMIRING_OPS_FAST_LOG_SCALED(c10::BFloat16)
#undef SEMIRING_OPS_SCALED_KERNEL
#endif  // !__CUDACC_RTC__

}  // namespace fast_log_scaled
}  // namespace cuda
}  // namespace semiring_ops
