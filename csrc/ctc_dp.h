// CTC's dynamic programs (structures/ctc.py has the topology): an item with target labels l_1 .. l_S has the
// K = 2 S + 1 states blank, l_1, blank, ..., l_S, blank; a frame stays, moves up one state, or skips the blank
// between two different labels; paths start in state 0 or 1 and end in K - 1 or K - 2. Written once for the CPU
// and CUDA backends (csrc/cpu/ctc_cpu.cpp, csrc/cuda/ctc_kernels.cu) over a Team of threads that share an item's
// states (CPU: one thread; CUDA: the block, a thread per state, strided; or, for the log program on sm_90+, one
// block of a cluster that splits the item's states into slices: CtcSlice), ATen-free.
//
// Log (ctc_log_item): the loss and, when asked, the occupancies d log Z / d log_probs, in one launch whose
// sequential depth is the item's T frames, not 2 T (torch's alpha then beta):
//   pass 1, frames meet in the middle: step i computes alpha at frame i and beta at frame L - 1 - i together, and
//     stores them (alpha below m = ceil(L / 2), beta from m on) in `rows` (N, T, K);
//   the total: log Z = logsumexp_s alpha(m - 1, s) + beta_ex(m - 1, s);
//   pass 2, frames move apart: step j continues beta down to frame m - 1 - j and alpha up to frame m + j; at each
//     the state's occupancy exp(alpha + beta - log Z) uses the direction's exclusive sum (its recursion before the
//     frame's emission) and the other direction's stored row, so it needs no division by the emission; it is
//     written over that stored row (read for the last time there).
// alpha_inc / beta_inc include the frame's emission; alpha_ex(t, s) = (+) of alpha_inc(t - 1, s - k) over the
// moves k in {0, 1, 2 (a skip)}; beta_ex(t, s) = (+) of beta_inc(t + 1, s + k). A step's inputs from global memory
// (its frames' emissions, and in pass 2 the stored rows) are staged into the scratch kCtcStages - 1 steps before,
// after that step's work (the team's copy_async: cp.async on the GPU, a copy on the CPU), so the loops over states
// read only the scratch (and vectorise on the CPU).
// Then (ctc_collect_frames, frames in parallel: a launch of its own on the GPU, made by the loss's backward) the
// state occupancies are summed per label deterministically, without atomics: the blank's over the even states by a
// team reduction, each label's by the thread of its first state, walking the chain of its later states (`chain`),
// kCollectBatch frames at a time, their rows staged into the scratch;
// times a factor per item (the loss's gradient), every entry of the (T, N, C) output written (0 times the factor
// off the labels, past the frames and for an item with no alignment: NaN where the factor is not finite, as the
// product with a zeroed tensor gives).
//
// Max (ctc_viterbi_item): the best path, forward with 2-bit moves stored per (frame, state), then walked back by
// the team's lead. Ties as torchaudio.functional.forced_align breaks them: a skip only when strictly better than
// both other moves, a step only when strictly better than staying; at the end the final blank only when strictly
// better than the last label.
#pragma once

#include "semiring.h"


// The loops over a frame's states write one row and read others (disjoint): told so on the CPU, which otherwise
// versions them on a runtime alias check.
#if defined(__CUDACC__) || !defined(__GNUC__)
#define SEMIRING_OPS_CTC_IVDEP
#else
#define SEMIRING_OPS_CTC_IVDEP _Pragma("GCC ivdep")
#endif
// A loop over kCollectBatch frames, unrolled (its sums stay in registers).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SEMIRING_OPS_CTC_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__clang__)
#define SEMIRING_OPS_CTC_UNROLL _Pragma("GCC unroll 4")
#else
#define SEMIRING_OPS_CTC_UNROLL
#endif

namespace semiring_ops {

// One batch of CTC problems. log_probs (t, n, c) at t * st + n * sn + c * sc; targets (n, i) at n * ts0 + i * ts1
// (padded past target_lengths[n]); K = 2 S + 1 with S the targets' width. Outputs as each program says.
template <class T> struct CtcArgs {
  const T* lp;
  int64_t st, sn, sc;
  const int64_t* targets;
  int64_t ts0, ts1;
  const int64_t* input_lengths;
  const int64_t* target_lengths;
  int64_t N, T_, C, S, K, blank;
  T* total;          // (N,)
  T* occupancy;      // (T, N, C) the collection's output: weight * d log Z / d log_probs (every entry written)
  int64_t os0, os1;  // its strides of t and n (c: 1)
  const T* weight;   // (N,) the collection's factor of each item, or null (1)
  T* rows;           // (N, T, K) the log program's state occupancies at each item's frames, or null (no gradient)
  unsigned char* moves;  // (N, T, K) of the max program
  int64_t* path;     // (N, T) the best path's states (-1 past the item's frames)
  int64_t cluster;   // CUDA: the blocks that share an item (a thread block cluster; the launcher sets it)
};

// The states [lo, hi) of an item that one member of a team computes at each step (CUDA clusters: each block of the
// item's cluster takes a contiguous slice, ClusterTeam in ctc_kernels.cu; otherwise [0, K)); left / right: whether
// a neighbouring block's slice reads this one's first / last two states (sent to it after each step).
struct CtcSlice {
  int lo, hi;
  bool left, right;
};

// ctc_log_item's hooks for a team that has its item to itself (the CPU's thread, a CUDA block): CRTP, over the team's
// rank() and barrier(). A cluster's team (ctc_kernels.cu) splits the item instead.
template <class Team> struct CtcWholeItem {
  SR_HD const Team& self() const { return static_cast<const Team&>(*this); }
  SR_HD CtcSlice slice(int K) const { return CtcSlice{0, K, false, false}; }
  // sends a computed state of step g's rows to the neighbour that reads it (none here)
  template <class T> SR_HD void pass_on(const CtcSlice&, int64_t, T*, T*, int, T, T) const {}
  SR_HD void wait_inputs(int64_t) const {}  // waits for the neighbours' states that step g reads
  SR_HD void step_done(const CtcSlice&, int64_t) const {}  // after step g's barrier
  SR_HD bool leads_item() const { return self().rank() == 0; }  // writes the item's outputs
  // the item's max / sum of the members' partials (v on rank 0), on every thread; cell: a shared entry to pass it
  template <class T> SR_HD T share_max(T v, T* cell) const { return share(v, cell); }
  template <class T> SR_HD T share_sum(T v, T* cell) const { return share(v, cell); }
  template <class T> SR_HD T share(T v, T* cell) const {
    if (self().rank() == 0) *cell = v;
    self().barrier();
    return *cell;
  }
};

// Stage buffers of the steps' inputs: a step's are staged kCtcStages - 1 steps ahead, so that its copies land
// while the steps before compute. (On the H200 two steps ahead measured as fast as one, within noise: a step
// waits on its chain of dependent arithmetic and its barrier, not on its copies.)
constexpr int kCtcStages = 3;

// Frames the collection (ctc_collect_frames) sums at once: a label's chain of states is walked once for all of them.
constexpr int kCollectBatch = 4;

// The item's shared arrays (CUDA: dynamic shared memory; CPU: a thread's buffers). A row holds K states and two
// -inf entries on each side, so a step reads s - 2 .. s + 2 without tests (it points at its state 0). The shared
// entries come first (36, of which the programs use 4); ctc_collect_frames needs the int32 arrays and its own
// buffers after them (ctc_scratch_values(K, false)).
template <class T> struct CtcScratch {
  int32_t* label;   // (K) the states' labels
  int32_t* chain;   // (K) odd states: the next state q of the same label (K: none), as q for the label's first
                    // state and -q - 2 for the others (ctc_chain_next)
  int32_t* skip;    // (K + 2) 1 where state s may be entered from s - 2 (0 past the item's states)
  T* values;        // the shared entries, rows, staged inputs and a spare row below
  int64_t K;
  SR_HD T* shared() const { return values; }  // the total, a flag, the peak, the total's partial sum
  // padded row `buf` of direction d (0 alpha, 1 beta), at its state 0 (no arrays of pointers: on the GPU they
  // would live in local memory)
  SR_HD T* rows(int d, int buf) const { return values + 36 + (2 * d + buf) * (K + 4) + 2; }
  // direction d's staged inputs of a step in stage buffer buf (of kCtcStages; K each): its frame's emissions,
  // and (pass 2) the other direction's stored row at that frame (the module comment)
  SR_HD T* emit(int d, int buf) const { return values + 36 + 4 * (K + 4) + (kCtcStages * d + buf) * K; }
  SR_HD T* stored(int d, int buf) const {
    return values + 36 + 4 * (K + 4) + (2 * kCtcStages + kCtcStages * d + buf) * K;
  }
  SR_HD T* spare() const { return values + 36 + 4 * (K + 4) + 4 * kCtcStages * K; }  // (K)
  // the collection's (ctc_collect_frames) two buffers of kCollectBatch frames' state occupancies (K each), and its
  // warps' partial sums of each frame (32 each), over the programs' rows: the two never share a scratch at once
  SR_HD T* frame_row(int buf, int f) const { return values + 36 + (buf * kCollectBatch + f) * K; }
  SR_HD T* collect_partial(int f) const { return values + 36 + 2 * kCollectBatch * K + 32 * f; }
};

// The scratch's int32 and T entry counts for K states (T entries: of the programs, or only of the collection's);
// ctc_carve lays one out over them.
SR_HD int64_t ctc_scratch_ints(int64_t K) { return 3 * K + 2; }
SR_HD int64_t ctc_scratch_values(int64_t K, bool programs = true) {
  return 36 + (programs ? 4 * (K + 4) + (4 * kCtcStages + 1) * K : 2 * kCollectBatch * K + 32 * kCollectBatch);
}
// The scratch's bytes, as the CUDA kernels lay it out in dynamic shared memory: the int32 entries, then (16-byte
// aligned) the T entries. alignment/ctc.py's cuda_max_labels mirrors this (a test compares the two).
SR_HD int64_t ctc_values_offset(int64_t K) { return (ctc_scratch_ints(K) * 4 + 15) / 16 * 16; }
template <class T> SR_HD int64_t ctc_scratch_bytes(int64_t K, bool programs = true) {
  return ctc_values_offset(K) + ctc_scratch_values(K, programs) * int64_t(sizeof(T));
}

template <class T> SR_HD CtcScratch<T> ctc_carve(int32_t* ints, T* values, int64_t K) {
  CtcScratch<T> sm;
  sm.label = ints;
  sm.chain = ints + K;
  sm.skip = ints + 2 * K;
  sm.values = values;
  sm.K = K;
  return sm;
}

// exp and log. exp: fast_exp2 (semiring.h): on the GPU one MUFU.EX2 in float32 (relative error ~2^-22), the
// library's exp2 in float64; on the CPU a branch-free polynomial the compiler vectorises over a frame's states
// (libm's is a call per element). log: on the GPU lg2.approx in float32 (absolute error below 2^-22 on the [1, 3]
// that log_add3 takes it over), the library's log in float64; on the CPU series_log, vectorised likewise.
// ln x for x >= 0 (0 and subnormals -> -inf, +inf -> inf, NaN and x < 0 -> NaN): x = 2^e m with m in
// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(u), u = (m - 1) / (m + 1), |u| < 0.172, by its odd series (to u^21 in
// float64, u^9 in float32: below half an ulp). Branch-free (selects), so that it vectorises.
SR_HD_ALWAYS_INLINE float series_log(float x) {
  union {
    float f;
    uint32_t u;
  } v, mv;
  v.f = x;
  const int32_t raw_e = int32_t((v.u >> 23) & 0xffu);
  mv.u = (v.u & 0x7fffffu) | 0x3f800000u;  // [1, 2)
  const bool high = mv.f > 1.41421356f;
  const float m = high ? mv.f * 0.5f : mv.f;
  const float e = float(raw_e - 127 + (high ? 1 : 0));
  const float u = (m - 1.f) / (m + 1.f), u2 = u * u;
  float p = 1.f / 9.f;
  p = p * u2 + 1.f / 7.f;
  p = p * u2 + 1.f / 5.f;
  p = p * u2 + 1.f / 3.f;
  p = p * u2 + 1.f;
  const float y = e * float(kLn2) + 2.f * u * p;
  const float special = raw_e == 0 ? -HUGE_VALF : (x == HUGE_VALF ? x : quiet_nan<float>());
  return (raw_e != 0 && raw_e != 255 && x > 0.f) ? y : (x < 0.f ? quiet_nan<float>() : special);
}
SR_HD_ALWAYS_INLINE double series_log(double x) {
  union {
    double f;
    uint64_t u;
  } v, mv;
  v.f = x;
  const int32_t raw_e = int32_t((v.u >> 52) & 0x7ffu);
  mv.u = (v.u & 0xfffffffffffffull) | 0x3ff0000000000000ull;
  const bool high = mv.f > 1.4142135623730951;
  const double m = high ? mv.f * 0.5 : mv.f;
  const double e = double(raw_e - 1023 + (high ? 1 : 0));
  const double u = (m - 1.) / (m + 1.), u2 = u * u;
  double p = 1. / 21.;
  p = p * u2 + 1. / 19.;
  p = p * u2 + 1. / 17.;
  p = p * u2 + 1. / 15.;
  p = p * u2 + 1. / 13.;
  p = p * u2 + 1. / 11.;
  p = p * u2 + 1. / 9.;
  p = p * u2 + 1. / 7.;
  p = p * u2 + 1. / 5.;
  p = p * u2 + 1. / 3.;
  p = p * u2 + 1.;
  const double y = e * kLn2 + 2. * u * p;
  const double special = raw_e == 0 ? -HUGE_VAL : (x == HUGE_VAL ? x : quiet_nan<double>());
  return (raw_e != 0 && raw_e != 2047 && x > 0.) ? y : (x < 0. ? quiet_nan<double>() : special);
}

template <class T> SR_HD_ALWAYS_INLINE T ctc_exp(T x) { return fast_exp2(x * T(kLog2e)); }
#if defined(__CUDA_ARCH__)
SR_HD float ctc_log(float x) {  // lg2.approx (relative error ~2^-22; x >= 1 here, no subnormal to handle)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y * float(kLn2);
}
SR_HD double ctc_log(double x) { return ::log(x); }
#else
template <class T> SR_HD_ALWAYS_INLINE T ctc_log(T x) { return series_log(x); }
#endif

// log(exp a + exp b + exp c): -inf when all are, NaN when one is. Branch-free.
template <class T> SR_HD_ALWAYS_INLINE T log_add3(T a, T b, T c) {
  T m = a > b ? a : b;
  m = m > c ? m : c;
  m = m == -pos_inf<T>() ? T(0) : m;
  return m + ctc_log(ctc_exp<T>(a - m) + ctc_exp<T>(b - m) + ctc_exp<T>(c - m));
}

// One item's view: its lengths, labels and emissions.
template <class T> struct CtcItem {
  const CtcArgs<T>& a;
  const CtcScratch<T>& sm;
  int64_t b, L;  // the item, its frames
  int K;         // its states, 2 S_b + 1
  SR_HD const T* emission_address(int64_t t, int64_t s) const {
    return a.lp + t * a.st + b * a.sn + int64_t(sm.label[s]) * a.sc;
  }
  SR_HD T* row(int64_t t) const { return a.rows + (b * a.T_ + t) * a.K; }
  // (+) of a padded row's predecessors of s (alpha_ex) / successors of s (beta_ex), in the log semiring
  SR_HD_ALWAYS_INLINE T from_before(const T* prev, int64_t s) const {
    const T two = prev[s - 2];  // (read unconditionally: a select, so the CPU loop vectorises)
    return log_add3<T>(prev[s], prev[s - 1], sm.skip[s] ? two : -pos_inf<T>());
  }
  SR_HD_ALWAYS_INLINE T from_after(const T* next, int64_t s) const {
    const T two = next[s + 2];
    return log_add3<T>(next[s], next[s + 1], sm.skip[s + 2] ? two : -pos_inf<T>());
  }
  // Stages the emissions of the slice's states at frame t into out (asynchronously on the GPU: the thread's own
  // entries, complete after the team's wait for their copy group). (No L2 prefetch further ahead: the copies are
  // issued kCtcStages - 1 steps before they are read, longer than a read from memory takes.)
  template <class Team> SR_HD void stage_emissions(const Team& team, const CtcSlice& sl, int64_t t, T* out) const {
    const T* now = a.lp + t * a.st + b * a.sn;  // (the frames' rows of this item: one multiply a state)
    for (int s = sl.lo + team.rank(); s < sl.hi; s += team.size())
      team.copy_async(out + s, now + int64_t(sm.label[s]) * a.sc);
  }
  // Stages the slice's entries of the stored row of frame t into out, likewise.
  template <class Team> SR_HD void stage_row(const Team& team, const CtcSlice& sl, int64_t t, T* out) const {
    const T* now = row(t);
    for (int s = sl.lo + team.rank(); s < sl.hi; s += team.size()) team.copy_async(out + s, now + s);
  }
};

// Fills the item's labels, and for the programs (`programs`) the skips and the rows' padding, else (the
// collection) the label chains; returns false (on every thread) when a length or label is out of range (the host
// checks them: NaN rather than a stray access).
template <class T, class Team>
SR_HD bool ctc_setup(const Team& team, const CtcArgs<T>& a, const CtcScratch<T>& sm, int64_t b, bool programs) {
  const int64_t L = a.input_lengths[b], Sb = a.target_lengths[b];
  if (L < 0 || L > a.T_ || Sb < 0 || Sb > a.S) return false;
  const int K = int(2 * Sb + 1);
  if (team.rank() == 0) sm.shared()[1] = T(0);
  team.barrier();
  for (int s = team.rank(); s < K; s += team.size()) {
    const int64_t label = (s & 1) ? a.targets[b * a.ts0 + (s >> 1) * a.ts1] : a.blank;
    if (label < 0 || label >= a.C) sm.shared()[1] = T(1);
    sm.label[s] = int32_t(label < 0 || label >= a.C ? 0 : label);
  }
  for (int i = team.rank(); programs && i < 16; i += team.size()) {  // the rows' -inf entries around K states
    const int at = i % 4 < 2 ? i % 4 - 2 : K + i % 4 - 2;
    sm.rows(i / 8, (i / 4) % 2)[at] = -pos_inf<T>();
  }
  team.barrier();
  const bool ok = sm.shared()[1] == T(0);
  for (int s = team.rank(); programs && s < K + 2; s += team.size())
    sm.skip[s] = ok && s < K && (s & 1) && s >= 3 && sm.label[s] != sm.label[s - 2];
  for (int s = 1 + 2 * team.rank(); !programs && ok && s < K; s += 2 * team.size()) {
    bool first = true;
    for (int p = s - 2; p >= 1 && first; p -= 2) first = sm.label[p] != sm.label[s];
    int next = s + 2;
    while (next < K && sm.label[next] != sm.label[s]) next += 2;
    sm.chain[s] = first ? next : -next - 2;
  }
  team.barrier();
  return ok;
}

// The rows before the first frame and after the last, so that every step is the same recursion: alpha_inc of
// frame -1 is one at state 0 (then alpha_ex(0) is one at states 0 and 1), beta_inc of frame L one at state K - 1
// (then beta_ex(L - 1) is one at the end states K - 1 and K - 2: K - 1 is a blank, which no skip enters).
template <class T, class Team> SR_HD void ctc_virtual_rows(const Team& team, const CtcScratch<T>& sm, int K) {
  for (int s = team.rank(); s < K; s += team.size()) {
    sm.rows(0, 0)[s] = s == 0 ? T(0) : -pos_inf<T>();
    sm.rows(1, 0)[s] = s == K - 1 ? T(0) : -pos_inf<T>();
  }
  team.barrier();
}

// The next state of a chain entry (CtcScratch::chain).
SR_HD int ctc_chain_next(int32_t link) { return link >= 0 ? link : -link - 2; }

// Frame t's (T, N, C) entries of item b: 0 times the item's factor w (ctc_collect_frames' zeros).
template <class T, class Team>
SR_HD void ctc_collect_zeros(const Team& team, const CtcArgs<T>& a, int64_t b, int64_t t, T w) {
  T* out = a.occupancy + t * a.os0 + b * a.os1;
  for (int64_t c = team.rank(); c < a.C; c += team.size()) out[c] = T(0) * w;
}

// Sums the state occupancies of frames t .. t + n - 1 (n <= kCollectBatch; their rows, over which pass 2 wrote them,
// staged into the scratch's buffer `buf`) per label into the occupancy tensor, times w: the blank's over the even
// states (a reduction over the team: warp sums, then the first warp's), each label's over its chain of states (its
// first state's thread walks the chain once for the n frames: n independent sums); the other labels' entries
// 0 * w. The team's labels and chains are the item's (ctc_setup).
template <class T, class Team>
SR_HD void ctc_collect_batch(const Team& team, const CtcArgs<T>& a, const CtcScratch<T>& sm, int64_t b, int K,
                             int64_t t, int n, T w, int buf) {
  for (int f = 0; f < n; ++f)  // (before the barrier below: the label entries are written after it)
    ctc_collect_zeros<T>(team, a, b, t + f, w);
  // frame f's row at occ + row(f) (the frames past n read frame 0's, and their sums go unused: the loops below
  // keep kCollectBatch sums, in registers)
  const T* occ = sm.frame_row(buf, 0);
  const auto row = [&](int f) { return (f < n ? f : 0) * sm.K; };  // (the scratch's K: the batch's widest)
  T v[kCollectBatch] = {};
  for (int s = 2 * team.rank(); s < K; s += 2 * team.size()) {
    SEMIRING_OPS_CTC_UNROLL
    for (int f = 0; f < kCollectBatch; ++f) v[f] += occ[row(f) + s];
  }
  SEMIRING_OPS_CTC_UNROLL
  for (int f = 0; f < kCollectBatch; ++f) {
    const T x = team.warp_sum(v[f]);
    if (team.lane() == 0) sm.collect_partial(f)[team.warp()] = x;
  }
  team.barrier();
  for (int f = 0; f < n; ++f) {
    const T blank = team.lead_sum(team.warps(), [&](int64_t q) { return sm.collect_partial(f)[q]; });
    if (team.rank() == 0) a.occupancy[(t + f) * a.os0 + b * a.os1 + a.blank] = blank * w;
  }
  for (int s = 1 + 2 * team.rank(); s < K; s += 2 * team.size()) {
    if (sm.chain[s] < 0) continue;
    T sum[kCollectBatch];
    SEMIRING_OPS_CTC_UNROLL
    for (int f = 0; f < kCollectBatch; ++f) sum[f] = occ[row(f) + s];
    for (int q = sm.chain[s]; q < K; q = ctc_chain_next(sm.chain[q])) {
      SEMIRING_OPS_CTC_UNROLL
      for (int f = 0; f < kCollectBatch; ++f) sum[f] += occ[row(f) + q];
    }
    SEMIRING_OPS_CTC_UNROLL
    for (int f = 0; f < kCollectBatch; ++f)
      if (f < n) a.occupancy[(t + f) * a.os0 + b * a.os1 + sm.label[s]] = sum[f] * w;
  }
  team.barrier();  // (the partial sums and the buffer are rewritten by the next batch but one)
}

// Item b's entries of frames [t0, t1) of the (T, N, C) output: its label sums times its factor at its frames (after
// ctc_log_item wrote its state occupancies), 0 times the factor past them and everywhere when its total is not
// finite (no alignment, or bad arguments).
template <class T, class Team>
SR_HD void ctc_collect_frames(const Team& team, const CtcArgs<T>& a, const CtcScratch<T>& sm, int64_t b, int64_t t0,
                              int64_t t1) {
  const T w = a.weight != nullptr ? a.weight[b] : T(1);
  const T Z = a.total[b];
  const bool ok = Z > -pos_inf<T>() && Z < pos_inf<T>() && ctc_setup<T>(team, a, sm, b, false);  // (NaN: not)
  const int64_t L = ok ? a.input_lengths[b] : 0;
  const int K = ok ? int(2 * a.target_lengths[b] + 1) : 0;
  const int64_t end = t1 < a.T_ ? t1 : a.T_, last = end < L ? end : L;  // frames [t0, last) have occupancies
  for (int64_t t = last > t0 ? last : t0; t < end; ++t) ctc_collect_zeros<T>(team, a, b, t, w);
  // batches of kCollectBatch frames, each's rows staged into the scratch a batch ahead (the team's copies: a thread's
  // own states; the chains' sums then read shared memory, not a dependent global load a link)
  auto stage = [&](int64_t t, int buf) {
    for (int f = 0; f < kCollectBatch && t + f < last; ++f) {
      const T* occ = a.rows + (b * a.T_ + t + f) * a.K;
      T* row = sm.frame_row(buf, f);
      for (int s = team.rank(); s < K; s += team.size()) team.copy_async(row + s, occ + s);
    }
    team.commit_copies();
  };
  stage(t0, 0);
  for (int64_t t = t0, buf = 0; t < last; t += kCollectBatch, buf ^= 1) {
    stage(t + kCollectBatch, int(buf ^ 1));
    team.wait_copies();  // (this batch's group: all but the one just committed)
    team.barrier();
    ctc_collect_batch<T>(team, a, sm, b, K, t, int(last - t < kCollectBatch ? last - t : kCollectBatch), w, int(buf));
  }
}

// The log program for item b (module comment): its total, and its state occupancies when a.rows is set. The team
// may be one of several that share the item (CUDA clusters: team.slice); then each computes its slice of every row,
// reads its neighbours' last states from the padding its rows keep around the slice (team.pass_on sends them,
// team.wait_inputs waits for them before a step; steps are numbered g over both passes), and the total is combined
// across the teams (team.share_max / share_sum).
template <class T, class Team>
SR_HD void ctc_log_item(const Team& team, const CtcArgs<T>& a, const CtcScratch<T>& sm, int64_t b) {
  const bool ok = ctc_setup<T>(team, a, sm, b, true);
  const bool lead = team.leads_item();
  if (!ok) {
    if (lead) a.total[b] = pos_inf<T>() - pos_inf<T>();
    return;
  }
  const int64_t L = a.input_lengths[b];
  const int K = int(2 * a.target_lengths[b] + 1);
  if (L == 0) {  // no frames: the empty target's one empty path, else none
    if (lead) a.total[b] = K == 1 ? T(0) : -pos_inf<T>();
    return;
  }
  const CtcItem<T> it{a, sm, b, L, K};
  const T zero = -pos_inf<T>();
  const int64_t m = (L + 1) / 2, beta_steps = L - m;
  const int r0 = team.rank(), dr = team.size();
  ctc_virtual_rows(team, sm, K);
  const CtcSlice sl = team.slice(K);  // (after the virtual rows: their padding is every slice's first input)
  int pa = 0, pb = 0;  // the buffer of each direction's latest row
  // pass 1: alpha at frame i, beta at frame L - 1 - i; a step's emissions staged kCtcStages - 1 steps ahead
  auto stage1 = [&](int64_t i, int buf) {  // step i's emissions into stage buffer buf (one copy group a step)
    if (i < m) it.stage_emissions(team, sl, i, sm.emit(0, buf));
    if (i < beta_steps) it.stage_emissions(team, sl, L - 1 - i, sm.emit(1, buf));
    team.commit_copies();
  };
  for (int i = 0; i < kCtcStages - 1; ++i) stage1(i, i);
  // step i reads stage buffer buf = i % kCtcStages and stages step i + kCtcStages - 1 into the one before it (no
  // 64-bit remainders in the steps)
  int buf = 0;
  for (int64_t i = 0; i < m; ++i, buf = buf == kCtcStages - 1 ? 0 : buf + 1) {
    const int64_t tb = L - 1 - i;
    const bool with_beta = i < beta_steps;
    team.wait_copies();  // (step i's group: all but the kCtcStages - 2 groups after it)
    team.wait_inputs(i);
    // both directions in one loop (their chains of dependent work overlap); a step without beta (the last
    // when L is odd) computes it into its spare buffer, which nothing reads
    const T* ea = sm.emit(0, buf);
    const T* eb = sm.emit(1, buf);
    const T* ap = sm.rows(0, pa);
    const T* bp = sm.rows(1, pb);
    T* an = sm.rows(0, pa ^ 1);
    T* bn = sm.rows(1, pb ^ 1);
    T* astore = a.rows ? it.row(i) : an;
    T* bstore = a.rows && with_beta ? it.row(tb) : bn;
    SEMIRING_OPS_CTC_IVDEP
    for (int s = sl.lo + r0; s < sl.hi; s += dr) {
      const T va = it.from_before(ap, s) + ea[s];
      const T vb = it.from_after(bp, s) + eb[s];
      an[s] = va;
      bn[s] = vb;
      astore[s] = va;
      bstore[s] = vb;
      team.pass_on(sl, i, an, bn, s, va, vb);
    }
    team.barrier();
    team.step_done(sl, i);
    // the staging after the step, not before: the step's chain of dependent work does not wait for it, and on a
    // cluster it overlaps the neighbours' states on their way (its buffer was last read by step i - 1)
    stage1(i + kCtcStages - 1, buf == 0 ? kCtcStages - 1 : buf - 1);
    pa ^= 1;
    if (with_beta) pb ^= 1;
  }
  team.wait_inputs(m);  // (pass 2's first step's; the total reads beta's)
  // the total at frame m - 1: alpha_inc there times beta_ex (beta_inc of frame m, or the end states at L - 1)
  T* prod = sm.spare();
  for (int s = sl.lo + r0; s < sl.hi; s += dr) prod[s] = sm.rows(0, pa)[s] + it.from_after(sm.rows(1, pb), s);
  team.barrier();
  const int width = sl.hi - sl.lo;
  const T peak = team.share_max(team.lead_max(width, [&](int64_t i) { return prod[sl.lo + i]; }), sm.shared() + 2);
  const T sum = team.share_sum(
      team.lead_sum(width, [&](int64_t i) { return peak == zero ? T(0) : ctc_exp<T>(prod[sl.lo + i] - peak); }),
      sm.shared() + 3);
  const T Z = (peak == zero || is_nan(peak)) ? peak : peak + ctc_log(sum);
  if (lead) a.total[b] = Z;
  if (a.rows == nullptr || Z == zero || is_nan(Z) || Z == pos_inf<T>()) return;
  // pass 2: beta from frame m - 1 down (staged: its emissions and alpha's stored row), alpha from frame m up
  // (its emissions and beta's stored row), each step's inputs staged during the step before; the state
  // occupancies written over the stored rows. (Those were written by other threads: the barriers since make them
  // visible.)
  auto stage2 = [&](int64_t j, int buf) {
    const int64_t t1 = m - 1 - j, t2 = m + j;
    if (j < m) {
      it.stage_emissions(team, sl, t1, sm.emit(1, buf));
      it.stage_row(team, sl, t1, sm.stored(1, buf));
    }
    if (j < m && t2 < L) {
      it.stage_emissions(team, sl, t2, sm.emit(0, buf));
      it.stage_row(team, sl, t2, sm.stored(0, buf));
    }
    team.commit_copies();
  };
  for (int j = 0; j < kCtcStages - 1; ++j) stage2(j, j);
  buf = 0;
  for (int64_t j = 0; j < m; ++j, buf = buf == kCtcStages - 1 ? 0 : buf + 1) {
    const int64_t t1 = m - 1 - j, t2 = m + j;
    const bool with_alpha = t2 < L, last = j == m - 1;
    team.wait_copies();
    if (j > 0) team.wait_inputs(m + j);
    // both directions in one loop; a step without alpha (the last when L is odd) computes it into buffers
    // that nothing reads
    const T* eb = sm.emit(1, buf);
    const T* ea = sm.emit(0, buf);
    const T* alpha1 = sm.stored(1, buf);
    const T* beta2 = sm.stored(0, buf);
    const T* bp = sm.rows(1, pb);
    const T* ap = sm.rows(0, pa);
    T* bn = sm.rows(1, pb ^ 1);
    T* an = sm.rows(0, pa ^ 1);
    T* o1 = it.row(t1);
    T* o2 = with_alpha ? it.row(t2) : sm.spare();
    SEMIRING_OPS_CTC_IVDEP
    for (int s = sl.lo + r0; s < sl.hi; s += dr) {
      const T bx = it.from_after(bp, s);
      const T ax = it.from_before(ap, s);
      o1[s] = ctc_exp<T>(alpha1[s] + bx - Z);
      o2[s] = ctc_exp<T>(ax + beta2[s] - Z);
      const T vb = bx + eb[s], va = ax + ea[s];
      bn[s] = vb;
      an[s] = va;
      if (!last) team.pass_on(sl, m + j, an, bn, s, va, vb);  // (the last step's rows are read by no one)
    }
    team.barrier();
    team.step_done(sl, m + j);
    stage2(j + kCtcStages - 1, buf == 0 ? kCtcStages - 1 : buf - 1);  // (as pass 1's)
    pb ^= 1;
    if (with_alpha) pa ^= 1;
  }
}

// The max program for item b (module comment): the best score into a.total and its states into a.path.
template <class T, class Team>
SR_HD void ctc_viterbi_item(const Team& team, const CtcArgs<T>& a, const CtcScratch<T>& sm, int64_t b) {
  const bool ok = ctc_setup<T>(team, a, sm, b, true);
  const bool lead = team.rank() == 0;
  int64_t* path = a.path + b * a.T_;
  for (int64_t t = team.rank(); t < a.T_; t += team.size()) path[t] = -1;
  if (!ok) {
    if (lead) a.total[b] = pos_inf<T>() - pos_inf<T>();
    return;
  }
  const int64_t L = a.input_lengths[b];
  const int K = int(2 * a.target_lengths[b] + 1);
  if (L == 0) {
    if (lead) a.total[b] = K == 1 ? T(0) : -pos_inf<T>();
    return;
  }
  const CtcItem<T> it{a, sm, b, L, K};
  const T zero = -pos_inf<T>();
  unsigned char* moves = a.moves + b * a.T_ * a.K;
  ctc_virtual_rows(team, sm, K);
  auto stage = [&](int64_t t) {
    if (t < L) it.stage_emissions(team, CtcSlice{0, K, false, false}, t, sm.emit(0, int(t % kCtcStages)));
    team.commit_copies();
  };
  for (int64_t t = 0; t < kCtcStages - 1; ++t) stage(t);
  int p = 0;
  for (int64_t t = 0; t < L; ++t) {
    const int buf = int(t % kCtcStages);
    team.wait_copies();
    stage(t + kCtcStages - 1);
    const T* e = sm.emit(0, buf);
    const T* prev = sm.rows(0, p);
    T* next = sm.rows(0, p ^ 1);
    unsigned char* move = moves + t * a.K;
    for (int s = team.rank(); s < K; s += team.size()) {
      const T x0 = prev[s], x1 = prev[s - 1], x2 = sm.skip[s] ? prev[s - 2] : zero;
      const bool two = x2 > x1 && x2 > x0, step = !two && x1 > x0;
      next[s] = (two ? x2 : step ? x1 : x0) + e[s];
      move[s] = two ? 2 : step ? 1 : 0;
    }
    team.barrier();
    p ^= 1;
  }
  if (!lead) return;
  const T* last = sm.rows(0, p);
  int64_t s = (K >= 2 && !(last[K - 1] > last[K - 2])) ? K - 2 : K - 1;
  a.total[b] = last[s];
  if (last[s] == zero) return;  // no path: none to walk
  for (int64_t t = L - 1; t >= 0; --t) {
    path[t] = s;
    s -= moves[t * a.K + s];
  }
}

}  // namespace semiring_ops
