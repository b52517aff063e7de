// The route's fused selections on Hopper (semiring_ops/lazy/hopper_gemm.py, kbest_nt): for each row i of A, the
// kKBest columns j with the best key, the smallest or the largest, from hopper_mma.cuh's 3xTF32 products
// (unpromoted: the route evaluates the winners again as written, winners.py) selected on chip: no matrix is
// written. kKBest comes from the source (SO_KBEST), one module per K. The key:
// - a dot product (row_norms null): A_i . B_j;
// - a squared distance: v = row_norms_i + col_norms_j - 2 A_i . B_j (the shifted, weighted norms and operands of
//   gemm_route), summed again from x, y (and w) as the plain kernel sums it (in increasing d) where it cancels:
//   !(v >= cancel (row_norms_i + col_norms_j)), NaN included (codegen._gram_cells' rule, cancel = 1 / GRAM_CANCEL).
//
// Work: items of one 128-row tile x one part of the columns (parts of equal numbers of column tiles, items grouped
// by 8 row tiles so that the blocks running at once read few of A's and B's tiles: L2). A warpgroup's 64 x 128
// products of a tile go through shared memory (row stride kStride: conflict-free reads), where each of its threads
// scans half of one row (the even or the odd columns) in a loop: one copy of the selection's code, not 64 unrolled
// (an epilogue unrolled over a thread's 64 cells compiled to ~500 KB in 6.8 s of NVRTC, and ran 22.5 ms against this
// one's 21.0 on a 50,000^2 k-NN at D = 128: docs/perf_notes.md, "The Hopper engine"). A thread keeps its row's
// kKBest best (key, j) in registers as 64-bit keys ordered as (key, j): the float's bits made monotone (NaN the
// last for the smallest, the first for the largest, as the plain kernel orders it) in the high word, j in the low
// word, so ties go to the lower j and one unsigned compare decides; the common case is one float compare against
// the list's last key (NaN until the list is full). At an item's end the row's 2 threads merge their lists by
// shuffles and write the row's list, sign bit flipped (so that int64 order is the keys' order), to
// out (parts, M, kKBest); empty slots are all ones (j = -1 in the low word).
#pragma once

#include "lazy/hopper_mma.cuh"

#ifndef SO_KBEST
#define SO_KBEST 10
#endif

namespace semiring_ops {
namespace lazy {
namespace hopper {

constexpr int kKBest = SO_KBEST;
constexpr int kKBestStages = 4;
constexpr int kStride = kTileN + 2;  // floats between the staged rows: a warp's 16 rows x 2 halves on 32 banks
constexpr int kKBestScratch = 2 * (64 * kStride + kTileN) * 4;  // per warpgroup: its 64 rows, the tile's col norms
constexpr int kKBestSharedBytes = shared_bytes(kKBestStages, kKBestScratch);

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
__device__ __forceinline__ u64 ordered(float key, int col, int largest) {
  u32 u;
  if (key != key) {
    u = largest ? 0u : 0xFFFFFFFFu;
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
// cancel: out of line, and a free function, so that the epilogue's members never leave registers)
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
  int largest;
  long long* out;  // (parts, m, kKBest)
  int m, n;
  const RowPartSchedule* schedule;
  float* rows;       // this warpgroup's staged tile (64, kStride)
  float* cols;       // the tile's column norms (kTileN)
  u64 best[kKBest];  // this thread's row's list over its columns, ascending
  float limit;       // threshold(best[kKBest - 1])
  float row_norm;
  int row;  // this thread's row (of the item's 128), and its half of the columns
  int side;

  __device__ __forceinline__ void begin(int item, unsigned char* scratch) {
    const int t = threadIdx.x & 127, half = (threadIdx.x >> 7) - 1;
    rows = reinterpret_cast<float*>(scratch) + half * (64 * kStride + kTileN);
    cols = rows + 64 * kStride;
    row = half * 64 + (t >> 1), side = t & 1;
#pragma unroll
    for (int s = 0; s < kKBest; ++s) best[s] = ~0ull;
    limit = threshold(~0ull);
    int tile_m, part;
    schedule->item_of(item, tile_m, part);
    const int r = tile_m * kTileM + row;
    row_norm = row_norms != nullptr && r < m ? row_norms[r] : 0.f;
  }

  __device__ __forceinline__ void prepare(int, int) {}

  __device__ __forceinline__ void insert(u64 entry) {
    if (entry >= best[kKBest - 1]) return;
#pragma unroll
    for (int s = kKBest - 1; s > 0; --s)
      best[s] = entry < best[s - 1] ? best[s - 1] : (entry < best[s] ? entry : best[s]);
    best[0] = entry < best[0] ? entry : best[0];
    limit = threshold(best[kKBest - 1]);
  }

  __device__ __forceinline__ void tile(const float (&v)[64], int m0, int n0) {
    const int tid = threadIdx.x & 127, lane = threadIdx.x & 31, warp = tid >> 5, half = (threadIdx.x >> 7) - 1;
    warpgroup_sync(half);  // the last tile's scan is done with the staging
    const int r0 = warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int c = j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[(r0 + 8 * h) * kStride + c] = v[4 * j + 2 * h];
        rows[(r0 + 8 * h) * kStride + c + 1] = v[4 * j + 2 * h + 1];
      }
    }
    if (row_norms != nullptr) cols[tid] = n0 + tid < n ? __ldg(col_norms + n0 + tid) : 0.f;
    warpgroup_sync(half);
    const int r = m0 + row;
    if (r >= m) return;
    const float* staged = rows + (row - half * 64) * kStride;
    const int count = min(kTileN, n - n0);
#pragma unroll 4
    for (int c = side; c < count; c += 2) {
      float key = staged[c];
      if (row_norms != nullptr) {
        const float total = row_norm + cols[c];
        key = fmaf(-2.f, key, total);
        if (!(key >= cancel * total)) key = resum_distance(x, y, w, dim, r, n0 + c);
      }
      if (largest) key = -key;
      if (!(key >= limit)) insert(ordered(key, n0 + c, largest));
    }
  }

  __device__ __forceinline__ void end(int item) {
    u64 other[kKBest];  // the row's other half of the columns
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
                    int largest, long long* out, int m, int n, int k, int parts, int per_part) {
  using namespace semiring_ops::lazy::hopper;
  const RowPartSchedule schedule{(m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN, parts, per_part,
                                 (k + kTileK - 1) / kTileK};
  KBestEpilogue epilogue{row_norms, col_norms, x, y, w, dim, cancel, largest, out, m, n, &schedule};
  warp_specialised_mma<false, kKBestStages>(&map_a, &map_b, schedule, epilogue);
}
