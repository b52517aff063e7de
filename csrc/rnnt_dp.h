// RNN-T's dynamic program on the lattice (structures/rnnt.py states it): an item with T_b frames and U_b labels has
// the cells (t, u), t < T_b, u <= U_b; a blank moves (t, u) -> (t + 1, u) with potential blank(t, u), a label
// (t, u) -> (t, u + 1) with label(t, u); paths run from (0, 0) and end with the blank of (T_b - 1, U_b).
// Written once for the CPU and CUDA backends (csrc/cpu/ctc_cpu.cpp, csrc/cuda/ctc_kernels.cu) over a Team of
// threads sharing an item (CPU: one thread; CUDA: the block, its threads striding over u), ATen-free.
//
// rnnt_item<kMax>: alpha along the anti-diagonals t + u (a barrier between two), the total alpha(T_b - 1, U_b) (x)
// blank(T_b - 1, U_b) and, when asked, each move's posterior d total / d potential:
//   log: beta along the anti-diagonals backwards (beta includes the cell's outgoing move and everything after it),
//        then post(move) = exp(alpha(cell) + potential(move) + beta(successor) - total), every cell at once;
//   max: 1 on the moves of the best path, walked back by the team's lead from the last cell, a blank taken where it
//        ties with the label (the structure's MaxSemiring picks the first of [blank, label] the same way).
// Every entry of the item's posteriors is written (0 off its lattice and when the total is the semiring's zero).
#pragma once

#include <cstdint>

#include "semiring.h"

namespace semiring_ops {

// One batch. pot (B, T, U1, 2) contiguous: [..., 0] the blank, [..., 1] the next label; frames / labels (B,).
template <class T> struct RnntArgs {
  const T* pot;
  const int64_t* frames;
  const int64_t* labels;
  int64_t B, T_, U1;
  T* total;  // (B,)
  T* post;   // (B, T, U1, 2) or null (no posteriors)
  T* alpha;  // (B, T, U1) scratch
  T* beta;   // (B, T, U1) scratch (log with posteriors)
};

template <class T> SR_HD_ALWAYS_INLINE T rnnt_exp(T x) { return fast_exp2(x * T(kLog2e)); }

template <bool kMax, class T> SR_HD_ALWAYS_INLINE T rnnt_plus(T a, T b) {
  return kMax ? MaxSemiring::plus<T>(a, b) : LogSemiring::plus<T>(a, b);
}

template <bool kMax, class T, class Team> SR_HD void rnnt_item(const Team& team, const RnntArgs<T>& a, int64_t b) {
  const int64_t Tb = a.frames[b], Ub = a.labels[b], U1 = a.U1;
  const T* pot = a.pot + b * a.T_ * U1 * 2;
  T* alpha = a.alpha + b * a.T_ * U1;
  const T zero = -pos_inf<T>();
  auto blank = [&](int64_t t, int64_t u) { return pot[(t * U1 + u) * 2]; };
  auto label = [&](int64_t t, int64_t u) { return pot[(t * U1 + u) * 2 + 1]; };
  const int64_t last = Tb - 1 + Ub;
  for (int64_t d = 0; d <= last; ++d) {
    const int64_t lo = d - Tb + 1 > 0 ? d - Tb + 1 : 0, hi = d < Ub ? d : Ub;
    for (int64_t u = lo + team.rank(); u <= hi; u += team.size()) {
      const int64_t t = d - u;
      T x = d == 0 ? T(0) : zero;
      if (t > 0) x = rnnt_plus<kMax>(x, alpha[(t - 1) * U1 + u] + blank(t - 1, u));
      if (u > 0) x = rnnt_plus<kMax>(x, alpha[t * U1 + u - 1] + label(t, u - 1));
      alpha[t * U1 + u] = x;
    }
    team.barrier();
  }
  const T total = alpha[(Tb - 1) * U1 + Ub] + blank(Tb - 1, Ub);
  if (team.rank() == 0) a.total[b] = total;
  if (!a.post) return;
  T* post = a.post + b * a.T_ * U1 * 2;
  for (int64_t i = team.rank(); i < a.T_ * U1 * 2; i += team.size()) post[i] = T(0);
  team.barrier();
  if (!(total > zero)) return;  // no path (or NaN): no posterior
  if (kMax) {
    if (team.rank() == 0) {
      int64_t t = Tb - 1, u = Ub;
      post[(t * U1 + u) * 2] = T(1);
      while (t > 0 || u > 0) {
        const T by_blank = t > 0 ? alpha[(t - 1) * U1 + u] + blank(t - 1, u) : zero;
        const T by_label = u > 0 ? alpha[t * U1 + u - 1] + label(t, u - 1) : zero;
        if (t > 0 && !(by_label > by_blank)) {
          --t;
          post[(t * U1 + u) * 2] = T(1);
        } else {
          --u;
          post[(t * U1 + u) * 2 + 1] = T(1);
        }
      }
    }
    team.barrier();
    return;
  }
  T* beta = a.beta + b * a.T_ * U1;
  for (int64_t d = last; d >= 0; --d) {
    const int64_t lo = d - Tb + 1 > 0 ? d - Tb + 1 : 0, hi = d < Ub ? d : Ub;
    for (int64_t u = lo + team.rank(); u <= hi; u += team.size()) {
      const int64_t t = d - u;
      T x = d == last ? blank(t, u) : zero;
      if (t + 1 < Tb) x = rnnt_plus<false>(x, blank(t, u) + beta[(t + 1) * U1 + u]);
      if (u < Ub) x = rnnt_plus<false>(x, label(t, u) + beta[t * U1 + u + 1]);
      beta[t * U1 + u] = x;
    }
    team.barrier();
  }
  for (int64_t i = team.rank(); i < Tb * (Ub + 1); i += team.size()) {
    const int64_t t = i / (Ub + 1), u = i % (Ub + 1);
    const T from = alpha[t * U1 + u] - total;
    const T after_blank = t + 1 < Tb ? beta[(t + 1) * U1 + u] : (u == Ub ? T(0) : zero);
    post[(t * U1 + u) * 2] = rnnt_exp(from + blank(t, u) + after_blank);
    if (u < Ub) post[(t * U1 + u) * 2 + 1] = rnnt_exp(from + label(t, u) + beta[t * U1 + u + 1]);
  }
  team.barrier();
}

}  // namespace semiring_ops
