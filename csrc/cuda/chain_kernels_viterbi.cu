// Viterbi's launchers: the selecting semirings (max, min) x {float, double}, with back-pointers (chain_viterbi).
#include "cuda/chain_kernels.cuh"

namespace semiring_ops {
namespace cuda {

SEMIRING_OPS_CHAIN_LAUNCHERS(MaxSemiring, float, true, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MaxSemiring, double, true, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MinSemiring, float, true, false)
SEMIRING_OPS_CHAIN_LAUNCHERS(MinSemiring, double, true, false)

}  // namespace cuda
}  // namespace semiring_ops
