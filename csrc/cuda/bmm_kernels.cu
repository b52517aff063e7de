// The semiring bmm's kernels (contract in ops.h, bmm_forward; launcher in bmm_launch.h):
//   out[p, i, j] = (+)_k times(to_kernel(a[p, i, k]), to_kernel(b[p, k, j])), plus argmax / argmin.
// One policy of the tile engine (tile_engine.cuh): a is the single left field, b the single right
// field, and each output's state is the semiring's Accumulator. Instantiated for every semiring of
// semiring.h x {float16, bfloat16, float32, float64}; the arg-tracking variant only for semirings
// that select (max, min).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "cuda/bmm_launch.h"
#include "cuda/tile_engine.cuh"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace {

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

}  // namespace

template <class S, class T, bool kArg>
LaunchStatus launch_bmm(BmmArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                        cudaStream_t stream) {
  return launch_contraction<SemiringBmmPolicy<S, T, kArg>>(args, batch, rows, cols, depth, stream);
}

#define SEMIRING_OPS_BMM(S, T, ARG) \
  template LaunchStatus launch_bmm<S, T, ARG>(BmmArgs<T>&, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
#define SEMIRING_OPS_BMM_DTYPES(S, ARG)  \
  SEMIRING_OPS_BMM(S, c10::Half, ARG)     \
  SEMIRING_OPS_BMM(S, c10::BFloat16, ARG) \
  SEMIRING_OPS_BMM(S, float, ARG)         \
  SEMIRING_OPS_BMM(S, double, ARG)
#define SEMIRING_OPS_BMM_SEMIRING(S) SEMIRING_OPS_BMM_DTYPES(S, false)
SEMIRING_OPS_FOR_EACH_SEMIRING(SEMIRING_OPS_BMM_SEMIRING)
SEMIRING_OPS_BMM_DTYPES(MaxSemiring, true)  // the selecting semirings' argmax / argmin
SEMIRING_OPS_BMM_DTYPES(MinSemiring, true)

}  // namespace cuda
}  // namespace semiring_ops
