// The host side of launch_status.h: raises what a launcher reported, naming the operation.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include "cuda/launch_status.h"

namespace semiring_ops {
namespace cuda {

inline void check_launch(const LaunchStatus& status, const char* who) {
  TORCH_CHECK(status.refusal == nullptr, who, ": ", status.refusal ? status.refusal : "");
  C10_CUDA_CHECK(status.error);
}

}  // namespace cuda
}  // namespace semiring_ops
