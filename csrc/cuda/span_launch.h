// The span structures' launcher (span_kernels.cuh, instantiated per semiring by span_kernels_*.cu), called by
// span_cuda.cpp. ATen-free: SpanArgs (span_dp.h) is plain data.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/launch_status.h"
#include "span_dp.h"

namespace semiring_ops {
namespace cuda {

// The inside pass (adjoint = false) or the adjoint of the structure a.structure over B items, one block per item,
// for S in {log, max, min} and T in {float, double}; the host has filled and checked the arguments.
template <class S, class T>
LaunchStatus span_launch(bool adjoint, const SpanArgs<T>& a, int64_t B, cudaStream_t stream);

}  // namespace cuda
}  // namespace semiring_ops
