// The log-weighted contraction's tile-engine policy (log_contract_kernels.cu instantiates it): see there.
// Device code and plain data only: NVRTC compiles it too (benchmarks/build_routes.py).
#pragma once

#include <type_traits>

#include "cuda/bmm_args.h"
#include "cuda/tile_engine.cuh"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {

#ifndef SEMIRING_OPS_LOG_CONTRACT_POLY_PER_16
#define SEMIRING_OPS_LOG_CONTRACT_POLY_PER_16 2
#endif

template <class T, bool kL1, bool kR1>
struct LogContractPolicy {
  using scalar_t = T;
  using acc_t = T;
  using Shape = typename ContractTiles<T>::type;
  static constexpr int kNumLeft = kL1 ? 2 : 1;   // field 0: L0, field 1: L1
  static constexpr int kNumRight = kR1 ? 2 : 1;  // field 0: R0, field 1: R1
  static constexpr bool kHasOutField = true;     // O0
  struct State {
    acc_t sum;
    acc_t o;  // O0[p, r, s] * log2(e)
  };
  using Params = LogContractParams<T>;

  static __device__ __forceinline__ acc_t load_left(int f, acc_t x) { return f == 0 ? LogWeight::to_kernel(x) : x; }
  static __device__ __forceinline__ acc_t load_right(int f, acc_t x) { return f == 0 ? LogWeight::to_kernel(x) : x; }
  static __device__ __forceinline__ acc_t load_out(acc_t x) { return LogWeight::to_kernel(x); }
  static __device__ __forceinline__ void init(State& st, acc_t o) {
    st.sum = acc_t(0);
    st.o = o;
  }
  // Each term's weight is one exponential: in float, SEMIRING_OPS_LOG_CONTRACT_POLY_PER_16 of every 16 terms of a
  // tile (by their place idx, tile_engine.cuh kIndexedCells) take exp2_poly on the FMA pipe, the others the MUFU
  // (fast_exp2): the same values to 2^-22, so that neither pipe bounds the loop (docs/perf_notes.md).
  static constexpr bool kIndexedCells = true;
  static __device__ __forceinline__ void cell_at(State& st, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
                                                 int32_t /*t*/, int idx) {
    const acc_t x = l[0] + r[0] + st.o;
    acc_t w;
    if constexpr (std::is_same_v<acc_t, float>) {
      w = in_share_of_16<SEMIRING_OPS_LOG_CONTRACT_POLY_PER_16>(idx) ? exp2_poly(x) : fast_exp2(x);
    } else {
      w = LogWeight::weight(x);
    }
    if constexpr (kL1 && kR1) {
      st.sum += (l[1] * r[1]) * w;
    } else if constexpr (kL1) {
      st.sum += l[1] * w;
    } else if constexpr (kR1) {
      st.sum += r[1] * w;
    } else {
      st.sum += w;
    }
  }
  static __device__ __forceinline__ void store(const State& st, const Params& prm, int64_t idx) {
    prm.out[idx] = st.sum;
  }
};

}  // namespace cuda
}  // namespace semiring_ops
