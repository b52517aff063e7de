// semiring_ops::ctc_log and ctc_viterbi for CPU tensors (contracts in ops.h; the programs in ctc_dp.h): the batch
// items in parallel (at::parallel_for), each one thread (a team of one) with its own row buffers.
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/serial_team.h"
#include "ctc_host.h"
#include "ops.h"

namespace semiring_ops {
namespace {

void check_cpu(const at::Tensor& log_probs, const char* who) {
  TORCH_CHECK_VALUE(log_probs.device().is_cpu(), who, " (CPU): got log_probs ", describe(log_probs));
}

// Each worker's scratch (ctc_dp.h's CtcScratch) over its own buffers; the items of [b0, b1) in turn.
template <class T, class Program> void run_items(const CtcArgs<T>& a, Program program) {
  at::parallel_for(0, a.N, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> ints(ctc_scratch_ints(a.K));
    std::vector<T> values(ctc_scratch_values(a.K));
    const CtcScratch<T> sm = ctc_carve<T>(ints.data(), values.data(), a.K);
    for (int64_t b = b0; b < b1; ++b) program(SerialTeam{}, a, sm, b);
  });
}

}  // namespace

std::vector<at::Tensor> ctc_log(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                const at::Tensor& target_lengths, int64_t blank, bool need_occupancy) {
  check_cpu(log_probs, "ctc_log");
  return ctc_log_host("ctc_log (CPU)", log_probs, targets, input_lengths, target_lengths, blank, need_occupancy,
                      [&](const auto& a) {
                        using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.lp)>>;
                        run_items(a, [](const SerialTeam& team, const CtcArgs<T>& args, const CtcScratch<T>& sm,
                                        int64_t b) {
                          ctc_log_item<T>(team, args, sm, b);
                          if (args.occupancy) ctc_collect_frames<T>(team, args, sm, b, 0, args.T_);
                        });
                      });
}

std::vector<at::Tensor> ctc_viterbi(const at::Tensor& log_probs, const at::Tensor& targets,
                                    const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank) {
  check_cpu(log_probs, "ctc_viterbi");
  return ctc_viterbi_host("ctc_viterbi (CPU)", log_probs, targets, input_lengths, target_lengths, blank,
                          [&](const auto& a) {
                            using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.lp)>>;
                            run_items(a, [](const SerialTeam& team, const CtcArgs<T>& args, const CtcScratch<T>& sm,
                                            int64_t b) { ctc_viterbi_item<T>(team, args, sm, b); });
                          });
}

}  // namespace semiring_ops
