// The host side of ctc_log, ctc_collect and ctc_viterbi (contracts in ops.h) that the CPU and CUDA backends share:
// argument checks, outputs and scratch, the dtype dispatch; the backend runs the filled CtcArgs.
#pragma once

#include "tensor_api.h"

#include <vector>

#include "checks.h"
#include "ctc_dp.h"

namespace semiring_ops {

inline void check_ctc_args(const char* who, const at::Tensor& log_probs, const at::Tensor& targets,
                           const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank) {
  TORCH_CHECK_VALUE(log_probs.dim() == 3 && (log_probs.scalar_type() == at::kFloat || log_probs.scalar_type() == at::kDouble),
                    who, ": log_probs must be a float32 or float64 (T, N, C) tensor, got ", describe(log_probs));
  const int64_t N = log_probs.size(1), C = log_probs.size(2);
  TORCH_CHECK_VALUE(targets.dim() == 2 && targets.size(0) == N && targets.scalar_type() == at::kLong, who,
                    ": targets must be int64 (N, S) with N = ", N, ", got ", describe(targets));
  for (const at::Tensor* t : {&input_lengths, &target_lengths})
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == N && t->scalar_type() == at::kLong, who,
                      ": input_lengths and target_lengths must be int64 (N,) with N = ", N, ", got ", describe(*t));
  for (const at::Tensor* t : {&targets, &input_lengths, &target_lengths})
    TORCH_CHECK_VALUE(t->device() == log_probs.device(), who, ": every tensor must be on log_probs' device (",
                      log_probs.device().str(), "), got ", describe(*t));
  TORCH_CHECK_VALUE(blank >= 0 && blank < C, who, ": blank must be in [0, C = ", C, "), got ", blank);
}

// Fills CtcArgs over contiguous copies of the integer tensors (kept alive in `keep`).
template <class T>
CtcArgs<T> ctc_args(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                    const at::Tensor& target_lengths, int64_t blank, std::vector<at::Tensor>& keep) {
  keep = {input_lengths.contiguous(), target_lengths.contiguous()};
  CtcArgs<T> a{};
  a.lp = log_probs.data_ptr<T>();
  a.st = log_probs.stride(0);
  a.sn = log_probs.stride(1);
  a.sc = log_probs.stride(2);
  a.targets = targets.data_ptr<int64_t>();
  a.ts0 = targets.stride(0);
  a.ts1 = targets.stride(1);
  a.input_lengths = keep[0].data_ptr<int64_t>();
  a.target_lengths = keep[1].data_ptr<int64_t>();
  a.T_ = log_probs.size(0);
  a.N = log_probs.size(1);
  a.C = log_probs.size(2);
  a.S = targets.size(1);
  a.K = 2 * a.S + 1;
  a.blank = blank;
  return a;
}

// ctc_log: [total (N,), states (N, T, K) or (0,)]; run(args) executes the program.
template <class Run>
std::vector<at::Tensor> ctc_log_host(const char* who, const at::Tensor& log_probs, const at::Tensor& targets,
                                     const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank,
                                     bool need_states, Run run) {
  check_ctc_args(who, log_probs, targets, input_lengths, target_lengths, blank);
  const int64_t T = log_probs.size(0), N = log_probs.size(1), K = 2 * targets.size(1) + 1;
  at::Tensor total = new_output(log_probs, {N}, log_probs.options());
  at::Tensor states = need_states ? new_output(log_probs, {N, T, K}, log_probs.options()) : log_probs.new_empty({0});
  AT_DISPATCH_FLOATING_TYPES(log_probs.scalar_type(), "ctc_log", [&] {
    std::vector<at::Tensor> keep;
    CtcArgs<scalar_t> a = ctc_args<scalar_t>(log_probs, targets, input_lengths, target_lengths, blank, keep);
    a.total = total.data_ptr<scalar_t>();
    if (need_states) a.rows = states.data_ptr<scalar_t>();
    run(a);
  });
  return {total, states};
}

// ctc_collect: the (T, N, C) weight * d log Z / d log_probs from ctc_log's total and states; run(args) executes the
// collection (every entry of the output written).
template <class Run>
at::Tensor ctc_collect_host(const char* who, const at::Tensor& log_probs, const at::Tensor& targets,
                            const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank,
                            const at::Tensor& total, const at::Tensor& states, const at::Tensor& weight, Run run) {
  check_ctc_args(who, log_probs, targets, input_lengths, target_lengths, blank);
  const int64_t T = log_probs.size(0), N = log_probs.size(1), C = log_probs.size(2), K = 2 * targets.size(1) + 1;
  for (const at::Tensor* t : {&total, &weight})
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == N && t->scalar_type() == log_probs.scalar_type() &&
                          t->device() == log_probs.device(),
                      who, ": total and weight must be (N,) with N = ", N, " of log_probs' dtype and device, got ",
                      describe(*t));
  TORCH_CHECK_VALUE(states.dim() == 3 && states.size(0) == N && states.size(1) == T && states.size(2) == K &&
                        states.scalar_type() == log_probs.scalar_type() && states.device() == log_probs.device() &&
                        states.is_contiguous(),
                    who, ": states must be ctc_log's contiguous (N, T, K = ", K, "), got ", describe(states));
  at::Tensor occupancy = new_output(log_probs, {T, N, C}, log_probs.options());
  AT_DISPATCH_FLOATING_TYPES(log_probs.scalar_type(), "ctc_collect", [&] {
    std::vector<at::Tensor> keep;
    CtcArgs<scalar_t> a = ctc_args<scalar_t>(log_probs, targets, input_lengths, target_lengths, blank, keep);
    keep.push_back(total.contiguous());
    keep.push_back(weight.contiguous());
    a.total = keep[2].data_ptr<scalar_t>();
    a.weight = keep[3].data_ptr<scalar_t>();
    a.rows = states.data_ptr<scalar_t>();
    a.occupancy = occupancy.data_ptr<scalar_t>();
    a.os0 = occupancy.stride(0);
    a.os1 = occupancy.stride(1);
    run(a);
  });
  return occupancy;
}

// ctc_viterbi: [total (N,), path (N, T) int64: the best path's states, -1 past each item's frames].
template <class Run>
std::vector<at::Tensor> ctc_viterbi_host(const char* who, const at::Tensor& log_probs, const at::Tensor& targets,
                                         const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                         int64_t blank, Run run) {
  check_ctc_args(who, log_probs, targets, input_lengths, target_lengths, blank);
  const int64_t T = log_probs.size(0), N = log_probs.size(1), K = 2 * targets.size(1) + 1;
  at::Tensor total = new_output(log_probs, {N}, log_probs.options());
  at::Tensor path = new_output(log_probs, {N, T}, log_probs.options().dtype(at::kLong));
  at::Tensor moves = log_probs.new_empty({N, T, K}, log_probs.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES(log_probs.scalar_type(), "ctc_viterbi", [&] {
    std::vector<at::Tensor> keep;
    CtcArgs<scalar_t> a = ctc_args<scalar_t>(log_probs, targets, input_lengths, target_lengths, blank, keep);
    a.total = total.data_ptr<scalar_t>();
    a.moves = moves.data_ptr<unsigned char>();
    a.path = path.data_ptr<int64_t>();
    run(a);
  });
  return {total, path};
}

}  // namespace semiring_ops
