// The host-side bodies of chain_scan and chain_viterbi (contracts in ops.h) that the backends share:
// output allocation and the semiring x dtype dispatch. A backend checks its device, then passes its
// launcher `run`, called as
//   run(S{}, scalar_t{}, std::bool_constant<kArg>{}, total, scores or nullptr, tags or nullptr)
// for the semiring S, the element type and whether back-pointers are kept (Viterbi).
#pragma once


#include <type_traits>
#include <vector>

#include "checks.h"
#include "tensor_api.h"
#include "semiring.h"

namespace semiring_ops {

template <class Run>
std::vector<at::Tensor> chain_scan_host(const char* who, const at::Tensor& emissions, int64_t semiring_id,
                                        bool save_scores, Run run) {
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  at::Tensor total = new_output(emissions, {B}, emissions.options());
  at::Tensor scores = save_scores ? new_output(emissions, {B, T_len, C}, emissions.options()) : emissions.new_empty({0});
  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_scan", [&] {
      run(semiring, scalar_t{}, std::false_type{}, total, save_scores ? &scores : nullptr, nullptr);
    });
  });
  TORCH_CHECK(found, who, ": unknown semiring id ", semiring_id);
  return {total, scores};
}

template <class Run>
std::vector<at::Tensor> chain_viterbi_host(const char* who, const at::Tensor& emissions, int64_t semiring_id,
                                           Run run) {
  const int64_t B = emissions.size(0), T_len = emissions.size(1);
  at::Tensor total = new_output(emissions, {B}, emissions.options());
  at::Tensor tags = new_output(emissions, {B, T_len}, emissions.options().dtype(at::kLong));
  bool selects = false;
  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    if constexpr (decltype(semiring)::kSelects) {
      selects = true;
      AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_viterbi",
                                 [&] { run(semiring, scalar_t{}, std::true_type{}, total, nullptr, &tags); });
    }
  });
  TORCH_CHECK(found && selects, who, ": semiring id ", semiring_id, " is not a selecting semiring");
  return {total, tags};
}

}  // namespace semiring_ops
