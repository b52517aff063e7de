// The scans' launchers: every semiring x {float, double}, without back-pointers or gradient (chain_scan, and
// crf_log_likelihood's log scan). One of three translation units, so that nvcc compiles them in parallel.
#include "cuda/chain_kernels.cuh"

namespace semiring_ops {
namespace cuda {

SEMIRING_OPS_CHAIN_LAUNCHERS(LogSemiring, float, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(LogSemiring, double, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MaxSemiring, float, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MaxSemiring, double, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MinSemiring, float, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MinSemiring, double, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(StdSemiring, float, false, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(StdSemiring, double, false, false)

}  // namespace cuda
}  // namespace semiring_ops
