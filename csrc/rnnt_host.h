// The host side of rnnt_lattice (contract in ops.h) that the CPU and CUDA backends share: argument checks, outputs
// and scratch, the dtype dispatch; the backend runs the filled RnntArgs (rnnt_dp.h).
#pragma once

#include "tensor_api.h"

#include <vector>

#include "checks.h"
#include "rnnt_dp.h"

namespace semiring_ops {

// rnnt_lattice: [total (B,), posteriors (B, T, U1, 2) or (0,)]; run(args, max) executes the program.
template <class Run>
std::vector<at::Tensor> rnnt_lattice_host(const char* who, const at::Tensor& potentials, const at::Tensor& frames,
                                          const at::Tensor& labels, bool max, bool need_posteriors, Run run) {
  TORCH_CHECK_VALUE(potentials.dim() == 4 && potentials.size(3) == 2 &&
                        (potentials.scalar_type() == at::kFloat || potentials.scalar_type() == at::kDouble),
                    who, ": potentials must be a float32 or float64 (B, T, U + 1, 2) tensor, got ",
                    describe(potentials));
  const int64_t B = potentials.size(0), T = potentials.size(1), U1 = potentials.size(2);
  for (const at::Tensor* t : {&frames, &labels}) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == B && t->scalar_type() == at::kLong, who,
                      ": frames and labels must be int64 (B,) with B = ", B, ", got ", describe(*t));
    TORCH_CHECK_VALUE(t->device() == potentials.device(), who, ": every tensor must be on potentials' device (",
                      potentials.device().str(), "), got ", describe(*t));
  }
  const at::Tensor pot = potentials.contiguous(), frames_c = frames.contiguous(), labels_c = labels.contiguous();
  at::Tensor total = new_output(potentials, {B}, potentials.options());
  at::Tensor post =
      need_posteriors ? new_output(potentials, {B, T, U1, 2}, potentials.options()) : potentials.new_empty({0});
  at::Tensor alpha = potentials.new_empty({B, T, U1});
  at::Tensor beta = need_posteriors && !max ? potentials.new_empty({B, T, U1}) : potentials.new_empty({0});
  AT_DISPATCH_FLOATING_TYPES(potentials.scalar_type(), "rnnt_lattice", [&] {
    RnntArgs<scalar_t> a{};
    a.pot = pot.data_ptr<scalar_t>();
    a.frames = frames_c.data_ptr<int64_t>();
    a.labels = labels_c.data_ptr<int64_t>();
    a.B = B;
    a.T_ = T;
    a.U1 = U1;
    a.total = total.data_ptr<scalar_t>();
    a.post = need_posteriors ? post.data_ptr<scalar_t>() : nullptr;
    a.alpha = alpha.data_ptr<scalar_t>();
    a.beta = beta.numel() ? beta.data_ptr<scalar_t>() : nullptr;
    if (B > 0) run(a, max);
  });
  return {total, post};
}

}  // namespace semiring_ops
