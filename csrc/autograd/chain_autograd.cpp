// crf_log_likelihood_autograd (autograd.h): a CRF's log-likelihood (one forward scan) with its gradient (one reverse
// scan) recorded as one C++ autograd node. The Python reference is chain_ops.py's _crf_backward.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>  // AutoDispatchBelowADInplaceOrView

#include "autograd/autograd.h"
#include "autograd/node.h"
#include "ops.h"

namespace semiring_ops {
namespace {

// The registered operator semiring_ops::chain_log_backward (chain_ops.py), for a backward that records a graph.
std::vector<at::Tensor> chain_log_backward_op(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start,
                                              const at::Tensor& end, const at::Tensor& lengths,
                                              const at::Tensor& alpha, const at::Tensor& log_z,
                                              const at::Tensor& grad, const at::Tensor& tags) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("semiring_ops::chain_log_backward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&)>();
  auto [g_em, g_trans, g_start, g_end] = op.call(em, trans, start, end, lengths, alpha, log_z, grad, tags);
  return {g_em, g_trans, g_start, g_end};
}

// The registered operator semiring_ops::pair_marginal_sum (chain_ops.py): the weighted pair marginals' sum (C, C)
// that chain_log_backward leaves to its caller when they do not fit on chip (large C on a GPU).
at::Tensor pair_marginal_sum_op(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& lengths,
                                const at::Tensor& alpha, const at::Tensor& log_z, const at::Tensor& weight,
                                const at::Tensor& beta) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("semiring_ops::pair_marginal_sum", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&)>();
  return op.call(em, trans, lengths, alpha, log_z, weight, beta);
}

// The gradient of each chain's log-likelihood (B,) from the gradient of the node's output: llh itself (reduction
// 0), or its sum (1), mean (2) or sum over the tokens' count (3), formed as PyTorch's SumBackward / MeanBackward /
// DivBackward form it (the same numbers as the Python path's llh.sum() ...), and differentiable when grad is.
at::Tensor llh_gradient(const at::Tensor& grad, int64_t reduction, int64_t batch, const at::Tensor& tokens) {
  switch (reduction) {
    case 0:
      return grad;
    case 1:
      return grad.expand({batch});
    case 2:
      return grad.expand({batch}).div(batch);
    default:
      return grad.div(tokens).expand({batch});
  }
}

struct CrfLogLikelihoodBackward final : torch::autograd::Node {
  SavedVariable em_, trans_, start_, end_, lengths_, tags_, alpha_, log_z_;
  int64_t reduction_ = 0;  // as crf_log_likelihood_autograd's
  at::Tensor tokens_;      // reduction 3: the denominator, max(sum of lengths, 1) (no gradient)

  std::string name() const override { return "CrfLogLikelihoodBackward"; }

  void release_variables() override {
    for (SavedVariable* s : {&em_, &trans_, &start_, &end_, &lengths_, &tags_, &alpha_, &log_z_}) s->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    variable_list result(4);
    if (!grads[0].defined()) return result;
    const at::Tensor em = em_.unpack(), trans = trans_.unpack(), start = start_.unpack(), end = end_.unpack();
    const at::Tensor lengths = lengths_.unpack(), tags = tags_.unpack(), alpha = alpha_.unpack();
    const at::Tensor log_z = log_z_.unpack();
    const at::Tensor grad = llh_gradient(grads[0], reduction_, em.size(0), tokens_).to(em.scalar_type());
    std::vector<at::Tensor> g;
    // create_graph=True with a gradient wanted of the inputs or of grad (second derivatives, differentiable
    // marginals): the registered op, whose own autograd formula differentiates the PyTorch chain program
    if (records_graph({grad, em, trans, start, end})) {
      g = chain_log_backward_op(em, trans, start, end, lengths, alpha, log_z, grad, tags);
    } else {
      g = chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags);
      if (g[4].numel())  // the pair marginals stayed off chip: add their sum (beta g[4], the chains' weights g[5])
        g[1] = pair_marginal_sum_op(em, trans, lengths, alpha, log_z, g[5], g[4]).add_(g[1]);
    }
    for (size_t i = 0; i < 4; ++i)
      if (task_should_compute_output(i)) result[i] = g[i];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> crf_log_likelihood_autograd(const at::Tensor& emissions, const at::Tensor& transitions,
                                                    const at::Tensor& start, const at::Tensor& end,
                                                    const at::Tensor& lengths, const at::Tensor& tags,
                                                    int64_t reduction) {
  TORCH_CHECK(reduction >= 0 && reduction <= 3, "crf_log_likelihood_autograd: reduction must be 0-3, got ", reduction);
  check_no_forward_ad("crf_log_likelihood", {emissions, transitions, start, end});
  std::vector<at::Tensor> outputs;  // llh (or its reduction), alpha, log_z
  at::Tensor tokens;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // the kernel's own tensor calls record nothing
    outputs = crf_log_likelihood(emissions, transitions, start, end, lengths, tags);
    const at::Tensor& llh = outputs[0];
    if (reduction == 1) {
      outputs[0] = llh.sum();
    } else if (reduction == 2) {
      outputs[0] = llh.mean();
    } else if (reduction == 3) {
      tokens = lengths.sum().clamp_min(1);
      outputs[0] = llh.sum().div(tokens);
    }
  }
  if (!torch::autograd::compute_requires_grad(emissions, transitions, start, end)) return outputs;
  auto node = new_node<CrfLogLikelihoodBackward>(emissions, transitions, start, end);
  node->reduction_ = reduction;
  node->tokens_ = tokens;
  node->em_ = SavedVariable(emissions, false);
  node->trans_ = SavedVariable(transitions, false);
  node->start_ = SavedVariable(start, false);
  node->end_ = SavedVariable(end, false);
  node->lengths_ = SavedVariable(lengths, false);
  node->tags_ = SavedVariable(tags, false);
  node->alpha_ = SavedVariable(outputs[1], false);  // alpha and log_z: not differentiable outputs
  node->log_z_ = SavedVariable(outputs[2], false);
  torch::autograd::set_history(outputs[0], node);  // gradients flow through llh (or its reduction) only
  return outputs;
}

}  // namespace semiring_ops
