// The route's fused selections on Hopper (semiring_ops/lazy/hopper_gemm.py, kbest_nt): for each row i of A, the
// kKBest columns j with the best key, the smallest or the largest, from hopper_mma.cuh's 3xTF32 products
// (unpromoted: the route evaluates the winners again as written, winners.py) selected on chip: no matrix is
// written. kKBest and kLargest come from the source (SO_KBEST, SO_LARGEST), one module per (K, largest). The key:
// - a dot product (row_norms null): A_i . B_j;
// - a squared distance: v = row_norms_i + col_norms_j - 2 A_i . B_j (the shifted, weighted norms and operands of
//   gemm_route), summed again from x, y (and w) as the plain kernel sums it (in increasing d) where it cancels:
//   !(v >= cancel (row_norms_i + col_norms_j)), NaN included (codegen._gram_cells' rule, cancel = 1 / GRAM_CANCEL).
//
// Work: items of one 128-row tile x one part of the columns (parts of equal numbers of column tiles, items grouped
// by 8 row tiles so that the blocks running at once read few of A's and B's tiles: L2). Each row's list is kept by
// two threads of its warpgroup (its "sides"), each holding kKBest (key, j) in registers as 64-bit keys ordered as
// (key, j): the float's bits made monotone (NaN the last for the smallest, the first for the largest, as the plain
// kernel orders it) in the high word, j in the low word, so ties go to the lower j and one unsigned compare decides.
// A row's bound is the better of its sides' last keys (each side alone holds kKBest keys up to it, so nothing at or
// past it can be among the row's best; NaN while both have room).
//
// A tile, each thread holding 2 rows x 32 columns of the wgmma accumulator:
// 1. filter, unrolled over the thread's 64 cells: the key, its store to the warpgroup's staged rows in shared
//    memory (float2 stores, conflict-free), one compare against its row's bound setting a bit of a pass mask (and
//    for a distance one against the cancelling limit; those cells, rare, are summed again after the loop, their
//    staged keys and pass bits made anew). ~4 instructions a cell for a dot product, ~7 for a distance, no branch;
//    the thread's 2 masks to shared memory;
// 2. after one named barrier each side walks the set bits of half its row's mask (the columns of 2 of its 4
//    lanes), inserting those keys. Past a part's first tiles few keys pass (about 2 K / t a row at its t-th tile);
//    in the first every key does, as a scan of the row would.
// At an item's end the row's 2 sides merge their lists by shuffles and write the row's list, sign bit flipped (so
// that int64 order is the keys' order), to out (parts, M, kKBest); empty slots are all ones (j = -1 in the low
// word). (Earlier epilogues, which staged every tile and scanned it, or inserted every cell: docs/perf_notes.md,
// "The Hopper engine".)
#pragma once

#include "lazy/hopper_mma.cuh"

#ifndef SO_KBEST
#define SO_KBEST 10
#endif
#ifndef SO_LARGEST
#define SO_LARGEST 0
#endif

namespace semiring_ops {
namespace lazy {
namespace hopper {

constexpr int kKBest = SO_KBEST;
constexpr bool kLargest = SO_LARGEST != 0;
constexpr int kKBestStages = 4;
// floats between the staged rows: a half-warp's float2 stores (4 rows x 4 column pairs) fall on 32 banks
constexpr int kStride = kTileN + 8;
// per warpgroup: its 64 rows' staged keys, the tile's column norms, each row's pass mask (4 words: the columns of
// its 4 lanes) and its 2 sides' bounds
constexpr int kKBestWarpgroupBytes = 64 * kStride * 4 + kTileN * 4 + 64 * 4 * 4 + 64 * 2 * 4;
constexpr int kKBestSharedBytes = shared_bytes(kKBestStages, 2 * kKBestWarpgroupBytes);

struct RowPartSchedule {  // items: (row tile, part of the column tiles), all of the part's column tiles
  int tiles_m, tiles_n, parts, per_part, depth_tiles;
  __device__ int items() const { return tiles_m * parts; }
  __device__ void item_of(int item, int& tile_m, int& part) const { grouped(item, tiles_m, parts, tile_m, part); }
  __device__ int tiles(int item) const {
    int tile_m, part;
    item_of(item, tile_m, part);
    return min(per_part, tiles_n - part * per_part);
  }
  __device__ void corner(int item, int t, int& m0, int& n0) const {
    int tile_m, part;
    item_of(item, tile_m, part);
    m0 = tile_m * kTileM, n0 = (part * per_part + t) * kTileN;
  }
};

__device__ __forceinline__ void warpgroup_sync(int half) {  // named barrier 1 or 2: the warpgroup's 128 threads
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + half) : "memory");
}

// key made monotone in an unsigned word: NaN the last for the smallest, the first for the largest (largest: the key
// is negated, so that smaller is better either way)
__device__ __forceinline__ u64 ordered(float key, int col) {
  u32 u;
  if (key != key) {
    u = kLargest ? 0u : 0xFFFFFFFFu;
  } else {
    const u32 bits = __float_as_uint(key);
    u = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<u64>(u) << 32) | static_cast<u32>(col);
}

// the float a list's last entry holds, as the fast compare's threshold: NaN (everything passes to the exact
// compare) while the list has room or its last key is NaN
__device__ __forceinline__ float threshold(u64 last) {
  if (last == ~0ull) return __uint_as_float(0x7FFFFFFFu);
  const u32 u = static_cast<u32>(last >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u ^ 0x80000000u) : ~u);
}

// the squared distance of x's row r and y's row c summed from the variables, in increasing d (the rare cells that
// cancel: out of line, one copy for the filter's 64 unrolled cells)
__device__ __noinline__ float resum_distance(const float* x, const float* y, const float* w, int dim, int r, int c) {
  const float* xr = x + static_cast<size_t>(r) * dim;
  const float* yc = y + static_cast<size_t>(c) * dim;
  float s = 0.f;
  for (int d = 0; d < dim; ++d) {
    const float diff = xr[d] - yc[d];
    s += w != nullptr ? w[d] * (diff * diff) : diff * diff;
  }
  return s;
}

struct KBestEpilogue {
  const float* row_norms;  // (m,), or null: a dot product
  const float* col_norms;  // (n,)
  const float* x;          // (m, dim) the outer variable as given (the re-summation)
  const float* y;          // (n, dim) the inner variable as given
  const float* w;          // (dim,) a weighted distance's weights, or null
  int dim;
  float cancel;
  long long* out;  // (parts, m, kKBest)
  int m, n;
  const RowPartSchedule* schedule;
  float* staged;     // this warpgroup's (64, kStride) keys of the tile
  float* cols;       // (kTileN) the tile's column norms
  u32* masks;        // (64, 4) the keys below their row's bound: word q, bit 2 j + e: column 8 j + 2 q + e
  float* bounds;     // (64, 2) each row's sides' threshold(last key)
  u64 best[kKBest];  // this thread's side of its row's list, ascending
  float limit;       // threshold(best[kKBest - 1])
  float row_norm[2];  // the rows of this thread's accumulator cells, h: row 16 warp + lane / 4 + 8 h
  int row;            // this thread's list: its row (of the item's 128) and side
  int side;

  __device__ __forceinline__ void begin(int item, unsigned char* scratch) {
    const int t = threadIdx.x & 127, lane = threadIdx.x & 31, warp = t >> 5, half = (threadIdx.x >> 7) - 1;
    unsigned char* mine = scratch + half * kKBestWarpgroupBytes;
    staged = reinterpret_cast<float*>(mine);
    cols = staged + 64 * kStride;
    masks = reinterpret_cast<u32*>(cols + kTileN);
    bounds = reinterpret_cast<float*>(masks + 64 * 4);
    row = half * 64 + (t >> 1), side = t & 1;
#pragma unroll
    for (int s = 0; s < kKBest; ++s) best[s] = ~0ull;
    limit = threshold(~0ull);
    bounds[t] = limit;  // (row t / 2's side t % 2; the last item's merges are done: its last tile's barrier)
    int tile_m, part;
    schedule->item_of(item, tile_m, part);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = tile_m * kTileM + half * 64 + warp * 16 + (lane >> 2) + 8 * h;
      row_norm[h] = row_norms != nullptr && r < m ? row_norms[r] : 0.f;
    }
  }

  // the tile's column norms, loaded while its products run (the last tile's filter read them before its barrier)
  __device__ __forceinline__ void prepare(int, int n0) {
    const int t = threadIdx.x & 127;
    if (row_norms != nullptr) cols[t] = n0 + t < n ? __ldg(col_norms + n0 + t) : 0.f;
  }

  __device__ __forceinline__ void insert(u64 entry) {
    if (entry >= best[kKBest - 1]) return;
#pragma unroll
    for (int s = kKBest - 1; s > 0; --s)
      best[s] = entry < best[s - 1] ? best[s - 1] : (entry < best[s] ? entry : best[s]);
    best[0] = entry < best[0] ? entry : best[0];
    limit = threshold(best[kKBest - 1]);
  }

  // step 1: v's cells made keys (negated for the largest) and staged; the cells below their row's bound marked in
  // passed[h] and the cancelling ones in cancelled[h] (bit 2 j + e)
  template <bool kDistance>
  __device__ __forceinline__ void filter(const float (&v)[64], const float (&bound)[2], u32 (&passed)[2],
                                         u32 (&cancelled)[2]) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, q = lane & 3;
    const int local0 = warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float2 pair[2];
      if constexpr (kDistance) pair[0] = *reinterpret_cast<const float2*>(cols + 8 * j + 2 * q);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float key = v[4 * j + 2 * h + e];
          if constexpr (kDistance) {
            const float total = row_norm[h] + (e ? pair[0].y : pair[0].x);
            key = fmaf(-2.f, key, total);
            if (!(key >= cancel * total)) cancelled[h] |= 1u << (2 * j + e);
          }
          if constexpr (kLargest) key = -key;
          if (!(key >= bound[h])) passed[h] |= 1u << (2 * j + e);
          (e ? pair[1].y : pair[1].x) = key;
        }
        *reinterpret_cast<float2*>(staged + (local0 + 8 * h) * kStride + 8 * j + 2 * q) = pair[1];
      }
    }
  }

  // the cancelling cells (rare): summed again from the variables, their staged keys and pass bits made anew
  __device__ __forceinline__ void resum_cancelled(int m0, int n0, const float (&bound)[2], u32 (&passed)[2],
                                               const u32 (&cancelled)[2]) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, half = (threadIdx.x >> 7) - 1, q = lane & 3;
    const int local0 = warp * 16 + (lane >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      u32 bits = cancelled[h];
      passed[h] &= ~bits;
      while (bits != 0) {
        const int b = __ffs(bits) - 1, col = 8 * (b >> 1) + 2 * q + (b & 1), r = m0 + half * 64 + local0 + 8 * h;
        bits &= bits - 1;
        float key = r < m && n0 + col < n ? resum_distance(x, y, w, dim, r, n0 + col) : 0.f;
        if (kLargest) key = -key;
        staged[(local0 + 8 * h) * kStride + col] = key;
        if (!(key >= bound[h])) passed[h] |= 1u << b;
      }
    }
  }

  __device__ __forceinline__ void tile(const float (&v)[64], int m0, int n0) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, half = (threadIdx.x >> 7) - 1;
    const int local0 = warp * 16 + (lane >> 2), local = row - half * 64;
    warpgroup_sync(half);  // the last tile's merge is done with the staged keys, the masks and the bounds
    float bound[2];
    u32 passed[2] = {0u, 0u}, cancelled[2] = {0u, 0u};
#pragma unroll
    for (int h = 0; h < 2; ++h)  // the better side's: nothing at or past it is among the row's best (NaN: room)
      bound[h] = fminf(bounds[2 * (local0 + 8 * h)], bounds[2 * (local0 + 8 * h) + 1]);
    if (row_norms != nullptr) {
      filter<true>(v, bound, passed, cancelled);
      if ((cancelled[0] | cancelled[1]) != 0) resum_cancelled(m0, n0, bound, passed, cancelled);
    } else {
      filter<false>(v, bound, passed, cancelled);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) masks[(local0 + 8 * h) * 4 + (lane & 3)] = passed[h];
    warpgroup_sync(half);
    if (m0 + row < m) {  // each side: the marked keys of 2 of its row's 4 words
      const float* keys = staged + local * kStride;
#pragma unroll
      for (int q = 2 * side; q < 2 * side + 2; ++q) {
        u32 bits = masks[local * 4 + q];
        while (bits != 0) {
          const int b = __ffs(bits) - 1, col = 8 * (b >> 1) + 2 * q + (b & 1);
          bits &= bits - 1;
          if (n0 + col < n) insert(ordered(keys[col], n0 + col));
        }
      }
    }
    bounds[2 * local + side] = limit;
  }

  __device__ __forceinline__ void end(int item) {
    u64 other[kKBest];  // the row's other side
#pragma unroll
    for (int s = 0; s < kKBest; ++s) other[s] = __shfl_xor_sync(0xFFFFFFFFu, best[s], 1);
#pragma unroll
    for (int s = 0; s < kKBest; ++s) insert(other[s]);
    int tile_m, part;
    schedule->item_of(item, tile_m, part);
    const int r = tile_m * kTileM + row;
    if (side != 0 || r >= m) return;
    long long* list = out + (static_cast<size_t>(part) * m + r) * kKBest;
#pragma unroll
    for (int s = 0; s < kKBest; ++s) list[s] = static_cast<long long>(best[s] ^ (1ull << 63));
  }
};

}  // namespace hopper
}  // namespace lazy
}  // namespace semiring_ops

// A (M, K) and B (N, K) by their tensor maps; the key's terms (KBestEpilogue); parts of per_part column tiles each
extern "C" __global__ void __launch_bounds__(semiring_ops::lazy::hopper::kThreads, 1)
    tf32x3_kbest_nt(const __grid_constant__ semiring_ops::lazy::hopper::TensorMap map_a,
                    const __grid_constant__ semiring_ops::lazy::hopper::TensorMap map_b, const float* row_norms,
                    const float* col_norms, const float* x, const float* y, const float* w, int dim, float cancel,
                    long long* out, int m, int n, int k, int parts, int per_part) {
  using namespace semiring_ops::lazy::hopper;
  const RowPartSchedule schedule{(m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN, parts, per_part,
                                 (k + kTileK - 1) / kTileK};
  KBestEpilogue epilogue{row_norms, col_norms, x, y, w, dim, cancel, out, m, n, &schedule};
  warp_specialised_mma<false, kKBestStages>(&map_a, &map_b, schedule, epilogue);
}
