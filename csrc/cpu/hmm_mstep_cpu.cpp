// semiring_ops::hmm_dirichlet_map (contract in ops.h): the M-step of categorical distributions under Dirichlet priors
// (start, transition and emission probabilities; emissions/base.py's dirichlet_map is the formula and the torch
// form), in one pass over the rows. On hmmlearn's one-sequence shapes the rows are a handful of numbers, and the
// torch form's eleven calls cost more than the E-step's thousand time steps.
#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

#include "checks.h"
#include "ops.h"

namespace semiring_ops {

at::Tensor hmm_dirichlet_map(const at::Tensor& counts, const at::Tensor& concentration_minus_one,
                             const at::Tensor& previous, bool keep_zeros) {
  TORCH_CHECK(counts.dim() >= 1 && concentration_minus_one.sizes() == counts.sizes() &&
                  previous.sizes() == counts.sizes(),
              "hmm_dirichlet_map: counts, concentration_minus_one and previous must have one shape (..., K): counts ",
              describe(counts), ", concentration_minus_one ", describe(concentration_minus_one), ", previous ",
              describe(previous));
  TORCH_CHECK(counts.scalar_type() == at::kFloat || counts.scalar_type() == at::kDouble,
              "hmm_dirichlet_map: float32 or float64 only, got counts ", describe(counts));
  for (const at::Tensor* t : {&counts, &concentration_minus_one, &previous})
    TORCH_CHECK(t->scalar_type() == counts.scalar_type() && t->device().is_cpu(),
                "hmm_dirichlet_map: every argument must share counts' dtype, on the CPU: got ", describe(*t),
                ", counts ", describe(counts));
  const at::Tensor n = counts.contiguous(), a = concentration_minus_one.contiguous(), p = previous.contiguous();
  at::Tensor out = new_output(counts, counts.sizes(), counts.options());
  const int64_t K = counts.size(-1), rows = K ? counts.numel() / K : 0;
  AT_DISPATCH_FLOATING_TYPES(counts.scalar_type(), "semiring_hmm_dirichlet_map", [&] {
    const scalar_t *np_ = n.data_ptr<scalar_t>(), *ap = a.data_ptr<scalar_t>(), *pp = p.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t neg_inf = -std::numeric_limits<scalar_t>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * K;
      scalar_t total = 0;
      for (int64_t k = 0; k < K; ++k) {
        scalar_t c = ap[o + k] + np_[o + k];
        c = c < scalar_t(0) ? scalar_t(0) : c;  // max(., 0), NaN kept
        if (keep_zeros && pp[o + k] == neg_inf) c = 0;
        op[o + k] = c;
        total += c;
      }
      if (total > scalar_t(0)) {  // false for NaN too: the row keeps previous, as the torch form's where
        const scalar_t log_total = std::log(total);
        for (int64_t k = 0; k < K; ++k) op[o + k] = std::log(op[o + k]) - log_total;
      } else {
        for (int64_t k = 0; k < K; ++k) op[o + k] = pp[o + k];
      }
    }
  });
  return out;
}

}  // namespace semiring_ops
