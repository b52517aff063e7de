// Max-plus / min-plus batched matmul without an index (sm_80+), for float32 and for 16-bit inputs in packed
// arithmetic:
//   out[p, i, j] = max_k (a[p, i, k] + b[p, k, j])        (min for the min semiring)
// float16 / bfloat16 hold two output columns per register: one HADD2 and one HMNMX2 (max.NaN / min.NaN .f16x2 or
// .bf16x2) per two cells. float32: one FADD and one FMNMX.NAN per cell. The tile engine (tile_engine.cuh), which
// also tracks indices and serves every semiring, spends more per cell on staging and shared reads (its 4 x 4
// micro-tiles); this kernel is built for the one loop.
//
// Exactness. Rounding to nearest is monotone, so max_k round(a + b) = round(max_k (a + b)): every sum rounded
// to the input dtype gives the same maximum as the exact sums rounded once at the end. The result is the
// correctly rounded value of the exact answer in the input dtype: what the public API returns for 16-bit
// inputs (the fp32 path rounds twice, fp32 then 16-bit, and may differ from it by one 16-bit ulp on a
// double-rounding tie). NaN propagates (max.NaN), -inf + +inf = NaN, an all -inf row gives -inf. No argmax: the
// host takes this path only when no index is asked for (the gradient path tracks it in the tile engine).
//
// Layout. A block computes a 128 x 128 output tile of one batch entry (grid.x: tiles, grid.y strides over the
// batch), each thread an 8 x 8 micro-tile. k-tiles (kBK: 16 for 16-bit, 8 for float32) are staged through
// registers into double-buffered shared memory as [kBK][kBM] and [kBK][kBN] elements. 16-bit: two adjacent
// columns of B form a pair; a row value of A is added to both as the pair (x, x), which the add reads from A's
// word with an operand swizzle (.H0_H0 / .H1_H1: no extra instruction).
//
// Staging. Each thread moves a run of 16 bytes (8 16-bit or 4 float32 elements) of each operand's 128 x kBK tile
// per k-tile, adjacent along the operand's unit-stride dimension (k for a row-major a, the column for a row-major
// b, either for views): one 16-byte load where the host found the operand aligned for it and the run lies inside
// it, else predicated scalar reads (any strides: broadcasts, odd views, the edges). Elements past the output's
// rows / columns or the depth are staged as the semiring zero (zero + zero = zero), so every k-tile runs all its
// steps without a length check; those rows / columns are never stored.
//
// Per k step and thread: 16-bit 1 + 1 LDS.128, 32 HADD2 and 32 HMNMX2 (64 cells); float32 2 + 2 LDS.128, 64 FADD
// and 64 FMNMX (64 cells). Per k-tile: two loads, 2-16 shared stores, one barrier. The k-tile depths are measured
// (docs/perf_notes.md): 16 for 16-bit (8: 8% slower), 8 for float32 (16: 1% slower).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/kernel_ref.h"
#include "cuda/packed_select_launch.h"
#include "cuda/tile_launch.h"
#include "semiring.h"
#if SEMIRING_OPS_DEVICE_PASS
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace semiring_ops {
namespace cuda {
namespace packed {  // named (not anonymous), so that NVRTC can name the kernel

constexpr int kBM = kPackedTileRows, kBN = kPackedTileCols, kTM = 8, kTN = 8;
constexpr int kThreadsN = kBN / kTN, kThreads = (kBM / kTM) * kThreadsN;  // 16 x 16 = 256
static_assert(kThreads == kPackedThreads && kBM == kBN, "the shape header's thread count and square tiles");

// The grid and block, as the tile engine's (tile_launch.h launch_contraction): a block per output tile and batch entry.
struct Shape {
  static constexpr int BM = kBM, BN = kBN, kThreads = packed::kThreads;
};

#if SEMIRING_OPS_DEVICE_PASS

// Per element type (its bits, raw): the run of elements a thread stages per operand and k-tile (16 bytes: 8
// 16-bit or 4 float32 elements) and so the k-tile's depth (16 or 8).
template <class raw>
struct Tiling {
  static constexpr int kRun = select_run<raw>(), kBK = kRun * kThreads / kBM;
};

// The element types. raw: the element's bits; reg: one accumulator register (kCells cells); row(w, i): the
// register of a's element i among the words w of its shared row (16-bit: (x, x), which ptxas folds into the add's
// operand as .H0_H0 / .H1_H1, so A stays one element per slot); the semiring's times (add) and plus (select,
// NaN-propagating) on registers.
template <class T>
struct SelectElem;

template <>
struct SelectElem<float> {
  using raw = uint32_t;
  using reg = float;
  static constexpr int kCells = 1;
  static constexpr raw kMinusInf = 0xff800000u, kPlusInf = 0x7f800000u;
  static __device__ __forceinline__ reg from_bits(uint32_t w) { return __uint_as_float(w); }
  static __device__ __forceinline__ reg splat(raw x) { return from_bits(x); }
  static __device__ __forceinline__ reg row(const uint32_t* w, int i) { return from_bits(w[i]); }
  static __device__ __forceinline__ reg add(reg x, reg y) { return __fadd_rn(x, y); }
  template <bool kIsMax>
  static __device__ __forceinline__ reg select(reg x, reg y) {
    return kIsMax ? nan_max(x, y) : nan_min(x, y);
  }
  static __device__ __forceinline__ void to_float(reg x, float (&out)[kCells]) { out[0] = x; }
};

// A pair's (lo, lo) (half 0) or (hi, hi) (half 1), and its two values in float.
__device__ __forceinline__ __half2 splat_half(__half2 x, int half) { return half ? __high2half2(x) : __low2half2(x); }
__device__ __forceinline__ __nv_bfloat162 splat_half(__nv_bfloat162 x, int half) {
  return half ? __high2bfloat162(x) : __low2bfloat162(x);
}
__device__ __forceinline__ float2 pair_to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }

// 16-bit pairs: reg is the CUDA pair type, built from a 32-bit word (low half = lower column).
template <class Pair, uint16_t kMinusInfBits, uint16_t kPlusInfBits>
struct SelectPair {
  using raw = uint16_t;
  using reg = Pair;
  static constexpr int kCells = 2;
  static constexpr raw kMinusInf = kMinusInfBits, kPlusInf = kPlusInfBits;
  static __device__ __forceinline__ reg from_bits(uint32_t w) { return *reinterpret_cast<const reg*>(&w); }
  static __device__ __forceinline__ reg splat(raw x) { return from_bits(static_cast<uint32_t>(x) * 0x10001u); }
  static __device__ __forceinline__ reg row(const uint32_t* w, int i) { return splat_half(from_bits(w[i / 2]), i % 2); }
  static __device__ __forceinline__ reg add(reg x, reg y) { return __hadd2(x, y); }
  template <bool kIsMax>
  static __device__ __forceinline__ reg select(reg x, reg y) {
    if constexpr (kIsMax) {
      return __hmax2_nan(x, y);
    } else {
      return __hmin2_nan(x, y);
    }
  }
  static __device__ __forceinline__ void to_float(reg x, float (&out)[kCells]) {
    const float2 f = pair_to_float2(x);
    out[0] = f.x;
    out[1] = f.y;
  }
};

template <>
struct SelectElem<c10::Half> : SelectPair<__half2, 0xfc00u, 0x7c00u> {};
template <>
struct SelectElem<c10::BFloat16> : SelectPair<__nv_bfloat162, 0xff80u, 0x7f80u> {};

// Which kRun elements of an operand's kOuter x kBK tile a thread stages: (o + q * step_o, t + q * step_t) for
// q < kRun, adjacent along the unit-stride dimension (outer_fastest: the outer one), so a warp's reads coalesce.
struct Run {
  int o, t, step_o, step_t;
};

template <class raw, int kOuter>
__device__ __forceinline__ Run run_of(bool outer_fastest, int tid) {
  constexpr int kRun = Tiling<raw>::kRun, kBK = Tiling<raw>::kBK;
  if (outer_fastest) return {kRun * (tid % (kOuter / kRun)), tid / (kOuter / kRun), 1, 0};
  return {tid / (kBK / kRun), kRun * (tid % (kBK / kRun)), 0, 1};
}

// An operand's reads as a cursor over the k-tiles: the address of the thread's element 0 at the current tile,
// the distance between its kRun elements, and which of them lie inside the outer extent (fixed per block).
template <class raw>
struct Cursor {
  const raw* ptr;
  int64_t step_q;     // elements from one of the run to the next (1 on the unit-stride dimension)
  int64_t step_tile;  // kBK * stride along k
  uint32_t outer_ok;  // bit q: element q's outer index is inside the operand
  bool vector;        // vector reads for the run in full k-tiles: aligned (the host's flag) and all inside
};

// kWords 32-bit words from 16-byte aligned src to 16-byte aligned dst, as kWords / 4 16-byte accesses.
template <int kWords>
__device__ __forceinline__ void copy_words(void* dst, const void* src) {
  static_assert(kWords % 4 == 0, "whole 16-byte vectors");
#pragma unroll
  for (int v = 0; v < kWords / 4; ++v) reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
}

// The run's staged elements' bits, packed into four words (16 bytes), ready for the vector load and the shared
// stores.
template <class raw>
struct Staged {
  static constexpr int kRun = Tiling<raw>::kRun, kWords = kRun * static_cast<int>(sizeof(raw)) / 4;
  uint32_t w[kWords];
  __device__ __forceinline__ raw get(int q) const {
    if constexpr (sizeof(raw) == 4) {
      return w[q];
    } else {
      return static_cast<raw>(w[q / 2] >> (16 * (q % 2)));
    }
  }
};

template <class T>
__device__ __forceinline__ Cursor<typename SelectElem<T>::raw> cursor_of(const OperandField<T>& f, bool vec,
                                                                          const Run& m, int64_t p, int outer0,
                                                                          int outer_end) {
  using raw = typename SelectElem<T>::raw;
  constexpr int kRun = Tiling<raw>::kRun, kBK = Tiling<raw>::kBK;
  Cursor<raw> c;
  c.ptr = reinterpret_cast<const raw*>(f.ptr) + p * f.stride_p + static_cast<int64_t>(outer0 + m.o) * f.stride_outer +
          static_cast<int64_t>(m.t) * f.stride_t;
  c.step_q = static_cast<int64_t>(m.step_o) * f.stride_outer + static_cast<int64_t>(m.step_t) * f.stride_t;
  c.step_tile = static_cast<int64_t>(kBK) * f.stride_t;
  c.outer_ok = 0;
#pragma unroll
  for (int q = 0; q < kRun; ++q) c.outer_ok |= (outer0 + m.o + q * m.step_o < outer_end ? 1u : 0u) << q;
  // computed once per block: the empty asm keeps the compiler from recomputing it from outer_ok in every k-tile
  // (~20 instructions a tile and operand, which it did for the 16-bit kernels)
  uint32_t vector = vec && c.outer_ok == (1u << kRun) - 1 ? 1u : 0u;
  asm volatile("" : "+r"(vector));
  c.vector = vector != 0;
  return c;
}

// Global -> registers for the cursor's tile at k0 (elements outside the operand become `zero`); the cursor moves
// on.
template <class raw>
__device__ __forceinline__ void fetch(Staged<raw>& st, Cursor<raw>& c, const Run& m, int k0, int depth, raw zero) {
  constexpr int kRun = Tiling<raw>::kRun, kBK = Tiling<raw>::kBK;
  if (c.vector && k0 + kBK <= depth) {
    copy_words<Staged<raw>::kWords>(st.w, c.ptr);
  } else {
#pragma unroll
    for (int i = 0; i < Staged<raw>::kWords; ++i) st.w[i] = 0;
#pragma unroll
    for (int q = 0; q < kRun; ++q) {
      const bool inside = ((c.outer_ok >> q) & 1u) && k0 + m.t + q * m.step_t < depth;
      const raw x = inside ? c.ptr[q * c.step_q] : zero;
      if constexpr (sizeof(raw) == 4) {
        st.w[q] = x;
      } else {
        st.w[q / 2] |= static_cast<uint32_t>(x) << (16 * (q % 2));
      }
    }
  }
  c.ptr += c.step_tile;
}

template <class T, bool kIsMax>
__global__ void __launch_bounds__(kThreads, 2) select_kernel(const __grid_constant__ PackedArgs<T> args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using E = SelectElem<T>;
  using raw = typename E::raw;
  using reg = typename E::reg;
  constexpr int kCells = E::kCells;
  constexpr int kRegsN = kTN / kCells;                 // registers per micro-tile row
  constexpr int kPitch = kBM + 16 / sizeof(raw);       // in elements: rows stay 16-byte aligned
  constexpr int kRowWords = kTM * sizeof(raw) / 4;     // a thread's kTM elements of an A row
  constexpr raw kZero = kIsMax ? E::kMinusInf : E::kPlusInf;
  constexpr int kRun = Tiling<raw>::kRun, kBK = Tiling<raw>::kBK;

  __shared__ __align__(16) raw smem_a[2][kBK][kPitch];
  __shared__ __align__(16) raw smem_b[2][kBK][kPitch];

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % kThreadsN, ty = tid / kThreadsN;
  const int r0 = static_cast<int>(blockIdx.x / args.tiles_n) * kBM;
  const int s0 = static_cast<int>(blockIdx.x % args.tiles_n) * kBN;
  const int num_tiles = (args.depth + kBK - 1) / kBK;
  const Run qa = run_of<raw, kBM>(args.a.stride_outer <= args.a.stride_t, tid);
  const Run qb = run_of<raw, kBN>(args.b.stride_outer <= args.b.stride_t, tid);
  // 16-bit B's thread reads 8 adjacent columns (one LDS.128); float32's two groups of 4, 64 apart, so that each
  // quarter-warp's 16-byte reads cover 128 adjacent bytes (no bank conflicts).
  auto column = [&](int j) {  // column of register j's first cell, within the tile
    if constexpr (kCells == 2) {
      return tx * kTN + 2 * j;
    } else {
      return (j < 4 ? 0 : kBN / 2) + tx * 4 + (j % 4);
    }
  };

  // a run along the tile's row (the outer dimension): one 16-byte store; along k: one element per row
  auto commit_one = [&](raw(*tile)[kPitch], const Run& q, const Staged<raw>& st) {
    if (q.step_o == 1) {
      copy_words<Staged<raw>::kWords>(&tile[q.t][q.o], st.w);
    } else {
#pragma unroll
      for (int i = 0; i < kRun; ++i) tile[q.t + i][q.o] = st.get(i);
    }
  };
  auto commit = [&](int buf, const Staged<raw>& sa, const Staged<raw>& sb) {
    commit_one(smem_a[buf], qa, sa);
    commit_one(smem_b[buf], qb, sb);
  };

  for (int64_t p = blockIdx.y; p < args.batch; p += gridDim.y) {
    reg acc[kTM][kRegsN];
    const reg zero = E::splat(kZero);
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kRegsN; ++j) acc[i][j] = zero;
    }
    Cursor<raw> ca = cursor_of(args.a, args.vec_a, qa, p, r0, args.rows);
    Cursor<raw> cb = cursor_of(args.b, args.vec_b, qb, p, s0, args.cols);
    Staged<raw> sa, sb;
    if (num_tiles > 0) {
      fetch(sa, ca, qa, 0, args.depth, kZero);
      fetch(sb, cb, qb, 0, args.depth, kZero);
      commit(0, sa, sb);
      __syncthreads();
    }
    for (int kt = 0; kt < num_tiles; ++kt) {
      const int buf = kt & 1;
      const bool has_next = kt + 1 < num_tiles;
      if (has_next) {  // in flight during the compute
        fetch(sa, ca, qa, (kt + 1) * kBK, args.depth, kZero);
        fetch(sb, cb, qb, (kt + 1) * kBK, args.depth, kZero);
      }
#pragma unroll
      for (int t = 0; t < kBK; ++t) {
        uint32_t aw[kRowWords], bw[kRegsN];  // B: a register's bits per word, in groups of 4 adjacent (column)
        copy_words<kRowWords>(aw, &smem_a[buf][t][ty * kTM]);
#pragma unroll
        for (int v = 0; v < kRegsN / 4; ++v) copy_words<4>(bw + 4 * v, &smem_b[buf][t][column(4 * v)]);
#pragma unroll
        for (int i = 0; i < kTM; ++i) {
#pragma unroll
          for (int j = 0; j < kRegsN; ++j) {
            acc[i][j] = E::template select<kIsMax>(acc[i][j], E::add(E::row(aw, i), E::from_bits(bw[j])));
          }
        }
      }
      // The other buffer was last read in iteration kt - 1, which ended with a barrier.
      if (has_next) commit(buf ^ 1, sa, sb);
      __syncthreads();
    }

    const int r_base = r0 + ty * kTM;
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int r = r_base + i;
      if (r >= args.rows) break;
      float* row = args.out + (p * args.rows + r) * static_cast<int64_t>(args.cols);
#pragma unroll
      for (int j = 0; j < kRegsN; ++j) {
        float v[kCells];
        E::to_float(acc[i][j], v);
#pragma unroll
        for (int c = 0; c < kCells; ++c) {
          const int s = s0 + column(j) + c;
          if (s < args.cols) row[s] = v[c];
        }
      }
    }
  }
#else
  __trap();  // the host launches it only on sm_80+
#endif
}
#endif  // SEMIRING_OPS_DEVICE_PASS

}  // namespace packed

#if !defined(__CUDACC_RTC__)

template <class T, bool kIsMax>
LaunchStatus launch_packed_select(PackedArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                                  cudaStream_t stream) {
  const void* kernel =
      SEMIRING_OPS_KERNEL_OF("cuda/packed_select_kernels.cu", packed::select_kernel, T, SEMIRING_OPS_VALUE(kIsMax));
  return launch_contraction<packed::Shape>(kernel, args, batch, rows, cols, depth, stream);
}

#define SEMIRING_OPS_PACKED(T, MAX) \
  template LaunchStatus launch_packed_select<T, MAX>(PackedArgs<T>&, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
SEMIRING_OPS_PACKED(float, true)
SEMIRING_OPS_PACKED(float, false)
SEMIRING_OPS_PACKED(c10::Half, true)
SEMIRING_OPS_PACKED(c10::Half, false)
SEMIRING_OPS_PACKED(c10::BFloat16, true)
SEMIRING_OPS_PACKED(c10::BFloat16, false)
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
