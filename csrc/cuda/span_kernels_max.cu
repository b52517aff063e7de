// The span structures' launchers under the max semiring (one of three translation units, compiled in parallel).
#include "cuda/span_kernels.cuh"

namespace semiring_ops {
namespace cuda {

SEMIRING_OPS_SPAN_LAUNCHERS(MaxSemiring)

}  // namespace cuda
}  // namespace semiring_ops
