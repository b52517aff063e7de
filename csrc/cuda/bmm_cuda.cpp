// semiring_ops::bmm_forward, log_contract and log_bmm_grads for CUDA tensors (contracts in ops.h): argument checks,
// outputs, the semiring x dtype dispatch and the fields of the tile engine's arguments; the kernels are in
// bmm_kernels.cu and log_contract_kernels.cu (bmm_launch.h), and the fused float32 log gradient in
// log_grads_kernels.cu (log_grads_launch.h). Float16 / bfloat16 max / min without an index may
// instead take the packed family (semiring_ops/ops/packed.py decides, before calling this).
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "checks.h"
#include "cuda/bmm_launch.h"
#include "cuda/contraction_host.h"
#include "cuda/device_attributes.h"
#include "cuda/launch_check.h"
#include "cuda/log_grads_launch.h"
#include "ops.h"
#include "semiring.h"
#include "tensor_api.h"

namespace semiring_ops {

std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id, bool with_arg) {
  check_bmm_args(a, b);
  TORCH_CHECK(a.is_cuda(), "semiring bmm kernel (CUDA backend): CUDA tensors only, got a ", describe(a));
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const auto acc_dtype = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;

  at::Tensor out, arg;
  const bool known = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    const bool track = with_arg && S::kSelects;
    out = new_output(a, {B, n, m}, a.options().dtype(acc_dtype));
    arg = track ? new_output(a, {B, n, m}, a.options().dtype(at::kLong)) : a.new_empty({0}, a.options().dtype(at::kLong));
    if (B * n * m == 0) return;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "semiring_bmm_forward_cuda", [&] {
      using acc_t = cuda::acc_of_t<scalar_t>;
      if (k == 0) {
        out.fill_(S::template zero<acc_t>());
        if (track) arg.zero_();
        return;
      }
      cuda::check_extents("semiring bmm kernel", n, m, k);
      const at::Tensor ua = cuda::with_unit_inner_stride(a), ub = cuda::with_unit_inner_stride(b);
      cuda::BmmArgs<scalar_t> args{};
      args.left[0] = cuda::left_field<scalar_t>(ua);
      args.right[0] = cuda::right_field<scalar_t>(ub);
      args.out_field = {nullptr, 0, 0, 0};
      args.params.out = out.data_ptr<acc_t>();
      args.params.arg = track ? arg.data_ptr<int64_t>() : nullptr;
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      cuda::LaunchStatus status;
      if constexpr (S::kSelects) {
        status = track ? cuda::launch_bmm<S, scalar_t, true>(args, B, n, m, k, stream)
                       : cuda::launch_bmm<S, scalar_t, false>(args, B, n, m, k, stream);
      } else {
        status = cuda::launch_bmm<S, scalar_t, false>(args, B, n, m, k, stream);
      }
      cuda::check_launch(status, "semiring bmm kernel");
    });
  });
  TORCH_CHECK(known, "semiring bmm kernel: unknown semiring id ", semiring_id);
  return {out, arg};
}

namespace {

template <class T, bool kL1, bool kR1>
void contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
              const std::optional<at::Tensor>& r1, const at::Tensor& o0, at::Tensor& out) {
  cuda::LogContractArgs<T, kL1, kR1> args{};
  // the copies with_unit_inner_stride may make live until the launch is queued (contraction_host.h)
  const at::Tensor ul0 = cuda::with_unit_inner_stride(l0), ur0 = cuda::with_unit_inner_stride(r0);
  at::Tensor ul1, ur1;
  args.left[0] = cuda::left_field<T>(ul0);
  args.right[0] = cuda::right_field<T>(ur0);
  if constexpr (kL1) {
    ul1 = cuda::with_unit_inner_stride(*l1);
    args.left[1] = cuda::left_field<T>(ul1);
  }
  if constexpr (kR1) {
    ur1 = cuda::with_unit_inner_stride(*r1);
    args.right[1] = cuda::right_field<T>(ur1);
  }
  args.out_field = cuda::out_field<T>(o0);
  args.params.out = out.data_ptr<T>();
  const cuda::LaunchStatus status = cuda::launch_log_contract<T, kL1, kR1>(
      args, l0.size(0), l0.size(1), r0.size(2), l0.size(2), c10::cuda::getCurrentCUDAStream());
  cuda::check_launch(status, "log_contract (CUDA)");
}

}  // namespace

at::Tensor log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                        const std::optional<at::Tensor>& r1, const at::Tensor& o0) {
  check_contract_args(l0, l1, r0, r1, o0);
  TORCH_CHECK(l0.is_cuda(), "log_contract (CUDA backend): CUDA tensors only, got L0 ", describe(l0));
  const c10::cuda::CUDAGuard guard(l0.device());
  const int64_t B = l0.size(0), R = l0.size(1), T = l0.size(2), S = r0.size(2);
  at::Tensor out = new_output(l0, {B, R, S}, l0.options());
  if (B * R * S == 0) return out;
  if (T == 0) return out.zero_();
  cuda::check_extents("log_contract (CUDA)", R, S, T);
  AT_DISPATCH_FLOATING_TYPES(l0.scalar_type(), "log_contract_cuda", [&] {
    const bool has_l1 = l1.has_value(), has_r1 = r1.has_value();
    if (has_l1 && has_r1) {
      contract<scalar_t, true, true>(l0, l1, r0, r1, o0, out);
    } else if (has_l1) {
      contract<scalar_t, true, false>(l0, l1, r0, r1, o0, out);
    } else if (has_r1) {
      contract<scalar_t, false, true>(l0, l1, r0, r1, o0, out);
    } else {
      contract<scalar_t, false, false>(l0, l1, r0, r1, o0, out);
    }
  });
  return out;
}

namespace {

cuda::GradsOperand grads_operand(const at::Tensor& x) {
  return {x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)};
}

int multiprocessors(int device) {
  int sms = 0;
  C10_CUDA_CHECK(cuda::device_attribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// SEMIRING_OPS_LOG_GRADS: "fused" takes the fused kernel wherever it can run (tests, the sanitizer's workload),
// "contractions" never; unset, the size rule of fused_grads decides.
int forced_log_grads() {
  const char* env = std::getenv("SEMIRING_OPS_LOG_GRADS");
  if (env == nullptr || *env == '\0') return 0;
  const std::string v(env);
  TORCH_CHECK(v == "fused" || v == "contractions", "SEMIRING_OPS_LOG_GRADS must be fused or contractions, got ", v);
  return v == "fused" ? 1 : -1;
}

// Both gradients in one pass (log_grads_kernels.cu) where it applies: float32, both needed, no empty extent,
// bitwise determinism not asked for (its grad_b sums are global atomics), and its 64 x 128 tiles at least two
// blocks per multiprocessor (fewer leave the GPU idle where the contractions' 64 x 64 tiles fill it: H200,
// B = 8, n = 256, 64 blocks: 0.16 ms fused, 0.10 ms two contractions).
bool fused_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& g, bool need_a,
                 bool need_b, at::Tensor& ga, at::Tensor& gb) {
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const int forced = forced_log_grads();
  if (forced < 0 || !(need_a && need_b) || a.scalar_type() != at::kFloat || B * n * k * m == 0 || B > 65535 ||
      at::globalContext().deterministicAlgorithms())
    return false;
  const int64_t blocks = B * ((n + cuda::kLogGradsRows - 1) / cuda::kLogGradsRows) *
                         ((k + cuda::kLogGradsCols - 1) / cuda::kLogGradsCols);
  if (forced == 0 && blocks < 2 * int64_t(multiprocessors(a.get_device()))) return false;
  ga = new_output(a, {B, n, k}, a.options());
  gb = b.new_zeros({B, k, m});  // the kernel adds into it
  const cuda::LogGradsParams params{grads_operand(a), grads_operand(b), grads_operand(c), grads_operand(g),
                                    ga.data_ptr<float>(), gb.data_ptr<float>(), B, n, k, m};
  cuda::check_launch(cuda::launch_log_bmm_grads_fused(params, c10::cuda::getCurrentCUDAStream()),
                     "log_bmm_grads (CUDA)");
  return true;
}

}  // namespace

std::vector<at::Tensor> log_bmm_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                      const at::Tensor& g, bool need_a, bool need_b) {
  check_log_bmm_grads_args(a, b, c, g);
  TORCH_CHECK(a.is_cuda(), "log_bmm_grads (CUDA backend): CUDA tensors only, got a ", describe(a));
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor ga, gb;
  if (fused_grads(a, b, c, g, need_a, need_b, ga, gb)) return {ga, gb};
  // -c, except -inf where c is -inf: a fully -inf output then weighs every term by exp(-inf) = 0.
  const at::Tensor negc = c.where(c.eq(-std::numeric_limits<double>::infinity()), c.neg());
  // grad_a[i, k] = sum_j g_ij exp(-c_ij + b_kj + a_ik): rows i, reduction j, columns k
  ga = need_a ? log_contract(negc, g, b.transpose(1, 2), std::nullopt, a) : a.new_empty({0});
  // grad_b[k, j] = sum_i exp(a_ik - c_ij + b_kj) g_ij: rows k, reduction i, columns j
  gb = need_b ? log_contract(a.transpose(1, 2), std::nullopt, negc, g, b) : a.new_empty({0});
  return {ga, gb};
}

}  // namespace semiring_ops
