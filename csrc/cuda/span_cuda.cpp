// semiring_ops::span_inside and span_adjoint for CUDA tensors (contracts in ops.h): the shared host body
// (span_host.h: checks, charts, dispatch) with the CUDA launcher (span_launch.h; kernels in span_kernels.cuh).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <type_traits>
#include <vector>

#include "cuda/launch_check.h"
#include "cuda/span_launch.h"
#include "ops.h"
#include "span_host.h"

namespace semiring_ops {
namespace {

void check_cuda(const at::Tensor& pot, const char* who) {
  TORCH_CHECK(pot.is_cuda(), who, " (CUDA): got potentials ", describe(pot));
  TORCH_CHECK(pot.size(0) <= 0x7fffffff, who, " (CUDA): at most 2^31 - 1 items, got potentials ", describe(pot));
}

}  // namespace

std::vector<at::Tensor> span_inside(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                                    int64_t semiring_id, bool multiroot) {
  check_cuda(potentials, "span_inside");
  const c10::cuda::CUDAGuard guard(potentials.device());
  return span_host("span_inside (CUDA)", potentials, lengths, structure, semiring_id, multiroot, nullptr, nullptr,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     cuda::check_launch(cuda::span_launch<S, T>(false, a, potentials.size(0), c10::cuda::getCurrentCUDAStream()), "span_inside (CUDA)");
                   });
}

at::Tensor span_adjoint(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                        int64_t semiring_id, bool multiroot, const at::Tensor& charts, const at::Tensor& grad) {
  check_cuda(potentials, "span_adjoint");
  const c10::cuda::CUDAGuard guard(potentials.device());
  return span_host("span_adjoint (CUDA)", potentials, lengths, structure, semiring_id, multiroot, &charts, &grad,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     cuda::check_launch(cuda::span_launch<S, T>(true, a, potentials.size(0), c10::cuda::getCurrentCUDAStream()), "span_adjoint (CUDA)");
                   })[0];
}

}  // namespace semiring_ops
