// Monotone alignments of two sequences (structures/alignment.py, torch-struct's AlignmentCRF layout) as a
// span-kernel structure (kSpanAlignment): match potentials (B, N, M, 3), m(i, j, op) scoring entry into cell
// (i, j) by op 0 from (i, j - 1), op 1 from (i - 1, j - 1) (a match) or op 2 from (i - 1, j). Written once for
// the CPU and CUDA backends (csrc/cpu/span_cpu.cpp, csrc/cuda/span_kernels.cuh), generic over the semirings whose
// product is + (log, max, min) and over the Team of span_dp.h (one thread a cell on either backend: a cell
// reduces three or four terms, too few to share).
//
//   alpha(i, j) = (+) of alpha(i, j - 1) (x) m(i, j, 0), alpha(i - 1, j - 1) (x) m(i, j, 1), alpha(i - 1, j) (x)
//                 m(i, j, 2), and (local) one (x) m(i, j, 1): an alignment may start in any cell
//   with alpha(-1, -1) = one; total: alpha(L - 1, M - 1) (global), or (+) of alpha(i, j) over i < L (local).
//
// Forward: one anti-diagonal i + j at a time (its cells are independent), a barrier between diagonals; rows
// i >= L are never computed (they reach no counted cell). Charts (B, 1, N, M + 1): alpha, and in column M the
// row totals (+)_j alpha(i, j) of a local alignment. Backward, diagonals in reverse: a cell's adjoint g is its
// share of the total plus what its three successors took from it (their op's gradient entry, final since they
// lie on later diagonals), and g times each term's weight (span_weight) is the gradient of the term's
// potential. The local start term's share goes to the adjoint chart first (it is not a successor's share of
// alpha) and is added to op 1's gradient at the end. Every entry has one writer: no atomics, deterministic.
// Bands (max_gap) are applied by the caller, as the semiring's zero outside them.
#pragma once

#include "span_dp.h"

namespace semiring_ops {

// The (N, M, 3) match potentials of one item, any strides.
template <class T> struct MatchPotentials {
  const T* data;
  int64_t s1, s2, s3;
  SR_HD T operator()(int64_t i, int64_t j, int64_t op) const { return data[i * s1 + j * s2 + op * s3]; }
};

// Term t of cell (i, j) (the module comment's order; 3: the local start), in natural units.
template <class S, class T>
SR_HD T alignment_term(const MatchPotentials<T>& m, const SpanChart<T>& alpha, int64_t i, int64_t j, int64_t t) {
  const T zero = S::template zero<T>();
  if (t == 0) return j > 0 ? S::times(alpha(i, j - 1), m(i, j, 0)) : zero;
  if (t == 2) return i > 0 ? S::times(alpha(i - 1, j), m(i, j, 2)) : zero;
  if (t == 3) return i > 0 || j > 0 ? S::times(S::template one<T>(), m(i, j, 1)) : zero;  // ((0, 0): term 1's)
  if (i > 0 && j > 0) return S::times(alpha(i - 1, j - 1), m(i, j, 1));
  return i == 0 && j == 0 ? S::times(S::template one<T>(), m(i, j, 1)) : zero;
}

// The cells (i, d - i) of anti-diagonal d within rows [0, L) and columns [0, M), dealt one per team.
template <class Team, class Cell> SR_HD void alignment_diagonal(const Team& team, int64_t d, int64_t L, int64_t M, Cell cell) {
  const int64_t lo = d - M + 1 > 0 ? d - M + 1 : 0, hi = d < L - 1 ? d : L - 1;
  for (int64_t i = lo + team.group(); i <= hi; i += team.groups()) cell(i, d - i);
}

// alpha over rows [0, L), the local row totals in column M; returns the item's total (on every thread).
template <class S, class T, class Team>
SR_HD T alignment_inside(const Team& team, const MatchPotentials<T>& m, SpanChart<T> alpha, int64_t L, int64_t M,
                         bool local) {
  const int64_t terms = local ? 4 : 3;
  for (int64_t d = 0; d < L + M - 1; ++d) {
    alignment_diagonal(team, d, L, M, [&](int64_t i, int64_t j) {
      const T v = span_reduce<S, T, false>(team, 0, terms, [&](int64_t t) { return alignment_term<S, T>(m, alpha, i, j, t); })
                      .result();
      if (team.rank() == 0) alpha(i, j) = v;
    });
    team.barrier();
  }
  if (!local) return alpha(L - 1, M - 1);
  for (int64_t i = team.group(); i < L; i += team.groups()) {
    const T row = span_reduce<S, T, false>(team, 0, M, [&](int64_t j) { return alpha(i, j); }).result();
    if (team.rank() == 0) alpha(i, M) = row;
  }
  team.barrier();
  return span_reduce<S, T, false>(team, 0, L, [&](int64_t i) { return alpha(i, M); }).result();
}

// The adjoint of alignment_inside for the total's gradient G: d(G total) / d m into dm (contiguous (N, M, 3),
// zeroed), with the zeroed adjoint chart `start` (the local start terms' shares).
template <class S, class T, class Team>
SR_HD void alignment_adjoint(const Team& team, const MatchPotentials<T>& m, SpanChart<T> alpha, SpanChart<T> start,
                             T* dm, int64_t L, int64_t M, bool local, T G) {
  auto dM = [&](int64_t i, int64_t j, int64_t op) -> T& { return dm[(i * M + j) * 3 + op]; };
  const int64_t terms = local ? 4 : 3;
  // a local total's weights: the rows' sum, and (max / min) the selected row's cells (the selected cell)
  const auto rows = span_reduce<S, T, S::kSelects>(team, 0, local ? L : 0, [&](int64_t i) { return alpha(i, M); });
  const bool any = rows.result() != S::template zero<T>();  // (no alignment: no gradient, no selected row)
  const int64_t best_row = S::kSelects && local && any ? int64_t(rows.arg()) : 0;
  const auto cells = span_reduce<S, T, S::kSelects>(team, 0, S::kSelects && local ? M : 0,
                                                     [&](int64_t j) { return alpha(best_row, j); });
  for (int64_t d = L + M - 2; d >= 0; --d) {
    alignment_diagonal(team, d, L, M, [&](int64_t i, int64_t j) {
      T g = T(0);
      if (!local) {
        if (i == L - 1 && j == M - 1) g = G;
      } else if constexpr (S::kSelects) {
        if (i == best_row && any) g = G * span_weight<S, T>(cells, alpha(i, j), j);
      } else {
        g = G * span_weight<S, T>(rows, alpha(i, j), i);
      }
      if (j + 1 < M) g += dM(i, j + 1, 0);  // the successors' shares of alpha(i, j)
      if (i + 1 < L && j + 1 < M) g += dM(i + 1, j + 1, 1);
      if (i + 1 < L) g += dM(i + 1, j, 2);
      span_scatter<S, T>(
          team, 0, terms, g, [&](int64_t t) { return alignment_term<S, T>(m, alpha, i, j, t); },
          [&](int64_t t, T share) { (t == 3 ? start(i, j) : dM(i, j, t)) += share; });
    });
    team.barrier();
  }
  if (!local) return;
  const int64_t first = int64_t(team.group()) * team.size() + team.rank(), step = int64_t(team.groups()) * team.size();
  for (int64_t c = first; c < L * M; c += step) dM(c / M, c % M, 1) += start(c / M, c % M);
}

template <class T> SR_HD MatchPotentials<T> match_potentials_of(const SpanArgs<T>& a, int64_t b) {
  return MatchPotentials<T>{a.pot + b * a.ps0, a.ps1, a.ps2, a.ps3};
}

// One item's (N, M + 1) chart in charts (B, 1, N, M + 1).
template <class T> SR_HD SpanChart<T> alignment_chart_of(T* base, const SpanArgs<T>& a, int64_t b) {
  return SpanChart<T>{base + b * a.N * (a.C + 1), a.C + 1};
}

// SpanArgs for the alignment: C is M (the second sequence's length), multiroot is `local`.
template <class S, class T, class Team>
SR_HD void alignment_inside_item(const Team& team, const SpanArgs<T>& a, int64_t b) {
  const int64_t L = a.lengths[b];
  const bool lead = team.group() == 0 && team.rank() == 0;
  if (L < 1 || L > a.N) {  // (checked in Python; NaN rather than a stray access)
    if (lead) a.total[b] = pos_inf<T>() - pos_inf<T>();
    return;
  }
  const T z = alignment_inside<S, T>(team, match_potentials_of(a, b), alignment_chart_of(a.charts, a, b), L, a.C, a.multiroot);
  if (lead) a.total[b] = z;
}

template <class S, class T, class Team>
SR_HD void alignment_adjoint_item(const Team& team, const SpanArgs<T>& a, int64_t b) {
  const int64_t L = a.lengths[b];
  if (L < 1 || L > a.N) return;
  alignment_adjoint<S, T>(team, match_potentials_of(a, b), alignment_chart_of(a.charts, a, b),
                          alignment_chart_of(a.dcharts, a, b),
                          a.dpot + b * a.N * a.C * 3, L, a.C, a.multiroot, a.grad[b * a.gs0]);
}

}  // namespace semiring_ops
