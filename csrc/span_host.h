// The host-side bodies of span_inside and span_adjoint (contracts in ops.h) that the backends share:
// argument checks, output allocation and the semiring x dtype dispatch. A backend checks its device, then
// passes its launcher, called as run(S{}, scalar_t{}) with the semiring S (log, max or min) and the dtype.
#pragma once


#include <vector>

#include "checks.h"
#include "tensor_api.h"
#include "semiring.h"
#include "alignment_dp.h"
#include "chain_dp.h"
#include "span_dp.h"

namespace semiring_ops {

inline int64_t span_charts(int64_t structure) {
  return structure == kSpanEisner ? 4 : structure == kSpanLinearChain ? 2 : 1;
}
// (kSpanAlignment: match potentials (B, N, M, 3), charts (B, 1, N, M + 1).)
// Structures whose potentials are (B, N - 1, ...) edges between positions, with charts (B, K, N, C).
inline bool span_over_edges(int64_t structure) {
  return structure == kSpanSemiMarkov || structure == kSpanLinearChain;
}
inline int64_t span_positions(int64_t structure, int64_t N) { return structure == kSpanEisner ? N + 1 : N; }
// The structure's N: the potentials' N, or for edges (B, N - 1, [D,] C, C) their size(1) + 1.
inline int64_t span_length(int64_t structure, const at::Tensor& pot) {
  return span_over_edges(structure) ? pot.size(1) + 1 : pot.size(1);
}
// The charts of one batch: (B, K, P, P), or (B, K, N, C) for edges.
inline std::vector<int64_t> span_chart_shape(int64_t structure, const at::Tensor& pot) {
  const int64_t B = pot.size(0), N = span_length(structure, pot);
  if (structure == kSpanAlignment) return {B, 1, N, pot.size(2) + 1};
  if (span_over_edges(structure)) return {B, span_charts(structure), N, pot.size(-1)};
  const int64_t P = span_positions(structure, N);
  return {B, span_charts(structure), P, P};
}

inline void check_span_args(const char* who, const at::Tensor& pot, const at::Tensor& lengths, int64_t structure) {
  TORCH_CHECK(structure >= kSpanEisner && structure <= kSpanAlignment, who, ": unknown structure id ", structure);
  if (structure == kSpanAlignment) {
    TORCH_CHECK(pot.dim() == 4 && pot.size(3) == 3 && pot.size(1) >= 1 && pot.size(2) >= 1, who,
                ": alignment match potentials must be (B, N, M, 3) with N, M >= 1, got ", describe(pot));
    TORCH_CHECK(pot.size(2) < (int64_t(1) << 15), who, ": M must be below 32768, got potentials ", describe(pot));
  } else if (structure == kSpanLinearChain) {
    TORCH_CHECK(pot.dim() == 4 && pot.size(2) == pot.size(3) && pot.size(2) >= 1, who,
                ": linear-chain edges must be (B, N - 1, C, C) with C >= 1, got ", describe(pot));
  } else if (structure == kSpanSemiMarkov) {
    TORCH_CHECK(pot.dim() == 5 && pot.size(3) == pot.size(4) && pot.size(2) >= 2, who,
                ": semi-Markov edges must be (B, N - 1, D, C, C) with D >= 2, got ", describe(pot));
  } else {
    TORCH_CHECK(pot.dim() == 3 && pot.size(1) == pot.size(2), who, ": potentials must be (B, N, N), got ",
                describe(pot));
  }
  TORCH_CHECK(pot.scalar_type() == at::kFloat || pot.scalar_type() == at::kDouble, who,
              ": float32 or float64 only, got potentials ", describe(pot));
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == pot.size(0) && lengths.scalar_type() == at::kLong &&
                  lengths.device() == pot.device(),
              who, ": lengths must be (B,) int64 on the potentials' device: lengths ", describe(lengths),
              ", potentials ", describe(pot));
  TORCH_CHECK(pot.size(1) < (int64_t(1) << 15), who, ": N must be below 32768, got potentials ", describe(pot));
}

// Calls run(S{}, scalar_t{}) for the log, max or min semiring of semiring_id and the potentials' dtype.
template <class Run> void span_dispatch(const char* who, const at::Tensor& pot, int64_t semiring_id, Run run) {
  bool additive = false;
  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    if constexpr (S::kId == LogSemiring::kId || S::kId == MaxSemiring::kId || S::kId == MinSemiring::kId) {
      additive = true;
      AT_DISPATCH_FLOATING_TYPES(pot.scalar_type(), "semiring_span", [&] { run(semiring, scalar_t{}); });
    }
  });
  TORCH_CHECK(found && additive, who, ": semiring id ", semiring_id, " is not log, max or min");
}

// Checks, allocates and fills SpanArgs for span_inside (adjoint = false: charts and total allocated) or
// span_adjoint (charts given; dcharts and dpot zeroed), then calls run(S{}, args) under the dispatch.
template <class Run>
std::vector<at::Tensor> span_host(const char* who, const at::Tensor& pot, const at::Tensor& lengths, int64_t structure,
                                  int64_t semiring_id, bool multiroot, const at::Tensor* charts_in,
                                  const at::Tensor* grad, Run run) {
  check_span_args(who, pot, lengths, structure);
  const int64_t B = pot.size(0), N = span_length(structure, pot), K = span_charts(structure);
  const int64_t P = span_positions(structure, N);
  const std::vector<int64_t> chart_shape = span_chart_shape(structure, pot);
  std::vector<at::Tensor> out;
  at::Tensor charts, dcharts, total, dpot;
  if (charts_in == nullptr) {
    charts = pot.new_zeros(chart_shape);  // entries the DP does not reach: 0 (deterministic)
    total = new_output(pot, {B}, pot.options());
    out = {total, charts};
  } else {
    TORCH_CHECK(charts_in->sizes() == at::IntArrayRef(chart_shape) && charts_in->is_contiguous() &&
                    charts_in->scalar_type() == pot.scalar_type() && charts_in->device() == pot.device(),
                who, ": charts must be span_inside's ", at::IntArrayRef(chart_shape), ", got ", describe(*charts_in));
    TORCH_CHECK(grad->dim() == 1 && grad->size(0) == B && grad->scalar_type() == pot.scalar_type() &&
                    grad->device() == pot.device(),
                who, ": grad must be (B,) = (", B, ",) like the potentials, got ", describe(*grad));
    charts = *charts_in;
    if (structure != kSpanLinearChain) dcharts = pot.new_zeros(chart_shape);  // (the chain needs none)
    dpot = pot.new_zeros(pot.sizes());
    out = {dpot};
  }
  span_dispatch(who, pot, semiring_id, [&](auto semiring, auto scalar) {
    using T = decltype(scalar);
    SpanArgs<T> a{};
    a.pot = pot.data_ptr<T>();
    a.ps0 = pot.stride(0), a.ps1 = pot.stride(1), a.ps2 = pot.stride(2);
    if (structure == kSpanSemiMarkov) a.ps3 = pot.stride(3), a.ps4 = pot.stride(4), a.D = pot.size(2), a.C = pot.size(3);
    if (structure == kSpanLinearChain || structure == kSpanAlignment) a.ps3 = pot.stride(3), a.C = pot.size(2);
    a.lengths = lengths.data_ptr<int64_t>();
    a.N = N, a.P = P, a.K = K, a.structure = structure, a.multiroot = multiroot;
    a.charts = charts.data_ptr<T>();
    if (charts_in == nullptr) {
      a.total = total.data_ptr<T>();
    } else {
      a.dcharts = dcharts.defined() ? dcharts.data_ptr<T>() : nullptr;
      a.dpot = dpot.data_ptr<T>();
      a.grad = grad->data_ptr<T>();
      a.gs0 = grad->stride(0);
    }
    if (B > 0 && N > 0) run(semiring, a);
  });
  return out;
}

}  // namespace semiring_ops
