// semiring_ops::log_bmm_fast_scales and log_bmm_fast_finish for CUDA tensors (contracts in ops.h): the fast log
// scaled tier's passes before and after its cuBLAS product, checked, allocated and dispatched; the kernels are in
// fast_log_scaled_kernels.cu (fast_log_scaled_launch.h). semiring_ops/ops/fast_log_scaled.py runs the product.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "checks.h"
#include "cuda/device_attributes.h"
#include "cuda/fast_log_scaled_launch.h"
#include "cuda/launch_check.h"
#include "ops.h"

namespace semiring_ops {
namespace cuda {
namespace fast_log_scaled {
namespace {

// `t` with unit stride along `dim` (its loads then coalesce), copied when it has not.
at::Tensor unit_stride(const at::Tensor& t, int64_t dim) {
  return t.size(dim) <= 1 || t.stride(dim) == 1 ? t : t.contiguous();
}

// The parts k is cut into for b's column maxima: enough blocks for ~8 per multiprocessor, at most
// kMaxColumnSplit parts and one per kColumnRows rows of k.
int64_t column_split(int64_t batch, int64_t k, int64_t m, int device) {
  int sms = 1;
  C10_CUDA_CHECK(device_attribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = std::max<int64_t>(1, (m + kColumns - 1) / kColumns * std::min<int64_t>(batch, 65535));
  const int64_t want = (8 * sms + blocks - 1) / blocks;
  return std::clamp<int64_t>(want, 1, std::clamp<int64_t>((k + kColumnRows - 1) / kColumnRows, 1, kMaxColumnSplit));
}

}  // namespace
}  // namespace fast_log_scaled
}  // namespace cuda

std::vector<at::Tensor> log_bmm_fast_scales(const at::Tensor& a, const at::Tensor& b) {
  using namespace cuda::fast_log_scaled;
  check_fast_log_args(a, b, "log_bmm_fast_scales");
  const auto dtype = a.scalar_type();
  const c10::cuda::OptionalCUDAGuard guard(at::device_of(a));
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const at::Tensor ua = unit_stride(a, 2), ub = unit_stride(b, 2);
  const auto f32 = a.options().dtype(at::kFloat), u8 = a.options().dtype(at::kByte);
  at::Tensor fa = new_output(a, {B, n, k}, f32), fb = new_output(a, {B, k, m}, f32);
  at::Tensor row_top = new_output(a, {B, n}, f32), col_top = new_output(a, {B, m}, f32);
  at::Tensor row_state = new_output(a, {B, n}, u8), col_state = new_output(a, {B, m}, u8);
  const int64_t split = column_split(B, k, m, a.get_device());
  const int64_t k_per_part = (k + split - 1) / split;
  at::Tensor partial = at::empty({B, split, m}, f32);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "log_bmm_fast_scales", [&] {
    if constexpr (std::is_same_v<scalar_t, double>) {
      TORCH_CHECK(false, "log_bmm_fast_scales: float64 is not supported");  // refused above
    } else {
      RowArgs<scalar_t> rows{ua.const_data_ptr<scalar_t>(), fa.mutable_data_ptr<float>(),
                             row_top.mutable_data_ptr<float>(), row_state.mutable_data_ptr<uint8_t>(),
                             ua.stride(0), ua.stride(1), ua.stride(2), B * n, n, k};
      check_launch(launch_row_factors(rows, stream), "log_bmm_fast_scales");
      ColumnArgs<scalar_t> cols{ub.const_data_ptr<scalar_t>(), partial.mutable_data_ptr<float>(),
                                fb.mutable_data_ptr<float>(), col_top.mutable_data_ptr<float>(),
                                col_state.mutable_data_ptr<uint8_t>(), ub.stride(0), ub.stride(1), ub.stride(2), B, k,
                                m, static_cast<int32_t>(split), k_per_part};
      check_launch(launch_column_factors(cols, stream), "log_bmm_fast_scales");
    }
  });
  return {fa, fb, row_top, row_state, col_top, col_state};
}

std::vector<at::Tensor> log_bmm_fast_finish(at::Tensor& sums, const at::Tensor& row_top, const at::Tensor& row_state,
                                            const at::Tensor& col_top, const at::Tensor& col_state) {
  using namespace cuda::fast_log_scaled;
  TORCH_CHECK(sums.is_cuda() && sums.dim() == 3 && sums.scalar_type() == at::kFloat && sums.is_contiguous(),
              "log_bmm_fast_finish: sums must be a contiguous (B, n, m) float32 CUDA tensor, got ", describe(sums));
  const int64_t B = sums.size(0), n = sums.size(1), m = sums.size(2);
  auto check = [&](const at::Tensor& t, const char* name, int64_t rows, at::ScalarType type) {
    TORCH_CHECK(t.device() == sums.device() && t.scalar_type() == type && t.is_contiguous() && t.dim() == 2 &&
                    t.size(0) == B && t.size(1) == rows,
                "log_bmm_fast_finish: ", name, " must be a contiguous (", B, ", ", rows, ") ", c10::toString(type),
                " tensor on ", sums.device().str(), ", got ", describe(t));
  };
  check(row_top, "row_top", n, at::kFloat);
  check(row_state, "row_state", n, at::kByte);
  check(col_top, "col_top", m, at::kFloat);
  check(col_state, "col_state", m, at::kByte);
  const c10::cuda::OptionalCUDAGuard guard(at::device_of(sums));
  at::Tensor flags = new_output(sums, {B, n, m}, sums.options().dtype(at::kBool));
  at::Tensor count = at::zeros({}, sums.options().dtype(at::kLong));
  EpilogueArgs args{sums.mutable_data_ptr<float>(),
                    reinterpret_cast<uint8_t*>(flags.mutable_data_ptr<bool>()),
                    reinterpret_cast<unsigned long long*>(count.mutable_data_ptr<int64_t>()),
                    row_top.const_data_ptr<float>(),
                    row_state.const_data_ptr<uint8_t>(),
                    col_top.const_data_ptr<float>(),
                    col_state.const_data_ptr<uint8_t>(),
                    B * n,
                    n,
                    m};
  check_launch(launch_epilogue(args, c10::cuda::getCurrentCUDAStream()), "log_bmm_fast_finish");
  return {flags, count};
}

}  // namespace semiring_ops
