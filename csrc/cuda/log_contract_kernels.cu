// The log-weighted contraction's kernels (contract in ops.h, log_contract; launcher in bmm_launch.h):
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s]).
// One policy of the tile engine (tile_engine.cuh; the policy in log_contract_policy.cuh): left fields {L0, L1?},
// right fields {R0, R1?}, O0 the output-indexed field. L0, R0 (at staging) and O0 (at init) are scaled by log2(e)
// (LogWeight::to_kernel), so each cell costs one exponential in base 2 (in float32 a fixed share of them on the FMA
// pipe: log_contract_policy.cuh). Instantiated for float32 / float64 x (L1 present?) x (R1 present?).
#include "cuda/bmm_args.h"
#include "cuda/kernel_ref.h"
#if SEMIRING_OPS_DEVICE_PASS
#include "cuda/log_contract_policy.cuh"
#endif

#if !defined(__CUDACC_RTC__)
#include "cuda/bmm_launch.h"

namespace semiring_ops {
namespace cuda {

#if !SEMIRING_OPS_DEVICE_PASS
template <class T, bool kL1, bool kR1>
struct LogContractPolicy;
#endif

template <class T, bool kL1, bool kR1>
LaunchStatus launch_log_contract(LogContractArgs<T, kL1, kR1>& args, int64_t batch, int64_t rows, int64_t cols,
                                 int64_t depth, cudaStream_t stream) {
  const void* kernel =
      SEMIRING_OPS_KERNEL_OF("cuda/log_contract_kernels.cu", contraction_kernel, LogContractPolicy<T, kL1, kR1>);
  return launch_contraction<typename ContractTiles<T>::type>(kernel, args, batch, rows, cols, depth, stream);
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
#endif  // !__CUDACC_RTC__
