// The tiled contraction engine shared by every CUDA kernel of the project.
//
// Problem: for each batch p and each output (r, s), fold over t = 0 .. T-1
//     state(p, r, s) <- cell(state, {L_f[p, r, t]}_f, {R_f[p, t, s]}_f, t)
// where L_0..L_{NL-1} are "left" fields indexed [p, r, t], R_0..R_{NR-1} are "right" fields indexed
// [p, t, s], and the state may be seeded from an "output-indexed" field O[p, r, s]. Every field is a
// pointer plus three int64 element strides (any strides; a batch stride of 0 is a broadcast).
//
// The engine owns the orchestration; a Policy owns the arithmetic. A Policy is a struct with
//   using scalar_t, acc_t;              element type of the fields; staging / accumulation type
//   using Shape = TileShape<...>;       the tile shape (see TileShape)
//   static constexpr int kNumLeft, kNumRight;   number of left / right fields (>= 1 each)
//   static constexpr bool kHasOutField;         whether the output-indexed field is read
//   struct State;                       per-output register state (a trivial aggregate)
//   struct Params;                      the policy's own kernel arguments (output pointers, ...)
//   __device__ static acc_t load_left(int f, acc_t x);   per-field transforms, applied once when a
//   __device__ static acc_t load_right(int f, acc_t x);  tile is staged into shared memory (f is a
//   __device__ static acc_t load_out(acc_t x);           compile-time constant after unrolling)
//   __device__ static void init(State&, acc_t o);        o = load_out(O[p, r, s]) (0 without O)
//   __device__ static void cell(State&, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
//                               int32_t t);              t is the global index, fed in increasing order
//   static constexpr int kChunk;        optional (default 1): with kChunk > 1, full t-tiles go to
//   __device__ static void cell_chunk<U>(State&, const acc_t (&l)[U][kNumLeft],
//                               const acc_t (&r)[U][kNumRight], int32_t t0)
//                                       U = kChunk consecutive t at once (t0, t0 + 1, ...), so a state
//                                       can amortise work over them (logsumexp: one rescale per chunk)
//   __device__ static void store(const State&, const Params&, int64_t idx);
//                                       idx = (p * R + r) * S + s, the offset into a contiguous
//                                       (B, R, S) output; called only for in-range outputs.
//   static constexpr bool kIndexedCells; optional (default false): then the engine calls
//   __device__ static void cell_at(State&, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
//                               int32_t t, int idx)  instead of cell, idx = (t' * TM + i) * TN + j the
//                                       term's place in the tile (t' its row in a full t-tile, 0 in the
//                                       partial one; (i, j) its output in the micro-tile): a constant once
//                                       the loops are unrolled, so a policy can send a fixed share of the
//                                       terms down another path (another pipe) at no cost
//   static constexpr bool kGuardedTiles; optional (default false): full t-tiles after the first run a fast
//                                       path, then a check, and on failure the exact path (cell_chunk / cell)
//                                       again from the state as it was (the fast path must leave it so):
//   __device__ static void cell_fast(State&, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
//                               int idx)         every term of the tile, idx as for cell_at (t' = 0 first)
//   __device__ static bool tile_ok(const State&);  whether the fast path's tile may be kept
//   __device__ static void tile_commit(State&);    keep it (called when every state of the thread is ok)
// A new operation is one such struct, a launcher in a *_kernels.cu file that calls launch_contraction<Shape> with
// contraction_kernel<Policy> (tile_launch.h; explicitly instantiated there), and a host function (*_cuda.cpp) that
// fills the ContractionArgs (contraction.h, contraction_host.h) and calls the launcher.
//
// Kernel structure: one block computes a BM x BN output tile of one batch (grid.x enumerates the
// tiles, grid.y strides over the batch); each thread owns a TM x TN micro-tile of states in registers.
// The reduction runs in t-tiles of BK: each tile of every field is read from global memory into
// registers (loop order chosen per field from its strides so that the warp reads along the smaller
// stride), then converted to acc_t, transformed and written to shared memory as [BK][BM] / [BK][BN]
// (rows padded by one 16-byte vector), from where each thread reads its TM rows / TN columns as
// vector loads. Shared memory is double-buffered and the next tile's global reads are issued before
// the current tile is computed, so one barrier per t-tile suffices. Out-of-range rows / columns are
// staged as 0 and never stored; the compute loop stops at the tile's true length, so padded t values
// never reach a policy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda/contraction.h"
#include "cuda/shared_span.cuh"
#include "cuda/tile_launch.h"  // TileShape; the launcher (host code: NVRTC compiles the kernel alone)

namespace semiring_ops {
namespace cuda {

// The kernel's arguments for a Policy (contraction.h).
template <class Policy>
using ArgsOf = ContractionArgs<typename Policy::scalar_t, Policy::kNumLeft, Policy::kNumRight, typename Policy::Params>;

// Whether the term at place idx of a tile (kIndexedCells) falls in a share of kPer16 of every 16: kPer16 of each 16
// consecutive idx (one t row of a 4 x 4 micro-tile), the window rotating with idx / 16 so that every output takes
// its share of the tile's rows. A constant once the engine's loops are unrolled.
template <int kPer16>
__device__ __forceinline__ constexpr bool in_share_of_16(int idx) {
  return ((idx + 5 * (idx >> 4)) & 15) < kPer16;
}

namespace detail {

// One field's share of a t-tile, held by one thread between the global read and the shared write:
// kLoads raw elements and a bit per element telling whether it lies inside the field.
template <class T, int kLoads>
struct Staged {
  T v[kLoads];
  uint32_t valid;
};

// Which element of a field's (OUTER x BK) tile the thread stages in its load l:
// (o + l * step_o, t + l * step_t). The warp walks along the field's smaller stride (outer fastest when
// stride_outer <= stride_t), so reads coalesce for either layout.
struct StageMap {
  int o, t, step_o, step_t;
};

template <int OUTER, int BK, int kThreads>
__device__ __forceinline__ StageMap stage_map(bool outer_fastest, int tid) {
  static_assert(kThreads % OUTER == 0 && kThreads % BK == 0,
                "staging assumes the thread count is a multiple of BM, BN and BK");
  if (outer_fastest) return {tid % OUTER, tid / OUTER, 0, kThreads / OUTER};
  return {tid / BK, tid % BK, kThreads / BK, 0};
}

template <int OUTER, int BK, int kThreads, class T>
__device__ __forceinline__ StageMap stage_map(const OperandField<T>& f, int tid) {
  return stage_map<OUTER, BK, kThreads>(f.stride_outer <= f.stride_t, tid);
}

// Global -> registers for the tile at (outer0, k0) of one field. Offset: the type of the in-batch offsets;
// int32_t where the caller has checked that they fit (fewer live registers: the compiler hoists one
// address per load out of the k loop).
template <int kLoads, class T, class Offset = int64_t>
__device__ __forceinline__ void fetch_field(Staged<T, kLoads>& st, const OperandField<T>& f, const StageMap& m,
                                            int64_t p, int outer0, int outer_end, int k0, int depth) {
  const T* base = f.ptr + p * f.stride_p;
  st.valid = 0;
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const int go = outer0 + m.o + l * m.step_o, gt = k0 + m.t + l * m.step_t;
    T x = T(0);
    if (go < outer_end && gt < depth) {
      x = base[static_cast<Offset>(go) * static_cast<Offset>(f.stride_outer) +
               static_cast<Offset>(gt) * static_cast<Offset>(f.stride_t)];
      st.valid |= 1u << l;
    }
    st.v[l] = x;
  }
}

// The engine's reads of one field, as a cursor that walks the t-tiles: the address of the thread's load 0 at the
// current tile (advanced by BK along t after each fetch), the distance between its loads (the same for every thread:
// the compiler keeps it in a uniform register) and which loads lie inside the field's outer extent (fixed for the
// block). A fetch then costs per load one 64-bit add and the read; the t extent is checked only in the last tile.
// (fetch_field computed every load's 64-bit address from its indices, ~30 instructions a load.)
template <class T>
struct FieldCursor {
  const T* ptr;      // element (outer0 + m.o, k0 + m.t) of batch p
  int64_t step;      // elements from one load to the next: m.step_o * stride_outer + m.step_t * stride_t
  uint32_t outer_ok;  // bit l: load l's outer index is inside the field
};

template <int kLoads, class T>
__device__ __forceinline__ FieldCursor<T> field_cursor(const OperandField<T>& f, const StageMap& m, int64_t p,
                                                       int outer0, int outer_end) {
  FieldCursor<T> c;
  c.ptr = f.ptr + p * f.stride_p + static_cast<int64_t>(outer0 + m.o) * f.stride_outer +
          static_cast<int64_t>(m.t) * f.stride_t;
  c.step = static_cast<int64_t>(m.step_o) * f.stride_outer + static_cast<int64_t>(m.step_t) * f.stride_t;
  c.outer_ok = 0;
#pragma unroll
  for (int l = 0; l < kLoads; ++l) c.outer_ok |= (outer0 + m.o + l * m.step_o < outer_end ? 1u : 0u) << l;
  return c;
}

// Global -> registers for the cursor's tile (at k0), then the cursor moves to the next tile.
template <int BK, int kLoads, class T>
__device__ __forceinline__ void fetch_cursor(Staged<T, kLoads>& st, FieldCursor<T>& c, const OperandField<T>& f,
                                             const StageMap& m, int k0, int depth) {
  uint32_t valid = c.outer_ok;
  if (k0 + BK > depth) {  // the last tile: drop the loads past the t extent
#pragma unroll
    for (int l = 0; l < kLoads; ++l)
      if (k0 + m.t + l * m.step_t >= depth) valid &= ~(1u << l);
  }
  const T* q = c.ptr;
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    st.v[l] = ((valid >> l) & 1u) ? *q : T(0);  // a predicated read
    q += c.step;
  }
  st.valid = valid;
  c.ptr += static_cast<int64_t>(BK) * f.stride_t;
}

// Registers -> shared memory tile [BK][kPitch], converting to acc_t and applying the field's
// transform (out-of-range elements become 0). Conversion and transform happen here, after the
// current tile's compute, so the global reads stay in flight meanwhile.
template <int kPitch, class acc_t, int kLoads, class T, class Transform>
__device__ __forceinline__ void commit_field(SharedSpan<acc_t> tile, const Staged<T, kLoads>& st, const StageMap& m,
                                             Transform transform) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const int o = m.o + l * m.step_o, t = m.t + l * m.step_t;
    tile[t * kPitch + o] = ((st.valid >> l) & 1u) ? transform(static_cast<acc_t>(st.v[l])) : acc_t(0);
  }
}

}  // namespace detail

// ---------------------------------------------------------------- the kernel

namespace detail {

// Policy::kChunk, or 1 when the policy has none.
template <class P, class = void>
struct ChunkOf {
  static constexpr int value = 1;
};
template <class P>
struct ChunkOf<P, std::void_t<decltype(P::kChunk)>> {
  static constexpr int value = P::kChunk;
};

// Policy::kIndexedCells / Policy::kGuardedTiles, or false when the policy has none.
template <class P, class = void>
struct IndexedOf {
  static constexpr bool value = false;
};
template <class P>
struct IndexedOf<P, std::void_t<decltype(P::kIndexedCells)>> {
  static constexpr bool value = P::kIndexedCells;
};
template <class P, class = void>
struct GuardedOf {
  static constexpr bool value = false;
};
template <class P>
struct GuardedOf<P, std::void_t<decltype(P::kGuardedTiles)>> {
  static constexpr bool value = P::kGuardedTiles;
};

// The kernel's pieces, as force-inlined functions so that the register arrays they take by reference
// (states, staged loads) never leave registers.
template <class Policy>
struct Engine {
  using Shape = typename Policy::Shape;
  using scalar_t = typename Policy::scalar_t;
  using acc_t = typename Policy::acc_t;
  using State = typename Policy::State;
  static constexpr int BM = Shape::BM, BN = Shape::BN, BK = Shape::BK, TM = Shape::TM, TN = Shape::TN;
  static constexpr int kThreads = Shape::kThreads;
  static constexpr int NL = Policy::kNumLeft, NR = Policy::kNumRight;
  // Rows padded by one 16-byte vector: keeps vector reads aligned and spreads the column-wise
  // writes of t-fastest staging over the banks.
  static constexpr int kPad = 16 / static_cast<int>(sizeof(acc_t));
  static constexpr int kPitchM = BM + kPad, kPitchN = BN + kPad;
  static constexpr int kTileL = BK * kPitchM, kTileR = BK * kPitchN;  // one field's tile, in elements
  using Span = SharedSpan<acc_t>;  // a place in the shared tiles
  static constexpr int kLoadsL = BM * BK / kThreads, kLoadsR = BN * BK / kThreads;
  static_assert(NL >= 1 && NR >= 1, "the engine needs at least one left and one right field");
  static_assert((kPitchM * sizeof(acc_t)) % 16 == 0 && (kPitchN * sizeof(acc_t)) % 16 == 0,
                "shared rows must stay 16-byte aligned");

  using StagedL = Staged<scalar_t, kLoadsL>;
  using StagedR = Staged<scalar_t, kLoadsR>;

  static __device__ __forceinline__ void init(State (&st)[TM][TN], const ArgsOf<Policy>& args, int64_t p,
                                              int r_base, int s_base) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        acc_t o = acc_t(0);
        if constexpr (Policy::kHasOutField) {
          const int r = r_base + i, s = s_base + j;
          if (r < args.rows && s < args.cols) {
            const OutField<scalar_t>& of = args.out_field;
            o = Policy::load_out(static_cast<acc_t>(of.ptr[p * of.stride_p + static_cast<int64_t>(r) * of.stride_r +
                                                           static_cast<int64_t>(s) * of.stride_s]));
          }
        }
        Policy::init(st[i][j], o);
      }
    }
  }

  // The staging maps of all fields (fixed for the whole kernel).
  static __device__ __forceinline__ void stage_maps(StageMap (&ml)[NL], StageMap (&mr)[NR],
                                                    const ArgsOf<Policy>& args, int tid) {
#pragma unroll
    for (int f = 0; f < NL; ++f) ml[f] = stage_map<BM, BK, kThreads>(args.left[f], tid);
#pragma unroll
    for (int f = 0; f < NR; ++f) mr[f] = stage_map<BN, BK, kThreads>(args.right[f], tid);
  }

  // The fields' cursors at the first tile of batch p.
  static __device__ __forceinline__ void cursors(FieldCursor<scalar_t> (&cl)[NL], FieldCursor<scalar_t> (&cr)[NR],
                                                 const StageMap (&ml)[NL], const StageMap (&mr)[NR],
                                                 const ArgsOf<Policy>& args, int64_t p, int r0, int s0) {
#pragma unroll
    for (int f = 0; f < NL; ++f) cl[f] = field_cursor<kLoadsL>(args.left[f], ml[f], p, r0, args.rows);
#pragma unroll
    for (int f = 0; f < NR; ++f) cr[f] = field_cursor<kLoadsR>(args.right[f], mr[f], p, s0, args.cols);
  }

  // The tile at k0 of every field (the cursors' tile), into registers; the cursors move on.
  static __device__ __forceinline__ void fetch(StagedL (&sl)[NL], StagedR (&sr)[NR], FieldCursor<scalar_t> (&cl)[NL],
                                               FieldCursor<scalar_t> (&cr)[NR], const StageMap (&ml)[NL],
                                               const StageMap (&mr)[NR], const ArgsOf<Policy>& args, int k0) {
#pragma unroll
    for (int f = 0; f < NL; ++f) fetch_cursor<BK>(sl[f], cl[f], args.left[f], ml[f], k0, args.depth);
#pragma unroll
    for (int f = 0; f < NR; ++f) fetch_cursor<BK>(sr[f], cr[f], args.right[f], mr[f], k0, args.depth);
  }

  // Staged registers -> shared buffer (tl, tr point at the buffer's first field).
  static __device__ __forceinline__ void commit(Span tl, Span tr, const StagedL (&sl)[NL], const StagedR (&sr)[NR],
                                                const StageMap (&ml)[NL], const StageMap (&mr)[NR]) {
#pragma unroll
    for (int f = 0; f < NL; ++f)
      commit_field<kPitchM, acc_t>(tl + f * kTileL, sl[f], ml[f], [f](acc_t x) { return Policy::load_left(f, x); });
#pragma unroll
    for (int f = 0; f < NR; ++f)
      commit_field<kPitchN, acc_t>(tr + f * kTileR, sr[f], mr[f], [f](acc_t x) { return Policy::load_right(f, x); });
  }

  // One reduction step: row t of the staged tiles (global index k) into every state of the micro-tile. phase: the
  // row's place in a full tile (a constant once unrolled), 0 in the partial tile (see kIndexedCells); kFast: the
  // guarded fast path (cell_fast).
  template <bool kFast = false>
  static __device__ __forceinline__ void step(State (&st)[TM][TN], Span tl, Span tr, int t, int32_t k,
                                              int ty, int tx, int phase) {
    acc_t lv[NL][TM], rv[NR][TN];
#pragma unroll
    for (int f = 0; f < NL; ++f) load_shared_vec(lv[f], tl + f * kTileL + t * kPitchM + ty * TM);
#pragma unroll
    for (int f = 0; f < NR; ++f) load_shared_vec(rv[f], tr + f * kTileR + t * kPitchN + tx * TN);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        acc_t l[NL], r[NR];
#pragma unroll
        for (int f = 0; f < NL; ++f) l[f] = lv[f][i];
#pragma unroll
        for (int f = 0; f < NR; ++f) r[f] = rv[f][j];
        const int idx = (phase * TM + i) * TN + j;
        if constexpr (kFast) {
          Policy::cell_fast(st[i][j], l, r, idx);
        } else if constexpr (IndexedOf<Policy>::value) {
          Policy::cell_at(st[i][j], l, r, k, idx);
        } else {
          Policy::cell(st[i][j], l, r, k);
        }
      }
    }
  }

  // A full t-tile on the exact path: in chunks of Policy::kChunk where the policy has them.
  static __device__ __forceinline__ void full_tile(State (&st)[TM][TN], Span tl, Span tr, int32_t k0,
                                                   int ty, int tx) {
    constexpr int U = ChunkOf<Policy>::value;
    if constexpr (U > 1 && BK % U == 0) {
#pragma unroll
      for (int t = 0; t < BK; t += U) step_chunk<U>(st, tl, tr, t, k0 + t, ty, tx);
    } else {
#pragma unroll
      for (int t = 0; t < BK; ++t) step(st, tl, tr, t, k0 + t, ty, tx, t);
    }
  }

  // A full t-tile on a guarded policy's fast path (kGuardedTiles). Returns whether every state passed the check
  // and was committed; otherwise no state was committed, and the caller redoes the tile with full_tile.
  static __device__ __forceinline__ bool fast_tile(State (&st)[TM][TN], Span tl, Span tr, int ty,
                                                   int tx) {
#pragma unroll
    for (int t = 0; t < BK; ++t) step<true>(st, tl, tr, t, 0, ty, tx, t);
    bool ok = true;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) ok &= Policy::tile_ok(st[i][j]);
    }
    if (ok) {
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) Policy::tile_commit(st[i][j]);
      }
    }
    return ok;
  }

  // U consecutive reduction steps (rows t0 .. t0 + U - 1, global indices k0 ..) through Policy::cell_chunk.
  template <int U>
  static __device__ __forceinline__ void step_chunk(State (&st)[TM][TN], Span tl, Span tr, int t0,
                                                    int32_t k0, int ty, int tx) {
    acc_t lv[U][NL][TM], rv[U][NR][TN];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int f = 0; f < NL; ++f) load_shared_vec(lv[u][f], tl + f * kTileL + (t0 + u) * kPitchM + ty * TM);
#pragma unroll
      for (int f = 0; f < NR; ++f) load_shared_vec(rv[u][f], tr + f * kTileR + (t0 + u) * kPitchN + tx * TN);
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        acc_t l[U][NL], r[U][NR];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int f = 0; f < NL; ++f) l[u][f] = lv[u][f][i];
#pragma unroll
          for (int f = 0; f < NR; ++f) r[u][f] = rv[u][f][j];
        }
        Policy::template cell_chunk<U>(st[i][j], l, r, k0);
      }
    }
  }

  static __device__ __forceinline__ void store(const State (&st)[TM][TN], const ArgsOf<Policy>& args,
                                               int64_t p, int r_base, int s_base) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int r = r_base + i, s = s_base + j;
        if (r < args.rows && s < args.cols)
          Policy::store(st[i][j], args.params, (p * args.rows + r) * args.cols + s);
      }
    }
  }
};

}  // namespace detail

template <class Policy>
__global__ void __launch_bounds__(Policy::Shape::kThreads, Policy::Shape::kMinBlocks)
    contraction_kernel(const __grid_constant__ ArgsOf<Policy> args) {
  using E = detail::Engine<Policy>;
  using acc_t = typename E::acc_t;
  constexpr int BK = E::BK;

  // [buffer][field][t][outer]
  __shared__ __align__(16) acc_t smem_l[2 * E::NL * E::kTileL];
  __shared__ __align__(16) acc_t smem_r[2 * E::NR * E::kTileR];

  const detail::SharedSpan<acc_t> smem_l_at = SEMIRING_OPS_SHARED_SPAN(smem_l);
  const detail::SharedSpan<acc_t> smem_r_at = SEMIRING_OPS_SHARED_SPAN(smem_r);
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % Policy::Shape::kThreadsN, ty = tid / Policy::Shape::kThreadsN;
  const int r0 = static_cast<int>(blockIdx.x / args.tiles_n) * E::BM;
  const int s0 = static_cast<int>(blockIdx.x % args.tiles_n) * E::BN;
  const int r_base = r0 + ty * E::TM, s_base = s0 + tx * E::TN;  // this thread's micro-tile
  const int T = args.depth;
  const int num_tiles = (T + BK - 1) / BK;
  detail::StageMap map_l[E::NL], map_r[E::NR];
  E::stage_maps(map_l, map_r, args, tid);

  for (int64_t p = blockIdx.y; p < args.batch; p += gridDim.y) {
    typename E::State st[E::TM][E::TN];
    E::init(st, args, p, r_base, s_base);

    typename E::StagedL stage_l[E::NL];
    typename E::StagedR stage_r[E::NR];
    detail::FieldCursor<typename E::scalar_t> cur_l[E::NL], cur_r[E::NR];
    E::cursors(cur_l, cur_r, map_l, map_r, args, p, r0, s0);
    if (num_tiles > 0) {
      E::fetch(stage_l, stage_r, cur_l, cur_r, map_l, map_r, args, 0);
      E::commit(smem_l_at, smem_r_at, stage_l, stage_r, map_l, map_r);
      __syncthreads();
    }
    for (int kt = 0; kt < num_tiles; ++kt) {
      const int buf = kt & 1;
      const int k0 = kt * BK;
      const bool has_next = kt + 1 < num_tiles;
      // the next tile's reads, in flight during the compute
      if (has_next) E::fetch(stage_l, stage_r, cur_l, cur_r, map_l, map_r, args, k0 + BK);
      const auto tl = smem_l_at + buf * E::NL * E::kTileL;
      const auto tr = smem_r_at + buf * E::NR * E::kTileR;
      const int len = min(BK, T - k0);
      if (len == BK) {
        if constexpr (detail::GuardedOf<Policy>::value) {
          // the first tile sets the states up on the exact path; a later one takes the fast path, and the exact
          // path again where the check fails (rare: a thread's branch, for its 16 states at once)
          if (kt == 0 || !E::fast_tile(st, tl, tr, ty, tx)) E::full_tile(st, tl, tr, k0, ty, tx);
        } else {
          E::full_tile(st, tl, tr, k0, ty, tx);
        }
      } else {  // the last, partial tile: stop at its true length
#pragma unroll 1
        for (int t = 0; t < len; ++t) E::step(st, tl, tr, t, k0 + t, ty, tx, 0);
      }
      // The other buffer was last read in iteration kt - 1, which ended with a barrier.
      if (has_next)
        E::commit(smem_l_at + (buf ^ 1) * E::NL * E::kTileL,
                  smem_r_at + (buf ^ 1) * E::NR * E::kTileR, stage_l, stage_r, map_l, map_r);
      __syncthreads();
    }

    E::store(st, args, p, r_base, s_base);
  }
}

}  // namespace cuda
}  // namespace semiring_ops
