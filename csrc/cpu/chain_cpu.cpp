// semiring_ops::chain_scan and chain_viterbi for CPU tensors (contracts in ops.h).
//
// Chains run in parallel (at::parallel_for over the batch); each walks its own length, one step at a time.
// A step is the vector-matrix product  u[o] = (+)_k vec[k] (x) M[k, o]  with the step matrix M stored
// input-major, in the kernel domain (S::to_kernel applied once per call) and with its columns padded to
// whole tiles of kCols with the semiring's zero: for each k, the loop over a tile's columns vectorises, the
// tile's accumulators staying in registers (the same AccTile as the bmm kernel, cpu_common.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")  // lets GCC vectorise the selects of semiring.h; see cpu_common.h
#endif

#include <ATen/Dispatch.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>

#include "chain_host.h"
#include "checks.h"
#include "cpu_common.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace {

// One chain's inputs and outputs; em(t, c) reads any strides.
template <class T> struct ChainView {
  const T* em;
  int64_t es1, es2;
  T em_at(int64_t t, int64_t c) const { return em[t * es1 + c * es2]; }
};

// The step matrix, input-major and padded: element (k, o) at m[k * cols + o]. Forward steps go from tag i
// to tag j through trans[i, j] (k = i, o = j); reverse steps from j back to i (k = j, o = i).
template <class S, class T> std::vector<T> step_matrix(const at::Tensor& trans, bool reverse, int64_t cols) {
  const int64_t C = trans.size(0);
  // read through the strides (reverse: transposed), no transposed copy
  const int64_t sk = reverse ? trans.stride(1) : trans.stride(0), so = reverse ? trans.stride(0) : trans.stride(1);
  const T* src = trans.data_ptr<T>();
  std::vector<T> out(static_cast<size_t>(C * cols), S::to_kernel(S::template zero<T>()));
  for (int64_t k = 0; k < C; ++k)
    for (int64_t o = 0; o < C; ++o) out[k * cols + o] = S::to_kernel(src[k * sk + o * so]);
  return out;
}

template <class S, class T, bool kArg> struct ChainRunner {
  using Acc = typename S::template Accumulator<T, kArg>;
  static constexpr int kCols = cpu::kTileCols<T>;
  using Tile = cpu::AccTile<Acc, 1, kCols>;

  int64_t T_len, C, cols;
  bool reverse;
  const T* mat;       // step_matrix
  const T* boundary_in;   // start (forward) or end (reverse), contiguous (C)
  const T* boundary_out;  // end (forward) or start (reverse)

  // u[o] = (+)_k vec[k] (x) mat[k, o] for o < C; args[o] the selected k (kArg).
  void step(const T* vec, T* u, int16_t* args) const {
    for (int64_t o0 = 0; o0 < cols; o0 += kCols) {
      Tile tile;
      tile.init();
      for (int64_t k = 0; k < C; ++k) {
        const T v = vec[k];
        const T* row = mat + k * cols + o0;
        const int32_t kk = static_cast<int32_t>(k);
        for (int j = 0; j < kCols; ++j) {
          Acc x = tile.get(0, j);
          x.add(S::times(v, row[j]), kk);
          tile.put(0, j, x);
        }
      }
      for (int64_t j = 0; j < kCols && o0 + j < C; ++j) {
        const Acc x = tile.get(0, static_cast<int>(j));
        u[o0 + j] = x.result();
        if constexpr (kArg) args[o0 + j] = static_cast<int16_t>(x.arg());
      }
    }
  }

  // Runs one chain of length L; scores (T, C) or null; pointers (T, C) for kArg. Returns the final
  // accumulator over the last vector (its result is the total, its arg the best last tag).
  Acc run(const ChainView<T>& ch, int64_t L, T* scores, int16_t* pointers, std::vector<T>& vec,
          std::vector<T>& u) const {
    for (int64_t c = 0; c < C; ++c) u[c] = boundary_in[c];
    for (int64_t s = 0; s < L; ++s) {
      const int64_t t = reverse ? L - 1 - s : s;
      if (s > 0) step(vec.data(), u.data(), kArg ? pointers + t * C : nullptr);
      for (int64_t c = 0; c < C; ++c) {
        const T through = S::times(u[c], ch.em_at(t, c));
        if (scores) scores[t * C + c] = reverse ? u[c] : through;
        vec[c] = S::to_kernel(through);
      }
    }
    Acc acc;
    acc.init();
    for (int64_t c = 0; c < C; ++c) acc.add(S::times(vec[c], S::to_kernel(boundary_out[c])), static_cast<int32_t>(c));
    return acc;
  }
};

// A length outside 0..T (kInvalidLength: a bad sequence found under CUDA graph capture) gives NaN results.
bool invalid_length(int64_t L, int64_t T) { return L < 0 || L > T; }
int64_t usable_length(int64_t L, int64_t T) { return invalid_length(L, T) ? 0 : L; }

template <class S, class T, bool kArg>
void run_chains(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start, const at::Tensor& end,
                const at::Tensor& lengths, bool reverse, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
  const int64_t B = em.size(0), T_len = em.size(1), C = em.size(2);
  const int64_t cols = (C + ChainRunner<S, T, kArg>::kCols - 1) / ChainRunner<S, T, kArg>::kCols *
                       ChainRunner<S, T, kArg>::kCols;
  const std::vector<T> mat = step_matrix<S, T>(trans, reverse, cols);
  const at::Tensor start_c = start.contiguous(), end_c = end.contiguous();
  ChainRunner<S, T, kArg> runner{T_len, C, cols, reverse, mat.data(),
                                 (reverse ? end_c : start_c).data_ptr<T>(),
                                 (reverse ? start_c : end_c).data_ptr<T>()};
  const T* em_ptr = em.data_ptr<T>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  T* total_ptr = total.data_ptr<T>();
  T* scores_ptr = scores ? scores->data_ptr<T>() : nullptr;
  int64_t* tags_ptr = tags ? tags->data_ptr<int64_t>() : nullptr;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, T_len * C * C));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    std::vector<T> vec(static_cast<size_t>(C)), u(static_cast<size_t>(C));
    std::vector<int16_t> pointers(kArg ? static_cast<size_t>(T_len * C) : 0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t L = usable_length(len[b], T_len);
      const ChainView<T> ch{em_ptr + b * em.stride(0), em.stride(1), em.stride(2)};
      T* sc = scores_ptr ? scores_ptr + b * T_len * C : nullptr;
      const auto acc = runner.run(ch, L, sc, pointers.data(), vec, u);
      total_ptr[b] = invalid_length(len[b], T_len) ? T(NAN) : L > 0 ? acc.result() : S::template one<T>();
      if (sc)
        for (int64_t i = L * C; i < T_len * C; ++i) sc[i] = S::template zero<T>();
      if constexpr (kArg) {
        int64_t* tg = tags_ptr + b * T_len;
        for (int64_t t = L; t < T_len; ++t) tg[t] = -1;
        if (L > 0) {
          int64_t c = acc.arg();
          tg[L - 1] = c;
          for (int64_t t = L - 1; t > 0; --t) {
            c = pointers[t * C + c];
            tg[t - 1] = c;
          }
        }
      }
    }
  });
}

}  // namespace

std::vector<at::Tensor> chain_scan(const at::Tensor& emissions, const at::Tensor& transitions,
                                   const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                   int64_t semiring_id, bool reverse, bool save_scores) {
  check_chain_args(emissions, transitions, start, end, lengths);
  TORCH_CHECK(emissions.device().is_cpu(), "chain kernel (CPU): got emissions ", describe(emissions));
  return chain_scan_host("chain_scan (CPU)", emissions, semiring_id, save_scores,
                         [&](auto s, auto x, auto arg, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
                           run_chains<decltype(s), decltype(x), decltype(arg)::value>(
                               emissions, transitions, start, end, lengths, reverse, total, scores, tags);
                         });
}

std::vector<at::Tensor> chain_viterbi(const at::Tensor& emissions, const at::Tensor& transitions,
                                      const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                      int64_t semiring_id) {
  check_chain_args(emissions, transitions, start, end, lengths);
  TORCH_CHECK(emissions.device().is_cpu(), "chain kernel (CPU): got emissions ", describe(emissions));
  return chain_viterbi_host("chain_viterbi (CPU)", emissions, semiring_id,
                            [&](auto s, auto x, auto arg, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
                              run_chains<decltype(s), decltype(x), decltype(arg)::value>(
                               emissions, transitions, start, end, lengths, false, total, scores, tags);
                            });
}

namespace {

// exp(x) as one base-2 exponential of semiring.h (vectorisable for float; exp(-inf) = 0).
template <class T> T exp_e(T x) { return fast_exp2(x * T(kLog2e)); }

// A batch of gold tag paths (B, T) int64, any strides.
struct GoldPaths {
  const int64_t* ptr;
  int64_t s0, s1;
  int64_t at(int64_t b, int64_t t) const { return ptr[b * s0 + t * s1]; }
};

// The log-semiring score of chain b's gold path over its first L steps (trans contiguous (C, C)).
template <class T>
T gold_path_score(const GoldPaths& y, int64_t b, const ChainView<T>& ch, const T* trans, const T* start, const T* end,
                  int64_t L, int64_t C) {
  T sum = T(0);
  for (int64_t t = 0; t < L; ++t) {
    const int64_t cur = y.at(b, t);
    if (cur < 0 || cur >= C) return std::numeric_limits<T>::quiet_NaN();  // unvalidated tags: NaN, never a stray read
    sum += ch.em_at(t, cur) + (t > 0 ? trans[y.at(b, t - 1) * C + cur] : start[cur]);
    if (t == L - 1) sum += end[cur];
  }
  return sum;
}

// chain_log_backward's work for the chains of one parallel task: per chain, the reverse scan (beta), then
// the marginals and pair marginals from alpha and beta; the (C, C), (C) sums stay in task-local buffers
// that are added to the outputs under a lock at the end.
template <class T>
void log_backward_chains(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start, const at::Tensor& end,
                         const at::Tensor& lengths, const at::Tensor& alpha, const at::Tensor& log_z,
                         const at::Tensor& grad, const GoldPaths* gold, at::Tensor& g_em, at::Tensor& g_trans,
                         at::Tensor& g_start, at::Tensor& g_end) {
  using S = LogSemiring;
  const int64_t B = em.size(0), T_len = em.size(1), C = em.size(2);
  constexpr int kCols = ChainRunner<S, T, false>::kCols;
  const int64_t cols = (C + kCols - 1) / kCols * kCols;
  const std::vector<T> mat = step_matrix<S, T>(trans, true, cols);
  const at::Tensor start_c = start.contiguous(), end_c = end.contiguous(), trans_c = trans.contiguous();
  const ChainRunner<S, T, false> runner{T_len, C, cols, true, mat.data(), end_c.data_ptr<T>(), start_c.data_ptr<T>()};
  const T* tr = trans_c.data_ptr<T>();
  const T* al = alpha.data_ptr<T>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  std::mutex lock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, T_len * C * C));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    std::vector<T> vec(static_cast<size_t>(C)), u(static_cast<size_t>(C)), beta(static_cast<size_t>(T_len * C));
    std::vector<T> xi(static_cast<size_t>(C * C), T(0)), gs(static_cast<size_t>(C), T(0)), ge(gs);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t L = usable_length(len[b], T_len);
      T* gm = g_em.data_ptr<T>() + b * T_len * C;
      std::fill(gm + L * C, gm + T_len * C, invalid_length(len[b], T_len) ? T(NAN) : T(0));
      const T z = log_z.data_ptr<T>()[b];
      if (L == 0) continue;
      const ChainView<T> ch{em.data_ptr<T>() + b * em.stride(0), em.stride(1), em.stride(2)};
      const T gold_score =
          gold ? gold_path_score(*gold, b, ch, tr, start_c.data_ptr<T>(), end_c.data_ptr<T>(), L, C) : T(0);
      // no gradient for an impossible chain; NaN for unvalidated (out-of-range) tags
      // with gold paths the loss is sum_b g_b (gold_b - log_z_b): the marginals weigh -g, the gold path +g
      const T gb = grad.data_ptr<T>()[b * grad.stride(0)];  // any stride (a reduction's gradient is expanded)
      const T g = gold_score != gold_score                                 ? gold_score
                  : (z == -pos_inf<T>() || gold_score == -pos_inf<T>()) ? T(0)
                                                                         : (gold ? -gb : gb);
      const T nz = z == -pos_inf<T>() ? T(0) : -z;
      runner.run(ch, L, beta.data(), nullptr, vec, u);
      const T* a = al + b * T_len * C;
      for (int64_t t = 0; t < L; ++t)
        for (int64_t c = 0; c < C; ++c) gm[t * C + c] = g * exp_e(a[t * C + c] + beta[t * C + c] + nz);
      if (gold && g == g)  // minus the gold path's indicators (a NaN gold score: unvalidated tags)
        for (int64_t t = 0; t < L; ++t) {
          gm[t * C + gold->at(b, t)] -= g;
          if (t > 0) xi[gold->at(b, t - 1) * C + gold->at(b, t)] -= g;
        }
      for (int64_t c = 0; c < C; ++c) {
        gs[c] += gm[c];
        ge[c] += gm[(L - 1) * C + c];
      }
      for (int64_t t = 0; t + 1 < L; ++t)
        for (int64_t i = 0; i < C; ++i) {
          const T left = a[t * C + i] + nz;
          for (int64_t j = 0; j < C; ++j)
            xi[i * C + j] += g * exp_e(left + tr[i * C + j] + ch.em_at(t + 1, j) + beta[(t + 1) * C + j]);
        }
    }
    const std::lock_guard<std::mutex> guard(lock);
    T* out_t = g_trans.data_ptr<T>();
    for (int64_t i = 0; i < C * C; ++i) out_t[i] += xi[i];
    for (int64_t c = 0; c < C; ++c) {
      g_start.data_ptr<T>()[c] += gs[c];
      g_end.data_ptr<T>()[c] += ge[c];
    }
  });
}

}  // namespace

std::vector<at::Tensor> chain_log_backward(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& alpha, const at::Tensor& log_z, const at::Tensor& grad,
                                           const std::optional<at::Tensor>& tags) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_chain_grad_args(emissions, alpha, log_z, grad);
  if (tags) check_chain_tags(emissions, *tags, "chain_log_backward");
  TORCH_CHECK(emissions.device().is_cpu(), "chain_log_backward (CPU): got emissions ", describe(emissions));
  const std::optional<GoldPaths> gold =
      tags ? std::optional<GoldPaths>(GoldPaths{tags->data_ptr<int64_t>(), tags->stride(0), tags->stride(1)})
           : std::nullopt;
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  const auto opts = emissions.options();
  at::Tensor g_em = new_output(emissions, {B, T_len, C}, opts);
  at::Tensor g_trans = emissions.new_zeros({C, C}), g_start = emissions.new_zeros({C}), g_end = emissions.new_zeros({C});
  AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_log_backward_cpu", [&] {
    log_backward_chains<scalar_t>(emissions, transitions, start, end, lengths, alpha.contiguous(), log_z.contiguous(),
                                  grad, gold ? &*gold : nullptr, g_em, g_trans, g_start, g_end);
  });
  return {g_em, g_trans, g_start, g_end, emissions.new_empty({0}), emissions.new_empty({0})};  // pair marginals summed
}

std::vector<at::Tensor> crf_log_likelihood(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& tags) {
  check_chain_args(emissions, transitions, start, end, lengths);
  check_chain_tags(emissions, tags, "crf_log_likelihood");
  TORCH_CHECK(emissions.device().is_cpu(), "crf_log_likelihood (CPU): got emissions ", describe(emissions));
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  const auto opts = emissions.options();
  at::Tensor llh = new_output(emissions, {B}, opts), log_z = new_output(emissions, {B}, opts);
  at::Tensor alpha = new_output(emissions, {B, T_len, C}, opts);
  const GoldPaths gold{tags.data_ptr<int64_t>(), tags.stride(0), tags.stride(1)};
  AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_crf_log_likelihood_cpu", [&] {
    using T = scalar_t;
    run_chains<LogSemiring, T, false>(emissions, transitions, start, end, lengths, false, log_z, &alpha, nullptr);
    const at::Tensor trans_c = transitions.contiguous(), start_c = start.contiguous(), end_c = end.contiguous();
    const int64_t* len = lengths.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      const ChainView<T> ch{emissions.data_ptr<T>() + b * emissions.stride(0), emissions.stride(1), emissions.stride(2)};
      const T g = gold_path_score(gold, b, ch, trans_c.data_ptr<T>(), start_c.data_ptr<T>(), end_c.data_ptr<T>(),
                                  usable_length(len[b], T_len), C);
      llh.data_ptr<T>()[b] = g == -pos_inf<T>() ? g : g - log_z.data_ptr<T>()[b];
    }
  });
  return {llh, alpha, log_z};
}

}  // namespace semiring_ops
