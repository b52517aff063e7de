// semiring_ops::chain_scan, chain_viterbi, chain_log_backward and crf_log_likelihood for CUDA tensors (contracts in
// ops.h): checks, outputs, the semiring x dtype dispatch (chain_host.h) and the kernel's parameters; the kernels,
// their plans and launches are in chain_kernels.cuh (chain_launch.h).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <limits>
#include <optional>

#include "chain_host.h"
#include "checks.h"
#include "cuda/chain_launch.h"
#include "cuda/launch_check.h"
#include "ops.h"
#include "semiring.h"
#include "tensor_api.h"

namespace semiring_ops {
namespace {

// The log-partition's gradient outputs, for a reverse scan run as the backward pass (kGrad).
struct GradArgs {
  const at::Tensor *alpha, *log_z, *grad;
  at::Tensor *g_em, *g_trans, *g_start, *g_end;
  at::Tensor* grad_used;  // (B,) or null
};

// SEMIRING_OPS_CHAIN_CLUSTER=K: blocks per chain forced (a power of two <= 16; 1: no clusters), for measurements;
// 0 when unset.
int forced_cluster() {
  const char* env = std::getenv("SEMIRING_OPS_CHAIN_CLUSTER");
  if (env == nullptr) return 0;
  const int K = std::atoi(env);
  TORCH_CHECK(K >= 1 && K <= 16 && (K & (K - 1)) == 0, "SEMIRING_OPS_CHAIN_CLUSTER must be a power of two in 1..16, got ",
              env);
  return K;
}

// Runs the kernel over the batch; returns whether the pair marginals were summed on chip (kGrad).
template <class S, class T, bool kArg, bool kGrad>
bool launch(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start, const at::Tensor& end,
            const at::Tensor& lengths, bool reverse, at::Tensor& total, at::Tensor* scores, at::Tensor* tags,
            const GradArgs* grads = nullptr, const at::Tensor* gold = nullptr, at::Tensor* llh = nullptr) {
  const int64_t B = em.size(0);
  const int Tn = static_cast<int>(em.size(1)), C = static_cast<int>(em.size(2));
  if (B == 0) return true;
  const at::Tensor start_c = start.contiguous(), end_c = end.contiguous();
  cuda::ChainPlan plan;
  cuda::check_launch(cuda::chain_plan<S, T, kArg, kGrad>(plan, B, Tn, C, em.get_device(), forced_cluster()),
                     "chain kernel (CUDA)");
  // Output-major step matrix, for reading from L2 (large C): forward steps produce tag j from tag i
  // (M[j, i] = trans[i, j]); reverse steps produce i from j (M[i, j] = trans[i, j]). On chip it is staged
  // from trans directly, with its strides.
  const at::Tensor mat = plan.mat_shared ? at::Tensor() : (reverse ? trans : trans.t()).contiguous();
  const bool xi = plan.xi;
  at::Tensor ptr_scratch;
  if (kArg && !plan.ptr_shared) ptr_scratch = em.new_empty({B, Tn, C}, em.options().dtype(at::kShort));

  cuda::ChainParams<T> p{};
  p.em = em.data_ptr<T>();
  p.es0 = em.stride(0);
  p.es1 = em.stride(1);
  p.es2 = em.stride(2);
  p.trans = trans.data_ptr<T>();
  p.trs0 = trans.stride(0);
  p.trs1 = trans.stride(1);
  p.mat = plan.mat_shared ? nullptr : mat.data_ptr<T>();
  p.boundary_in = (reverse ? end_c : start_c).data_ptr<T>();
  p.boundary_out = (reverse ? start_c : end_c).data_ptr<T>();
  p.lengths = lengths.data_ptr<int64_t>();
  p.total = total.data_ptr<T>();
  // the backward's beta (B, T, C) is made here, once the plan says the pair marginals are summed off chip (the
  // caller passes it undefined); with xi it is not needed
  if (kGrad && scores && !xi && !scores->defined()) *scores = em.new_empty({B, Tn, C});
  p.scores = scores && !(kGrad && xi) ? scores->data_ptr<T>() : nullptr;
  p.pointers = ptr_scratch.defined() ? ptr_scratch.data_ptr<int16_t>() : nullptr;
  p.tags = tags ? tags->data_ptr<int64_t>() : nullptr;
  p.steps = Tn;
  p.C = C;
  p.group = plan.G;
  p.pitch = plan.P;
  p.cluster = plan.K;
  p.slice = plan.S;
  p.reverse = reverse;
  if (gold) {
    p.gold = gold->data_ptr<int64_t>();
    p.gs0 = gold->stride(0);
    p.gs1 = gold->stride(1);
    p.llh = llh ? llh->data_ptr<T>() : nullptr;
    p.g_trans_gold = grads ? grads->g_trans->data_ptr<T>() : nullptr;
  }
  if (grads) {
    p.alpha = grads->alpha->data_ptr<T>();
    p.log_z = grads->log_z->data_ptr<T>();
    p.grad = grads->grad->data_ptr<T>();
    p.grad_stride = grads->grad->stride(0);
    p.g_em = grads->g_em->data_ptr<T>();
    p.g_start = grads->g_start->data_ptr<T>();
    p.g_end = grads->g_end->data_ptr<T>();
    p.g_trans = xi ? grads->g_trans->data_ptr<T>() : nullptr;
    p.grad_used = grads->grad_used ? grads->grad_used->data_ptr<T>() : nullptr;
  }
  cuda::check_launch(cuda::chain_launch<S, T, kArg, kGrad>(plan, p, B, c10::cuda::getCurrentCUDAStream()),
                     "chain kernel (CUDA)");
  return xi;
}

void check_cuda(const at::Tensor& em, const char* what) {
  TORCH_CHECK(em.is_cuda(), what, " (CUDA): got emissions ", describe(em));
  TORCH_CHECK(em.size(0) <= 0x7fffffff && em.size(1) <= 0x7fffffff, what,
              " (CUDA): at most 2^31 - 1 chains and steps, got emissions ", describe(em));
}

}  // namespace

std::vector<at::Tensor> chain_scan(const at::Tensor& emissions, const at::Tensor& transitions,
                                   const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                   int64_t semiring_id, bool reverse, bool save_scores) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_cuda(emissions, "chain_scan");
  const c10::cuda::CUDAGuard guard(emissions.device());
  return chain_scan_host("chain_scan (CUDA)", emissions, semiring_id, save_scores,
                         [&](auto s, auto x, auto arg, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
                           launch<decltype(s), decltype(x), decltype(arg)::value, false>(
                               emissions, transitions, start, end, lengths, reverse, total, scores, tags);
                         });
}

std::vector<at::Tensor> chain_viterbi(const at::Tensor& emissions, const at::Tensor& transitions,
                                      const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                      int64_t semiring_id) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_cuda(emissions, "chain_viterbi");
  const c10::cuda::CUDAGuard guard(emissions.device());
  return chain_viterbi_host("chain_viterbi (CUDA)", emissions, semiring_id,
                            [&](auto s, auto x, auto arg, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
                              launch<decltype(s), decltype(x), decltype(arg)::value, false>(
                                  emissions, transitions, start, end, lengths, false, total, scores, tags);
                            });
}

std::vector<at::Tensor> chain_log_backward(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& alpha, const at::Tensor& log_z, const at::Tensor& grad,
                                           const std::optional<at::Tensor>& tags) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_chain_grad_args(emissions, alpha, log_z, grad);
  if (tags) check_chain_tags(emissions, *tags, "chain_log_backward");
  check_cuda(emissions, "chain_log_backward");
  const c10::cuda::CUDAGuard guard(emissions.device());
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  const auto opts = emissions.options();
  at::Tensor total = emissions.new_empty({B});
  at::Tensor g_em = new_output(emissions, {B, T_len, C}, opts);
  // the atomically accumulated sums start at zero; three allocations, not views of one buffer: a registered
  // operator's outputs may not share storage (torch.compile rejects it), so one memset each
  at::Tensor g_trans = emissions.new_empty({C, C}), g_start = emissions.new_empty({C}), g_end = emissions.new_empty({C});
  for (at::Tensor* sum : {&g_trans, &g_start, &g_end})
    C10_CUDA_CHECK(cudaMemsetAsync(sum->data_ptr(), 0, sum->nbytes(), c10::cuda::getCurrentCUDAStream()));
  at::Tensor beta;  // made by launch only when the pair marginals are summed off chip
  // grad may be a broadcast scalar (stride 0: the backward of a sum): read in place
  const at::Tensor alpha_c = alpha.contiguous(), log_z_c = log_z.contiguous();
  const at::Tensor grad_c = grad.stride(0) == 0 ? grad : grad.contiguous();
  bool xi_on_chip = true;
  // with tags, the weights the kernel gave the chains (0 where the gold path is impossible) feed the
  // off-chip pair-marginal sum
  at::Tensor grad_used = tags ? emissions.new_empty({B}) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_log_backward_cuda", [&] {
    const GradArgs grads{&alpha_c, &log_z_c, &grad_c, &g_em, &g_trans, &g_start, &g_end, tags ? &grad_used : nullptr};
    xi_on_chip = launch<LogSemiring, scalar_t, false, true>(emissions, transitions, start, end, lengths, true, total,
                                                            &beta, nullptr, &grads, tags ? &*tags : nullptr);
  });
  // off chip: g_trans holds the gold transitions' counts (zeros without tags); the caller adds the pair marginals'
  // sum from beta and the chains' weights (ops.h)
  if (!xi_on_chip && T_len > 1) return {g_em, g_trans, g_start, g_end, beta, tags ? grad_used : grad_c};
  return {g_em, g_trans, g_start, g_end, emissions.new_empty({0}), emissions.new_empty({0})};
}

std::vector<at::Tensor> crf_log_likelihood(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& tags) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_chain_tags(emissions, tags, "crf_log_likelihood");
  check_cuda(emissions, "crf_log_likelihood");
  const c10::cuda::CUDAGuard guard(emissions.device());
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  const auto opts = emissions.options();
  at::Tensor llh = new_output(emissions, {B}, opts), log_z = new_output(emissions, {B}, opts);
  at::Tensor alpha = new_output(emissions, {B, T_len, C}, opts);
  AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_crf_log_likelihood_cuda", [&] {
    launch<LogSemiring, scalar_t, false, false>(emissions, transitions, start, end, lengths, false, log_z, &alpha,
                                                nullptr, nullptr, &tags, &llh);
  });
  return {llh, alpha, log_z};
}

}  // namespace semiring_ops
