// The eager autograd entry points: a kernel's forward recorded with its backward as one C++ autograd node, so a
// training step's host time is the kernels' and the autograd engine's, with no Python between them (issue 29).
// Python (semiring_ops/ops) calls these for plain eager tensors that need a gradient; torch.compile, dispatch
// modes and tensor subclasses go through the registered custom operators instead, whose Python autograd formulas
// (registry.py, chain_ops.py) are the reference these nodes are tested against.
//
// Each node's backward calls the kernels directly when it records no graph. When it does (create_graph=True,
// double backward), it calls the registered operator (semiring_ops::log_bmm_backward, whose own autograd gives
// the second derivatives) or differentiable ATen methods, so higher derivatives match the operators'.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace semiring_ops {

// bmm_forward (ops.h) recorded for autograd: {out (B, n, m), arg}, arg marked non-differentiable. The backward:
//   log:      log_bmm_grads (ops.h) in the accumulation dtype, cast back to a's / b's;
//   max, min: each output's gradient scattered to its selected k (none where out is the semiring's zero; the
//             index is recomputed when the forward ran without it);
//   std:      torch.bmm's gradients.
std::vector<at::Tensor> bmm_autograd(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id, bool with_arg);

// crf_log_likelihood (ops.h) recorded for autograd: {llh (B,), alpha, log_z}, gradients through llh only, by
// chain_log_backward with the tags (one reverse scan). When that kernel leaves the pair marginals off chip, their
// sum comes from the registered operator semiring_ops::pair_marginal_sum (chain_ops.py).
std::vector<at::Tensor> crf_log_likelihood_autograd(const at::Tensor& emissions, const at::Tensor& transitions,
                                                    const at::Tensor& start, const at::Tensor& end,
                                                    const at::Tensor& lengths, const at::Tensor& tags);

}  // namespace semiring_ops
