// The bmm family's launchers (bmm_kernels.cu, log_contract_kernels.cu), called by bmm_cuda.cpp: two policies of
// the tile engine. ATen-free (launch_status.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/bmm_args.h"
#include "cuda/launch_status.h"

namespace semiring_ops {
namespace cuda {

// ---------------------------------------------------------------- bmm_forward

// out[p, i, j] = (+)_k a[p, i, k] (x) b[p, k, j] in the semiring S, for T in {c10::Half, c10::BFloat16, float,
// double}; kArg (the selecting semirings only) also writes the argmax / argmin. Needs B n m > 0 and k > 0.
template <class S, class T, bool kArg>
LaunchStatus launch_bmm(BmmArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                        cudaStream_t stream);

// ---------------------------------------------------------------- log_contract

// out[p, r, s] = sum_t L1[p, r, t] R1[p, t, s] exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s]) for T in {float, double}.
// Needs B R S > 0.
template <class T, bool kL1, bool kR1>
LaunchStatus launch_log_contract(LogContractArgs<T, kL1, kR1>& args, int64_t batch, int64_t rows, int64_t cols,
                                 int64_t depth, cudaStream_t stream);

}  // namespace cuda
}  // namespace semiring_ops
