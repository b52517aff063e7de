// The semiring bmm's tile-engine policy (bmm_kernels.cu instantiates it): see there.
// Device code and plain data only: NVRTC compiles it too (benchmarks/build_routes.py).
#pragma once

#include <type_traits>

#include "cuda/bmm_args.h"
#include "cuda/tile_engine.cuh"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {

// Tile shapes, per accumulation type. fp64 halves the tile: its states and staging take twice
// the registers and shared memory.
template <class acc_t>
struct BmmTiles;
template <>
struct BmmTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct BmmTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

template <class S, class scalar_t_, bool kArg>
struct SemiringBmmPolicy {
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
  // logsumexp takes full t-tiles 4 terms at a time: one rescale of the running sum per 4 (semiring.h
  // LogSumExp2Accumulator::add_chunk), ~4 instructions per cell beside the ex2 instead of ~8.
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

}  // namespace cuda
}  // namespace semiring_ops
