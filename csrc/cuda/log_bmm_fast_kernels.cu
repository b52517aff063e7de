// semiring_ops::log_bmm_fast for CUDA tensors (contract in ops.h): the log-semiring product
//   C[p, i, j] = logsumexp_k (A[p, i, k] + B[p, k, j])
// on tensor cores, with an underflow guard that flags the outputs it cannot vouch for (the host recomputes
// those exactly: semiring_ops/ops/fast_log.py).
//
// The math (base 2: a = A log2 e, b = B log2 e; k split into tiles t of kKT):
//   alpha[i, t] = max_{k in t} a[i, k],   beta[t, j] = max_{k in t} b[k, j]      (host, ATen ops: log_bmm_fast_cuda.cpp)
//   Ahat[i, k] = 2^(a[i, k] - alpha[i, t]),   Bhat[k, j] = 2^(b[k, j] - beta[t, j])   both in [0, 1]
//   P_t[i, j] = sum_{k in t} Ahat[i, k] Bhat[k, j]                       mma.sync m16n8k8 TF32, fp32 sums
//   per output a running FlashAttention-style combine of s_t = alpha[i, t] + beta[t, j]:
//     s <= m:  acc += P_t 2^(s - m);     s > m:  acc = acc 2^(m - s) + P_t,  m = s
//   C = (m + log2 acc) ln 2.
// kPasses = 1: each operand rounded to TF32 (cvt.rna: relative error <= 2^-11), so every product carries
// a relative error <= ~2^-10 and so does their positive sum: |error of C| <= ~1e-3 nats.
// kPasses = 3 ("3xTF32"): x = hi + lo with hi = tf32(x), lo = tf32(x - hi); P = hi hi + hi lo + lo hi, the
// dropped lo lo and the rounding of lo are <= ~2^-21 relative: |error| ~1e-6 nats.
//
// Underflow guard. Terms whose scaled value falls below 2^-126 (flushed exp2 results, flushed products,
// flushed 2^(s - m) factors) are lost: at most 2k 2^-126 in units of 2^m. An output is TRUSTED when
//   acc >= 2^-64   (the lost mass is then <= 2k 2^-62 of the total: nothing), or
//   m was never raised above its start (no tile had a finite s): every term is -inf, C = -inf exactly.
// Anything else (acc below 2^-64, which is what happens when a tile's row and column maxima sit at
// different k so that P_t underflows; NaN) is written as NaN with flags = 1 and counted in *count.
// The host makes the maxima of a row (column) that holds NaN, +inf or |x| > 2^125 anywhere NaN in every
// tile: NaN then reaches acc (acc = fma(P, 2^NaN, acc)) and stays there, so the whole row (column) is
// flagged and recomputed exactly, and for the rows and columns that remain |s| < 2^127: no overflow, and
// m's start value -FLT_MAX is below every finite s.
//
// Kernel layout: a block computes a kBM x kBN output tile of one batch entry (grid.x: the tiles in groups
// of kGroupM tile rows, for L2 reuse; grid.y strides over the batch) with kThreads threads = 2 x 2 warps,
// each warp a 32 x 32 tile = 2 (m16) x 4 (n8) mma tiles, so a thread holds 32 outputs' m and acc (and, per
// k-tile, P). Per k-tile kt: each thread cp.async-copies its quads of the raw tile (kBM x kKT of A, kKT x kBN
// of B, in the input dtype) into its own slots of a raw area (it later reads back only what it copied
// itself, so those copies need no barrier, only cp.async.wait_group), and one warp copies the tile's row /
// column maxima into a two-stage ring, two tiles ahead (they are read by every thread, so they must pass a
// barrier). The thread then converts its elements to float, exponentiates them against the maxima (one ex2
// per element), rounds to TF32 and writes them to one of two "hat" buffers, [kBM][kPitchA] for A (row-major
// in k) and [kKT][kPitchB] for B; one barrier; the next copies are issued; the warps run the mma's on the
// hat buffer and the combine. Double-buffered hats: one barrier per k-tile. Interior tiles (no row, column
// or k out of range) take copy and transform paths without bounds checks.
//
// Inputs must have a unit inner stride, row and batch strides that are multiples of 4 elements (or a
// batch stride of 0: a broadcast operand is read in place) and 4-element-aligned data; the host copies an
// operand that does not (into a padded buffer, a broadcast one once), see vector_ready below.
// Requires sm_80 or newer (mma.sync tf32, cp.async); the host refuses older devices.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cuda/fast_log_launch.h"
#include "cuda/kernel_ref.h"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace fast_log {

// ---------------------------------------------------------------- shape

constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 8;          // mma.sync m16n8k8
constexpr int kTilesM = kWarpM / kMmaM;                  // 2 mma tiles along rows per warp
constexpr int kTilesN = kWarpN / kMmaN;                  // 4 along columns
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kGroupM = 8;                               // tile rows per rasterisation group

// Hat buffers: A as [row][k] with pitch kKT + 4 and B as [k][col] with pitch kBN + 8, so the fragment loads
// of a warp (lanes: g = lane >> 2 in 0..7, t = lane & 3 in 0..3) hit 32 distinct banks: A reads row g,
// column t (bank 4g + t mod 32), B reads row t, column g (bank 8t + g mod 32). Rows stay 16-byte aligned.
constexpr int kPitchA = kKT + 4;
constexpr int kPitchB = kBN + 8;
static_assert(kPitchA % 32 == 4 && kPitchB % 32 == 8, "pitches chosen for conflict-free fragment loads");
static_assert((kPitchA * 4) % 16 == 0 && (kPitchB * 4) % 16 == 0, "hat rows must stay 16-byte aligned");

// Staging: each thread copies quads (4 consecutive elements along the operand's unit stride).
// A tile kBM x kKT: kQuadsA quads per row; thread tid takes quad column tid % kQuadsA of rows
// tid / kQuadsA + l * kRowStepA. B tile kKT x kBN: quad column tid % kQuadsB of k-rows tid / kQuadsB + l * kRowStepB.
constexpr int kQuadsA = kKT / 4, kRowStepA = kThreads / kQuadsA, kLoadsA = kBM / kRowStepA;
constexpr int kQuadsB = kBN / 4, kRowStepB = kThreads / kQuadsB, kLoadsB = kKT / kRowStepB;
static_assert(kThreads % kQuadsA == 0 && kBM % kRowStepA == 0, "A staging must tile the block");
static_assert(kThreads % kQuadsB == 0 && kKT % kRowStepB == 0, "B staging must tile the block");

// Below this, acc is not trusted (module comment).
constexpr float kTrust = 5.42101086242752217e-20f;  // 2^-64
constexpr float kMaxFinite = 3.402823466e+38f;
constexpr float kLog2eF = static_cast<float>(kLog2e);
constexpr float kLn2F = static_cast<float>(kLn2);

// ---------------------------------------------------------------- shared memory layout (bytes)

template <class scalar_t, int kPasses>
struct Smem {
  static constexpr int kParts = kPasses == 1 ? 1 : 2;  // TF32 hi (and lo) of every hat element
  static constexpr int kQuadBytes = 4 * static_cast<int>(sizeof(scalar_t));
  // raw area (per thread: each thread reads back only its own slots): [kLoadsA][kThreads] quads of A,
  // [kLoadsB][kThreads] quads of B
  static constexpr int kRawA = 0;
  static constexpr int kRawB = kRawA + kLoadsA * kThreads * kQuadBytes;
  static constexpr int kRawBytes = kRawB + kLoadsB * kThreads * kQuadBytes;
  // maxima ring (shared by the block): [2][kBM + kBN] floats, a k-tile's row then column maxima in natural
  // units, copied two tiles ahead
  static constexpr int kRing = kRawBytes;
  static constexpr int kRingStage = (kBM + kBN) * 4;
  // one hat buffer: [kParts][kBM][kPitchA] A, [kParts][kKT][kPitchB] B, [kBM] alpha, [kBN] beta (floats)
  static constexpr int kHatA = 0;
  static constexpr int kHatB = kHatA + kParts * kBM * kPitchA * 4;
  static constexpr int kHatAlpha = kHatB + kParts * kKT * kPitchB * 4;
  static constexpr int kHatBeta = kHatAlpha + kBM * 4;
  static constexpr int kHatBytes = kHatBeta + kBN * 4;
  static constexpr int kHat0 = kRing + 2 * kRingStage;  // two hat buffers
  static constexpr int kBytes = kHat0 + 2 * kHatBytes;
  static_assert(kRawB % 16 == 0 && kRawBytes % 16 == 0 && kRingStage % 16 == 0, "alignment");
  static_assert(kHatB % 16 == 0 && kHatAlpha % 16 == 0 && kHatBeta % 16 == 0 && kHatBytes % 16 == 0, "alignment");
};

#if SEMIRING_OPS_DEVICE_PASS
// ---------------------------------------------------------------- device helpers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous global -> shared copies of 4, 8 or 16 bytes (cp.async, sm_80+); `src_bytes` < 4 copies that
// many bytes of a 4-byte slot and zero-fills the rest.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(kBytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async4_partial(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// x rounded to TF32 (10 mantissa bits, round to nearest, ties away from zero), as an fp32 value whose low 13
// bits are zero: exactly the TF32 number the mma uses. This is cvt.rna.tf32.f32's rounding, written as the
// integer add-and-mask that ptxas lowers cvt.rna to on sm_80 / sm_90, without its test for inf / NaN
// (the hat values are finite, in [0, 1]).
__device__ __forceinline__ float round_tf32(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// D += A B for one m16n8k8 tile, TF32 operands, fp32 accumulation. Fragment layout (PTX ISA, "Matrix
// Fragments for mma.m16n8k8", .tf32; identical to CUTLASS's SM80_16x8x8_F32TF32TF32F32_TN traits,
// include/cute/atom/mma_traits_sm80.hpp), with g = lane >> 2 and t = lane & 3:
//   A (16 x 8, row):  a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4]
//   B (8 x 8, col):   b0 = B[t][g], b1 = B[t + 4][g]                       (B[k][n])
//   C, D (16 x 8):    c0 = C[g][2t], c1 = C[g][2t + 1], c2 = C[g + 8][2t], c3 = C[g + 8][2t + 1]
// (tests/test_bmm_fast.py emulates this mapping with the kernel's shared-memory addressing.)
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four staged elements of the input dtype -> float.
template <class T>
__device__ __forceinline__ void load_quad(const T* q, float (&x)[4]) {
  if constexpr (sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(q);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(q);
    T e[4];
    memcpy(e, &u, sizeof(u));
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = static_cast<float>(e[i]);
  }
}

// Copies the quad src[0..3] of a row of `len` valid elements starting at element `pos` (so src[e] is valid
// for pos + e < len) into the 4-element slot dst. The full-quad case is one 16-byte (fp32) or 8-byte
// (16-bit) copy: the host guarantees 4-element alignment. A partial quad copies only the valid elements
// (16-bit: in 4-byte pairs, the second element of a pair zero-filled when invalid); the rest of the slot
// keeps stale data, masked at the transform.
template <class T>
__device__ __forceinline__ void copy_quad(T* dst, const T* src, int pos, int len) {
  if (pos + 3 < len) {
    cp_async<4 * static_cast<int>(sizeof(T))>(dst, src);
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int e = 0; e < 3; ++e)
      if (pos + e < len) cp_async<4>(dst + e, src + e);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int valid = len - (pos + 2 * h);  // elements of this pair inside the row
      if (valid > 0) cp_async4_partial(dst + 2 * h, src + 2 * h, valid >= 2 ? 4 : 2);
    }
  }
}

// ---------------------------------------------------------------- the kernel

template <class scalar_t, int kPasses>
struct Kernel {
  using Layout = Smem<scalar_t, kPasses>;
  static constexpr int kParts = Layout::kParts;
  static constexpr int kQuadBytes = Layout::kQuadBytes;

  // Thread-fixed coordinates.
  struct Ids {
    int tid, lane, g, t, wm, wn;  // warp (wm, wn) of the block's 2 x 2, lane's g = lane >> 2, t = lane & 3
    int aq, ar, bq, br;           // staging: A quad column / first row, B quad column / first k-row
  };

  static __device__ __forceinline__ Ids ids() {
    Ids d;
    d.tid = static_cast<int>(threadIdx.x);
    d.lane = d.tid & 31;
    const int warp = d.tid >> 5;
    d.wm = warp / kWarpsN;
    d.wn = warp % kWarpsN;
    d.g = d.lane >> 2;
    d.t = d.lane & 3;
    d.aq = d.tid % kQuadsA;
    d.ar = d.tid / kQuadsA;
    d.bq = d.tid % kQuadsB;
    d.br = d.tid / kQuadsB;
    return d;
  }

  // A tile with every row, column and k inside the problem: no bounds checks (uniform over the block).
  static __device__ __forceinline__ bool interior(const Args<scalar_t>& args, int r0, int c0, int kt) {
    return (r0 + kBM <= args.n) & (c0 + kBN <= args.m) & ((kt + 1) * kKT <= args.k);
  }

  // Issues this thread's cp.async copies of k-tile kt of batch entry p into its raw slots (not committed).
  static __device__ __forceinline__ void issue_tile(unsigned char* smem, const Args<scalar_t>& args, const Ids& d,
                                                    int64_t p, int r0, int c0, int kt) {
    scalar_t* raw_a = reinterpret_cast<scalar_t*>(smem + Layout::kRawA) + 4 * d.tid;
    scalar_t* raw_b = reinterpret_cast<scalar_t*>(smem + Layout::kRawB) + 4 * d.tid;
    const int k0 = kt * kKT;
    const int kq = k0 + 4 * d.aq, col = c0 + 4 * d.bq;
    const scalar_t* a = args.a + p * args.a_sp + static_cast<int64_t>(r0 + d.ar) * args.a_sr + kq;
    const scalar_t* b = args.b + p * args.b_sp + static_cast<int64_t>(k0 + d.br) * args.b_sr + col;
    const int64_t a_step = kRowStepA * args.a_sr, b_step = kRowStepB * args.b_sr;
    if (interior(args, r0, c0, kt)) {
#pragma unroll
      for (int l = 0; l < kLoadsA; ++l) cp_async<kQuadBytes>(raw_a + l * 4 * kThreads, a + l * a_step);
#pragma unroll
      for (int l = 0; l < kLoadsB; ++l) cp_async<kQuadBytes>(raw_b + l * 4 * kThreads, b + l * b_step);
      return;
    }
#pragma unroll
    for (int l = 0; l < kLoadsA; ++l)
      if ((r0 + d.ar + l * kRowStepA < args.n) & (kq < args.k))
        copy_quad(raw_a + l * 4 * kThreads, a + l * a_step, kq, args.k);
#pragma unroll
    for (int l = 0; l < kLoadsB; ++l)
      if ((k0 + d.br + l * kRowStepB < args.k) & (col < args.m))
        copy_quad(raw_b + l * 4 * kThreads, b + l * b_step, col, args.m);
  }

  // The first kBM / 4 + kBN / 4 threads copy k-tile kt's row and column maxima into ring stage kt & 1
  // (16 bytes each; n_pad and m_pad are multiples of the tile, so the copies are in range and aligned).
  static __device__ __forceinline__ void issue_maxima(unsigned char* smem, const Args<scalar_t>& args, const Ids& d,
                                                      int64_t p, int r0, int c0, int kt) {
    float* ring = reinterpret_cast<float*>(smem + Layout::kRing + (kt & 1) * Layout::kRingStage);
    if (d.tid < kBM / 4) {
      cp_async<16>(ring + 4 * d.tid,
                   args.rmax + p * args.rmax_sp + static_cast<int64_t>(kt) * args.n_pad + r0 + 4 * d.tid);
    } else if (d.tid < kBM / 4 + kBN / 4) {
      const int q = d.tid - kBM / 4;
      cp_async<16>(ring + kBM + 4 * q,
                   args.cmax + p * args.cmax_sp + static_cast<int64_t>(kt) * args.m_pad + c0 + 4 * q);
    }
  }

  // This thread's raw elements of k-tile kt -> hat buffer: 2^(x log2 e - alpha), rounded to TF32 (3 passes:
  // hi and lo parts), and the tile's scaled maxima. Invalid elements (past k, n or m, or in a row / column
  // whose maximum is not finite: -inf, or NaN for a bad row) become 2^-inf = 0, so stale raw data never
  // reaches the mma.
  template <bool kInterior>
  static __device__ __forceinline__ void transform(unsigned char* smem, unsigned char* hat, const Args<scalar_t>& args,
                                                   const Ids& d, int r0, int c0, int kt) {
    const scalar_t* raw_a = reinterpret_cast<const scalar_t*>(smem + Layout::kRawA) + 4 * d.tid;
    const scalar_t* raw_b = reinterpret_cast<const scalar_t*>(smem + Layout::kRawB) + 4 * d.tid;
    const float* ring = reinterpret_cast<const float*>(smem + Layout::kRing + (kt & 1) * Layout::kRingStage);
    float* hat_a = reinterpret_cast<float*>(hat + Layout::kHatA);
    float* hat_b = reinterpret_cast<float*>(hat + Layout::kHatB);
    float* hat_alpha = reinterpret_cast<float*>(hat + Layout::kHatAlpha);
    float* hat_beta = reinterpret_cast<float*>(hat + Layout::kHatBeta);
    const int k0 = kt * kKT;
#pragma unroll
    for (int l = 0; l < kLoadsA; ++l) {
      const int row_local = d.ar + l * kRowStepA;
      const int kq = k0 + 4 * d.aq;
      // the same rounded product x * log2e as for the elements, so the maximum maps to exactly 2^0
      const float alpha = __fmul_rn(ring[row_local], kLog2eF);
      // (& rather than &&: no short-circuit branches) fabsf(alpha) <= max is false for -inf and NaN
      bool use = fabsf(alpha) <= kMaxFinite;
      if constexpr (!kInterior) use = use & (r0 + row_local < args.n);
      float x[4];
      load_quad(raw_a + l * 4 * kThreads, x);
      float hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool ok = use;
        if constexpr (!kInterior) ok = ok & (kq + e < args.k);
        // select the exponent, not the result: no branch, and 2^-inf = 0 for the invalid elements
        const float v = fast_exp2(ok ? __fsub_rn(__fmul_rn(x[e], kLog2eF), alpha) : -pos_inf<float>());
        hi[e] = round_tf32(v);
        lo[e] = round_tf32(v - hi[e]);
      }
      float* dst = hat_a + row_local * kPitchA + 4 * d.aq;
      *reinterpret_cast<float4*>(dst) = make_float4(hi[0], hi[1], hi[2], hi[3]);
      if constexpr (kParts == 2)
        *reinterpret_cast<float4*>(dst + kBM * kPitchA) = make_float4(lo[0], lo[1], lo[2], lo[3]);
      if (d.aq == 0) hat_alpha[row_local] = alpha;
    }
    const float4 bm = *reinterpret_cast<const float4*>(ring + kBM + 4 * d.bq);
    const float beta[4] = {__fmul_rn(bm.x, kLog2eF), __fmul_rn(bm.y, kLog2eF), __fmul_rn(bm.z, kLog2eF),
                           __fmul_rn(bm.w, kLog2eF)};
    bool use_col[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      use_col[e] = fabsf(beta[e]) <= kMaxFinite;
      if constexpr (!kInterior) use_col[e] = use_col[e] & (c0 + 4 * d.bq + e < args.m);
    }
#pragma unroll
    for (int l = 0; l < kLoadsB; ++l) {
      const int krow_local = d.br + l * kRowStepB;
      float x[4];
      load_quad(raw_b + l * 4 * kThreads, x);
      float hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool ok = use_col[e];
        if constexpr (!kInterior) ok = ok & (k0 + krow_local < args.k);
        const float v = fast_exp2(ok ? __fsub_rn(__fmul_rn(x[e], kLog2eF), beta[e]) : -pos_inf<float>());
        hi[e] = round_tf32(v);
        lo[e] = round_tf32(v - hi[e]);
      }
      float* dst = hat_b + krow_local * kPitchB + 4 * d.bq;
      *reinterpret_cast<float4*>(dst) = make_float4(hi[0], hi[1], hi[2], hi[3]);
      if constexpr (kParts == 2)
        *reinterpret_cast<float4*>(dst + kKT * kPitchB) = make_float4(lo[0], lo[1], lo[2], lo[3]);
    }
    if (d.br == 0) *reinterpret_cast<float4*>(hat_beta + 4 * d.bq) = make_float4(beta[0], beta[1], beta[2], beta[3]);
  }

  // The warp's 32 x 32 products of one k-tile: P[mt][nt][c] for mma tile (mt, nt), fragment element c.
  static __device__ __forceinline__ void products(float (&P)[kTilesM][kTilesN][4], const unsigned char* hat,
                                                  const Ids& d) {
    const float* hat_a = reinterpret_cast<const float*>(hat + Layout::kHatA);
    const float* hat_b = reinterpret_cast<const float*>(hat + Layout::kHatB);
#pragma unroll
    for (int mt = 0; mt < kTilesM; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) P[mt][nt][c] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKT / kMmaK; ++ks) {
      uint32_t fa[kParts][kTilesM][4], fb[kParts][kTilesN][2];
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
#pragma unroll
        for (int mt = 0; mt < kTilesM; ++mt) {
          // rows wm*32 + mt*16 + g (+8), columns ks*8 + t (+4) of the A hat
          const float* src = hat_a + part * kBM * kPitchA + (d.wm * kWarpM + mt * kMmaM + d.g) * kPitchA +
                             ks * kMmaK + d.t;
          fa[part][mt][0] = __float_as_uint(src[0]);
          fa[part][mt][1] = __float_as_uint(src[8 * kPitchA]);
          fa[part][mt][2] = __float_as_uint(src[4]);
          fa[part][mt][3] = __float_as_uint(src[8 * kPitchA + 4]);
        }
#pragma unroll
        for (int nt = 0; nt < kTilesN; ++nt) {
          // k-rows ks*8 + t (+4), column wn*32 + nt*8 + g of the B hat
          const float* src = hat_b + part * kKT * kPitchB + (ks * kMmaK + d.t) * kPitchB + d.wn * kWarpN +
                             nt * kMmaN + d.g;
          fb[part][nt][0] = __float_as_uint(src[0]);
          fb[part][nt][1] = __float_as_uint(src[4 * kPitchB]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kTilesM; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kTilesN; ++nt) {
          if constexpr (kParts == 2) {  // the small cross terms first
            mma_tf32(P[mt][nt], fa[1][mt], fb[0][nt]);
            mma_tf32(P[mt][nt], fa[0][mt], fb[1][nt]);
          }
          mma_tf32(P[mt][nt], fa[0][mt], fb[0][nt]);
        }
      }
    }
  }

  // The running combine of one k-tile's products into (m, acc): one ex2 per output, no branch.
  // With up = s > m:  acc = up ? acc 2^(m - s) + P : acc + P 2^(s - m);  m = max(m, s).
  // s = -inf (an all -inf row or column in the tile; P = 0 then): 2^-inf = 0, nothing changes.
  // s = NaN (a bad row / column): 2^NaN poisons acc, and acc stays NaN through every later tile.
  static __device__ __forceinline__ void combine(float (&mx)[kTilesM][kTilesN][4], float (&acc)[kTilesM][kTilesN][4],
                                                 const float (&P)[kTilesM][kTilesN][4], const unsigned char* hat,
                                                 const Ids& d) {
    const float* hat_alpha = reinterpret_cast<const float*>(hat + Layout::kHatAlpha);
    const float* hat_beta = reinterpret_cast<const float*>(hat + Layout::kHatBeta);
    float al[kTilesM][2], be[kTilesN][2];
#pragma unroll
    for (int mt = 0; mt < kTilesM; ++mt) {
      al[mt][0] = hat_alpha[d.wm * kWarpM + mt * kMmaM + d.g];
      al[mt][1] = hat_alpha[d.wm * kWarpM + mt * kMmaM + d.g + 8];
    }
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
      const float2 v = *reinterpret_cast<const float2*>(hat_beta + d.wn * kWarpN + nt * kMmaN + 2 * d.t);
      be[nt][0] = v.x;
      be[nt][1] = v.y;
    }
#pragma unroll
    for (int mt = 0; mt < kTilesM; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float s = al[mt][c >> 1] + be[nt][c & 1];
          const float dlt = s - mx[mt][nt][c];
          const bool up = dlt > 0.f;
          const float e = fast_exp2(-fabsf(dlt));
          // both candidates after the ex2, then a select (ptxas: an FFMA and a predicated FFMA)
          const float raised = fmaf(acc[mt][nt][c], e, P[mt][nt][c]);
          const float kept = fmaf(P[mt][nt][c], e, acc[mt][nt][c]);
          acc[mt][nt][c] = up ? raised : kept;
          mx[mt][nt][c] = fmaxf(mx[mt][nt][c], s);  // NaN s leaves m (acc carries the NaN)
        }
      }
    }
  }

  // Writes out / flags of the thread's in-range outputs and adds the warp's flag count to *count.
  static __device__ __forceinline__ void store(const float (&mx)[kTilesM][kTilesN][4],
                                               const float (&acc)[kTilesM][kTilesN][4], const Args<scalar_t>& args,
                                               const Ids& d, int64_t p, int r0, int c0) {
    unsigned flagged = 0;
#pragma unroll
    for (int mt = 0; mt < kTilesM; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // fragment element c of tile (mt, nt) is C[g + 8 (c >> 1)][2t + (c & 1)] (mma_tf32's layout)
          const int row = r0 + d.wm * kWarpM + mt * kMmaM + d.g + 8 * (c >> 1);
          const int col = c0 + d.wn * kWarpN + nt * kMmaN + 2 * d.t + (c & 1);
          if (row < args.n && col < args.m) {
            const float a = acc[mt][nt][c], mm = mx[mt][nt][c];
            float value;
            uint8_t flag = 0;
            if (a >= kTrust) {
              value = (mm + log2f(a)) * kLn2F;
            } else if (a == 0.f && mm == -kMaxFinite) {  // no tile had a finite s: every term is -inf
              value = -pos_inf<float>();
            } else {
              value = __uint_as_float(0x7fffffffu);  // NaN until the host recomputes it
              flag = 1;
              ++flagged;
            }
            const int64_t idx = (p * args.n + row) * static_cast<int64_t>(args.m) + col;
            args.out[idx] = value;
            args.flags[idx] = flag;
          }
        }
      }
    }
    const unsigned warp_flagged = __reduce_add_sync(0xffffffffu, flagged);
    if (d.lane == 0 && warp_flagged != 0) atomicAdd(args.count, static_cast<unsigned long long>(warp_flagged));
  }
};

template <class scalar_t, int kPasses>
__global__ void __launch_bounds__(kThreads, kPasses == 1 ? 3 : 2)
    log_bmm_fast_kernel(const __grid_constant__ Args<scalar_t> args) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using K = Kernel<scalar_t, kPasses>;
  using Layout = typename K::Layout;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* hats = smem + Layout::kHat0;

  const typename K::Ids d = K::ids();
  // grouped rasterisation: kGroupM consecutive tile rows sweep the tile columns together
  const int pid = static_cast<int>(blockIdx.x);
  const int group = kGroupM * args.tiles_n;
  const int first_m = (pid / group) * kGroupM;
  const int group_rows = min(args.tiles_m - first_m, kGroupM);
  const int tile_m = first_m + (pid % group) % group_rows;
  const int tile_n = (pid % group) / group_rows;
  const int r0 = tile_m * kBM, c0 = tile_n * kBN;
  const int T = args.num_kt;

  for (int64_t p = blockIdx.y; p < args.batch; p += gridDim.y) {
    float mx[kTilesM][kTilesN][4], acc[kTilesM][kTilesN][4];
#pragma unroll
    for (int mt = 0; mt < kTilesM; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          mx[mt][nt][c] = -kMaxFinite;
          acc[mt][nt][c] = 0.f;
        }

    // Pipeline: the raw tile kt + 1 and the maxima of tile kt + 2 are copied while tile kt is computed.
    // Maxima of tile j: copied (by a few threads) after barrier j - 2, waited for by those threads at the top
    // of iteration j - 1, visible to all after barrier j - 1, read by transform j, overwritten (ring stage
    // j & 1) by the copy of tile j + 2 after barrier j.
    K::issue_maxima(smem, args, d, p, r0, c0, 0);
    if (T > 1) K::issue_maxima(smem, args, d, p, r0, c0, 1);
    K::issue_tile(smem, args, d, p, r0, c0, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();  // the maxima of tiles 0 and 1 are visible to every thread
#pragma unroll 1
    for (int kt = 0; kt < T; ++kt) {
      unsigned char* hat = hats + (kt & 1) * Layout::kHatBytes;
      cp_async_wait<0>();  // this thread's copies of raw tile kt (it reads only those) and of maxima kt + 1
      if (K::interior(args, r0, c0, kt))
        K::template transform<true>(smem, hat, args, d, r0, c0, kt);
      else
        K::template transform<false>(smem, hat, args, d, r0, c0, kt);
      // hat[kt & 1] is complete; every thread has finished tile kt - 1's products (the other hat), its
      // transform has read its raw slots and ring stage kt & 1, which the next copies may now overwrite
      __syncthreads();
      if (kt + 1 < T) K::issue_tile(smem, args, d, p, r0, c0, kt + 1);
      if (kt + 2 < T) K::issue_maxima(smem, args, d, p, r0, c0, kt + 2);
      cp_async_commit();
      float P[kTilesM][kTilesN][4];
      K::products(P, hat, d);
      K::combine(mx, acc, P, hat, d);
    }
    K::store(mx, acc, args, d, p, r0, c0);
    __syncthreads();  // the next batch entry's prologue writes the ring and hat 0, which may still be being read
  }
#else
  __trap();  // the host refuses devices below sm_80
#endif
}

#endif  // SEMIRING_OPS_DEVICE_PASS

#if !defined(__CUDACC_RTC__)
template <class scalar_t, int kPasses>
LaunchStatus launch_fast_log(const Args<scalar_t>& args, cudaStream_t stream) {
  using Layout = Smem<scalar_t, kPasses>;
  const void* kernel = SEMIRING_OPS_KERNEL_OF("cuda/log_bmm_fast_kernels.cu", fast_log::log_bmm_fast_kernel, scalar_t,
                                              SEMIRING_OPS_VALUE(kPasses));
  SEMIRING_OPS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout::kBytes));
  SEMIRING_OPS_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>(args.tiles_m) * static_cast<unsigned>(args.tiles_n),
                  static_cast<unsigned>(std::min<int64_t>(args.batch, 65535)));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, grid, dim3(kThreads), Layout::kBytes, stream, args));
  return last_launch();
}

#define SEMIRING_OPS_FAST_LOG(T, PASSES) \
  template LaunchStatus launch_fast_log<T, PASSES>(const Args<T>&, cudaStream_t);
SEMIRING_OPS_FAST_LOG(float, 1)
SEMIRING_OPS_FAST_LOG(float, 3)
SEMIRING_OPS_FAST_LOG(c10::Half, 1)
SEMIRING_OPS_FAST_LOG(c10::Half, 3)
SEMIRING_OPS_FAST_LOG(c10::BFloat16, 1)
SEMIRING_OPS_FAST_LOG(c10::BFloat16, 3)
#endif  // !__CUDACC_RTC__

}  // namespace fast_log
}  // namespace cuda
}  // namespace semiring_ops
