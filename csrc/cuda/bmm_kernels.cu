// The semiring bmm's kernels (contract in ops.h, bmm_forward; launcher in bmm_launch.h):
//   out[p, i, j] = (+)_k times(to_kernel(a[p, i, k]), to_kernel(b[p, k, j])), plus argmax / argmin.
// One policy of the tile engine (tile_engine.cuh; the policy in bmm_policy.cuh): a is the single left field, b the single right
// field, and each output's state is the semiring's Accumulator (the log semiring in float accumulation:
// LogSumExp2TileAccumulator on the engine's guarded fast path, bmm_policy.cuh LogBmmPolicy). Instantiated for
// every semiring of semiring.h x {float16, bfloat16, float32, float64}; the arg-tracking variant only for
// semirings that select (max, min). Under NVRTC each is compiled when first launched (kernel_ref.h).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "cuda/bmm_args.h"
#include "cuda/kernel_ref.h"
#include "semiring.h"
#if SEMIRING_OPS_DEVICE_PASS
#include "cuda/bmm_policy.cuh"
#endif

#if !defined(__CUDACC_RTC__)
#include "cuda/bmm_launch.h"

namespace semiring_ops {
namespace cuda {

#if !SEMIRING_OPS_DEVICE_PASS
template <class S, class scalar_t, bool kArg>
struct SemiringBmmPolicy;
#endif

template <class S, class T, bool kArg>
LaunchStatus launch_bmm(BmmArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                        cudaStream_t stream) {
  const void* kernel = SEMIRING_OPS_KERNEL_OF("cuda/bmm_kernels.cu", contraction_kernel, SemiringBmmPolicy<S, T, kArg>);
  return launch_contraction<typename BmmTiles<acc_of_t<T>>::type>(kernel, args, batch, rows, cols, depth, stream);
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
#endif  // !__CUDACC_RTC__
