// semiring_ops::bmm_packed_select for CUDA tensors (contract in ops.h): checks, the output and the fields; the
// kernel is in packed_select_kernels.cu (packed_select_launch.h). semiring_ops/build/backends.py decides when a
// float32 / float16 / bfloat16 max / min product without an index takes it instead of bmm_forward.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>

#include "checks.h"
#include "cuda/contraction_host.h"
#include "cuda/device_attributes.h"
#include "cuda/launch_check.h"
#include "cuda/packed_select_launch.h"
#include "ops.h"
#include "tensor_api.h"

namespace semiring_ops {
namespace {

// float32 / float16 / bfloat16 on a device of compute capability 8.0 or newer.
bool supported(const at::Tensor& a) {
  const auto dtype = a.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) return false;
  int major = 0;
  C10_CUDA_CHECK(cuda::device_attribute(&major, cudaDevAttrComputeCapabilityMajor, a.get_device()));
  return major >= 8;
}

template <class T, bool kIsMax>
void launch(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const at::Tensor ua = cuda::with_unit_inner_stride(a), ub = cuda::with_unit_inner_stride(b);
  const int64_t batch = a.size(0), rows = a.size(1), depth = a.size(2), cols = b.size(2);
  cuda::check_extents("semiring bmm kernel (select)", rows, cols, depth);
  cuda::PackedArgs<T> args{};
  args.a = cuda::left_field<T>(ua);
  args.b = cuda::right_field<T>(ub);
  args.vec_a = cuda::select_vector_ok(args.a);
  args.vec_b = cuda::select_vector_ok(args.b);
  args.out = out.data_ptr<float>();
  const cuda::LaunchStatus status =
      cuda::launch_packed_select<T, kIsMax>(args, batch, rows, cols, depth, c10::cuda::getCurrentCUDAStream());
  cuda::check_launch(status, "bmm_packed_select");
}

}  // namespace

at::Tensor bmm_packed_select(const at::Tensor& a, const at::Tensor& b, bool is_max) {
  check_bmm_args(a, b);
  TORCH_CHECK(a.is_cuda(), "bmm_packed_select: CUDA tensors only, got a ", describe(a));
  const c10::cuda::CUDAGuard guard(a.device());
  TORCH_CHECK(supported(a),
              "bmm_packed_select: float32 / float16 / bfloat16 CUDA tensors on a GPU of compute capability 8.0+; got a ",
              describe(a), ", b ", describe(b));
  at::Tensor out = new_output(a, {a.size(0), a.size(1), b.size(2)}, a.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  if (a.size(2) == 0) return out.fill_(is_max ? -std::numeric_limits<float>::infinity()
                                              : std::numeric_limits<float>::infinity());
  if (a.scalar_type() == at::kFloat) {
    is_max ? launch<float, true>(a, b, out) : launch<float, false>(a, b, out);
  } else if (a.scalar_type() == at::kHalf) {
    is_max ? launch<c10::Half, true>(a, b, out) : launch<c10::Half, false>(a, b, out);
  } else {
    is_max ? launch<c10::BFloat16, true>(a, b, out) : launch<c10::BFloat16, false>(a, b, out);
  }
  return out;
}

}  // namespace semiring_ops
