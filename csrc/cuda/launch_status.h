// The ATen-free layer of the CUDA backend: every *_kernels.cu file holds kernels and their launchers and includes
// no PyTorch header, so nvcc compiles device code only (a translation unit with ATen/ATen.h costs nvcc about 50 s
// before any kernel: docs/build.md, "Compile time"). The ATen-facing host code (argument checks, allocation, dtype
// dispatch) lives in *_cuda.cpp files compiled by the host compiler, which call the launchers declared in
// *_launch.h and raise what they report:
//   a CUDA error (a failed launch or runtime call), or a refusal: arguments outside what the kernels take, with
//   its reason (static text; the host adds the arguments).
#pragma once

#include <cuda_runtime_api.h>

namespace semiring_ops {
namespace cuda {

struct LaunchStatus {
  cudaError_t error = cudaSuccess;
  const char* refusal = nullptr;
};

// The status of the launch just made: the runtime's last error (cleared), as C10_CUDA_KERNEL_LAUNCH_CHECK reads it.
inline LaunchStatus last_launch() { return {cudaGetLastError(), nullptr}; }

inline LaunchStatus refused(const char* reason) { return {cudaSuccess, reason}; }

}  // namespace cuda
}  // namespace semiring_ops

// Returns the failure of a runtime call from a launcher.
#define SEMIRING_OPS_CUDA_TRY(expr)                                               \
  do {                                                                            \
    const cudaError_t semiring_ops_error_ = (expr);                               \
    if (semiring_ops_error_ != cudaSuccess) return {semiring_ops_error_, nullptr}; \
  } while (0)
