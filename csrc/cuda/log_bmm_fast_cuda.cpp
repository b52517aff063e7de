// semiring_ops::log_bmm_fast for CUDA tensors (contract in ops.h): checks, the operands made ready for the
// kernel's vector copies, each k-tile's row and column maxima (ATen ops), the outputs and the flags; the kernel and
// its math are in log_bmm_fast_kernels.cu (fast_log_launch.h). semiring_ops/ops/fast_log.py recomputes the flagged
// outputs exactly.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "checks.h"
#include "cuda/device_attributes.h"
#include "cuda/fast_log_launch.h"
#include "cuda/launch_check.h"
#include "ops.h"

namespace semiring_ops {
namespace cuda {
namespace fast_log {
namespace {

// `t` (B, R, C) ready for the kernel: unit stride along C, row / batch strides multiples of 4 elements (a
// broadcast batch keeps stride 0), 4-element-aligned data. Otherwise copied into a buffer whose rows are
// padded to a multiple of 4 (a broadcast operand once). Returns the view and its batch / row strides.
struct Ready {
  at::Tensor t;  // (B or 1, R, C): batch entry 0 only when broadcast
  int64_t sp, sr;
};

inline Ready vector_ready(const at::Tensor& t) {
  const int64_t B = t.size(0), R = t.size(1), C = t.size(2);
  const int64_t esize = static_cast<int64_t>(t.element_size());
  const int64_t sp = B == 1 ? 0 : t.stride(0);
  const int64_t sr = R == 1 ? 0 : t.stride(1);
  const bool unit = C == 1 || t.stride(2) == 1;
  const bool aligned = reinterpret_cast<uintptr_t>(t.const_data_ptr()) % static_cast<uintptr_t>(4 * esize) == 0;
  const at::Tensor first = sp == 0 ? t.narrow(0, 0, 1) : t;  // a broadcast batch: one entry
  if (unit && aligned && sp % 4 == 0 && sr % 4 == 0) return {first, sp, sr};
  const int64_t C4 = (C + 3) / 4 * 4;
  at::Tensor buf = at::empty({first.size(0), R, C4}, t.options());
  at::Tensor view = buf.narrow(2, 0, C);
  view.copy_(first);
  return {view, sp == 0 ? 0 : R * C4, C4};
}

// The maxima of every k-tile of a (B', n, k) along k (rows) -> (B', num_kt, n_pad) float, padded with -inf,
// and NaN in every tile of a row holding NaN, +inf or |x| > 2^125 (its outputs are then all flagged).
inline at::Tensor tile_row_maxima(const at::Tensor& a, int64_t num_kt, int64_t n_pad) {
  const int64_t Bp = a.size(0), n = a.size(1), k = a.size(2);
  const double ninf = -std::numeric_limits<double>::infinity();
  const at::Tensor padded = k == num_kt * kKT ? a : at::constant_pad_nd(a, {0, num_kt * kKT - k}, ninf);
  const at::Tensor tile_max = padded.unflatten(2, {num_kt, kKT}).amax(3).to(at::kFloat);  // (B', n, T)
  at::Tensor out = at::full({Bp, num_kt, n_pad}, ninf, a.options().dtype(at::kFloat));
  out.narrow(2, 0, n).copy_(tile_max.transpose(1, 2));
  const at::Tensor bad = at::logical_not(out.abs() <= kBadMagnitude).logical_and_(out != ninf);
  out.masked_fill_(bad.any(1, /*keepdim=*/true), std::numeric_limits<double>::quiet_NaN());
  return out;
}

// The same for b (B', k, m) along k (columns) -> (B', num_kt, m_pad).
inline at::Tensor tile_col_maxima(const at::Tensor& b, int64_t num_kt, int64_t m_pad) {
  const int64_t Bp = b.size(0), k = b.size(1), m = b.size(2);
  const double ninf = -std::numeric_limits<double>::infinity();
  const at::Tensor padded = k == num_kt * kKT ? b : at::constant_pad_nd(b, {0, 0, 0, num_kt * kKT - k}, ninf);
  const at::Tensor tile_max = padded.unflatten(1, {num_kt, kKT}).amax(2).to(at::kFloat);  // (B', T, m)
  at::Tensor out = at::full({Bp, num_kt, m_pad}, ninf, b.options().dtype(at::kFloat));
  out.narrow(2, 0, m).copy_(tile_max);
  const at::Tensor bad = at::logical_not(out.abs() <= kBadMagnitude).logical_and_(out != ninf);
  out.masked_fill_(bad.any(1, /*keepdim=*/true), std::numeric_limits<double>::quiet_NaN());
  return out;
}

template <class scalar_t, int kPasses>
void launch(const Ready& a, const Ready& b, const at::Tensor& rmax, const at::Tensor& cmax, at::Tensor& out,
            at::Tensor& flags, at::Tensor& count, int64_t B, int64_t n, int64_t k, int64_t m, int64_t num_kt,
            int64_t n_pad, int64_t m_pad) {
  Args<scalar_t> args{};
  args.a = a.t.const_data_ptr<scalar_t>();
  args.b = b.t.const_data_ptr<scalar_t>();
  args.rmax = rmax.const_data_ptr<float>();
  args.cmax = cmax.const_data_ptr<float>();
  args.out = out.mutable_data_ptr<float>();
  args.flags = flags.mutable_data_ptr<uint8_t>();
  args.count = reinterpret_cast<unsigned long long*>(count.mutable_data_ptr<int64_t>());
  args.a_sp = a.sp;
  args.a_sr = a.sr;
  args.b_sp = b.sp;
  args.b_sr = b.sr;
  args.rmax_sp = rmax.size(0) == 1 ? 0 : rmax.stride(0);
  args.cmax_sp = cmax.size(0) == 1 ? 0 : cmax.stride(0);
  args.batch = B;
  args.n = static_cast<int32_t>(n);
  args.k = static_cast<int32_t>(k);
  args.m = static_cast<int32_t>(m);
  args.n_pad = static_cast<int32_t>(n_pad);
  args.m_pad = static_cast<int32_t>(m_pad);
  args.tiles_m = static_cast<int32_t>(n_pad / kBM);
  args.tiles_n = static_cast<int32_t>(m_pad / kBN);
  args.num_kt = static_cast<int32_t>(num_kt);

  check_launch(launch_fast_log<scalar_t, kPasses>(args, c10::cuda::getCurrentCUDAStream()), "log_bmm_fast");
}

}  // namespace
}  // namespace fast_log
}  // namespace cuda

std::vector<at::Tensor> log_bmm_fast(const at::Tensor& a, const at::Tensor& b, int64_t passes) {
  using namespace cuda::fast_log;
  check_fast_log_args(a, b, "log_bmm_fast");
  const auto dtype = a.scalar_type();
  TORCH_CHECK(passes == 1 || passes == 3, "log_bmm_fast: passes must be 1 or 3, got ", passes);
  const c10::cuda::OptionalCUDAGuard guard(at::device_of(a));
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cuda::device_attribute(&major, cudaDevAttrComputeCapabilityMajor, a.get_device()));
  C10_CUDA_CHECK(cuda::device_attribute(&minor, cudaDevAttrComputeCapabilityMinor, a.get_device()));
  TORCH_CHECK(major >= 8, "log_bmm_fast: needs a GPU of compute capability 8.0 or newer (tensor-core TF32), got ",
              major, ".", minor);
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max() - 4096;
  TORCH_CHECK(n <= kLimit && k <= kLimit && m <= kLimit, "log_bmm_fast: dimensions must stay below ", kLimit,
              ", got n=", n, " k=", k, " m=", m);

  const auto opts = a.options();
  at::Tensor out = new_output(a, {B, n, m}, opts.dtype(at::kFloat));
  // poisoned: 0 ("trusted"), so an output the kernel forgets keeps its NaN instead of being recomputed
  at::Tensor flags = poison_outputs_flag() ? at::zeros({B, n, m}, opts.dtype(at::kByte))
                                           : at::empty({B, n, m}, opts.dtype(at::kByte));
  at::Tensor count = at::zeros({1}, opts.dtype(at::kLong));
  if (B * n * m == 0) return {out, flags, count};
  if (k == 0) {
    out.fill_(-std::numeric_limits<double>::infinity());
    flags.zero_();
    return {out, flags, count};
  }
  const int64_t num_kt = (k + kKT - 1) / kKT;
  const int64_t n_pad = (n + kBM - 1) / kBM * kBM, m_pad = (m + kBN - 1) / kBN * kBN;
  TORCH_CHECK((n_pad / kBM) * (m_pad / kBN) <= std::numeric_limits<int32_t>::max(),
              "log_bmm_fast: too many output tiles for n=", n, ", m=", m);

  const Ready ra = vector_ready(a), rb = vector_ready(b);
  const at::Tensor rmax = tile_row_maxima(ra.t, num_kt, n_pad);
  const at::Tensor cmax = tile_col_maxima(rb.t, num_kt, m_pad);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "log_bmm_fast_cuda", [&] {
    if constexpr (std::is_same_v<scalar_t, double>) {
      TORCH_CHECK(false, "log_bmm_fast: float64 is not supported");  // refused above
    } else if (passes == 1) {
      launch<scalar_t, 1>(ra, rb, rmax, cmax, out, flags, count, B, n, k, m, num_kt, n_pad, m_pad);
    } else {
      launch<scalar_t, 3>(ra, rb, rmax, cmax, out, flags, count, B, n, k, m, num_kt, n_pad, m_pad);
    }
  });
  return {out, flags, count};
}

}  // namespace semiring_ops
