// semiring_ops::ctc_log, ctc_collect, ctc_viterbi and rnnt_lattice for CUDA tensors (contracts in ops.h): the shared
// host bodies (ctc_host.h, rnnt_host.h) with the CUDA launchers (ctc_launch.h, rnnt_launch.h; kernels in
// ctc_kernels.cu).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <type_traits>
#include <vector>

#include "ctc_host.h"
#include "cuda/ctc_launch.h"
#include "cuda/launch_check.h"
#include "cuda/rnnt_launch.h"
#include "ops.h"
#include "rnnt_host.h"

namespace semiring_ops {
namespace {

void check_cuda(const at::Tensor& log_probs, const char* who) {
  TORCH_CHECK_VALUE(log_probs.is_cuda(), who, " (CUDA): got log_probs ", describe(log_probs));
  TORCH_CHECK_VALUE(log_probs.dim() < 2 || log_probs.size(1) <= 0x7fffffff, who,
                    " (CUDA): at most 2^31 - 1 items, got log_probs ", describe(log_probs));
}

// SEMIRING_OPS_CTC_CLUSTER=c: blocks per item of the log program forced (1 to 8; 1: no clusters; sm_90+), for
// measurements and tests; 0 when unset.
int forced_cluster() {
  const char* env = std::getenv("SEMIRING_OPS_CTC_CLUSTER");
  if (env == nullptr) return 0;
  const int c = std::atoi(env);
  TORCH_CHECK(c >= 1 && c <= 8, "SEMIRING_OPS_CTC_CLUSTER must be an integer from 1 to 8, got ", env);
  return c;
}

}  // namespace

std::vector<at::Tensor> ctc_log(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                const at::Tensor& target_lengths, int64_t blank, bool need_states) {
  check_cuda(log_probs, "ctc_log");
  const c10::cuda::CUDAGuard guard(log_probs.device());
  return ctc_log_host("ctc_log (CUDA)", log_probs, targets, input_lengths, target_lengths, blank, need_states,
                      [&](const auto& a) {
                        cuda::check_launch(cuda::ctc_log_launch(a, forced_cluster(), c10::cuda::getCurrentCUDAStream()),
                                           "ctc_log (CUDA)");
                      });
}

at::Tensor ctc_collect(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                       const at::Tensor& target_lengths, int64_t blank, const at::Tensor& total,
                       const at::Tensor& states, const at::Tensor& weight) {
  check_cuda(log_probs, "ctc_collect");
  const c10::cuda::CUDAGuard guard(log_probs.device());
  return ctc_collect_host("ctc_collect (CUDA)", log_probs, targets, input_lengths, target_lengths, blank, total, states,
                          weight, [&](const auto& a) {
                            cuda::check_launch(cuda::ctc_collect_launch(a, c10::cuda::getCurrentCUDAStream()),
                                               "ctc_collect (CUDA)");
                          });
}

std::vector<at::Tensor> ctc_viterbi(const at::Tensor& log_probs, const at::Tensor& targets,
                                    const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank) {
  check_cuda(log_probs, "ctc_viterbi");
  const c10::cuda::CUDAGuard guard(log_probs.device());
  return ctc_viterbi_host("ctc_viterbi (CUDA)", log_probs, targets, input_lengths, target_lengths, blank,
                          [&](const auto& a) {
                            cuda::check_launch(cuda::ctc_viterbi_launch(a, c10::cuda::getCurrentCUDAStream()),
                                               "ctc_viterbi (CUDA)");
                          });
}

std::vector<at::Tensor> rnnt_lattice(const at::Tensor& potentials, const at::Tensor& frames, const at::Tensor& labels,
                                     bool max, bool need_posteriors) {
  TORCH_CHECK_VALUE(potentials.is_cuda(), "rnnt_lattice (CUDA): got potentials ", describe(potentials));
  const c10::cuda::CUDAGuard guard(potentials.device());
  return rnnt_lattice_host("rnnt_lattice (CUDA)", potentials, frames, labels, max, need_posteriors,
                           [&](const auto& a, bool use_max) {
                             const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
                             cuda::check_launch(cuda::rnnt_lattice_launch(a, use_max, stream), "rnnt_lattice (CUDA)");
                           });
}

}  // namespace semiring_ops
