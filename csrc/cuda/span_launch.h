// The span structures' launcher (span_kernels.cuh, instantiated per semiring by span_kernels_*.cu), called by
// span_cuda.cpp. ATen-free: SpanArgs (span_dp.h) is plain data.
#pragma once

#include <cstdint>

#include "span_dp.h"
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

#if !defined(__CUDACC_RTC__)
// The inside pass (adjoint = false) or the adjoint of the structure a.structure over B items, one block per item,
// for S in {log, max, min} and T in {float, double}; the host has filled and checked the arguments.
template <class S, class T>
LaunchStatus span_launch(bool adjoint, const SpanArgs<T>& a, int64_t B, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
