// RNN-T's launcher (in ctc_kernels.cu), called by ctc_cuda.cpp. ATen-free: RnntArgs (rnnt_dp.h) is plain data.
#pragma once

#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif
#include "rnnt_dp.h"

namespace semiring_ops {
namespace cuda {

#if !defined(__CUDACC_RTC__)
// The lattice program (rnnt_dp.h) over a.B items, one block each, its threads striding over the labels;
// T in {float, double}; the host has filled the arguments.
template <class T> LaunchStatus rnnt_lattice_launch(const RnntArgs<T>& a, bool max, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
