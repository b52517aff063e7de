// The fused linear chains' kernels (semiring_ops::chain_scan, chain_viterbi, chain_log_backward, crf_log_likelihood:
// contracts in ops.h; host side chain_cuda.cpp, launchers chain_launch.h, instantiated by chain_kernels_*.cu).
//
// One thread block per chain walks the chain's whole length in one launch ("persistent" over t): the
// vector of the current step lives in shared memory, and so does the step matrix (in the kernel domain)
// when it fits, else it is read from global memory (L2) at every step. On sm_90+ a chain may instead take
// a cluster of K blocks (kCluster): block r keeps output rows [r S, r S + S) of the matrix on chip (S =
// ceil(C / K)), computes those outputs of each step, writes them into every block's next vector through
// distributed shared memory (st.async, each write counted by the receiver's mbarrier: no cluster-wide
// barrier per step, whose release fence drains every global store), so a large C (whose matrix fits no
// single SM) runs from shared memory on K SMs. A step
//     u[o] = (+)_k vec[k] (x) M[o, k]        (M output-major)
// gives each output a group of G lanes (G a power of two, chosen per C: about 8 or more terms per lane and
// at most 512 threads when M is on chip; a whole warp reading consecutive k of a row from L2 otherwise);
// the group's lanes split k, the log semiring folding its terms 4 at a time (one rescale per 4,
// LogSumExp2Accumulator::add_chunk), and merge with shuffles (merge() of semiring.h). On-chip rows are
// padded to a pitch P = G (mod 32), so the 32 / G groups of a warp read distinct banks. Viterbi keeps int16
// back-pointers (in shared memory when they fit) and backtracks in the same kernel, so a decode is one
// launch. Given gold tag paths (a CRF's loss), the block also sums the gold path's score, so the forward
// scan yields the log-likelihood and the reverse scan its whole gradient.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chain_launch.h"
#include "cuda/cluster.cuh"
#include "cuda/kernel_ref.h"
#include "semiring.h"
#if SEMIRING_OPS_DEVICE_PASS
#include <cmath>  // NAN
#include <cstring>
#include <limits>
#include <type_traits>

#include "warp_merge.cuh"
#endif
#if !defined(__CUDACC_RTC__)
#include <algorithm>
#include <limits>

#include "cuda/device_attributes.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace chain {  // named (not anonymous), so that NVRTC can name the kernel

constexpr int kMaxWarps = 16;  // 512 threads: up to 128 registers each

#if SEMIRING_OPS_DEVICE_PASS

// exp(x) for the gradient epilogue, as one ex2 of x scaled to base 2 (x = -inf gives 0).
template <class T> __device__ __forceinline__ T exp_e(T x) { return fast_exp2(x * T(kLog2e)); }

// trans[i, j] (user domain).
template <class T> __device__ __forceinline__ T transition(const ChainParams<T>& p, int64_t i, int64_t j) {
  return p.trans[i * p.trs0 + j * p.trs1];
}

// The log-semiring score of chain b's gold path (ChainParams::gold) over its first L steps, summed by the
// whole block (every thread calls this and gets the sum; red: 32 elements of shared scratch).
template <class T>
__device__ T gold_path_score(const ChainParams<T>& p, int64_t b, int64_t L, const T* start, const T* end, T* red) {
  const int64_t* y = p.gold + b * p.gs0;
  const T* em = p.em + b * p.es0;
  T sum = T(0);
  for (int64_t t = threadIdx.x; t < L; t += blockDim.x) {
    const int64_t cur = y[t * p.gs1], prev = t == 0 ? 0 : y[(t - 1) * p.gs1];
    if (cur < 0 || cur >= p.C || prev < 0 || prev >= p.C) {  // unvalidated tags: NaN, never a stray read
      sum = T(NAN);
      break;
    }
    sum += em[t * p.es1 + cur * p.es2] + (t == 0 ? start[cur] : transition(p, prev, cur));
    if (t == L - 1) sum += end[cur];
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < int(blockDim.x >> 5); ++w) total += red[w];
  return total;
}

#endif  // SEMIRING_OPS_DEVICE_PASS

// Shared memory, in this order: 32 bytes for the mbarriers of the step vectors (clusters); the step vectors,
// a ring of kRing(kCluster) (C each: 2, or 3 with clusters, so that a block that runs a step ahead writes
// into a buffer its peers no longer read); the block's S output rows of the step matrix (pitch P,
// kMatShared; S = C without clusters); for kGrad two rows of alpha (2 C) and, for kXi, the block's rows of
// the pair-marginal sums (S * C); a block reduction's scratch (32); the block's back-pointers (T * S int16,
// kArg, when they fit).
constexpr int ring_size(bool cluster) { return cluster ? 3 : 2; }

template <class T> struct ChainSmem {
  static size_t bytes(int C, int S, int P, int Tn, bool mat, bool ptr, bool grad, bool xi, bool cluster) {
    size_t n = (ring_size(cluster) * size_t(C) + (mat ? size_t(S) * P : 0) + (grad ? 2 * size_t(C) : 0) +
                (xi ? size_t(S) * C : 0) + 32) *
               sizeof(T);
    return 32 + n + (ptr ? size_t(Tn) * S * sizeof(int16_t) : 0);
  }
};

#if SEMIRING_OPS_DEVICE_PASS
template <class S, class T, bool kArg, bool kMatShared, bool kGrad, bool kXi, bool kCluster>
__global__ void __launch_bounds__(kMaxWarps * 32) chain_kernel(ChainParams<T> p) {
  using Acc = typename S::template Accumulator<T, kArg>;
  // the log semiring folds 4 terms per rescale (LogSumExp2Accumulator::add_chunk)
  constexpr bool kChunked = std::is_same<S, LogSemiring>::value;
  static_assert(!kGrad || std::is_same<S, LogSemiring>::value, "the gradient epilogue is the log semiring's");
  static_assert(!kXi || (kGrad && kMatShared), "pair marginals need the gradient and the matrix on chip");
  static_assert(!kCluster || kMatShared, "a cluster splits an on-chip matrix");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int C = p.C, Tn = p.steps;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem_raw);  // kCluster: one mbarrier per ring buffer
  constexpr int kRing = ring_size(kCluster);
  T* ring = reinterpret_cast<T*>(smem_raw + 32);  // step s writes ring[s % kRing] (C each), kernel domain
  T* vec = ring;                                  // the step's input
  const int P = p.pitch, G = p.group, K = kCluster ? p.cluster : 1, Sl = kCluster ? p.slice : C;
  T* mat_s = ring + kRing * C;                  // (Sl, P) kernel domain, when kMatShared
  T* arow = mat_s + (kMatShared ? Sl * P : 0);  // kGrad: alpha[t] - log_z, kernel domain, two rows
  T* xi = arow + (kGrad ? 2 * C : 0);           // kXi: sum over this chain's t of g * pair marginals (Sl, C)
  T* red = xi + (kXi ? Sl * C : 0);             // block-reduction scratch (32)
  int16_t* ptr_s = reinterpret_cast<int16_t*>(red + 32);  // (T, Sl)
  // this block's outputs: [o_begin, o_end) (all of them without clusters)
  const int rank = kCluster ? cluster_rank() : 0;
  const int o_begin = min(C, rank * Sl), o_end = min(C, o_begin + Sl), rows = o_end - o_begin;
  if constexpr (kCluster) {  // every block owns >= 1 output (the host's K = ceil(C / S))
    if (threadIdx.x < kRing) barrier_init(bars + threadIdx.x, 1);
  }
  // work shared by a chain's blocks (filling the rows past the length): this block's first index and stride
  const int spread0 = rank * blockDim.x + threadIdx.x, spread = K * blockDim.x;
  const int64_t b = blockIdx.x / K;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t given = p.lengths[b];
  // kInvalidLength (a bad sequence found under graph capture) or any length outside 0..T: NaN results
  const bool invalid = given < 0 || given > Tn;
  const int64_t L = invalid ? 0 : given;
  const T* em = p.em + b * p.es0;
  // back-pointer of output o at step t: global (t, C) rows, or this block's (t, Sl) rows on chip
  int16_t* ptr_g = p.pointers ? p.pointers + b * int64_t(Tn) * C : nullptr;
  auto pointer_slot = [&](int64_t t, int o) -> int16_t* {
    return ptr_g ? ptr_g + t * C + o : ptr_s + t * Sl + (o - o_begin);
  };
  auto read_pointer = [&](int64_t t, int o) -> int {  // any block's (the backtrack)
    if (ptr_g) return ptr_g[t * C + o];
    const int owner = o / Sl;
    const int16_t* src = kCluster ? cluster_peer(ptr_s, owner) : ptr_s;
    return src[t * Sl + (o - owner * Sl)];
  };

  if constexpr (kMatShared) {
    // output-major: row o is what step outputs o read (forward: trans[:, o]; reverse: trans[o, :])
    for (int i = threadIdx.x; i < rows * C; i += blockDim.x) {
      const int r = i / C, k = i - r * C, o = o_begin + r;
      mat_s[r * P + k] = S::to_kernel(p.reverse ? transition(p, o, k) : transition(p, k, o));
    }
  }
  if (p.scores) {
    T* sc = p.scores + b * int64_t(Tn) * C;
    for (int64_t i = L * C + spread0; i < int64_t(Tn) * C; i += spread) sc[i] = S::template zero<T>();
  }
  if (p.tags) {
    for (int64_t t = L + spread0; t < Tn; t += spread) p.tags[b * Tn + t] = -1;
  }

  const T* start = p.reverse ? p.boundary_out : p.boundary_in;
  const T* end = p.reverse ? p.boundary_in : p.boundary_out;
  const T gold = p.gold ? gold_path_score(p, b, L, start, end, red) : T(0);

  // The gradient epilogue (kGrad): weights are g * exp(score - log_z), and none when log_z (or the gold
  // path's score) is -inf.
  T grad = T(0), neg_log_z = T(0);
  const T* alpha = nullptr;
  if constexpr (kGrad) {
    const T z = p.log_z[b];
    // no gradient for an impossible chain; NaN for unvalidated (out-of-range) tags
    // with gold paths the loss is sum_b g_b (gold_b - log_z_b): the marginals weigh -g, the gold path +g
    const T g = p.grad[b * p.grad_stride];
    grad = invalid        ? T(NAN)
           : gold != gold ? gold
           : (z == -pos_inf<T>() || gold == -pos_inf<T>()) ? T(0)
                                                          : (p.gold ? -g : g);
    if (p.grad_used && rank == 0 && threadIdx.x == 0) p.grad_used[b] = grad;
    if (p.gold && grad != T(0) && grad == grad) {  // the gold path's transitions: -grad each
      const int64_t* y = p.gold + b * p.gs0;
      for (int64_t t = spread0 + 1; t < L; t += spread)
        atomicAdd(p.g_trans_gold + y[(t - 1) * p.gs1] * C + y[t * p.gs1], -grad);
    }
    neg_log_z = z == -pos_inf<T>() ? T(0) : -z;
    alpha = p.alpha + b * int64_t(Tn) * C;
    T* ge = p.g_em + b * int64_t(Tn) * C;
    for (int64_t i = L * C + spread0; i < int64_t(Tn) * C; i += spread) ge[i] = invalid ? T(NAN) : T(0);
    if constexpr (kXi) {
      for (int i = threadIdx.x; i < rows * C; i += blockDim.x) xi[i] = T(0);
    }
    // alpha[t] - log_z in the kernel domain, for the pair marginals of step t -> t + 1
    if (L > 1)
      for (int i = threadIdx.x; i < C; i += blockDim.x) arow[C + i] = S::to_kernel(alpha[(L - 2) * C + i] + neg_log_z);
  }

  // Output o of step t, from u (user domain), the emission e, alpha[t, o] and the gold tag y at t (kGrad):
  // record() stores its score and its marginal (the block that owns o), emit() also passes it on as the
  // next step's input, to every block of the cluster.
  auto record = [&](int o, int64_t t, T u, T through, T a, int64_t y) {
    if (p.scores) p.scores[(b * Tn + t) * C + o] = p.reverse ? u : through;
    if constexpr (kGrad) {
      T m = grad * exp_e(a + u + neg_log_z);
      if (y == o) m -= grad;
      p.g_em[(b * Tn + t) * C + o] = m;
      if (t == 0) atomicAdd(p.g_start + o, m);
      if (t == L - 1) atomicAdd(p.g_end + o, m);
    }
  };
  auto emit = [&](int o, int64_t t, T u, T e, T a, int64_t y, int slot) {
    const T through = S::times(u, e);
    record(o, t, u, through, a, y);
    const T next = S::to_kernel(through);
    ring[slot * C + o] = next;
    if constexpr (kCluster) {
      const uint32_t local = shared_address(ring + slot * C + o), bar = shared_address(bars + slot);
      for (int j = 0; j < K; ++j)
        if (j != rank) store_async(peer_address(local, j), next, peer_address(bar, j));
    }
  };
  auto alpha_at = [&](int64_t t, int o) { return kGrad ? alpha[t * C + o] : T(0); };
  auto gold_at = [&](int64_t t) { return kGrad && p.gold ? p.gold[b * p.gs0 + t * p.gs1] : int64_t(-1); };

  if (L > 0) {  // the first step: each block computes all C inputs (no remote writes before the barrier)
    const int64_t t0 = p.reverse ? L - 1 : 0;
    for (int o = threadIdx.x; o < C; o += blockDim.x) {
      const T u = p.boundary_in[o], through = S::times(u, em[t0 * p.es1 + o * p.es2]);
      if (o >= o_begin && o < o_end) record(o, t0, u, through, alpha_at(t0, o), gold_at(t0));
      vec[o] = S::to_kernel(through);
    }
  }
  // with clusters: every block has started and initialised its mbarriers (it may take remote writes)
  if constexpr (kCluster) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  // xi's share of each thread (kXi; blockDim >= C): column j, rows o_begin + i0, + xi_rows, ...
  const int xi_rows = blockDim.x / C, xi_j = threadIdx.x % C;
  const int xi_i0 = threadIdx.x < xi_rows * C ? threadIdx.x / C : C;
  // Outputs per lane group: 1 with the matrix on chip (G lanes split a row); 4 with rows read from L2
  // (G = 32), four independent accumulators in flight.
  constexpr int R = kMatShared ? 1 : 4;
  const int log_g = __ffs(G) - 1;  // G is a power of two: shifts, not divisions, in the step loop
  const int group = lane >> log_g, gl = lane & (G - 1), per_warp = (32 >> log_g) * R;
  auto t_of = [&](int64_t s) -> int64_t { return p.reverse ? L - 1 - s : s; };
  T alpha_ahead = T(0);  // kXi: alpha[t - 1, threadIdx.x] for the next step's arow, loaded a step early
  if constexpr (kXi) {
    if (L > 2 && threadIdx.x < C) alpha_ahead = alpha[(L - 3) * C + threadIdx.x];
  }
  for (int64_t s = 1; s < L; ++s) {
    const int64_t t = t_of(s);
    const int slot = static_cast<int>(s % kRing);  // vec = ring[(s - 1) % kRing]
    if constexpr (kCluster) {  // the peers' outputs of this step: (C - rows) values into ring[slot]
      if (threadIdx.x == 0) barrier_expect(bars + slot, unsigned(C - rows) * sizeof(T));
    }
    if constexpr (kXi) {
      // pairs (t, t + 1): xi[i, j] += g exp(alpha[t, i] + trans[i, j] + em[t + 1, j] + beta[t + 1, j] - log_z),
      // with vec = em[t + 1] + beta[t + 1] and mat_s[i * P + j] = trans[i, j], all in the kernel domain
      const T* a_t = arow + (s & 1) * C;
      const T v_j = vec[xi_j];
      for (int i = o_begin + xi_i0; i < o_end; i += xi_rows) {
        const int r = i - o_begin;
        xi[r * C + xi_j] += grad * fast_exp2(a_t[i] + mat_s[r * P + xi_j] + v_j);
      }
      if (t > 0 && threadIdx.x < C) {  // the next step's row, loaded a step ago; then the one after
        arow[((s + 1) & 1) * C + threadIdx.x] = S::to_kernel(alpha_ahead + neg_log_z);
        if (t > 1) alpha_ahead = alpha[(t - 2) * C + threadIdx.x];
      }
    }
    for (int o0 = o_begin + warp * per_warp; o0 < o_end; o0 += nwarps * per_warp) {
      // the group's lanes 0 .. R-1 emit its outputs ob .. ob + R - 1
      const int ob = o0 + group * R, o_mine = ob + gl;
      const bool emitter = gl < R && o_mine < o_end;  // loads issued now, their latency hidden by the step
      const T e_mine = emitter ? em[t * p.es1 + o_mine * p.es2] : T(0);
      const T a_mine = emitter ? alpha_at(t, o_mine) : T(0);
      const int64_t y_mine = emitter ? gold_at(t) : int64_t(-1);
      // output o's term k; rows past this block's last repeat it and are never stored
      auto term = [&](int o, int k) {
        o = min(o, o_end - 1);
        const T m = kMatShared ? mat_s[(o - o_begin) * P + k] : S::to_kernel(__ldg(p.mat + int64_t(o) * C + k));
        return S::times(vec[k], m);
      };
      Acc acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r].init();
      if constexpr (kChunked && kMatShared) {
        // one output (R = 1) from shared memory: whole chunks of 4 unchecked, then the ragged tail
        const T* row = mat_s + (min(ob, o_end - 1) - o_begin) * P;
        int k0 = gl;
#pragma unroll 2
        for (; k0 + 3 * G < C; k0 += 4 * G) {
          T x[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) x[u] = S::times(vec[k0 + u * G], row[k0 + u * G]);
          acc[0].template add_chunk<4>(x);
        }
        if (k0 < C) {
          T x[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) x[u] = k0 + u * G < C ? S::times(vec[k0 + u * G], row[k0 + u * G]) : -pos_inf<T>();
          acc[0].template add_chunk<4>(x);
        }
      } else if constexpr (kChunked) {
        for (int k0 = gl; k0 < C; k0 += 4 * G) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            T x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) x[u] = k0 + u * G < C ? term(ob + r, k0 + u * G) : -pos_inf<T>();
            acc[r].template add_chunk<4>(x);
          }
        }
      } else if constexpr (kMatShared) {
        const T* row = mat_s + (min(ob, o_end - 1) - o_begin) * P;
#pragma unroll 4
        for (int k = gl; k < C; k += G) acc[0].add(S::times(vec[k], row[k]), k);
      } else {
#pragma unroll 4  // several k in flight: from global memory (large C) each load waits on L2
        for (int k = gl; k < C; k += G) {
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r].add(term(ob + r, k), k);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        for (int mask = G >> 1; mask > 0; mask >>= 1) acc[r].merge(shfl_xor(acc[r], mask));
        if (emitter && gl == r) {
          emit(o_mine, t, acc[r].result(), e_mine, a_mine, y_mine, slot);
          if constexpr (kArg) *pointer_slot(t, o_mine) = static_cast<int16_t>(acc[r].arg());
        }
      }
    }
    __syncthreads();  // this block's outputs are in; it no longer reads vec
    // the peers' outputs: the n-th use of a buffer waits for its mbarrier's phase n (parity n mod 2)
    if constexpr (kCluster) barrier_wait(bars + slot, unsigned((s - 1) / kRing) & 1u);
    vec = ring + slot * C;
  }
  // with clusters: the back-pointers (read across the cluster by the backtrack) and every step are in
  if constexpr (kCluster) cluster_sync();

  if constexpr (kXi) {
    for (int idx = threadIdx.x; idx < rows * C; idx += blockDim.x)
      if (L > 1) atomicAdd(p.g_trans + o_begin * C + idx, xi[idx]);
  }
  if (warp == 0 && rank == 0) {
    Acc acc;
    acc.init();
    if (L > 0)
      for (int c = lane; c < C; c += 32) acc.add(S::times(vec[c], S::to_kernel(p.boundary_out[c])), c);
    warp_merge(acc);
    if (lane == 0) {
      const T total = L > 0 ? acc.result() : S::template one<T>();
      // the length read again (not kept live across the steps: a register the step loop wants)
      const int64_t again = p.lengths[b];
      const bool bad = again < 0 || again > Tn;
      p.total[b] = bad ? T(NAN) : total;
      if (p.llh) p.llh[b] = bad ? T(NAN) : gold == -pos_inf<T>() ? gold : gold - total;
      if constexpr (kArg) {
        if (L > 0) {
          int c = acc.arg();
          int64_t* tags = p.tags + b * Tn;
          tags[L - 1] = c;
          for (int64_t t = L - 1; t > 0; --t) {
            c = read_pointer(t, c);
            tags[t - 1] = c;
          }
        }
      }
    }
  }
  if constexpr (kCluster) {
    cluster_sync();  // no block leaves while its shared memory may be read
    if (threadIdx.x < kRing) barrier_inval(bars + threadIdx.x);  // every st.async into this block has landed
  }
}

#endif  // SEMIRING_OPS_DEVICE_PASS

// ---------------------------------------------------------------- the host's plan and launch
#if !defined(__CUDACC_RTC__)

// G, lanes per output for an on-chip matrix of `rows` outputs of C terms: doubled while a lane keeps more
// than 8 terms and the block stays within 512 threads (rows = C = 8: 1, 32: 4, 64: 8, 128: 4, 256: 2;
// 32 rows of C = 512: 16).
inline int lanes_per_output(int rows, int C) {
  int g = 1;
  while (g < 32 && g * 8 < C && rows * g * 2 <= 512) g *= 2;
  return g;
}

// The smallest row pitch >= C that is G modulo 32: output row o starts at bank (o * G) mod 32, so the
// groups of a warp (consecutive o, lanes reading k = lane mod G + ...) hit distinct banks.
inline int matrix_pitch(int C, int G) { return C + (((G - C) % 32) + 32) % 32; }


template <class T> ChainPlan plan_for(int K, int C, int Tn, bool arg, bool grad, int optin) {
  ChainPlan pl;
  pl.S = std::max(1, (C + K - 1) / K);
  pl.K = K = std::max(1, (C + pl.S - 1) / pl.S);  // no block without outputs (C = 5 over 4: 2, 2, 1)
  const int G = lanes_per_output(pl.S, C);
  pl.P = matrix_pitch(C, G);
  const auto bytes = [&](bool mat, bool ptr, bool xi) {
    return ChainSmem<T>::bytes(C, pl.S, pl.P, Tn, mat, ptr, grad, xi, K > 1);
  };
  pl.mat_shared = bytes(true, false, false) <= size_t(optin);
  // the pair-marginal sums take a thread per tag (column)
  pl.xi = grad && pl.mat_shared && C <= kMaxWarps * 32 && bytes(true, false, true) <= size_t(optin);
  pl.ptr_shared = arg && bytes(pl.mat_shared, true, pl.xi) <= size_t(optin);
  pl.smem = bytes(pl.mat_shared, pl.ptr_shared, pl.xi);
  pl.G = pl.mat_shared ? G : 32;  // rows from L2: a warp reads 32 consecutive k
  // one lane group per output, at most kMaxWarps; the pair-marginal sums want at least 8 warps and C threads
  pl.warps = std::min(kMaxWarps, std::max(pl.xi ? std::max(8, (C + 31) / 32) : 1, (pl.S * pl.G + 31) / 32));
  if (K > 1 && !pl.mat_shared) return plan_for<T>(1, C, Tn, arg, grad, optin);  // clusters split on-chip rows
  return pl;
}

constexpr int kMaxCluster = 16;        // non-portable above 8: taken only where a matrix needs it
constexpr int kPortableCluster = 8;
constexpr int kMinBlockTerms = 8192;  // a cluster that spreads a small batch keeps >= 8192 terms per block

// Blocks per chain: 1 without clusters (before sm_90); else the smallest K that puts the step matrix (and
// for the gradient the pair-marginal sums, C <= 512) on chip, doubled up to 8 while the batch still takes
// one block per SM (B 2K <= SMs) and each block keeps kMinBlockTerms terms of a step (S C). H100, CRF train /
// decode in ms (docs/perf_notes.md): B=32 C=128: K=1 1.00 / 0.38, K=2 0.75 / 0.31, K=4 1.10 / 0.48;
// B=8 C=256: K=2 1.29 / 0.57, K=8 0.96 / 0.39; B=8 C=512: K=8 1.45 / 0.63, K=16 1.98 / 0.68.
// forced (SEMIRING_OPS_CHAIN_CLUSTER=K, a power of two <= 16, read and checked by the host; 1: no clusters)
// overrides for measurements; 0: choose.
template <class T>
ChainPlan choose_plan(int64_t B, int Tn, int C, bool arg, bool grad, int optin, int major, int sms, int forced) {
  const auto plan = [&](int K) { return plan_for<T>(K, C, Tn, arg, grad, optin); };
  if (major < 9 || B * kMaxCluster > std::numeric_limits<int>::max()) return plan(1);
  if (forced > 0) return plan(forced);
  const auto fits = [&](const ChainPlan& q, bool want_xi) { return q.mat_shared && (!want_xi || q.xi); };
  const bool want_xi = grad && C <= kMaxWarps * 32;
  int K = 1;
  while (K < kMaxCluster && !fits(plan(K), want_xi)) K *= 2;
  if (!fits(plan(K), want_xi)) {  // no cluster holds the pair marginals: the matrix alone, if any does
    K = 1;
    while (K < kMaxCluster && !plan(K).mat_shared) K *= 2;
    if (!plan(K).mat_shared) return plan(1);  // rows from L2 with one block per chain
  }
  while (2 * K <= kPortableCluster && B * 2 * K <= sms &&
         int64_t((C + 2 * K - 1) / (2 * K)) * C >= kMinBlockTerms)
    K *= 2;
  return plan(K);
}

// The kernel for a plan (kernel_ref.h: its address, or its NVRTC handle).
#define SEMIRING_OPS_CHAIN_KERNEL(MAT, XI, CLUSTER)                                                         \
  SEMIRING_OPS_KERNEL_OF("cuda/chain_kernels.cuh", chain::chain_kernel, S, T, SEMIRING_OPS_VALUE(kArg),     \
                         SEMIRING_OPS_VALUE(MAT), SEMIRING_OPS_VALUE(kGrad), SEMIRING_OPS_VALUE(XI),        \
                         SEMIRING_OPS_VALUE(CLUSTER))
template <class S, class T, bool kArg, bool kGrad> const void* kernel_for(const ChainPlan& q) {
  if (!q.mat_shared) return SEMIRING_OPS_CHAIN_KERNEL(false, false, false);
  if (q.K > 1) return q.xi ? SEMIRING_OPS_CHAIN_KERNEL(true, kGrad, true) : SEMIRING_OPS_CHAIN_KERNEL(true, false, true);
  return q.xi ? SEMIRING_OPS_CHAIN_KERNEL(true, kGrad, false) : SEMIRING_OPS_CHAIN_KERNEL(true, false, false);
}
#undef SEMIRING_OPS_CHAIN_KERNEL

// The kernel's dynamic shared memory (set once per kernel and device), and the non-portable cluster size it may need.
inline cudaError_t prepare(const void* k, const ChainPlan& q) {
  cudaError_t e = allow_dynamic_smem(k, int(q.smem));
  if (e == cudaSuccess && q.K > kPortableCluster) e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return e;
}

#endif  // !__CUDACC_RTC__
}  // namespace chain

#if !defined(__CUDACC_RTC__)
template <class S, class T, bool kArg, bool kGrad>
LaunchStatus chain_plan(ChainPlan& plan, int64_t B, int Tn, int C, int device, int forced_cluster) {
  using namespace chain;
  int optin = 0, major = 0, sms = 0;
  SEMIRING_OPS_CUDA_TRY(device_attribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SEMIRING_OPS_CUDA_TRY(device_attribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  SEMIRING_OPS_CUDA_TRY(device_attribute(&sms, cudaDevAttrMultiProcessorCount, device));
  plan = choose_plan<T>(B, Tn, C, kArg, kGrad, optin, major, sms, forced_cluster);
  auto kernel = kernel_for<S, T, kArg, kGrad>(plan);
  SEMIRING_OPS_CUDA_TRY(prepare(kernel, plan));
  // a 16-block cluster runs only where a GPC has 16 free SMs: 8 blocks per chain when fewer than B (or, with
  // K forced, none) run at once
  if (plan.K > kPortableCluster) {
    const int active = max_active_clusters(kernel, plan.K, plan.warps * 32, plan.smem, device);
    if (active == 0 || (active < B && forced_cluster == 0)) {
      plan = plan_for<T>(kPortableCluster, C, Tn, kArg, kGrad, optin);
      if (!plan.mat_shared) plan = plan_for<T>(1, C, Tn, kArg, kGrad, optin);
      SEMIRING_OPS_CUDA_TRY(prepare(kernel_for<S, T, kArg, kGrad>(plan), plan));
    }
  }
  return {};
}

template <class S, class T, bool kArg, bool kGrad>
LaunchStatus chain_launch(const ChainPlan& plan, const ChainParams<T>& p, int64_t B, cudaStream_t stream) {
  const void* kernel = chain::kernel_for<S, T, kArg, kGrad>(plan);
  const dim3 grid(static_cast<unsigned>(B * plan.K)), block(plan.warps * 32);
  void* args[] = {const_cast<ChainParams<T>*>(&p)};
  if (plan.K > 1) {
    const ClusterLaunch launch(plan.K, grid, block, plan.smem, stream);
    SEMIRING_OPS_CUDA_TRY(cudaLaunchKernelExC(&launch.cfg, kernel, args));
    return {};
  }
  SEMIRING_OPS_CUDA_TRY(cudaLaunchKernel(kernel, grid, block, args, plan.smem, stream));
  return last_launch();
}
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops

// One (S, T, kArg, kGrad) of the launchers, for the chain_kernels_*.cu files.
#define SEMIRING_OPS_CHAIN_LAUNCHERS(S, T, ARG, GRAD)                                                              \
  template LaunchStatus chain_plan<S, T, ARG, GRAD>(ChainPlan&, int64_t, int, int, int, int);                    \
  template LaunchStatus chain_launch<S, T, ARG, GRAD>(const ChainPlan&, const ChainParams<T>&, int64_t, cudaStream_t);
