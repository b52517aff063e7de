// semiring_ops::rnnt_lattice for CPU tensors (contract in ops.h; the program in rnnt_dp.h): the batch items in
// parallel (at::parallel_for), each one thread.
#include <ATen/Parallel.h>

#include <type_traits>
#include <vector>

#include "cpu/serial_team.h"
#include "ops.h"
#include "rnnt_host.h"

namespace semiring_ops {

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
