// bmm_autograd (autograd.h): the semiring batched matmul with its gradient recorded as one C++ autograd node. The
// Python reference of the backward is registry.py's _bmm_backward (the custom operator's autograd formula).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>  // AutoDispatchBelowADInplaceOrView

#include "autograd/autograd.h"
#include "autograd/node.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace {

// The registered operator semiring_ops::log_bmm_backward (registry.py): the log gradient with its own autograd,
// for a backward that records a graph (double backward).
std::tuple<at::Tensor, at::Tensor> log_bmm_backward_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                                       const at::Tensor& g, bool need_a, bool need_b) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("semiring_ops::log_bmm_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, bool, bool)>();
  return op.call(a, b, c, g, need_a, need_b);
}

double semiring_zero(int64_t semiring_id) {
  double zero = 0.0;
  dispatch_semiring(semiring_id, [&](auto s) { zero = decltype(s)::template zero<double>(); });
  return zero;
}

// max / min: each output's gradient to its selected k; none where out is the semiring's zero (no term selected).
std::pair<at::Tensor, at::Tensor> selection_grads(const at::Tensor& a, const at::Tensor& b, at::Tensor out,
                                                  at::Tensor arg, const at::Tensor& grad, int64_t semiring_id) {
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const auto acc = out.options();
  if (k == 0) return {a.new_zeros({B, n, 0}, acc), b.new_zeros({B, 0, m}, acc)};
  if (arg.numel() != out.numel()) {  // the forward ran without the index: recompute it
    const at::AutoGradMode no_grad(false);
    auto recomputed = bmm_forward(a.detach(), b.detach(), semiring_id, true);
    out = recomputed[0];
    arg = recomputed[1];
  }
  const at::Tensor g = grad.to(out.scalar_type()).masked_fill(out.eq(semiring_zero(semiring_id)), 0.0);
  return {a.new_zeros({B, n, k}, acc).scatter_add_(2, arg, g), b.new_zeros({B, k, m}, acc).scatter_add_(1, arg, g)};
}

struct SemiringBmmBackward final : torch::autograd::Node {
  SavedVariable a_, b_, out_, arg_;
  int64_t semiring_id_ = 0;

  std::string name() const override { return "SemiringBmmBackward"; }

  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
    out_.reset_data();
    arg_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const bool need_a = task_should_compute_output(0), need_b = task_should_compute_output(1);
    variable_list result(2);
    const at::Tensor& grad = grads[0];
    if (!grad.defined() || !(need_a || need_b)) return result;
    const at::Tensor a = a_.unpack(), b = b_.unpack(), out = out_.unpack(getptr()), arg = arg_.unpack();
    const at::ScalarType acc = out.scalar_type();
    at::Tensor ga, gb;
    if (semiring_id_ == LogSemiring::kId) {
      const at::Tensor a_acc = a.to(acc), b_acc = b.to(acc), g_acc = grad.to(acc);
      if (records_graph({a, b, out, grad})) {
        std::tie(ga, gb) = log_bmm_backward_op(a_acc, b_acc, out, g_acc, need_a, need_b);
      } else {
        auto both = log_bmm_grads(a_acc, b_acc, out, g_acc, need_a, need_b);
        ga = both[0];
        gb = both[1];
      }
    } else if (semiring_id_ == MaxSemiring::kId || semiring_id_ == MinSemiring::kId) {
      std::tie(ga, gb) = selection_grads(a, b, out, arg, grad, semiring_id_);
    } else if (semiring_id_ == StdSemiring::kId) {
      const at::Tensor g_acc = grad.to(acc);
      if (need_a) ga = g_acc.bmm(b.to(acc).transpose(1, 2));
      if (need_b) gb = a.to(acc).transpose(1, 2).bmm(g_acc);
    } else {
      TORCH_CHECK(false, "bmm_autograd: no gradient for semiring id ", semiring_id_);
    }
    if (need_a) result[0] = ga.to(a.scalar_type());
    if (need_b) result[1] = gb.to(b.scalar_type());
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> bmm_autograd(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id, bool with_arg) {
  check_no_forward_ad("semiring bmm", {a, b});
  std::vector<at::Tensor> outputs;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // the kernel's own tensor calls record nothing
    outputs = bmm_forward(a, b, semiring_id, with_arg);
  }
  if (!torch::autograd::compute_requires_grad(a, b)) return outputs;
  auto node = new_node<SemiringBmmBackward>(a, b);
  node->semiring_id_ = semiring_id;
  node->a_ = SavedVariable(a, false);
  node->b_ = SavedVariable(b, false);
  torch::autograd::set_history(outputs[0], node);
  node->out_ = SavedVariable(outputs[0], true);
  node->arg_ = SavedVariable(outputs[1], false);  // an index: not differentiable
  return outputs;
}

}  // namespace semiring_ops
