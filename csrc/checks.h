// Argument checks shared by the CPU and CUDA backends (see ops.h for the contracts they guard).
#pragma once

#include "tensor_api.h"

#include <limits>
#include <optional>
#include <string>

namespace semiring_ops {

inline std::string describe(const at::Tensor& t) {
  std::string s = "shape [";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "], dtype " + std::string(c10::toString(t.scalar_type())) + ", device " + t.device().str();
}

// Testing aid (semiring_ops.build.backends.set_poison_outputs): when on, outputs are allocated filled
// with NaN (signed integer outputs with -1, unsigned and bool ones with their largest value) instead of left
// uninitialised, so an element a kernel fails to write cannot pass for a right answer.
inline bool& poison_outputs_flag() {
  static bool flag = false;
  return flag;
}

// An output of `sizes` and `options` (device: like's), uninitialised or poisoned (above).
inline at::Tensor new_output(const at::Tensor& like, at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (!poison_outputs_flag()) return like.new_empty(sizes, options);
  const at::ScalarType type = c10::typeMetaToScalarType(options.dtype());
  const double poison = at::isFloatingType(type) ? std::numeric_limits<double>::quiet_NaN()
                        : type == at::kByte      ? 255.0
                        : type == at::kBool      ? 1.0
                                                 : -1.0;
  return like.new_full(sizes, poison, options);
}

inline void check_bmm_args(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "semiring bmm kernel: a and b must be 3-D, got a ", describe(a),
              " and b ", describe(b));
  TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "semiring bmm kernel: a (B, n, k) and b (B, k, m) disagree: a ", describe(a), ", b ", describe(b));
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.device() == b.device(),
              "semiring bmm kernel: a and b need one dtype and device: a ", describe(a), ", b ", describe(b));
  TORCH_CHECK(at::isFloatingType(a.scalar_type()), "semiring bmm kernel: floating inputs only, got a ",
              describe(a));
}

// a (B, n, k) and b (B, k, m) for the log fast mode's kernels (`who` names the op): check_bmm_args, CUDA tensors,
// float32, float16 or bfloat16.
inline void check_fast_log_args(const at::Tensor& a, const at::Tensor& b, const char* who) {
  check_bmm_args(a, b);
  TORCH_CHECK(a.is_cuda(), who, ": CUDA tensors only, got a ", describe(a));
  const auto dtype = a.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, who,
              ": float32, float16 or bfloat16 only, got a ", describe(a));
}

inline void check_contract_args(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                                const std::optional<at::Tensor>& r1, const at::Tensor& o0) {
  TORCH_CHECK(l0.dim() == 3 && r0.dim() == 3 && o0.dim() == 3, "log_contract: L0, R0, O0 must be 3-D");
  const int64_t B = l0.size(0), R = l0.size(1), T = l0.size(2), S = r0.size(2);
  TORCH_CHECK(r0.size(0) == B && r0.size(1) == T && o0.size(0) == B && o0.size(1) == R && o0.size(2) == S,
              "log_contract: shapes disagree: L0 ", describe(l0), ", R0 ", describe(r0), ", O0 ", describe(o0));
  TORCH_CHECK(l0.scalar_type() == at::kFloat || l0.scalar_type() == at::kDouble,
              "log_contract: float32 or float64 only, got L0 ", describe(l0));
  auto same = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == l0.scalar_type() && t.device() == l0.device(), "log_contract: ", name,
                " must match L0's dtype and device: ", name, " ", describe(t), ", L0 ", describe(l0));
  };
  same(r0, "R0");
  same(o0, "O0");
  if (l1) {
    same(*l1, "L1");
    TORCH_CHECK(l1->sizes() == l0.sizes(), "log_contract: L1 ", describe(*l1), " must have L0's shape ", describe(l0));
  }
  if (r1) {
    same(*r1, "R1");
    TORCH_CHECK(r1->sizes() == r0.sizes(), "log_contract: R1 ", describe(*r1), " must have R0's shape ", describe(r0));
  }
}

inline void check_log_bmm_grads_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                     const at::Tensor& g) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && g.dim() == 3,
              "log_bmm_grads: a, b, c, g must be 3-D, got a ", describe(a), ", b ", describe(b));
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  TORCH_CHECK(b.size(0) == B && b.size(1) == k && c.size(0) == B && c.size(1) == n && c.size(2) == m &&
                  g.sizes() == c.sizes(),
              "log_bmm_grads: shapes disagree: a ", describe(a), ", b ", describe(b), ", c ", describe(c), ", g ",
              describe(g));
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble,
              "log_bmm_grads: float32 or float64 only, got a ", describe(a));
  for (const at::Tensor* t : {&b, &c, &g})
    TORCH_CHECK(t->scalar_type() == a.scalar_type() && t->device() == a.device(),
                "log_bmm_grads: b, c and g must match a's dtype and device: a ", describe(a), ", got ", describe(*t));
}

inline void check_chain_args(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start,
                             const at::Tensor& end, const at::Tensor& lengths) {
  TORCH_CHECK(em.dim() == 3, "chain kernel: emissions must be (B, T, C), got ", describe(em));
  const int64_t C = em.size(2);
  TORCH_CHECK(trans.dim() == 2 && trans.size(0) == C && trans.size(1) == C,
              "chain kernel: transitions must be (C, C) with C = emissions.size(2): transitions ", describe(trans),
              ", emissions ", describe(em));
  TORCH_CHECK(start.dim() == 1 && start.size(0) == C && end.dim() == 1 && end.size(0) == C,
              "chain kernel: start and end must be (C,): start ", describe(start), ", end ", describe(end));
  TORCH_CHECK(em.scalar_type() == at::kFloat || em.scalar_type() == at::kDouble,
              "chain kernel: float32 or float64 only, got emissions ", describe(em));
  for (const at::Tensor* t : {&trans, &start, &end})
    TORCH_CHECK(t->scalar_type() == em.scalar_type() && t->device() == em.device(),
                "chain kernel: transitions, start and end must match the emissions' dtype and device: got ",
                describe(*t), ", emissions ", describe(em));
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == em.size(0) && lengths.scalar_type() == at::kLong &&
                  lengths.device() == em.device(),
              "chain kernel: lengths must be int64 (B,) on the emissions' device: lengths ", describe(lengths),
              ", emissions ", describe(em));
  TORCH_CHECK(C <= std::numeric_limits<int16_t>::max(), "chain kernel: at most 32767 tags, got emissions ",
              describe(em));
}

inline void check_chain_grad_args(const at::Tensor& em, const at::Tensor& alpha, const at::Tensor& log_z,
                                  const at::Tensor& grad) {
  TORCH_CHECK(alpha.sizes() == em.sizes() && alpha.scalar_type() == em.scalar_type() && alpha.device() == em.device(),
              "chain_log_backward: alpha must match the emissions: alpha ", describe(alpha), ", emissions ",
              describe(em));
  for (const at::Tensor* t : {&log_z, &grad})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == em.size(0) && t->scalar_type() == em.scalar_type() &&
                    t->device() == em.device(),
                "chain_log_backward: log_z and grad must be (B,) like the emissions' batch: got ", describe(*t),
                ", emissions ", describe(em));
}

inline void check_chain_tags(const at::Tensor& em, const at::Tensor& tags, const char* who) {
  TORCH_CHECK(tags.dim() == 2 && tags.size(0) == em.size(0) && tags.size(1) == em.size(1) &&
                  tags.scalar_type() == at::kLong && tags.device() == em.device(),
              who, ": tags must be int64 (B, T) on the emissions' device: tags ", describe(tags), ", emissions ",
              describe(em));
}

}  // namespace semiring_ops
