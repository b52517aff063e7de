// Max-plus / min-plus batched matmul on 16-bit inputs with packed arithmetic (sm_80+):
//   out[p, i, j] = max_k (a[p, i, k] + b[p, k, j])        (min for the min semiring)
// two output columns per register: one HADD2 and one HMNMX2 (max.NaN / min.NaN .f16x2 or .bf16x2) per two
// cells, where the fp32 path (tile_engine.cuh) spends one FADD and one half-rate FMNMX per cell.
//
// Exactness. Rounding to nearest is monotone, so max_k round(a + b) = round(max_k (a + b)): every sum rounded
// to the input dtype gives the same maximum as the exact sums rounded once at the end. The result is the
// correctly rounded 16-bit value of the exact answer: what the public API returns for 16-bit inputs (the
// fp32 path rounds twice, fp32 then 16-bit, and may differ from it by one 16-bit ulp on a double-rounding
// tie). NaN propagates (max.NaN), -inf + +inf = NaN as in fp32, an all -inf row gives -inf. No argmax: the
// host takes this path only when no index is asked for (the gradient path tracks it in fp32).
//
// Layout. A block computes a kBM x kBN output tile of one batch entry (grid.x: tiles, grid.y strides over
// the batch), each thread a kTM x kTN micro-tile held as kTM x kTN/2 packed registers. k-tiles of kBK are
// staged through registers (the tile engine's fetch_field / stage_map, so any strides and broadcast batches
// read coalesced) into double-buffered shared memory: A as [kBK][kBM] pairs (x, x) (a row value duplicated
// into both halves, so the compute loop needs no shuffle), B as [kBK][kBN] scalars (two adjacent columns
// form a pair). k beyond the depth is staged as the semiring zero in both operands (zero + zero = zero),
// so every tile runs the full kBK without a length check; rows / columns beyond the output are staged as
// zero too and never stored. Per k and thread: 2 + 1 LDS.128, kTM * kTN / 2 HADD2 and as many HMNMX2.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/packed_select_launch.h"
#include "cuda/tile_engine.cuh"

namespace semiring_ops {
namespace cuda {
namespace {

constexpr int kBM = kPackedTileRows, kBN = kPackedTileCols, kBK = 8, kTM = 8, kTN = 8;
constexpr int kThreadsN = kBN / kTN, kThreads = (kBM / kTM) * kThreadsN;  // 16 x 16 = 256
constexpr int kPitchA = kBM + 4;  // in pairs (4 bytes): rows stay 16-byte aligned
constexpr int kPitchB = kBN + 8;  // in scalars (2 bytes): idem
constexpr int kLoadsA = kBM * kBK / kThreads, kLoadsB = kBN * kBK / kThreads;

// The 16-bit types: torch's storage type, CUDA's scalar and pair types, and the packed operations.
template <class T>
struct Packed;
template <>
struct Packed<c10::Half> {
  using scalar = __half;
  using pair = __half2;
  static __device__ __forceinline__ scalar bits(c10::Half x) { return __ushort_as_half(x.x); }
  static __device__ __forceinline__ pair dup(scalar x) { return __half2half2(x); }
  static __device__ __forceinline__ scalar from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 to_float2(pair x) { return __half22float2(x); }
};
template <>
struct Packed<c10::BFloat16> {
  using scalar = __nv_bfloat16;
  using pair = __nv_bfloat162;
  static __device__ __forceinline__ scalar bits(c10::BFloat16 x) { return __ushort_as_bfloat16(x.x); }
  static __device__ __forceinline__ pair dup(scalar x) { return __bfloat162bfloat162(x); }
  static __device__ __forceinline__ scalar from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float2 to_float2(pair x) { return __bfloat1622float2(x); }
};

// The semiring's plus on pairs (its times is the packed add): NaN-propagating max or min.
template <bool kIsMax>
struct PackedSelect {
  template <class pair>
  static __device__ __forceinline__ pair plus(pair x, pair y) {
    if constexpr (kIsMax) {
      return __hmax2_nan(x, y);
    } else {
      return __hmin2_nan(x, y);
    }
  }
};

template <class T, bool kIsMax>
__global__ void __launch_bounds__(kThreads, 2) packed_select_kernel(const __grid_constant__ PackedArgs<T> args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using P = Packed<T>;
  using scalar = typename P::scalar;
  using pair = typename P::pair;
  using Plus = PackedSelect<kIsMax>;
  static_assert(sizeof(pair) == 4 && sizeof(scalar) == 2, "16-bit pairs");

  __shared__ __align__(16) pair smem_a[2][kBK][kPitchA];
  __shared__ __align__(16) scalar smem_b[2][kBK][kPitchB];

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % kThreadsN, ty = tid / kThreadsN;
  const int r0 = static_cast<int>(blockIdx.x / args.tiles_n) * kBM;
  const int s0 = static_cast<int>(blockIdx.x % args.tiles_n) * kBN;
  const int num_tiles = (args.depth + kBK - 1) / kBK;
  const scalar zero = P::from_float(args.zero);
  const detail::StageMap map_a = detail::stage_map<kBM, kBK, kThreads>(args.a, tid);
  const detail::StageMap map_b = detail::stage_map<kBN, kBK, kThreads>(args.b, tid);
  detail::Staged<T, kLoadsA> stage_a;
  detail::Staged<T, kLoadsB> stage_b;

  auto fetch = [&](int64_t p, int k0) {
    // 32-bit in-batch offsets (the host checks that they fit): with 64-bit ones the hoisted addresses spill
    detail::fetch_field<kLoadsA, T, int32_t>(stage_a, args.a, map_a, p, r0, args.rows, k0, args.depth);
    detail::fetch_field<kLoadsB, T, int32_t>(stage_b, args.b, map_b, p, s0, args.cols, k0, args.depth);
  };
  auto commit = [&](int buf) {
#pragma unroll
    for (int l = 0; l < kLoadsA; ++l) {
      const scalar x = ((stage_a.valid >> l) & 1u) ? P::bits(stage_a.v[l]) : zero;
      smem_a[buf][map_a.t + l * map_a.step_t][map_a.o + l * map_a.step_o] = P::dup(x);
    }
#pragma unroll
    for (int l = 0; l < kLoadsB; ++l) {
      const scalar x = ((stage_b.valid >> l) & 1u) ? P::bits(stage_b.v[l]) : zero;
      smem_b[buf][map_b.t + l * map_b.step_t][map_b.o + l * map_b.step_o] = x;
    }
  };

  for (int64_t p = blockIdx.y; p < args.batch; p += gridDim.y) {
    pair acc[kTM][kTN / 2];
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN / 2; ++j) acc[i][j] = P::dup(zero);
    }
    if (num_tiles > 0) {
      fetch(p, 0);
      commit(0);
      __syncthreads();
    }
    for (int kt = 0; kt < num_tiles; ++kt) {
      const int buf = kt & 1;
      const bool has_next = kt + 1 < num_tiles;
      if (has_next) fetch(p, (kt + 1) * kBK);  // in flight during the compute
#pragma unroll
      for (int t = 0; t < kBK; ++t) {
        pair av[kTM], bv[kTN / 2];
        const uint4* pa = reinterpret_cast<const uint4*>(&smem_a[buf][t][ty * kTM]);
        const uint4 b4 = *reinterpret_cast<const uint4*>(&smem_b[buf][t][tx * kTN]);
#pragma unroll
        for (int v = 0; v < kTM / 4; ++v) {
          const uint4 a4 = pa[v];
          av[4 * v + 0] = *reinterpret_cast<const pair*>(&a4.x);
          av[4 * v + 1] = *reinterpret_cast<const pair*>(&a4.y);
          av[4 * v + 2] = *reinterpret_cast<const pair*>(&a4.z);
          av[4 * v + 3] = *reinterpret_cast<const pair*>(&a4.w);
        }
        bv[0] = *reinterpret_cast<const pair*>(&b4.x);
        bv[1] = *reinterpret_cast<const pair*>(&b4.y);
        bv[2] = *reinterpret_cast<const pair*>(&b4.z);
        bv[3] = *reinterpret_cast<const pair*>(&b4.w);
#pragma unroll
        for (int i = 0; i < kTM; ++i) {
#pragma unroll
          for (int j = 0; j < kTN / 2; ++j) acc[i][j] = Plus::plus(acc[i][j], __hadd2(av[i], bv[j]));
        }
      }
      // The other buffer was last read in iteration kt - 1, which ended with a barrier.
      if (has_next) commit(buf ^ 1);
      __syncthreads();
    }

    const int r_base = r0 + ty * kTM, s_base = s0 + tx * kTN;
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int r = r_base + i;
      if (r >= args.rows) break;
      float* row = args.out + (p * args.rows + r) * static_cast<int64_t>(args.cols);
#pragma unroll
      for (int j = 0; j < kTN / 2; ++j) {
        const int s = s_base + 2 * j;
        const float2 v = P::to_float2(acc[i][j]);
        if (s < args.cols) row[s] = v.x;
        if (s + 1 < args.cols) row[s + 1] = v.y;
      }
    }
  }
#else
  __trap();  // the host launches it only on sm_80+
#endif
}

}  // namespace

template <class T, bool kIsMax>
LaunchStatus launch_packed_select(PackedArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                                  cudaStream_t stream) {
  const int64_t tiles_m = (rows + kBM - 1) / kBM, tiles_n = (cols + kBN - 1) / kBN;
  if (tiles_m * tiles_n > std::numeric_limits<int32_t>::max()) return refused("too many output tiles (over 2^31)");
  args.batch = batch;
  args.rows = static_cast<int32_t>(rows);
  args.cols = static_cast<int32_t>(cols);
  args.depth = static_cast<int32_t>(depth);
  args.tiles_n = static_cast<int32_t>(tiles_n);
  args.zero = kIsMax ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  packed_select_kernel<T, kIsMax><<<grid, kThreads, 0, stream>>>(args);
  return last_launch();
}

#define SEMIRING_OPS_PACKED(T, MAX) \
  template LaunchStatus launch_packed_select<T, MAX>(PackedArgs<T>&, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
SEMIRING_OPS_PACKED(c10::Half, true)
SEMIRING_OPS_PACKED(c10::Half, false)
SEMIRING_OPS_PACKED(c10::BFloat16, true)
SEMIRING_OPS_PACKED(c10::BFloat16, false)

}  // namespace cuda
}  // namespace semiring_ops
