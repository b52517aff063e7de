// The log-partition gradient's launchers: the log semiring x {float, double}, reverse scan with the gradient
// epilogue (chain_log_backward).
#include "cuda/chain_kernels.cuh"

namespace semiring_ops {
namespace cuda {

SEMIRING_OPS_CHAIN_LAUNCHERS(LogSemiring, float, false, true)
SEMIRING_OPS_CHAIN_LAUNCHERS(LogSemiring, double, false, true)

}  // namespace cuda
}  // namespace semiring_ops
