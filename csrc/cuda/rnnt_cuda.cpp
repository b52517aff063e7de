// semiring_ops::rnnt_lattice for CUDA tensors (contract in ops.h): the shared host body (rnnt_host.h) with the
// CUDA launcher (rnnt_launch.h; the kernel in rnnt_kernels.cu).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "cuda/launch_check.h"
#include "cuda/rnnt_launch.h"
#include "ops.h"
#include "rnnt_host.h"

namespace semiring_ops {

std::vector<at::Tensor> rnnt_lattice(const at::Tensor& potentials, const at::Tensor& frames, const at::Tensor& labels,
                                     bool max, bool need_posteriors) {
  TORCH_CHECK_VALUE(potentials.is_cuda(), "rnnt_lattice (CUDA): got potentials ", describe(potentials));
  const c10::cuda::CUDAGuard guard(potentials.device());
  return rnnt_lattice_host("rnnt_lattice (CUDA)", potentials, frames, labels, max, need_posteriors,
                           [&](const auto& a, bool use_max) {
                             cuda::check_launch(cuda::rnnt_lattice_launch(a, use_max, c10::cuda::getCurrentCUDAStream()),
                                                "rnnt_lattice (CUDA)");
                           });
}

}  // namespace semiring_ops
