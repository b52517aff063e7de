// semiring_ops::span_inside and span_adjoint for CPU tensors (contracts in ops.h; the dynamic programs in
// span_dp.h, chain_dp.h, alignment_dp.h): the batch items in parallel (at::parallel_for), each one thread (a team of one).
#include <ATen/Parallel.h>

#include <vector>

#include "ops.h"
#include "span_host.h"

namespace semiring_ops {
namespace {

struct SerialTeam {
  int rank() const { return 0; }
  int size() const { return 1; }
  int group() const { return 0; }
  int groups() const { return 1; }
  template <class Acc> Acc all_reduce(const Acc& acc) const { return acc; }
  void barrier() const {}
};

void check_cpu(const at::Tensor& pot, const char* who) {
  TORCH_CHECK(pot.device().is_cpu(), who, " (CPU): got potentials ", describe(pot));
}

}  // namespace

std::vector<at::Tensor> span_inside(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                                    int64_t semiring_id, bool multiroot) {
  check_cpu(potentials, "span_inside");
  return span_host("span_inside (CPU)", potentials, lengths, structure, semiring_id, multiroot, nullptr, nullptr,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     at::parallel_for(0, potentials.size(0), 1, [&](int64_t b0, int64_t b1) {
                       std::vector<T> rows(structure == kSpanLinearChain ? 2 * a.C : 0);
                       for (int64_t b = b0; b < b1; ++b) {
                         if (structure == kSpanLinearChain) {
                           DirectTiles<T> tiles{chain_edges_of(a, b)};
                           chain_inside_item<S, T>(SerialTeam{}, a, b, -1, tiles, rows.data(), nullptr, 0);
                         } else if (structure == kSpanAlignment) {
                           alignment_inside_item<S, T>(SerialTeam{}, a, b);
                         } else {
                           span_inside_item<S, T>(SerialTeam{}, a, b);
                         }
                       }
                     });
                   });
}

at::Tensor span_adjoint(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                        int64_t semiring_id, bool multiroot, const at::Tensor& charts, const at::Tensor& grad) {
  check_cpu(potentials, "span_adjoint");
  return span_host("span_adjoint (CPU)", potentials, lengths, structure, semiring_id, multiroot, &charts, &grad,
                   [&](auto s, const auto& a) {
                     using S = decltype(s);
                     using T = std::remove_cv_t<std::remove_pointer_t<decltype(a.pot)>>;
                     at::parallel_for(0, potentials.size(0), 1, [&](int64_t b0, int64_t b1) {
                       for (int64_t b = b0; b < b1; ++b) {
                         if (structure == kSpanLinearChain)
                           chain_adjoint_item<S, T>(SerialTeam{}, a, b);
                         else if (structure == kSpanAlignment)
                           alignment_adjoint_item<S, T>(SerialTeam{}, a, b);
                         else
                           span_adjoint_item<S, T>(SerialTeam{}, a, b);
                       }
                     });
                   })[0];
}

}  // namespace semiring_ops
