// The route's promoted 3xTF32 GEMM on Hopper (semiring_ops/lazy/hopper_gemm.py): C (M, N) = A (M, K) B (N, K)^T in
// float32, on hopper_mma.cuh's engine with promotion (more accurate than the SGEMM: unit-norm near neighbours at
// D = 768, 3.6e-7 max error of x.y against float64, the SGEMM 1.6e-6, cuBLAS's 3xTF32 5.2e-6; at 1.9x the SGEMM's
// speed, benchmarks/wgmma_probe.py). Tiles walk 8 row tiles down a column of tiles; each is stored from registers
// (float2 where N is even), rows and columns past the ends skipped, while the loader fills the next tile's stages.
#pragma once

#include "lazy/hopper_mma.cuh"

namespace semiring_ops {
namespace lazy {
namespace hopper {

constexpr int kGemmStages = 6;
constexpr int kGemmSharedBytes = shared_bytes(kGemmStages, 0);

struct TileSchedule {  // one item per output tile
  int tiles_m, tiles_n, depth_tiles;
  __device__ int items() const { return tiles_m * tiles_n; }
  __device__ int tiles(int) const { return 1; }
  __device__ void corner(int item, int, int& m0, int& n0) const {
    int tile_m, tile_n;
    grouped(item, tiles_m, tiles_n, tile_m, tile_n);
    m0 = tile_m * kTileM, n0 = tile_n * kTileN;
  }
};

struct StoreEpilogue {
  float* c;
  int m, n;
  __device__ void begin(int, unsigned char*) {}
  __device__ void prepare(int, int) {}
  __device__ void end(int) {}
  __device__ __forceinline__ void tile(const float (&v)[64], int m0, int n0) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, half = (threadIdx.x >> 7) - 1;
    const int row = m0 + half * 64 + warp * 16 + (lane >> 2);
    const bool pairs = (n & 1) == 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = n0 + j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row + 8 * h;
        if (r >= m) continue;
        float* out = c + static_cast<size_t>(r) * n + col;
        if (pairs && col + 1 < n) {
          *reinterpret_cast<float2*>(out) = make_float2(v[4 * j + 2 * h], v[4 * j + 2 * h + 1]);
        } else {
          if (col < n) out[0] = v[4 * j + 2 * h];
          if (col + 1 < n) out[1] = v[4 * j + 2 * h + 1];
        }
      }
    }
  }
};

}  // namespace hopper
}  // namespace lazy
}  // namespace semiring_ops

// A and B by their tensor maps (boxes of kTileK x 128 rows, 128-byte swizzle)
extern "C" __global__ void __launch_bounds__(semiring_ops::lazy::hopper::kThreads, 1)
    tf32x3_gemm_nt(const __grid_constant__ semiring_ops::lazy::hopper::TensorMap map_a,
                   const __grid_constant__ semiring_ops::lazy::hopper::TensorMap map_b, float* __restrict__ c, int m,
                   int n, int k) {
  using namespace semiring_ops::lazy::hopper;
  const TileSchedule schedule{(m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN, (k + kTileK - 1) / kTileK};
  StoreEpilogue epilogue{c, m, n};
  warp_specialised_mma<true, kGemmStages>(&map_a, &map_b, schedule, epilogue);
}
