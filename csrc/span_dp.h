// The inside algorithms over spans (Eisner's projective dependency trees, CKY's binary span trees, the semi-Markov
// model's labelled segments, which with segments of length 1 is the linear chain of torch-struct's layout) and their
// adjoints, written once for the CPU and CUDA backends (csrc/cpu/span_cpu.cpp, csrc/cuda/span_kernels.cuh) and
// generic over the semirings whose product is + (log, max, min: semiring.h).
//
// One batch item at a time. A span's value is a semiring sum over its split points, computed by a Team: the
// threads that reduce one span together (a warp on the GPU, one thread on the CPU). A Team provides
//   rank(), size()          this thread's index in the team and the team's size (split points are dealt out),
//   group(), groups()       this team's index among the item's teams and their number (spans are dealt out),
//   all_reduce(acc)         an accumulator merged over the team (every member gets the result),
//   barrier()               a barrier over every team of the item (the end of a phase).
// Charts are (P, P) arrays [start][end] per item; entries past an item's length are never read or written.
//
// The adjoint (backward) runs the widths in reverse. A span's adjoint G is final when its width comes up (only
// wider spans use it); each reduction is recomputed and G times each term's weight (log: its softmax share,
// exp(term - value); max / min: 1 for the first selected term, as the forward's argmax) is added to the two
// entries the term was made of. Within one phase those targets are distinct across spans (each update reads
// its left operands at the span's start and its right operands at its end), so no atomics are needed and the
// result is deterministic.
#pragma once

#include "semiring.h"

namespace semiring_ops {

constexpr int64_t kSpanEisner = 0;  // projective dependency trees: 4 charts over N + 1 positions
constexpr int64_t kSpanCky = 1;     // binary span trees: 1 chart over N positions
constexpr int64_t kSpanSemiMarkov = 2;  // labelled segments: 1 chart (N, C), positions x labels
constexpr int64_t kSpanLinearChain = 3;  // label sequences: 2 charts (N, C) (chain_dp.h)
constexpr int64_t kSpanAlignment = 4;  // monotone alignments: 1 chart (N, M + 1) (alignment_dp.h)

template <class T> struct SpanChart {
  T* data;
  int64_t P;  // row stride
  SR_HD T& operator()(int64_t s, int64_t t) const { return data[s * P + t]; }
};

// A read-only (n, n) matrix with any strides (the potentials of one item).
template <class T> struct Strided2D {
  const T* data;
  int64_t s0, s1;
  SR_HD T operator()(int64_t i, int64_t j) const { return data[i * s0 + j * s1]; }
};

// A writable (n, n) matrix with rows of stride s0 (the gradient of one item's potentials, contiguous).
template <class T> struct Out2D {
  T* data;
  int64_t s0;
  SR_HD T& operator()(int64_t i, int64_t j) const { return data[i * s0 + j]; }
};

template <class S, class T, bool kArg> using SpanAcc = typename S::template Accumulator<T, kArg>;

// The team's semiring sum of term(j) over j in [lo, hi) (terms in natural units).
template <class S, class T, bool kArg, class Team, class Term>
SR_HD SpanAcc<S, T, kArg> span_reduce(const Team& team, int64_t lo, int64_t hi, Term term) {
  SpanAcc<S, T, kArg> acc;
  acc.init();
  for (int64_t j = lo + team.rank(); j < hi; j += team.size()) acc.add(S::template to_kernel<T>(term(j)), int32_t(j));
  return team.all_reduce(acc);
}

// d value / d term(j) for the reduction acc of the terms: the softmax share (log), or 1 for the selected term
// (max, min); 0 when the value is the semiring's zero (no structure: no gradient).
template <class S, class T, class Acc> SR_HD T span_weight(const Acc& acc, T term, int64_t j) {
  const T value = acc.result();
  if (value == S::template zero<T>()) return T(0);
  if constexpr (S::kSelects) {
    return j == acc.arg() ? T(1) : T(0);
  } else {
    return fast_exp2((term - value) * T(kLog2e));
  }
}

// G times each term's weight, passed to add(j, share) for j in [lo, hi) (the team's members split the j).
template <class S, class T, class Team, class Term, class Add>
SR_HD void span_scatter(const Team& team, int64_t lo, int64_t hi, T G, Term term, Add add) {
  if (G == T(0)) return;  // (G is the same on every member: the branch is uniform)
  const auto acc = span_reduce<S, T, S::kSelects>(team, lo, hi, term);
  for (int64_t j = lo + team.rank(); j < hi; j += team.size()) {
    const T w = span_weight<S, T>(acc, term(j), j);
    if (w != T(0)) add(j, G * w);
  }
}

// ---------------------------------------------------------------- Eisner

// Arc scores over positions 0 (the root) .. L from the (N, N) potentials (arc[h, m]: word h heads m, arc[m, m]:
// the root heads m): arcs into the root are the semiring zero (self-arcs never arise: spans have s < t).
template <class S, class T> struct EisnerArcs {
  Strided2D<T> a;
  SR_HD T operator()(int64_t h, int64_t m) const {
    if (m == 0) return S::template zero<T>();
    return h == 0 ? a(m - 1, m - 1) : a(h - 1, m - 1);
  }
};

// Charts: cl = C<-, cr = C->, il = I<-, ir = I->. Returns the item's total (on every thread).
template <class S, class T, class Team>
SR_HD T eisner_inside(const Team& team, const EisnerArcs<S, T>& arc, SpanChart<T> cl, SpanChart<T> cr,
                      SpanChart<T> il, SpanChart<T> ir, int64_t L, bool multiroot) {
  for (int64_t s = team.group(); s <= L; s += team.groups())
    if (team.rank() == 0) cl(s, s) = cr(s, s) = S::template one<T>();
  team.barrier();
  for (int64_t w = 1; w <= L; ++w) {
    for (int64_t s = team.group(); s + w <= L; s += team.groups()) {
      const int64_t t = s + w;
      const T inner = span_reduce<S, T, false>(team, 0, w, [&](int64_t j) { return cr(s, s + j) + cl(s + j + 1, t); })
                          .result();
      if (team.rank() == 0) {
        il(s, t) = S::times(inner, arc(t, s));
        ir(s, t) = S::times(inner, arc(s, t));
      }
    }
    team.barrier();
    for (int64_t s = team.group(); s + w <= L; s += team.groups()) {
      const int64_t t = s + w;
      const T left = span_reduce<S, T, false>(team, 0, w, [&](int64_t j) { return cl(s, s + j) + il(s + j, t); })
                         .result();
      const T right = span_reduce<S, T, false>(team, 1, w + 1, [&](int64_t j) { return ir(s, s + j) + cr(s + j, t); })
                          .result();
      if (team.rank() == 0) {
        cl(s, t) = left;
        cr(s, t) = right;
      }
    }
    team.barrier();
  }
  if (multiroot) return cr(0, L);
  // one root child r: C<-[1, r] (x) arc(root -> r) (x) C->[r, L]
  return span_reduce<S, T, false>(team, 1, L + 1, [&](int64_t r) { return cl(1, r) + arc(0, r) + cr(r, L); }).result();
}

// The adjoint of eisner_inside for the total's gradient G: adds d(G total) / d arc into darc (over positions,
// mapped back to the (N, N) layout), using the zeroed adjoint charts dcl, dcr, dil, dir.
template <class S, class T, class Team>
SR_HD void eisner_adjoint(const Team& team, const EisnerArcs<S, T>& arc, SpanChart<T> cl, SpanChart<T> cr,
                          SpanChart<T> il, SpanChart<T> ir, SpanChart<T> dcl, SpanChart<T> dcr, SpanChart<T> dil,
                          SpanChart<T> dir, Out2D<T> darc, int64_t L, bool multiroot, T G) {
  auto add_arc = [&](int64_t h, int64_t m, T g) {  // arcs into the root have no potential
    if (m > 0) (h == 0 ? darc(m - 1, m - 1) : darc(h - 1, m - 1)) += g;
  };
  if (team.group() == 0) {
    if (multiroot) {
      if (team.rank() == 0) dcr(0, L) = G;
    } else {
      span_scatter<S, T>(
          team, 1, L + 1, G, [&](int64_t r) { return cl(1, r) + arc(0, r) + cr(r, L); },
          [&](int64_t r, T g) {
            dcl(1, r) += g;
            add_arc(0, r, g);
            dcr(r, L) += g;
          });
    }
  }
  team.barrier();
  for (int64_t w = L; w >= 1; --w) {
    for (int64_t s = team.group(); s + w <= L; s += team.groups()) {  // the complete spans' updates
      const int64_t t = s + w;
      span_scatter<S, T>(
          team, 0, w, dcl(s, t), [&](int64_t j) { return cl(s, s + j) + il(s + j, t); },
          [&](int64_t j, T g) {
            dcl(s, s + j) += g;
            dil(s + j, t) += g;
          });
      span_scatter<S, T>(
          team, 1, w + 1, dcr(s, t), [&](int64_t j) { return ir(s, s + j) + cr(s + j, t); },
          [&](int64_t j, T g) {
            dir(s, s + j) += g;
            dcr(s + j, t) += g;
          });
    }
    team.barrier();
    for (int64_t s = team.group(); s + w <= L; s += team.groups()) {  // the incomplete spans' updates
      const int64_t t = s + w;
      const T gl = dil(s, t), gr = dir(s, t);
      if (team.rank() == 0) {
        add_arc(t, s, gl);
        add_arc(s, t, gr);
      }
      span_scatter<S, T>(
          team, 0, w, gl + gr, [&](int64_t j) { return cr(s, s + j) + cl(s + j + 1, t); },
          [&](int64_t j, T g) {
            dcr(s, s + j) += g;
            dcl(s + j + 1, t) += g;
          });
    }
    team.barrier();
  }
}

// ---------------------------------------------------------------- CKY

// beta(i, i) = s(i, i); beta(i, t) = ((+)_k beta(i, i + k) (x) beta(i + k + 1, t)) (x) s(i, t); total beta(0, L - 1).
template <class S, class T, class Team>
SR_HD T cky_inside(const Team& team, const Strided2D<T>& score, SpanChart<T> beta, int64_t L) {
  for (int64_t i = team.group(); i < L; i += team.groups())
    if (team.rank() == 0) beta(i, i) = score(i, i);
  team.barrier();
  for (int64_t w = 1; w < L; ++w) {
    for (int64_t i = team.group(); i + w < L; i += team.groups()) {
      const int64_t t = i + w;
      const T split =
          span_reduce<S, T, false>(team, 0, w, [&](int64_t k) { return beta(i, i + k) + beta(i + k + 1, t); }).result();
      if (team.rank() == 0) beta(i, t) = S::times(split, score(i, t));
    }
    team.barrier();
  }
  return beta(0, L - 1);
}

// The adjoint of cky_inside for the total's gradient G: d(G total) / d score into dscore, with the zeroed
// adjoint chart dbeta. Left children (at the span's start) and right children (at its end) in two phases.
template <class S, class T, class Team>
SR_HD void cky_adjoint(const Team& team, const Strided2D<T>& score, SpanChart<T> beta, SpanChart<T> dbeta,
                       Out2D<T> dscore, int64_t L, T G) {
  if (team.group() == 0 && team.rank() == 0) dbeta(0, L - 1) = G;
  team.barrier();
  for (int64_t w = L - 1; w >= 1; --w) {
    for (int part = 0; part < 2; ++part) {
      for (int64_t i = team.group(); i + w < L; i += team.groups()) {
        const int64_t t = i + w;
        if (part == 0 && team.rank() == 0) dscore(i, t) += dbeta(i, t);
        span_scatter<S, T>(
            team, 0, w, dbeta(i, t), [&](int64_t k) { return beta(i, i + k) + beta(i + k + 1, t); },
            [&](int64_t k, T g) { (part == 0 ? dbeta(i, i + k) : dbeta(i + k + 1, t)) += g; });
      }
      team.barrier();
    }
  }
  for (int64_t i = team.group(); i < L; i += team.groups())
    if (team.rank() == 0) dscore(i, i) += dbeta(i, i);
}

// ---------------------------------------------------------------- semi-Markov

// The (N - 1, D, C, C) edge potentials of one item with any strides: edge(m, k, c, c') scores a segment of length
// k from boundary m to m + k labelled c, after label c' (torch-struct's SemiMarkov layout).
template <class T> struct SegmentEdges {
  const T* data;
  int64_t s1, s2, s3, s4;
  SR_HD T operator()(int64_t m, int64_t k, int64_t c, int64_t cp) const {
    return data[m * s1 + k * s2 + c * s3 + cp * s4];
  }
};

// beta(0, c) = one; beta(n, c) = (+)_{1 <= k < D, k <= n} (+)_c' beta(n - k, c') (x) edge(n - k, k, c, c');
// total (+)_c beta(L - 1, c). beta: (L, C) rows of C. A team reduces one label's (k, c') terms, k major.
template <class S, class T, class Team>
SR_HD T semimarkov_inside(const Team& team, const SegmentEdges<T>& edge, T* beta, int64_t L, int64_t D, int64_t C) {
  for (int64_t c = team.group(); c < C; c += team.groups())
    if (team.rank() == 0) beta[c] = S::template one<T>();
  team.barrier();
  for (int64_t n = 1; n < L; ++n) {
    const int64_t terms = (n < D - 1 ? n : D - 1) * C;
    for (int64_t c = team.group(); c < C; c += team.groups()) {
      const T v = span_reduce<S, T, false>(team, 0, terms, [&](int64_t j) {
                    const int64_t k = 1 + j / C, cp = j % C;
                    return beta[(n - k) * C + cp] + edge(n - k, k, c, cp);
                  }).result();
      if (team.rank() == 0) beta[n * C + c] = v;
    }
    team.barrier();
  }
  return span_reduce<S, T, false>(team, 0, C, [&](int64_t c) { return beta[(L - 1) * C + c]; }).result();
}

// The adjoint of semimarkov_inside for the total's gradient G into dedge (contiguous (N - 1, D, C, C), zeroed),
// with the zeroed adjoint chart dbeta. Per position n, in reverse: each label's terms get G x weight into the
// edges of the segments ending at n (distinct entries), then each (k, c') sums them over c into dbeta(n - k, c').
template <class S, class T, class Team>
SR_HD void semimarkov_adjoint(const Team& team, const SegmentEdges<T>& edge, const T* beta, T* dbeta, T* dedge,
                              int64_t L, int64_t D, int64_t C, T G) {
  auto dE = [&](int64_t m, int64_t k, int64_t c, int64_t cp) -> T& { return dedge[((m * D + k) * C + c) * C + cp]; };
  if (team.group() == 0)
    span_scatter<S, T>(
        team, 0, C, G, [&](int64_t c) { return beta[(L - 1) * C + c]; },
        [&](int64_t c, T g) { dbeta[(L - 1) * C + c] += g; });
  team.barrier();
  for (int64_t n = L - 1; n >= 1; --n) {
    const int64_t terms = (n < D - 1 ? n : D - 1) * C;
    for (int64_t c = team.group(); c < C; c += team.groups()) {
      span_scatter<S, T>(
          team, 0, terms, dbeta[n * C + c],
          [&](int64_t j) {
            const int64_t k = 1 + j / C, cp = j % C;
            return beta[(n - k) * C + cp] + edge(n - k, k, c, cp);
          },
          [&](int64_t j, T g) {
            const int64_t k = 1 + j / C;
            dE(n - k, k, c, j % C) += g;
          });
    }
    team.barrier();
    const int64_t first = int64_t(team.group()) * team.size() + team.rank(), step = int64_t(team.groups()) * team.size();
    for (int64_t j = first; j < terms; j += step) {
      const int64_t k = 1 + j / C, cp = j % C;
      T sum = T(0);
      for (int64_t c = 0; c < C; ++c) sum += dE(n - k, k, c, cp);
      dbeta[(n - k) * C + cp] += sum;
    }
    team.barrier();
  }
}

// ---------------------------------------------------------------- one batch item (the backends' loop bodies)

// The arguments of span_inside / span_adjoint (ops.h) as raw pointers and strides.
template <class T> struct SpanArgs {
  const T* pot;
  int64_t ps0, ps1, ps2, ps3, ps4;
  const int64_t* lengths;
  int64_t N, P, K;  // the structure's N (positions of an item), chart positions, charts per item
  int64_t D, C;     // semi-Markov: segment lengths below D, C labels (charts (N, C), P = N); linear chain: C;
                    // alignment: C = M, the second sequence's length
  int64_t structure;
  bool multiroot;   // Eisner: several root children; alignment: local (start and end anywhere)
  T* charts;        // (B, K, P, P); semi-Markov (B, 1, N, C), linear chain (B, 2, N, C), alignment (B, 1, N, M + 1)
  T* total;         // (B,)            span_inside
  T* dcharts;       // (B, K, P, P), zeroed: span_adjoint
  T* dpot;          // (B, N, N), zeroed
  const T* grad;    // (B,) with stride gs0
  int64_t gs0;
};

template <class T> SR_HD SpanChart<T> chart_of(T* base, const SpanArgs<T>& a, int64_t b, int64_t k) {
  return SpanChart<T>{base + (b * a.K + k) * a.P * a.P, a.P};
}

template <class T> SR_HD SegmentEdges<T> edges_of(const SpanArgs<T>& a, int64_t b) {
  return SegmentEdges<T>{a.pot + b * a.ps0, a.ps1, a.ps2, a.ps3, a.ps4};
}

template <class S, class T, class Team> SR_HD void span_inside_item(const Team& team, const SpanArgs<T>& a, int64_t b) {
  const int64_t L = a.lengths[b];
  const bool lead = team.group() == 0 && team.rank() == 0;
  if (L < 1 || L > a.N) {  // (checked in Python; NaN rather than a stray access)
    if (lead) a.total[b] = pos_inf<T>() - pos_inf<T>();
    return;
  }
  const Strided2D<T> pot{a.pot + b * a.ps0, a.ps1, a.ps2};
  T z;
  if (a.structure == kSpanSemiMarkov) {
    z = semimarkov_inside<S, T>(team, edges_of(a, b), a.charts + b * a.N * a.C, L, a.D, a.C);
  } else if (a.structure == kSpanEisner) {
    z = eisner_inside<S, T>(team, EisnerArcs<S, T>{pot}, chart_of(a.charts, a, b, 0), chart_of(a.charts, a, b, 1),
                            chart_of(a.charts, a, b, 2), chart_of(a.charts, a, b, 3), L, a.multiroot);
  } else {
    z = cky_inside<S, T>(team, pot, chart_of(a.charts, a, b, 0), L);
  }
  if (lead) a.total[b] = z;
}

template <class S, class T, class Team>
SR_HD void span_adjoint_item(const Team& team, const SpanArgs<T>& a, int64_t b) {
  const int64_t L = a.lengths[b];
  if (L < 1 || L > a.N) return;
  const Strided2D<T> pot{a.pot + b * a.ps0, a.ps1, a.ps2};
  const Out2D<T> dpot{a.dpot + b * a.N * a.N, a.N};
  const T G = a.grad[b * a.gs0];
  if (a.structure == kSpanSemiMarkov) {
    const int64_t item = a.N * a.C;
    semimarkov_adjoint<S, T>(team, edges_of(a, b), a.charts + b * item, a.dcharts + b * item,
                             a.dpot + b * (a.N - 1) * a.D * a.C * a.C, L, a.D, a.C, G);
  } else if (a.structure == kSpanEisner) {
    eisner_adjoint<S, T>(team, EisnerArcs<S, T>{pot}, chart_of(a.charts, a, b, 0), chart_of(a.charts, a, b, 1),
                         chart_of(a.charts, a, b, 2), chart_of(a.charts, a, b, 3), chart_of(a.dcharts, a, b, 0),
                         chart_of(a.dcharts, a, b, 1), chart_of(a.dcharts, a, b, 2), chart_of(a.dcharts, a, b, 3),
                         dpot, L, a.multiroot, G);
  } else {
    cky_adjoint<S, T>(team, pot, chart_of(a.charts, a, b, 0), chart_of(a.dcharts, a, b, 0), dpot, L, G);
  }
}

}  // namespace semiring_ops
