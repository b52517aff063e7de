// semiring_ops::hmm_gaussian_log_prob (contract in ops.h): Gaussian log-densities of every sample under every state,
// in one pass. The torch form (emissions/gaussian.py) builds (N, C, D) differences and reduces them in 5 to 8 calls, and
// a one-sequence EM iteration of hmmlearn's shapes (N = 1,000, C = 3, D = 2) spends more in those calls' dispatch
// than in the whole E-step; here each (n, c) is D + D^2 multiply-adds in registers, samples in parallel.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "checks.h"
#include "ops.h"

namespace semiring_ops {
namespace {

// out[n, c] = offsets[c] - 0.5 * |F_c (x_n - mu_c)|^2 with F_c diagonal (factors (C, D)) or dense (C, D, D).
// kD > 0: D at compile time (the small dimensions of hmmlearn's users), 0: at run time.
template <class T, int kD>
void log_prob_rows(const T* x, const T* means, const T* factors, const T* offsets, bool dense, int64_t C, int64_t D_,
                   int64_t begin, int64_t end, T* out) {
  const int64_t D = kD > 0 ? kD : D_;
  constexpr int64_t kMaxD = 32;  // the caller routes larger D to torch
  T d[kMaxD], z[kMaxD];
  for (int64_t n = begin; n < end; ++n) {
    const T* xn = x + n * D;
    for (int64_t c = 0; c < C; ++c) {
      const T* mu = means + c * D;
      for (int64_t k = 0; k < D; ++k) d[k] = xn[k] - mu[k];
      T q = 0;
      if (dense) {
        const T* F = factors + c * D * D;
        for (int64_t i = 0; i < D; ++i) {
          T s = 0;
          for (int64_t k = 0; k < D; ++k) s += F[i * D + k] * d[k];
          z[i] = s;
        }
        for (int64_t i = 0; i < D; ++i) q += z[i] * z[i];
      } else {
        const T* f = factors + c * D;
        for (int64_t k = 0; k < D; ++k) {
          const T v = f[k] * d[k];
          q += v * v;
        }
      }
      out[n * C + c] = offsets[c] - T(0.5) * q;
    }
  }
}

}  // namespace

at::Tensor hmm_gaussian_log_prob(const at::Tensor& x, const at::Tensor& means, const at::Tensor& factors,
                                 const at::Tensor& offsets) {
  TORCH_CHECK(x.dim() == 2 && means.dim() == 2 && x.size(1) == means.size(1),
              "hmm_gaussian_log_prob: x must be (N, D) and means (C, D): x ", describe(x), ", means ", describe(means));
  const int64_t N = x.size(0), D = x.size(1), C = means.size(0);
  const bool dense = factors.dim() == 3;
  TORCH_CHECK((factors.dim() == 2 && factors.size(0) == C && factors.size(1) == D) ||
                  (dense && factors.size(0) == C && factors.size(1) == D && factors.size(2) == D),
              "hmm_gaussian_log_prob: factors must be (C, D) (diagonal) or (C, D, D) with means (C, D) = ",
              describe(means), ", got factors ", describe(factors));
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == C, "hmm_gaussian_log_prob: offsets must be (C,), got ",
              describe(offsets), " with means ", describe(means));
  TORCH_CHECK(D <= 32, "hmm_gaussian_log_prob: at most 32 features, got x ", describe(x));
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "hmm_gaussian_log_prob: float32 or float64 only, got x ", describe(x));
  for (const at::Tensor* t : {&x, &means, &factors, &offsets})
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->device().is_cpu(),
                "hmm_gaussian_log_prob: x, means, factors and offsets must share x's dtype, on the CPU: got ",
                describe(*t), ", x ", describe(x));
  const at::Tensor xc = x.contiguous(), mc = means.contiguous(), fc = factors.contiguous(), oc = offsets.contiguous();
  at::Tensor out = new_output(x, {N, C}, x.options());
  if (N == 0 || C == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "semiring_hmm_gaussian_log_prob", [&] {
    const scalar_t *xp = xc.data_ptr<scalar_t>(), *mp = mc.data_ptr<scalar_t>(), *fp = fc.data_ptr<scalar_t>(),
                   *op = oc.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, C * D * (dense ? D : 1)));
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      switch (D) {
        case 1: return log_prob_rows<scalar_t, 1>(xp, mp, fp, op, dense, C, D, begin, end, out_p);
        case 2: return log_prob_rows<scalar_t, 2>(xp, mp, fp, op, dense, C, D, begin, end, out_p);
        case 3: return log_prob_rows<scalar_t, 3>(xp, mp, fp, op, dense, C, D, begin, end, out_p);
        default: return log_prob_rows<scalar_t, 0>(xp, mp, fp, op, dense, C, D, begin, end, out_p);
      }
    });
  });
  return out;
}

}  // namespace semiring_ops
