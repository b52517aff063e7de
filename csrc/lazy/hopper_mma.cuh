// The warp-specialised wgmma engine of the lazy reductions' Hopper (sm_90a) kernels: products A B^T of float32
// row-major A (M, K) and B (N, K) whose K columns are 3xTF32 operands (gemm_route._three_tf32: [lo, hi, hi] and
// [hi, lo, hi], every value exact in TF32), in 128 x 128 output tiles, each handed in registers to an epilogue:
// tf32x3_gemm.cuh stores it (the route's promoted GEMM), tf32x3_kbest.cuh keeps each row's K best (the route's
// fused selections). FlashAttention-3 / CUTLASS style, written here in PTX:
//
// - persistent: gridDim.x blocks walk the schedule's items (an item: one or more tiles of the same rows, then the
//   epilogue's end), block b taking items b, b + gridDim.x, ...;
// - warpgroup 0: one thread loads each 32-deep stage of A (128 rows) and B (128 rows) by TMA (128-byte swizzle, rows
//   and columns past the ends zero-filled) against the stage's "full" mbarrier, kStages stages ahead, across tiles
//   and items;
// - warpgroups 1 and 2: 64 rows of the tile each, four wgmma m64n128k8 per stage from the swizzled shared memory,
//   the stage freed on its "empty" mbarrier (one arrival per warp) once their wgmma has read it;
// - kPromote: each stage's products summed by wgmma from zero, waited for and added into IEEE float32 registers
//   ("promoted"): the tensor cores' float32 accumulation truncates (docs/perf_notes.md, "3xTF32 on Hopper": a
//   product of depth k is off by ~1e-8 x k relative to its running sum), so this keeps that to one 32-deep stage
//   whatever K, more accurate than the SGEMM; while one warpgroup waits and adds, the other's wgmma keeps the tensor
//   cores busy. Else the products accumulate in the tensor cores' accumulator, one wgmma group kept in flight
//   (cuBLAS's 3xTF32 accuracy, ~20% faster).
//
// Registers: setmaxnreg gives the loader 40 and the multiplying warpgroups 232 (the accumulators: 64, 128 promoted).
//
// Accumulator layout (per warp, as mma.sync's m16n8 C fragments along N): element 4 j + 2 h + e of a thread is row
// 16 warp + lane / 4 + 8 h of its warpgroup's 64, column 8 j + 2 (lane % 4) + e of the tile's 128.
#pragma once

namespace semiring_ops {
namespace lazy {
namespace hopper {

using u32 = unsigned int;  // (no <cstdint>: the lazy kernels compile with NVRTC and csrc alone on the path)
using u64 = unsigned long long;

constexpr int kTileM = 128, kTileN = 128, kTileK = 32;  // kTileK floats: one 128-byte swizzle row
constexpr int kABytes = kTileM * kTileK * 4, kStageBytes = kABytes + kTileN * kTileK * 4;
constexpr int kThreads = 384;  // loader warpgroup + 2 multiplying warpgroups
// dynamic shared memory of kStages stages and an epilogue's scratch (+ alignment of the stages to 1,024 bytes)
constexpr int shared_bytes(int stages, int scratch) { return stages * kStageBytes + scratch + 1024; }
constexpr int kGroup = 8;  // schedules walk 8 row tiles at a time (L2 reuse of both operands)

struct alignas(64) TensorMap {  // CUtensorMap, made on the host by cuTensorMapEncodeTiled
  unsigned long long opaque[16];
};

// item -> (row tile, column part) in groups of kGroup row tiles: the blocks running at once share few row tiles and
// few column parts, so both operands' tiles come from L2
__device__ __forceinline__ void grouped(int item, int tiles_m, int parts, int& tile_m, int& part) {
  const int per_group = kGroup * parts, first_m = (item / per_group) * kGroup;
  const int rows_in_group = min(tiles_m - first_m, kGroup);
  tile_m = first_m + (item % per_group) % rows_in_group;
  part = (item % per_group) / rows_in_group;
}

// K-major operand in shared memory, 128-byte swizzle: rows of 128 bytes, 8-row atoms 1,024 bytes apart
__device__ __forceinline__ u64 smem_descriptor(u32 addr) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(1) << 16) | (static_cast<u64>(1024 >> 4) << 32) |
         (static_cast<u64>(1) << 62);
}

// keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma's fences and waits
__device__ __forceinline__ void fence_registers(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void mbarrier_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbarrier_wait(u32 bar, int parity) {
  u32 done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int k0, int row0, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<u64>(map)), "r"(k0), "r"(row0), "r"(bar)
      : "memory");
}

// d (64 floats a thread: the m64n128 f32 accumulator) += A (64 x 8, shared memory) B^T (128 x 8, shared memory), TF32;
// scale_d == 0: d = A B^T
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[64], u64 a, u64 b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(scale_d));
}


// Schedule: items() (the items to walk), tiles(item) (the tiles of an item), corner(item, t, m0, n0) (the t-th tile's
// first row and column), depth_tiles (kTileK-deep stages of a tile). Epilogue: begin(item, scratch) (scratch: its
// shared memory, after the stages), prepare(m0, n0) (before a tile's products: loads whose latency they hide),
// tile(values, m0, n0) (the tile's 64 x 128 values of this warpgroup in the accumulator layout), end(item).
template <bool kPromote, int kStages, class Schedule, class Epilogue>
__device__ __forceinline__ void warp_specialised_mma(const TensorMap* map_a, const TensorMap* map_b,
                                                     const Schedule& schedule, Epilogue& epilogue) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) u64 barriers[2 * kStages];
  const u32 base = (static_cast<u32>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const u32 full0 = static_cast<u32>(__cvta_generic_to_shared(barriers)), empty0 = full0 + 8 * kStages;
  const int tid = threadIdx.x, warpgroup = tid >> 7;
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) mbarrier_init(full0 + 8 * s, 1), mbarrier_init(empty0 + 8 * s, 8);
  __syncthreads();
  const int items = schedule.items(), depth_tiles = schedule.depth_tiles;
  int stage = 0, phase = 0;
  if (warpgroup == 0) {  // the loader
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid != 0) return;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int tiles = schedule.tiles(item);
      for (int t = 0; t < tiles; ++t) {
        int m0, n0;
        schedule.corner(item, t, m0, n0);
        for (int kt = 0; kt < depth_tiles; ++kt) {
          mbarrier_wait(empty0 + 8 * stage, phase ^ 1);
          const u32 s = base + stage * kStageBytes, full = full0 + 8 * stage;
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "r"(kStageBytes)
                       : "memory");
          tma_load(s, map_a, kt * kTileK, m0, full);
          tma_load(s + kABytes, map_b, kt * kTileK, n0, full);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int half = warpgroup - 1, lane = tid & 31;
  float acc[64], total[kPromote ? 64 : 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  unsigned char* scratch = smem_raw + (base - static_cast<u32>(__cvta_generic_to_shared(smem_raw))) +
                           kStages * kStageBytes;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    epilogue.begin(item, scratch);
    const int tiles = schedule.tiles(item);
    for (int t = 0; t < tiles; ++t) {
      int m0, n0;
      schedule.corner(item, t, m0, n0);
      epilogue.prepare(m0, n0);
      if constexpr (kPromote) {
#pragma unroll
        for (int i = 0; i < 64; ++i) total[i] = 0.f;
      }
      int previous = -1;  // (not promoting) the stage whose wgmma the last wait left in flight
      for (int kt = 0; kt < depth_tiles; ++kt) {
        mbarrier_wait(full0 + 8 * stage, phase);
        const u32 s = base + stage * kStageBytes;
        const u64 da = smem_descriptor(s + half * 64 * kTileK * 4), db = smem_descriptor(s + kABytes);
        fence_registers(acc);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kTileK / 8; ++kk)
          wgmma_m64n128k8_tf32(acc, da + 2 * kk, db + 2 * kk, kPromote ? kk > 0 : kt + kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if constexpr (kPromote) {
          asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
          fence_registers(acc);
          if (lane == 0) mbarrier_arrive(empty0 + 8 * stage);
#pragma unroll
          for (int i = 0; i < 64; ++i) total[i] += acc[i];
        } else {
          asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
          if (previous >= 0 && lane == 0) mbarrier_arrive(empty0 + 8 * previous);
          previous = stage;
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      if constexpr (kPromote) {
        epilogue.tile(total, m0, n0);
      } else {
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_registers(acc);
        if (previous >= 0 && lane == 0) mbarrier_arrive(empty0 + 8 * previous);
        epilogue.tile(acc, m0, n0);
      }
    }
    epilogue.end(item);
  }
}

}  // namespace hopper
}  // namespace lazy
}  // namespace semiring_ops
