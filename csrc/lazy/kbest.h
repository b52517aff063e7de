// The k-best reducer of the lazy reductions (Kmin, argKmin, Kmax, ...): per output row and per component of
// the formula, one list of the K best (value, j) seen so far, best first, in torch.topk's order
// (semiring_ops/lazy/reductions.py _kbest_order): by value (NaN the largest value: first for kIsMax, last
// otherwise), ties by the lower index. Slots not yet filled hold index -1 and NaN, and are stored as
// +inf (-inf for kIsMax) with index -1.
//
// Cost: add() compares each term with the list's last value, one compare that rejects it in the common case
// (a term beyond the K-th needs no more); a term that passes is inserted by shifting the worse entries one
// slot down. Terms come in increasing j, so a new term loses every tie with a held entry, and the one
// compare is exact except for NaN (for min: a NaN term passes it and is then rejected by the exact test;
// a NaN K-th value lets everything through to the exact test). Over n random terms about K (1 + ln(n / K))
// are inserted. merge() folds the list of a disjoint range of j in one O(K) pass of a two-list merge.
//
// Three insertions, all of the same result: kRegisters (the CUDA kernels' lists of up to
// reductions.KBEST_REGISTER_WORDS registers): an unrolled select chain whose indices are all compile-time
// constants, so the lists stay in registers; otherwise the lists live in memory (the stack on the CPU,
// local memory, cached in L1, on the GPU) and the K-th values are mirrored in ``last``, so the common
// compare reads no memory: a scan from the end that shifts as it goes, or on the host for K > 32 the rank
// by one vectorised count and a memmove of the entries behind.
//
// Entry points: add (one term), add_chunk (U terms, the CUDA chunked loop: one branch per U compares, then
// only the terms that may enter),
// add_lanes (the CPU kernels' vector lanes: one vector compare gives the mask of the terms that may enter).
#pragma once

#include "semiring.h"

namespace semiring_ops {
namespace lazy {

template <class T, int D, int K, bool kIsMax, bool kRegisters = false> struct KBestReducer {
  static constexpr int kIn = D, kOut = D * K, kIdx = D * K;
  static constexpr bool kBlockSum = false;  // no sums (reducers.h)
#if defined(__CUDA_ARCH__)
  static constexpr bool kCountRank = false;
#else
  // the host's insertion for long lists: rank by a vector count, then memmove (shorter: one scan-and-shift)
  static constexpr bool kCountRank = K > 32;
#endif
  T v[D][K];
  int32_t ix[D][K];
  T last[D];  // v[d][K - 1]: NaN while the list is not full, so every term passes the first compare
  int32_t n[D];  // filled entries (the memory variant's; the register variant tests ix[d][k] < 0)

  // whether a is strictly better than b by value alone (NaN: the largest value; two NaN tie). With & and |, not
  // && and ||, here and in insert(): the tests then compile to predicates and selects, where short-circuits made
  // a branch and a reconvergence point of each NaN case, in each slot of the register insertion (~250
  // instructions an insertion instead of ~120; nvcc and NVRTC 13.0, sm_90: docs/perf_notes.md, "The k-best
  // kernel on the route")
  SR_HD static bool better(T a, T b) {
    if (kIsMax) return (a > b) | (is_nan(a) & !is_nan(b));
    return (a < b) | (is_nan(b) & !is_nan(a));
  }
  // whether (va, ia) comes before (vb, ib): by value, then by the lower index; empty slots (index < 0) last
  SR_HD static bool before(T va, int32_t ia, T vb, int32_t ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    if (better(va, vb)) return true;
    if (better(vb, va)) return false;
    return ia < ib;
  }
  // the one compare of add(): false only for a term that cannot enter the list (x ties or is worse than a
  // non-NaN K-th value); x NaN, or a NaN (or empty) K-th value, passes
  SR_HD static bool may_enter(T x, T kth) { return kIsMax ? !(x <= kth) : !(x >= kth); }
  // whether a held value y stays ahead of a new term x (= !better(x, y), xnan = is_nan(x))
  SR_HD static bool stays_ahead(T y, T x, bool xnan) {
    if (xnan) return kIsMax ? is_nan(y) : true;
    return kIsMax ? !(x > y) : x >= y;
  }

  SR_HD void init() {
    const T nan = pos_inf<T>() - pos_inf<T>();
#pragma unroll
    for (int d = 0; d < D; ++d) {
      last[d] = nan;
      n[d] = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        v[d][k] = nan;
        ix[d][k] = -1;
      }
    }
  }

  // (x, j) into list d, j greater than every index it holds (so x loses ties)
  SR_HD void insert(int d, T x, int32_t j) {
    if ((ix[d][K - 1] >= 0) & !better(x, v[d][K - 1])) return;  // the exact test (the compare let it through)
    if constexpr (kRegisters) {
      // slot k takes slot k - 1 while x goes before it, then x; later slots keep theirs (all unrolled)
      bool moving = true;
#pragma unroll
      for (int k = K - 1; k > 0; --k) {
        const bool down = moving & ((ix[d][k - 1] < 0) | better(x, v[d][k - 1]));
        v[d][k] = down ? v[d][k - 1] : (moving ? x : v[d][k]);
        ix[d][k] = down ? ix[d][k - 1] : (moving ? j : ix[d][k]);
        moving = down;
      }
      if (moving) {
        v[d][0] = x;
        ix[d][0] = j;
      }
    } else {
      const int nd = n[d];
      const bool xnan = is_nan(x);
      int p;  // the slot of x: after the filled entries that stay ahead of it (the list is sorted)
      if constexpr (kCountRank) {
        p = 0;  // counted in one vectorisable pass, then the entries behind moved one slot down in one go
        for (int k = 0; k < K; ++k) p += (k < nd) & stays_ahead(v[d][k], x, xnan);
        const int end = nd < K ? nd : K - 1;
        if (end > p) {
          __builtin_memmove(&v[d][p + 1], &v[d][p], sizeof(T) * (end - p));
          __builtin_memmove(&ix[d][p + 1], &ix[d][p], sizeof(int32_t) * (end - p));
        }
      } else {
        for (p = nd < K ? nd : K - 1; p > 0 && !stays_ahead(v[d][p - 1], x, xnan); --p) {
          v[d][p] = v[d][p - 1];
          ix[d][p] = ix[d][p - 1];
        }
      }
      v[d][p] = x;
      ix[d][p] = j;
      n[d] = nd + (nd < K);
    }
    last[d] = v[d][K - 1];
  }

  SR_HD void add(const T* f, int32_t j) {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (may_enter(f[d], last[d])) insert(d, f[d], j);
  }

  // U consecutive cells f[u * kIn + d] at j0, j0 + 1, ... (the CUDA kernels' chunked loop): the U compares
  // give a mask of the terms that may enter, and only those are visited, in increasing j (so ties keep the
  // lower index), each against the K-th value as it then is. The common case costs one compare per term and
  // one branch per chunk. A warp runs the visiting loop as often as its busiest lane has candidates (1 in
  // the common case when any lane has one), not U times: early in a list's scan some lane of 32 inserts in
  // most chunks (a random order inserts at position t with probability ~K / t), and a loop over all U terms
  // made those chunks ~4x dearer (H200, 50,000^2 routed k-NN at D = 128: docs/perf_notes.md)
  template <int U> SR_HD void add_chunk(const T* f, int32_t j0) {
    static_assert(U <= 32, "add_chunk: at most 32 terms");
#pragma unroll
    for (int d = 0; d < D; ++d) {
      uint32_t mask = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) mask |= may_enter(f[u * kIn + d], last[d]) ? 1u << u : 0u;
#pragma unroll 1
      while (mask) {  // rare: one inlined copy of the insertion, the term picked by unrolled selects
#if defined(__CUDA_ARCH__)
        const int u = __ffs(mask) - 1;
#else
        const int u = __builtin_ctz(mask);
#endif
        mask &= mask - 1;
        T x = f[d];
#pragma unroll
        for (int w = 1; w < U; ++w) x = u == w ? f[w * kIn + d] : x;
        if (may_enter(x, last[d])) insert(d, x, j0 + u);
      }
    }
  }

#if !defined(__CUDA_ARCH__)
  // L (<= 32) consecutive terms per component, f[d * L + l] at j0 + l (the CPU kernels' lanes): one
  // vectorisable pass of compares against the K-th value gives the mask of the terms that may enter, and
  // only those are visited (each against the K-th value as it then is)
  template <int L> inline void add_lanes(const T* f, int32_t j0) {
    add_lanes_at<L>(f, [j0](int l) { return j0 + l; });
  }
  // the same for terms of any indices, js[l] (a block-sparse reduction's gathered terms)
  template <int L> inline void add_lanes(const T* f, const int32_t* js) {
    add_lanes_at<L>(f, [js](int l) { return js[l]; });
  }
  template <int L, class Index> inline void add_lanes_at(const T* f, Index index_of) {
    static_assert(L <= 32, "add_lanes: at most 32 lanes");
    for (int d = 0; d < D; ++d) {
      const T kth = last[d];
      const T* fd = f + d * L;
      uint32_t mask = 0;
      // (not unrolled: g++ vectorises the loop, not its unrolled copy)
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) mask |= may_enter(fd[l], kth) ? 1u << l : 0u;
      while (mask) {
        const int l = __builtin_ctz(mask);
        mask &= mask - 1;
        if (may_enter(fd[l], last[d])) insert(d, fd[l], index_of(l));
      }
    }
  }
#endif

  // folds in the lists of a disjoint range of j: a two-list merge, the K first kept (O(K) per component)
  SR_HD void merge(const KBestReducer& o) {
    for (int d = 0; d < D; ++d) {
      T mv[K];
      int32_t mi[K];
      int a = 0, b = 0;  // a + b = k < K: both stay in range
      for (int k = 0; k < K; ++k) {
        const bool take_o = before(o.v[d][b], o.ix[d][b], v[d][a], ix[d][a]);
        mv[k] = take_o ? o.v[d][b] : v[d][a];
        mi[k] = take_o ? o.ix[d][b] : ix[d][a];
        b += take_o;
        a += !take_o;
      }
      int filled = 0;
      for (int k = 0; k < K; ++k) {
        v[d][k] = mv[k];
        ix[d][k] = mi[k];
        filled += mi[k] >= 0;
      }
      n[d] = filled;
      last[d] = v[d][K - 1];
    }
  }

  // values and indices in (K, D) order: vals[k * D + d]
  SR_HD void store(T* vals, int64_t* idx) const {
    const T empty = kIsMax ? -pos_inf<T>() : pos_inf<T>();
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int k = 0; k < K; ++k) {
        vals[k * D + d] = ix[d][k] < 0 ? empty : v[d][k];
        idx[k * D + d] = ix[d][k];
      }
  }
};

}  // namespace lazy
}  // namespace semiring_ops
