// The reducers of the lazy reductions: what a generated kernel (semiring_ops/lazy/codegen.py) keeps per
// output row while it walks the reduced index j. Each reducer consumes the formula's value at (i, j), a
// vector f of kIn components, and produces kOut values (and kIdx indices) per row:
//
//   SemiringReducer<T, S, D, kArg>     one semiring.h accumulator per component: sum (Std), logsumexp (Log),
//                                      max, min (with the index of the first extremum when kArg)
//   WeightedLogSumExpReducer<T, DW>    log sum_j exp(f0) * w_j for f = (f0, w_1 .. w_DW)
//   KBestReducer<T, D, K, kIsMax>      the K best values of each component and their indices (kbest.h)
//
// The interface, shared by the CPU and CUDA skeletons: init(); add(f, j) with j increasing within one
// reducer; merge(other) folding in a reducer of a disjoint range of j (split reductions, SIMD lanes, blocks);
// store(vals, idx); kBlockSum (SemiringReducer); and, for the CUDA skeleton's chunked loop,
// SemiringReducer::add_chunk<U>(f, j0).
// Reducers are plain aggregates, so split reductions can park them in a workspace.
#pragma once

#include "kbest.h"
#include "semiring.h"

namespace semiring_ops {
namespace lazy {

// U consecutive terms x[0..U) (user units, indices k0, k0 + 1, ...) into one accumulator of semiring S:
// U calls of add(), or for logsumexp the accumulator's add_chunk (one rescale per chunk, and the
// conversion to base 2 fused into the exponent's FFMA).
template <class S> struct ChunkAdder {
  template <int U, class A, class T> SR_HD static void add(A& acc, const T* x, int32_t k0) {
#pragma unroll
    for (int u = 0; u < U; ++u) acc.add(S::to_kernel(x[u]), k0 + u);
  }
};
template <> struct ChunkAdder<LogSemiring> {
  template <int U, class A, class T> SR_HD static void add(A& acc, const T* x, int32_t) {
    acc.template add_chunk<U>(x, T(kLog2e));
  }
};

// kBlockSum: the skeletons keep a second reducer per row (or lane) and fold this one into it at the end of each
// block of j (every tile on CUDA, every 1,024 terms on the CPU): KeOps' default sum_scheme "block_sum", so a float32
// sum of n terms carries a rounding error of ~(block + n / block) eps instead of ~n eps (over 10^6 points: ~1e-6
// relative instead of ~1e-4). Sums only: a max, min or k-best is exact in any order.
template <class T, class S, int D, bool kArg> struct SemiringReducer {
  static constexpr int kIn = D, kOut = D, kIdx = kArg ? D : 0;
  static constexpr bool kBlockSum = S::kId == StdSemiring::kId;
  using Acc = typename S::template Accumulator<T, kArg>;
  Acc acc[D];

  SR_HD void init() {
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d].init();
  }
  SR_HD void add(const T* f, int32_t j) {
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d].add(S::to_kernel(f[d]), j);
  }
  // U consecutive cells f[u * kIn + d], u = 0..U-1, at j0, j0 + 1, ...
  template <int U> SR_HD void add_chunk(const T* f, int32_t j0) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      T x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = f[u * kIn + d];
      ChunkAdder<S>::template add<U>(acc[d], x, j0);
    }
  }
  SR_HD void merge(const SemiringReducer& o) {
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d].merge(o.acc[d]);
  }
  SR_HD void store(T* vals, int64_t* idx) const {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      vals[d] = acc[d].result();
      if (kArg) idx[d] = acc[d].arg();
    }
  }
};

// log(sum_j exp(f0_j) w_j) per weight component, one running maximum of f0 shared by all components
// (base 2, one ex2 per term as LogSumExp2Accumulator). Negative sums give NaN, as log would.
template <class T, int DW> struct WeightedLogSumExpReducer {
  static constexpr int kIn = 1 + DW, kOut = DW, kIdx = 0;
  static constexpr bool kBlockSum = false;
  T m;
  T s[DW];

  SR_HD void init() {
    m = -max_finite<T>();
#pragma unroll
    for (int k = 0; k < DW; ++k) s[k] = T(0);
  }
  SR_HD void add(const T* f, int32_t /*j*/) {
    const T v = f[0] * T(kLog2e);
    const T d = v == m ? T(0) : v - m;
    const T e = fast_exp2(-sr_abs(d));
    const bool up = d > T(0);
#pragma unroll
    for (int k = 0; k < DW; ++k) s[k] = up ? s[k] * e + f[1 + k] : s[k] + f[1 + k] * e;
    m = up ? v : m;
  }
  SR_HD void merge(const WeightedLogSumExpReducer& o) {
    const T top = o.m > m ? o.m : m;
    const T ea = fast_exp2(m == top ? T(0) : m - top);
    const T eb = fast_exp2(o.m == top ? T(0) : o.m - top);
#pragma unroll
    for (int k = 0; k < DW; ++k) s[k] = s[k] * ea + o.s[k] * eb;
    m = top;
  }
  SR_HD void store(T* vals, int64_t* /*idx*/) const {
#pragma unroll
    for (int k = 0; k < DW; ++k) vals[k] = (m + sr_log2(s[k])) * T(kLn2);
  }
};

}  // namespace lazy
}  // namespace semiring_ops
