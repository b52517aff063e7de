// semiring_ops::hmm_scaled_estep (contract in ops.h): the E-step of Baum-Welch in scaled probability space, the
// compiled form of semiring_ops/hmm/scaling.py (its docstring has the recursions and the underflow rule; the
// results are the same). scaling.py steps a padded batch in lockstep with one (B, C) x (C, C) product per time
// step, so a single long sequence (hmmlearn's examples: one sequence of 1,000 to 30,000 steps, 2 to 4 states)
// pays Python and dispatch per step; here each sequence is one C++ loop over its own length, sequences in
// parallel, with O(C^2) multiply-adds per step and one exp per (t, c). A sequence the scaled pass cannot vouch for
// (underflow, a -inf emission) is done again here in log space, O(C^2) exps per step: only one whose likelihood is
// not finite is left flagged for the caller.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "ops.h"

namespace semiring_ops {
namespace {

// Row-relative values below this may have lost mass to underflow (scaling.py's _tiny).
template <class T> T tiny() { return std::numeric_limits<T>::min() * T(1 << 20); }

// Inputs shared by every sequence: A = exp(log_trans) (C, C) and pi = exp(log_start) (C,), and their logs, contiguous.
template <class T> struct Chain {
  const T* A;
  const T* pi;
  const T* log_A;
  const T* log_pi;
  int64_t C;
};

// The outputs of one sequence: its posteriors (T, C) rows, its transition counts (C, C) (the scaled pass leaves them
// without the factor A, which `run` applies; the log-space pass includes it).
template <class T> struct SequenceOut {
  T* posteriors;
  T* transitions;
  T log_likelihood;
  bool suspect;
};

// One sequence of L steps: log-emissions at le[t * st + c * sc], their row-relative exponentials e (L, C) contiguous
// (e[t, c] = exp(le - m_t), computed for the whole batch by one vectorised exp, `run`) and the row shifts m (L,).
// Returns its log-likelihood and whether it is suspect; writes its posteriors and (when not suspect) its expected
// transition counts, without the factor A. kC > 0: C = kC at compile time (hmmlearn's users run 2 to 4 states), so
// the O(C^2) recursions unroll into registers; 0: C at run time.
template <class T, int kC>
void one_sequence(const Chain<T>& chain, const T* le, int64_t st, int64_t sc, const T* e, const T* m, int64_t L,
                  std::vector<T>& inv_scale, std::vector<T>& work, SequenceOut<T>& out) {
  const int64_t C = kC > 0 ? kC : chain.C;
  const T small = tiny<T>();
  T A_local[kC > 0 ? kC * kC : 1], pi_local[kC > 0 ? kC : 1];
  if constexpr (kC > 0) {  // private copies: the writes below cannot alias them, so they stay in registers
    std::copy(chain.A, chain.A + kC * kC, A_local);
    std::copy(chain.pi, chain.pi + kC, pi_local);
  }
  const T* A = kC > 0 ? A_local : chain.A;
  const T* pi = kC > 0 ? pi_local : chain.pi;
  bool suspect = false;
  T ll = 0;
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t c = 0; c < C; ++c) suspect |= !std::isfinite(le[t * st + c * sc]) || e[t * C + c] < small;
    ll += m[t];
  }
  // Forward: alpha_t (normalised, into the posteriors' rows), 1 / c_t with c_t the normaliser. c_t <= 1 when A's
  // rows sum to 1 (alpha does, e <= 1), so log prod c_t is kept as a running product, its log taken only when it
  // leaves [2^-300, 2^300] (one log per ~300 steps instead of one per step, whatever the rows sum to).
  T* alpha = out.posteriors;
  double product = 1;
  for (int64_t t = 0; t < L; ++t) {
    T* a = alpha + t * C;
    const T* et = e + t * C;
    if (t == 0) {
      for (int64_t j = 0; j < C; ++j) a[j] = pi[j] * et[j];
    } else {
      const T* prev = alpha + (t - 1) * C;
      T acc[kC > 0 ? kC : 1];
      T* next = kC > 0 ? acc : a;
      for (int64_t j = 0; j < C; ++j) next[j] = 0;
      for (int64_t i = 0; i < C; ++i) {
        const T p = prev[i];
        const T* row = A + i * C;
        for (int64_t j = 0; j < C; ++j) next[j] += p * row[j];
      }
      for (int64_t j = 0; j < C; ++j) a[j] = next[j] * et[j];
    }
    T sum = 0;
    for (int64_t j = 0; j < C; ++j) sum += a[j];
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < C; ++j) {
      a[j] *= inv;
      // a zero start probability is structure, not underflow: that state's alpha_0 is exactly 0, and the later
      // steps are those of any chain (transitions all positive here)
      suspect |= a[j] < small && !(t == 0 && pi[j] == T(0));
    }
    inv_scale[t] = inv;
    const double c = double(sum);
    if (!(c >= 0x1p-300 && c <= 0x1p300)) {  // 0 (-inf), NaN, or too far from 1 to multiply in safely
      ll += std::log(c);
    } else {  // both factors within 2^+-300: the product neither overflows nor underflows
      product *= c;
      if (product < 0x1p-300 || product > 0x1p300) {
        ll += std::log(product);
        product = 1;
      }
    }
  }
  ll += std::log(product);
  // Backward: beta_t, w_t = e_t * beta_t / c_t; posteriors = alpha_t * beta_t; counts += alpha_t^T w_{t+1}.
  T* beta = work.data();
  T* w_next = beta + C;
  T xi_local[kC > 0 ? kC * kC : 1] = {};
  T* xi = kC > 0 ? xi_local : out.transitions;
  for (int64_t t = L - 1; t >= 0; --t) {
    const T* a = alpha + t * C;
    if (t == L - 1) {
      std::fill(beta, beta + C, T(1));
    } else {
      T top = 0;
      for (int64_t i = 0; i < C; ++i) {
        const T* row = A + i * C;
        T s = 0;
        for (int64_t j = 0; j < C; ++j) s += row[j] * w_next[j];
        beta[i] = s;
        top = std::max(top, s);
      }
      for (int64_t i = 0; i < C; ++i) suspect |= beta[i] < small * top;
      for (int64_t i = 0; i < C; ++i) {
        const T ai = a[i];
        for (int64_t j = 0; j < C; ++j) xi[i * C + j] += ai * w_next[j];
      }
    }
    const T* et = e + t * C;
    const T inv = inv_scale[t];
    T* post = out.posteriors + t * C;
    for (int64_t j = 0; j < C; ++j) {
      w_next[j] = et[j] * beta[j] * inv;
      post[j] = a[j] * beta[j];  // a aliases post: read before the write, element by element
    }
  }
  if constexpr (kC > 0) std::copy(xi_local, xi_local + kC * kC, out.transitions);
  out.log_likelihood = ll;
  out.suspect = suspect || !std::isfinite(ll);
}

// one_sequence with C fixed at compile time where it is small.
template <class T>
void scaled_sequence(const Chain<T>& chain, const T* le, int64_t st, int64_t sc, const T* e, const T* m, int64_t L,
                     std::vector<T>& inv_scale, std::vector<T>& work, SequenceOut<T>& out) {
  switch (chain.C) {
    case 2: return one_sequence<T, 2>(chain, le, st, sc, e, m, L, inv_scale, work, out);
    case 3: return one_sequence<T, 3>(chain, le, st, sc, e, m, L, inv_scale, work, out);
    case 4: return one_sequence<T, 4>(chain, le, st, sc, e, m, L, inv_scale, work, out);
    default: return one_sequence<T, 0>(chain, le, st, sc, e, m, L, inv_scale, work, out);
  }
}

// log(sum(exp(x[0..n)))): -inf when every x is -inf; NaN in, NaN out.
template <class T> T log_sum_exp(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  if (nan) return std::numeric_limits<T>::quiet_NaN();
  if (!std::isfinite(m)) return m;
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

// A sequence the scaled pass flagged, again in log space (the log chain's recursions, no underflow): overwrites its
// posteriors and transition counts (the factor A included). Returns false, leaving
// the sequence to the caller, when its log-likelihood is not finite (zero probability, NaN).
template <class T>
bool log_space_sequence(const Chain<T>& chain, const T* le, int64_t st, int64_t sc, int64_t L, std::vector<T>& log_alpha,
                        std::vector<T>& work, SequenceOut<T>& out) {
  const int64_t C = chain.C;
  T* terms = work.data();
  T* log_beta = terms + C;
  T* log_beta_next = log_beta + C;
  T* la = log_alpha.data();
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t j = 0; j < C; ++j) {
      T x;
      if (t == 0) {
        x = chain.log_pi[j];
      } else {
        for (int64_t i = 0; i < C; ++i) terms[i] = la[(t - 1) * C + i] + chain.log_A[i * C + j];
        x = log_sum_exp(terms, C);
      }
      la[t * C + j] = x + le[t * st + j * sc];
    }
  }
  const T ll = log_sum_exp(la + (L - 1) * C, C);
  if (!std::isfinite(ll)) return false;
  T* xi = out.transitions;
  std::fill(xi, xi + C * C, T(0));
  for (int64_t t = L - 1; t >= 0; --t) {
    if (t == L - 1) {
      std::fill(log_beta, log_beta + C, T(0));
    } else {
      // next[j] = le_{t+1}(j) + log beta_{t+1}(j): the weight of going to j at t + 1
      for (int64_t j = 0; j < C; ++j) log_beta_next[j] += le[(t + 1) * st + j * sc];
      for (int64_t i = 0; i < C; ++i) {
        for (int64_t j = 0; j < C; ++j) terms[j] = chain.log_A[i * C + j] + log_beta_next[j];
        log_beta[i] = log_sum_exp(terms, C);
        const T a_i = la[t * C + i] - ll;
        // with log A inside the exponent: exp(a_i + log_beta_next) alone can overflow where A underflows to 0
        // (the variational E-step's sub-normalised transitions reach exp(-1e3) and below), and inf * 0 is NaN
        for (int64_t j = 0; j < C; ++j) xi[i * C + j] += std::exp(a_i + chain.log_A[i * C + j] + log_beta_next[j]);
      }
    }
    T* post = out.posteriors + t * C;
    for (int64_t j = 0; j < C; ++j) post[j] = std::exp(la[t * C + j] + log_beta[j] - ll);
    std::copy(log_beta, log_beta + C, log_beta_next);
  }
  out.log_likelihood = ll;
  return true;
}

template <class T>
void run(const at::Tensor& log_emissions, const at::Tensor& A_t, const at::Tensor& pi_t, const at::Tensor& log_A,
         const at::Tensor& log_pi, bool structural_zeros, const int64_t* lengths,
         at::Tensor& ll, at::Tensor& posteriors, at::Tensor& per_sequence, at::Tensor& suspect) {
  const int64_t B = log_emissions.size(0), T_ = log_emissions.size(1), C = log_emissions.size(2);
  const int64_t sb = log_emissions.stride(0), st = log_emissions.stride(1), sc = log_emissions.stride(2);
  const T* le = log_emissions.data_ptr<T>();
  const Chain<T> chain{A_t.data_ptr<T>(), pi_t.data_ptr<T>(), log_A.data_ptr<T>(), log_pi.data_ptr<T>(), C};
  // Emissions relative to each step's largest: m_t = max_c le (0 where not finite, NaN included) and
  // e = exp(le - m_t) (B, T, C) contiguous, its exponentials in one vectorised ATen pass (a scalar exp per value costs
  // as much as the recursions). Past a sequence's length they are neither written nor read.
  at::Tensor shifts, scaled;
  if (!structural_zeros) {
    shifts = log_emissions.new_empty({B, T_});  // (uninitialised past each length: never read there)
    scaled = log_emissions.new_empty({B, T_, C});
    T* m_ptr = shifts.data_ptr<T>();
    T* e_ptr = scaled.data_ptr<T>();
    at::parallel_for(0, B, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, T_ * C)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t b = begin; b < end; ++b) {
                         for (int64_t t = 0; t < lengths[b]; ++t) {
                           const T* x = le + b * sb + t * st;
                           T m = -std::numeric_limits<T>::infinity();
                           bool nan = false;
                           for (int64_t c = 0; c < C; ++c) {
                             nan |= std::isnan(x[c * sc]);
                             m = std::max(m, x[c * sc]);
                           }
                           m = (std::isfinite(m) && !nan) ? m : T(0);
                           m_ptr[b * T_ + t] = m;
                           for (int64_t c = 0; c < C; ++c) e_ptr[(b * T_ + t) * C + c] = x[c * sc] - m;
                         }
                       }
                     });
    scaled.exp_();
  }
  T* ll_ptr = ll.data_ptr<T>();
  T* post_ptr = posteriors.data_ptr<T>();
  T* xi_ptr = per_sequence.data_ptr<T>();
  bool* suspect_ptr = suspect.data_ptr<bool>();
  const int64_t work_per_sequence = std::max<int64_t>(1, T_ * (C * C + C));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / work_per_sequence);
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> inv_scale(T_), work(3 * C), log_alpha;
    for (int64_t b = begin; b < end; ++b) {
      SequenceOut<T> out{post_ptr + b * T_ * C, xi_ptr + b * C * C, T(0), false};
      if (structural_zeros) {
        out.suspect = lengths[b] > 0;  // a zero transition: the scaled recursions would flag it
      } else {
        scaled_sequence<T>(chain, le + b * sb, st, sc, scaled.data_ptr<T>() + b * T_ * C,
                           shifts.data_ptr<T>() + b * T_, lengths[b], inv_scale, work, out);
        // the scaled pass's counts are finite (nothing underflowed): the factor A now
        if (!out.suspect)
          for (int64_t k = 0; k < C * C; ++k) out.transitions[k] *= chain.A[k];
      }
      if (out.suspect) {
        log_alpha.resize(T_ * C);
        out.suspect = !log_space_sequence<T>(chain, le + b * sb, st, sc, lengths[b], log_alpha, work, out);
      }
      if (out.suspect) std::fill(out.transitions, out.transitions + C * C, T(0));
      ll_ptr[b] = out.log_likelihood;
      suspect_ptr[b] = out.suspect;
    }
  });
}

}  // namespace

std::vector<at::Tensor> hmm_scaled_estep(const at::Tensor& log_emissions, const at::Tensor& log_trans,
                                         const at::Tensor& log_start, const at::Tensor& lengths) {
  TORCH_CHECK(log_emissions.dim() == 3, "hmm_scaled_estep: log_emissions must be (B, T, C), got ",
              describe(log_emissions));
  const int64_t B = log_emissions.size(0), T = log_emissions.size(1), C = log_emissions.size(2);
  TORCH_CHECK(log_trans.dim() == 2 && log_trans.size(0) == C && log_trans.size(1) == C && log_start.dim() == 1 &&
                  log_start.size(0) == C,
              "hmm_scaled_estep: log_trans must be (C, C) and log_start (C,) with C = log_emissions.size(2): "
              "log_emissions ",
              describe(log_emissions), ", log_trans ", describe(log_trans), ", log_start ", describe(log_start));
  TORCH_CHECK(log_emissions.scalar_type() == at::kFloat || log_emissions.scalar_type() == at::kDouble,
              "hmm_scaled_estep: float32 or float64 only, got log_emissions ", describe(log_emissions));
  for (const at::Tensor* t : {&log_trans, &log_start})
    TORCH_CHECK(t->scalar_type() == log_emissions.scalar_type() && t->device().is_cpu(),
                "hmm_scaled_estep: log_trans and log_start must match log_emissions' dtype, on the CPU: got ",
                describe(*t), ", log_emissions ", describe(log_emissions));
  TORCH_CHECK(log_emissions.device().is_cpu(), "hmm_scaled_estep (CPU): got log_emissions ", describe(log_emissions));
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B && lengths.scalar_type() == at::kLong &&
                  lengths.device().is_cpu(),
              "hmm_scaled_estep: lengths must be (B,) int64 on the CPU with B = log_emissions.size(0), got ",
              describe(lengths));
  const at::Tensor L = lengths.contiguous();
  const int64_t* lengths_ptr = L.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lengths_ptr[b] >= 0 && lengths_ptr[b] <= T, "hmm_scaled_estep: lengths[", b, "] = ", lengths_ptr[b],
                " is outside 0..T = ", T);

  const at::Tensor log_A = log_trans.contiguous(), log_pi = log_start.contiguous();
  const at::Tensor A = log_A.exp(), pi = log_pi.exp();
  // every sequence writes its ll, suspect flag and posteriors up to its length: zeros only where padding is left
  bool padded = false;
  for (int64_t b = 0; b < B; ++b) padded |= lengths_ptr[b] < T;
  at::Tensor ll = log_emissions.new_empty({B});
  at::Tensor posteriors = padded ? log_emissions.new_zeros({B, T, C}) : log_emissions.new_empty({B, T, C});
  at::Tensor per_sequence = log_emissions.new_zeros({B, C, C});
  at::Tensor suspect = log_emissions.new_empty({B}, log_emissions.options().dtype(at::kBool));
  at::Tensor transitions = log_emissions.new_zeros({C, C});
  at::Tensor starts = log_emissions.new_zeros({C});
  if (B == 0 || C == 0) return {ll.zero_(), posteriors.zero_(), transitions, starts, suspect.zero_()};
  AT_DISPATCH_FLOATING_TYPES(log_emissions.scalar_type(), "semiring_hmm_scaled_estep", [&] {
    // a zero transition probability is structure the underflow check cannot tell from underflow: such a chain goes
    // to log space directly (a zero start probability only zeroes its state's first alpha: exempt from the check)
    const scalar_t* log_a = log_A.data_ptr<scalar_t>();
    bool zeros = false;
    for (int64_t k = 0; k < C * C; ++k) zeros |= log_a[k] == -std::numeric_limits<scalar_t>::infinity();
    run<scalar_t>(log_emissions, A, pi, log_A, log_pi, zeros, lengths_ptr, ll, posteriors, per_sequence, suspect);
    // The sums over sequences in order (deterministic whatever the threads): transition counts, and the
    // posteriors of the first step as the start counts, of the sequences not suspect.
    scalar_t* tr = transitions.data_ptr<scalar_t>();
    scalar_t* st = starts.data_ptr<scalar_t>();
    const scalar_t* xi = per_sequence.data_ptr<scalar_t>();
    const scalar_t* post = posteriors.data_ptr<scalar_t>();
    const bool* bad = suspect.data_ptr<bool>();
    for (int64_t b = 0; b < B; ++b) {
      if (bad[b] || lengths_ptr[b] == 0) continue;
      for (int64_t k = 0; k < C * C; ++k) tr[k] += xi[b * C * C + k];
      for (int64_t c = 0; c < C; ++c) st[c] += post[b * T * C + c];
    }
  });
  return {ll, posteriors, transitions, starts, suspect};
}

}  // namespace semiring_ops
