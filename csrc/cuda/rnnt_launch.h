// RNN-T's launcher (in ctc_kernels.cu), called by ctc_cuda.cpp. ATen-free: RnntArgs (rnnt_dp.h) is plain data.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/launch_status.h"
#include "rnnt_dp.h"

namespace semiring_ops {
namespace cuda {

// The lattice program (rnnt_dp.h) over a.B items, one block each, its threads striding over the labels;
// T in {float, double}; the host has filled the arguments.
template <class T> LaunchStatus rnnt_lattice_launch(const RnntArgs<T>& a, bool max, cudaStream_t stream);

}  // namespace cuda
}  // namespace semiring_ops
