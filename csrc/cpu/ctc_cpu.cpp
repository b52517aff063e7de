// semiring_ops::ctc_log, ctc_collect, ctc_viterbi and rnnt_lattice for CPU tensors (contracts in ops.h; the programs
// in ctc_dp.h and rnnt_dp.h): the batch items in parallel (at::parallel_for), each one thread (a team of one) with
// its own buffers. (RNN-T's entry lives here rather than in a file of its own: one translation unit that includes ATen
// fewer, 7.5 s of g++ on each build of the family.)
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "ctc_host.h"
#include "ops.h"
#include "rnnt_host.h"

namespace semiring_ops {
namespace {

struct SerialTeam : CtcWholeItem<SerialTeam> {
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() const {}
  int lane() const { return 0; }
  int warp() const { return 0; }
  int warps() const { return 1; }
  template <class T> T warp_sum(T v) const { return v; }
  template <class T> void copy_async(T* dst, const T* src) const { *dst = *src; }
  void commit_copies() const {}
  void wait_copies() const {}
  template <class F> auto lead_sum(int64_t n, F f) const -> decltype(f(0)) {
    decltype(f(0)) v = 0;
    for (int64_t i = 0; i < n; ++i) v += f(i);
    return v;
  }
  template <class F> auto lead_max(int64_t n, F f) const -> decltype(f(0)) {
    using T = decltype(f(0));
    T v = -pos_inf<T>();
    for (int64_t i = 0; i < n; ++i) {
      const T x = f(i);
      v = (x > v || is_nan(x)) ? x : v;
    }
    return v;
  }
};

void check_cpu(const at::Tensor& log_probs, const char* who) {
  TORCH_CHECK_VALUE(log_probs.device().is_cpu(), who, " (CPU): got log_probs ", describe(log_probs));
}

// Each worker's scratch (ctc_dp.h's CtcScratch) over its own buffers; the items of [b0, b1) in turn.
template <class T, class Program> void run_items(const CtcArgs<T>& a, Program program) {
  at::parallel_for(0, a.N, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> ints(ctc_scratch_ints(a.K));
    std::vector<T> values(std::max(ctc_scratch_values(a.K), ctc_scratch_values(a.K, false)));  // programs, collection
    const CtcScratch<T> sm = ctc_carve<T>(ints.data(), values.data(), a.K);
    for (int64_t b = b0; b < b1; ++b) program(SerialTeam{}, a, sm, b);
  });
}

}  // namespace

std::vector<at::Tensor> ctc_log(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                const at::Tensor& target_lengths, int64_t blank, bool need_states) {
  check_cpu(log_probs, "ctc_log");
  return ctc_log_host("ctc_log (CPU)", log_probs, targets, input_lengths, target_lengths, blank, need_states,
                      [&](const auto& a) {
                        using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.lp)>>;
                        run_items(a, [](const SerialTeam& team, const CtcArgs<T>& args, const CtcScratch<T>& sm,
                                        int64_t b) { ctc_log_item<T>(team, args, sm, b); });
                      });
}

at::Tensor ctc_collect(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                       const at::Tensor& target_lengths, int64_t blank, const at::Tensor& total,
                       const at::Tensor& states, const at::Tensor& weight) {
  check_cpu(log_probs, "ctc_collect");
  return ctc_collect_host("ctc_collect (CPU)", log_probs, targets, input_lengths, target_lengths, blank, total, states,
                          weight, [&](const auto& a) {
                            using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.lp)>>;
                            run_items(a, [](const SerialTeam& team, const CtcArgs<T>& args, const CtcScratch<T>& sm,
                                            int64_t b) { ctc_collect_frames<T>(team, args, sm, b, 0, args.T_); });
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

std::vector<at::Tensor> rnnt_lattice(const at::Tensor& potentials, const at::Tensor& frames, const at::Tensor& labels,
                                     bool max, bool need_posteriors) {
  TORCH_CHECK_VALUE(potentials.device().is_cpu(), "rnnt_lattice (CPU): got potentials ", describe(potentials));
  return rnnt_lattice_host("rnnt_lattice (CPU)", potentials, frames, labels, max, need_posteriors,
                           [&](const auto& a, bool use_max) {
                             at::parallel_for(0, a.B, 1, [&](int64_t b0, int64_t b1) {
                               for (int64_t b = b0; b < b1; ++b) {
                                 if (use_max)
                                   rnnt_item<true>(SerialTeam{}, a, b);
                                 else
                                   rnnt_item<false>(SerialTeam{}, a, b);
                               }
                             });
                           });
}

}  // namespace semiring_ops
