// The log-weighted contraction's kernels (contract in ops.h, log_contract; launcher in bmm_launch.h):
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s]).
// One policy of the tile engine (tile_engine.cuh): left fields {L0, L1?}, right fields {R0, R1?}, O0
// the output-indexed field. L0, R0 (at staging) and O0 (at init) are scaled by log2(e)
// (LogWeight::to_kernel), so each cell costs one ex2. Instantiated for float32 / float64 x
// (L1 present?) x (R1 present?).
#include "cuda/bmm_launch.h"
#include "cuda/tile_engine.cuh"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace {

// Tile shapes, per element type (fp64 halves the tile, as for bmm).
template <class T>
struct ContractTiles;
template <>
struct ContractTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct ContractTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

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
  static __device__ __forceinline__ void cell(State& st, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
                                              int32_t /*t*/) {
    const acc_t w = LogWeight::weight(l[0] + r[0] + st.o);
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

}  // namespace

template <class T, bool kL1, bool kR1>
LaunchStatus launch_log_contract(LogContractArgs<T, kL1, kR1>& args, int64_t batch, int64_t rows, int64_t cols,
                                 int64_t depth, cudaStream_t stream) {
  return launch_contraction<LogContractPolicy<T, kL1, kR1>>(args, batch, rows, cols, depth, stream);
}

#define SEMIRING_OPS_LOG_CONTRACT(T, L1, R1)                                                                     \
  template LaunchStatus launch_log_contract<T, L1, R1>(LogContractArgs<T, L1, R1>&, int64_t, int64_t, int64_t, \
                                                       int64_t, cudaStream_t);
#define SEMIRING_OPS_LOG_CONTRACT_DTYPE(T)    \
  SEMIRING_OPS_LOG_CONTRACT(T, false, false) \
  SEMIRING_OPS_LOG_CONTRACT(T, false, true)  \
  SEMIRING_OPS_LOG_CONTRACT(T, true, false)  \
  SEMIRING_OPS_LOG_CONTRACT(T, true, true)
SEMIRING_OPS_LOG_CONTRACT_DTYPE(float)
SEMIRING_OPS_LOG_CONTRACT_DTYPE(double)

}  // namespace cuda
}  // namespace semiring_ops
