// semiring_ops::span_inside and span_adjoint for CUDA tensors (contracts in ops.h; the dynamic programs in
// span_dp.h): one thread block per batch item, its warps the teams (a warp reduces one span at a time, its
// lanes over the split points), a __syncthreads between the phases of a width. 256 threads; 1024 for the
// semi-Markov program over more than 8 labels (one warp per label: a position's labels in one round). The charts live in global
// memory (L2-resident at the sizes these structures have: 4 (N + 1)^2 values per item).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "ops.h"
#include "span_host.h"
#include "warp_merge.cuh"

namespace semiring_ops {
namespace cuda {
namespace {

template <int kThreads> struct WarpTeam {
  int lane, warp;
  __device__ int rank() const { return lane; }
  __device__ int size() const { return 32; }
  __device__ int group() const { return warp; }
  __device__ int groups() const { return kThreads / 32; }
  template <class Acc> __device__ Acc all_reduce(Acc acc) const {
    warp_merge(acc);
    return acc;
  }
  __device__ void barrier() const { __syncthreads(); }
};

template <class S, class T, int kThreads> __global__ void __launch_bounds__(kThreads) span_inside_kernel(SpanArgs<T> a) {
  span_inside_item<S, T>(WarpTeam<kThreads>{int(threadIdx.x % 32), int(threadIdx.x / 32)}, a, blockIdx.x);
}

template <class S, class T, int kThreads>
__global__ void __launch_bounds__(kThreads) span_adjoint_kernel(SpanArgs<T> a) {
  span_adjoint_item<S, T>(WarpTeam<kThreads>{int(threadIdx.x % 32), int(threadIdx.x / 32)}, a, blockIdx.x);
}

// One block per item, with the thread count of the module comment.
template <class S, class T> void launch(bool adjoint, const SpanArgs<T>& a, int64_t B) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (a.structure == kSpanSemiMarkov && a.C > 8) {
    if (adjoint)
      span_adjoint_kernel<S, T, 1024><<<unsigned(B), 1024, 0, stream>>>(a);
    else
      span_inside_kernel<S, T, 1024><<<unsigned(B), 1024, 0, stream>>>(a);
  } else {
    if (adjoint)
      span_adjoint_kernel<S, T, 256><<<unsigned(B), 256, 0, stream>>>(a);
    else
      span_inside_kernel<S, T, 256><<<unsigned(B), 256, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_cuda(const at::Tensor& pot, const char* who) {
  TORCH_CHECK(pot.is_cuda(), who, " (CUDA): got potentials ", describe(pot));
  TORCH_CHECK(pot.size(0) <= 0x7fffffff, who, " (CUDA): at most 2^31 - 1 items, got potentials ", describe(pot));
}

}  // namespace
}  // namespace cuda

std::vector<at::Tensor> span_inside(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                                    int64_t semiring_id, bool multiroot) {
  cuda::check_cuda(potentials, "span_inside");
  const c10::cuda::CUDAGuard guard(potentials.device());
  return span_host("span_inside (CUDA)", potentials, lengths, structure, semiring_id, multiroot, nullptr, nullptr,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     cuda::launch<S, T>(false, a, potentials.size(0));
                   });
}

at::Tensor span_adjoint(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                        int64_t semiring_id, bool multiroot, const at::Tensor& charts, const at::Tensor& grad) {
  cuda::check_cuda(potentials, "span_adjoint");
  const c10::cuda::CUDAGuard guard(potentials.device());
  return span_host("span_adjoint (CUDA)", potentials, lengths, structure, semiring_id, multiroot, &charts, &grad,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     cuda::launch<S, T>(true, a, potentials.size(0));
                   })[0];
}

}  // namespace semiring_ops
