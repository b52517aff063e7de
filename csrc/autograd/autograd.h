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

#include <optional>
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
// sum comes from the registered operator semiring_ops::pair_marginal_sum (chain_ops.py). reduction 1 / 2 / 3
// returns llh's sum / mean / sum over max(sum of lengths, 1) instead of llh, reduced inside the node (one node
// where llh.sum() would add a second, a separate op and its backward: ~10 us of a CPU step).
std::vector<at::Tensor> crf_log_likelihood_autograd(const at::Tensor& emissions, const at::Tensor& transitions,
                                                    const at::Tensor& start, const at::Tensor& end,
                                                    const at::Tensor& lengths, const at::Tensor& tags,
                                                    int64_t reduction = 0);

// LinearChainCRF.forward (structures/crf.py) in one call: emissions (T, B, C), or (B, T, C) with batch_first; tags
// and mask (bool / uint8) in the same layout; lengths (B,) instead of a mask; the CRF's transitions (C, C), start
// and end (C,); reduction 0 none, 1 sum, 2 mean, 3 token_mean; validate as LinearChainCRF.validate. Returns the
// reduced log-likelihood, or nullopt where the Python path must run instead (crf_forward.cpp says when).
std::optional<at::Tensor> crf_forward(const at::Tensor& emissions, const at::Tensor& tags,
                                      const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                                      const at::Tensor& transitions, const at::Tensor& start, const at::Tensor& end,
                                      bool batch_first, int64_t reduction, bool validate);

}  // namespace semiring_ops
