// The semiring bmm's tile-engine policy (bmm_kernels.cu instantiates it): see there.
// Device code and plain data only: NVRTC compiles it too (benchmarks/build_routes.py).
#pragma once

#include <type_traits>

#include "cuda/bmm_args.h"
#include "cuda/tile_engine.cuh"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {

template <class S, class scalar_t_, bool kArg>
struct GenericBmmPolicy {
  using scalar_t = scalar_t_;
  using acc_t = acc_of_t<scalar_t>;
  using Shape = typename BmmTiles<acc_t>::type;
  static constexpr int kNumLeft = 1, kNumRight = 1;
  static constexpr bool kHasOutField = false;
  using State = typename S::template Accumulator<acc_t, kArg>;
  using Params = BmmParams<acc_t>;

  static __device__ __forceinline__ acc_t load_left(int, acc_t x) { return S::to_kernel(x); }
  static __device__ __forceinline__ acc_t load_right(int, acc_t x) { return S::to_kernel(x); }
  static __device__ __forceinline__ acc_t load_out(acc_t x) { return x; }
  static __device__ __forceinline__ void init(State& st, acc_t) { st.init(); }
  static __device__ __forceinline__ void cell(State& st, const acc_t (&l)[1], const acc_t (&r)[1], int32_t k) {
    st.add(S::times(l[0], r[0]), k);
  }
  // logsumexp (float64 here) takes full t-tiles 4 terms at a time: one rescale of the running sum per 4
  // (semiring.h LogSumExp2Accumulator::add_chunk), ~4 instructions per cell beside the ex2 instead of ~8.
  static constexpr int kChunk = std::is_same<S, LogSemiring>::value ? 4 : 1;
  template <int U>
  static __device__ __forceinline__ void cell_chunk(State& st, const acc_t (&l)[U][1], const acc_t (&r)[U][1],
                                                    int32_t) {
    acc_t v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = S::times(l[u][0], r[u][0]);
    st.template add_chunk<U>(v);
  }
  static __device__ __forceinline__ void store(const State& st, const Params& prm, int64_t idx) {
    prm.out[idx] = st.result();
    if constexpr (kArg) prm.arg[idx] = static_cast<int64_t>(st.arg());
  }
};

// Of every 16 terms of a full t-tile, how many the log bmm's fast path computes on the FMA pipe (exp2_poly)
// instead of the MUFU (fast_exp2): chosen so that neither pipe bounds the loop (docs/perf_notes.md, "Log
// semiring past the exp unit"). Overridable at compile time to measure the balance.
#ifndef SEMIRING_OPS_LOG_POLY_PER_16
#define SEMIRING_OPS_LOG_POLY_PER_16 3
#endif

// The log semiring with float accumulation (float32, float16, bfloat16 inputs). Full t-tiles after the first
// take the engine's guarded fast path: per term one FADD (l + r), one FADD (- m), one exponential, one FADD,
// and no running maximum (semiring.h LogSumExp2TileAccumulator); the exponentials of SEMIRING_OPS_LOG_POLY_PER_16
// terms in 16 run on the FMA pipe. The first tile, a tile whose check fails (a new maximum more than 64 above
// m, +inf, NaN) and the last, partial tile take the exact path (add_chunk / add, integer running maximum).
template <class scalar_t_>
struct LogBmmPolicy {
  using scalar_t = scalar_t_;
  using acc_t = float;
  using Shape = typename BmmTiles<float>::type;
  static constexpr int kNumLeft = 1, kNumRight = 1;
  static constexpr bool kHasOutField = false;
  using State = LogSumExp2TileAccumulator;
  using Params = BmmParams<float>;

  static __device__ __forceinline__ float load_left(int, float x) { return LogSemiring::to_kernel(x); }
  static __device__ __forceinline__ float load_right(int, float x) { return LogSemiring::to_kernel(x); }
  static __device__ __forceinline__ float load_out(float x) { return x; }
  static __device__ __forceinline__ void init(State& st, float) { st.init(); }
  static __device__ __forceinline__ void cell(State& st, const float (&l)[1], const float (&r)[1], int32_t k) {
    st.add(l[0] + r[0], k);
  }
  static constexpr int kChunk = 4;
  template <int U>
  static __device__ __forceinline__ void cell_chunk(State& st, const float (&l)[U][1], const float (&r)[U][1],
                                                    int32_t) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = l[u][0] + r[u][0];
    st.template add_chunk<U>(v);
  }
  // the engine's guarded fast path (tile_engine.cuh)
  static constexpr bool kGuardedTiles = true;
  static __device__ __forceinline__ void cell_fast(State& st, const float (&l)[1], const float (&r)[1], int idx) {
    st.add_fast(l[0] + r[0], idx < Shape::TM * Shape::TN, in_share_of_16<SEMIRING_OPS_LOG_POLY_PER_16>(idx));
  }
  static __device__ __forceinline__ bool tile_ok(const State& st) { return st.tile_ok(); }
  static __device__ __forceinline__ void tile_commit(State& st) { st.tile_commit(); }
  static __device__ __forceinline__ void store(const State& st, const Params& prm, int64_t idx) {
    prm.out[idx] = st.result();
  }
};

// The bmm's policy for semiring S, element type scalar_t: LogBmmPolicy for the log semiring in float
// accumulation, GenericBmmPolicy otherwise.
template <class S, class scalar_t, bool kArg>
struct SemiringBmmPolicy
    : std::conditional_t<std::is_same_v<S, LogSemiring> && std::is_same_v<acc_of_t<scalar_t>, float> && !kArg,
                         LogBmmPolicy<scalar_t>, GenericBmmPolicy<S, scalar_t, kArg>> {};

}  // namespace cuda
}  // namespace semiring_ops
