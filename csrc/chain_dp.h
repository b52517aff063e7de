// The linear chain of torch-struct's layout as a span-kernel structure (kSpanLinearChain): edge potentials
// (B, N - 1, C, C), edge(n, c, c') scoring label c at position n + 1 after label c' at position n. Written once
// for the CPU and CUDA backends (csrc/cpu/span_cpu.cpp, csrc/cuda/span_kernels.cuh), generic over the semirings whose
// product is + (log, max, min) and over the Team of span_dp.h (a warp per label on the GPU, one thread on the CPU).
//
// Forward (span_inside): the alpha pass, and under log the beta pass (two independent recursions: two thread
// blocks per item on the GPU, run side by side). Charts (B, 2, N, C): alpha, then beta (log) or, under max /
// min, the selected predecessors (arg(n, c): the c' that alpha(n, c) came from, stored as T) followed back from
// the best last label at the end of the alpha pass, which leaves the best path's label at n in arg(n, 0).
// Backward (span_adjoint): under log every edge's marginal at once, G exp(alpha(n, c') + edge(n, c, c') +
// beta(n + 1, c) - Z); under max / min G on the best path's edges. Neither has a recursion.
//
// Labels are dealt to the teams in rounds that every team goes through (a team past the last label reduces
// nothing): the GPU's teams may be parts of one warp, whose merges need all its lanes.
//
// A step reads a whole (C, C) tile of edges. Tiles is the policy that serves them, told the order of the steps
// (begin(team, first, steps, dir): steps first, first + dir, ...) and called at the start of each (ready(team, i),
// the i-th step, which is also the step's barrier). DirectTiles reads the potentials where they are; the CUDA
// backend's staged policy copies the tiles of the next few steps into shared memory (asynchronously) while a
// step computes, so a step waits on no global load.
#pragma once

#include "span_dp.h"

namespace semiring_ops {

// The (N - 1, C, C) edges of one item, any strides.
template <class T> struct ChainEdges {
  const T* data;
  int64_t s1, s2, s3;
  SR_HD T operator()(int64_t n, int64_t c, int64_t cp) const { return data[n * s1 + c * s2 + cp * s3]; }
};

template <class T> SR_HD ChainEdges<T> chain_edges_of(const SpanArgs<T>& a, int64_t b) {
  return ChainEdges<T>{a.pot + b * a.ps0, a.ps1, a.ps2, a.ps3};
}

// Tiles read in place: begin() has nothing to do; ready() is the step's barrier.
template <class T> struct DirectTiles {
  ChainEdges<T> edges;
  template <class Team> SR_HD void begin(const Team&, int64_t, int64_t, int64_t) {}
  template <class Team> SR_HD void ready(const Team& team, int64_t) { team.barrier(); }
  SR_HD T operator()(int64_t n, int64_t c, int64_t cp) const { return edges(n, c, cp); }
};

// alpha(0, c) = one; alpha(n + 1, c) = (+)_c' alpha(n, c') (x) edge(n, c, c'); the total (+)_c alpha(L - 1, c).
// rows: 2 C values shared by the item's teams (alpha's current and next row); chart, arg: (N, C) rows of C.
template <class S, class T, class Team, class Tiles>
SR_HD SpanAcc<S, T, S::kSelects> chain_alpha(const Team& team, Tiles& tiles, T* rows, T* chart, T* arg, int64_t L,
                                             int64_t C) {
  constexpr bool kSel = S::kSelects;
  for (int64_t c = team.group(); c < C; c += team.groups())
    if (team.rank() == 0) rows[c] = chart[c] = S::template one<T>();
  tiles.begin(team, 0, L - 1, 1);
  for (int64_t n = 0; n + 1 < L; ++n) {
    tiles.ready(team, n);  // tile n and alpha row n are visible to every team
    const T* cur = rows + (n & 1) * C;
    T* next = rows + ((n + 1) & 1) * C;
    for (int64_t base = 0; base < C; base += team.groups()) {  // (rounds: every team through each, see above)
      const int64_t c = base + team.group();
      const auto acc =
          span_reduce<S, T, kSel>(team, 0, c < C ? C : 0, [&](int64_t cp) { return cur[cp] + tiles(n, c, cp); });
      if (c < C && team.rank() == 0) {
        next[c] = chart[(n + 1) * C + c] = acc.result();
        if constexpr (kSel) arg[(n + 1) * C + c] = T(acc.arg());
      }
    }
  }
  team.barrier();
  const T* last = rows + ((L - 1) & 1) * C;
  const auto acc = span_reduce<S, T, kSel>(team, 0, C, [&](int64_t c) { return last[c]; });
  return acc;
}

// The best path, followed back from the label `last` at L - 1 through the selected predecessors in arg:
// path(L - 1) = last, path(n - 1) = arg(n, path(n)); path(n) is left in arg(n, 0) (arg's other entries are
// scratch after this). With `scratch` (team-shared, `piece` rows of C), the chase reads arg a piece of rows at a
// time copied there by the whole team (one dependent read per step from shared memory instead of global);
// without, it reads arg in place. One member follows the path.
template <class T, class Team>
SR_HD void chain_follow(const Team& team, T* arg, T* scratch, int64_t piece, int64_t L, int64_t C, int64_t last) {
  const bool lead = team.group() == 0 && team.rank() == 0;
  const int64_t member = int64_t(team.group()) * team.size() + team.rank(), members = int64_t(team.groups()) * team.size();
  int64_t label = last;
  for (int64_t hi = L; hi > 1;) {
    const int64_t lo = scratch != nullptr ? (hi - piece > 1 ? hi - piece : 1) : 1;
    const T* rows = arg + lo * C;
    if (scratch != nullptr) {
      team.barrier();  // the previous piece's chase is done with scratch
      for (int64_t i = member; i < (hi - lo) * C; i += members) scratch[i] = rows[i];
      team.barrier();
      rows = scratch;
    }
    if (lead)
      for (int64_t n = hi - 1; n >= lo; --n) {
        const int64_t from = int64_t(rows[(n - lo) * C + label]);
        arg[n * C] = T(label);
        label = from;
      }
    hi = lo;
  }
  if (lead) arg[0] = T(label);
}

// beta(L - 1, c) = one; beta(n, c') = (+)_c edge(n, c, c') (x) beta(n + 1, c). rows and chart as chain_alpha.
template <class S, class T, class Team, class Tiles>
SR_HD void chain_beta(const Team& team, Tiles& tiles, T* rows, T* chart, int64_t L, int64_t C) {
  for (int64_t c = team.group(); c < C; c += team.groups())
    if (team.rank() == 0) rows[((L - 1) & 1) * C + c] = chart[(L - 1) * C + c] = S::template one<T>();
  tiles.begin(team, L - 2, L - 1, -1);
  for (int64_t n = L - 2; n >= 0; --n) {
    tiles.ready(team, L - 2 - n);
    const T* cur = rows + ((n + 1) & 1) * C;
    T* next = rows + (n & 1) * C;
    for (int64_t base = 0; base < C; base += team.groups()) {
      const int64_t cp = base + team.group();
      const T v =
          span_reduce<S, T, false>(team, 0, cp < C ? C : 0, [&](int64_t c) { return tiles(n, c, cp) + cur[c]; })
              .result();
      if (cp < C && team.rank() == 0) next[cp] = chart[n * C + cp] = v;
    }
  }
  team.barrier();
}

// One item's forward: pass 0 the alpha pass and the total (and under max / min the best path), pass 1 the beta
// pass (log only); pass -1 both, in turn (a team that runs the whole item, as on the CPU). rows: 2 C values of
// team-shared memory; scratch, piece: chain_follow's.
template <class S, class T, class Team, class Tiles>
SR_HD void chain_inside_item(const Team& team, const SpanArgs<T>& a, int64_t b, int pass, Tiles& tiles, T* rows,
                             T* scratch, int64_t piece) {
  const int64_t L = a.lengths[b], C = a.C;
  const bool lead = team.group() == 0 && team.rank() == 0;
  if (L < 1 || L > a.N) {  // (checked in Python; NaN rather than a stray access)
    if (lead && pass <= 0) a.total[b] = pos_inf<T>() - pos_inf<T>();
    return;
  }
  T* alpha = a.charts + b * 2 * a.N * C;
  T* second = alpha + a.N * C;  // beta (log) or arg (max / min)
  if (pass <= 0) {
    const auto acc = chain_alpha<S, T>(team, tiles, rows, alpha, second, L, C);
    if (lead) a.total[b] = acc.result();
    if constexpr (S::kSelects) chain_follow(team, second, scratch, piece, L, C, acc.arg());
  }
  if constexpr (!S::kSelects) {
    if (pass < 0) team.barrier();  // the alpha pass's last reads of rows are done
    if (pass != 0) chain_beta<S, T>(team, tiles, rows, second, L, C);
  }
}

// One item's backward into dedge (contiguous (N - 1, C, C), zeroed): the marginals times G (log: a team a step),
// or G on the best path's edges (max / min: the steps dealt over every member); no barrier.
// Nothing when G is 0 or the total is the semiring's zero (no structure: no gradient).
template <class S, class T, class Team> SR_HD void chain_adjoint_item(const Team& team, const SpanArgs<T>& a, int64_t b) {
  const int64_t L = a.lengths[b], C = a.C;
  if (L < 1 || L > a.N) return;
  const T* alpha = a.charts + b * 2 * a.N * C;
  const T* second = alpha + a.N * C;
  T* dedge = a.dpot + b * (a.N - 1) * C * C;
  const T G = a.grad[b * a.gs0];
  const T z = span_reduce<S, T, false>(team, 0, C, [&](int64_t c) { return alpha[(L - 1) * C + c]; }).result();
  if (G == T(0) || z == S::template zero<T>()) return;
  if constexpr (S::kSelects) {
    const int64_t first = int64_t(team.group()) * team.size() + team.rank();
    for (int64_t n = first, step = int64_t(team.groups()) * team.size(); n + 1 < L; n += step)
      dedge[(n * C + int64_t(second[(n + 1) * C])) * C + int64_t(second[n * C])] = G;
  } else {
    // Each step's marginals sum to 1; computed from alpha, beta and Z, whose rounding differs, they do not
    // quite, so each step is normalised by its own sum (a team a step): the marginals stay as consistent as a
    // step-by-step softmax (what autograd of the recursion gives), which entropies and KLs, differences of
    // expected scores, need in float32.
    const ChainEdges<T> edge = chain_edges_of(a, b);
    const int64_t cells = C * C;
    auto marginal = [&](int64_t n, int64_t k) {
      const int64_t c = k / C, cp = k - c * C;
      return fast_exp2(((alpha[n * C + cp] - z) + second[(n + 1) * C + c] + edge(n, c, cp)) * T(kLog2e));
    };
    for (int64_t n = team.group(); n + 1 < L; n += team.groups()) {
      SumAccumulator<T> sum;
      sum.init();
      for (int64_t k = team.rank(); k < cells; k += team.size()) sum.add(marginal(n, k), 0);
      const T scale = G / team.all_reduce(sum).result();
      for (int64_t k = team.rank(); k < cells; k += team.size()) dedge[n * cells + k] = marginal(n, k) * scale;
    }
  }
}

}  // namespace semiring_ops
