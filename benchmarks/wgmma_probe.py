"""Feasibility of the fused route kernel on Hopper's wgmma (issue 42; the mma.sync probe, tf32_promotion_probe.py,
showed mma.sync's ceiling at ~150 TFLOP/s of TF32 work against cuBLAS's 361): C = A B^T for float32 A (M, K) and
B (N, K), 3xTF32 with the operands split once into [lo, hi, hi] and [hi, lo, hi] (gemm_route._three_tf32, a TF32
GEMM of depth 3 K), on wgmma.mma_async m64n128k8 from 128-byte-swizzled shared memory filled by a cp.async
pipeline. Variants: promotion of each 32-deep tile's products into IEEE float32 registers (FP32 accuracy) or none
(cuBLAS's 3xTF32), and 2 or 3 warpgroups of 64 rows per block. Beside cuBLAS's 3xTF32 (gemm_route.route_mm) and
SGEMM. Accuracy: max |error| of x.y against float64 for unit-norm near neighbours (cosine ~0.96, 2,048 x 4,096);
time: 16,384^2 outputs, median of 7 CUDA-event timings (randn operands).

    python benchmarks/wgmma_probe.py      # on an sm_90 GPU, with nvcc (torch.utils.cpp_extension.load_inline)
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(__file__))
from tf32_promotion_probe import near_neighbours
from timing import time_ms


def _wgmma_asm(n: int) -> str:
    """The inline asm of wgmma.mma_async m64n{n}k8 f32 += tf32 x tf32, both operands from shared memory."""
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return (
        f"__device__ __forceinline__ void wgmma(float (&d)[{regs}], uint64_t a, uint64_t b, int scale_d) {{\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 "\n'
        f'      "{{{acc}}}, %{regs}, %{regs + 1}, p, 1, 1;\\n}}\\n"\n'
        f"      : {outs}\n"
        '      : "l"(a), "l"(b), "r"(scale_d));\n'
        "}\n"
    )


SRC = (
    r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>
#include <cuda.h>
#include <cudaTypedefs.h>

constexpr int BK = 32;  // floats: one 128-byte swizzle row

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// K-major operand in shared memory, 128-byte swizzle: rows of 128 bytes, 8-row atoms 1,024 bytes apart
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
"""
    + _wgmma_asm(128)
    + _wgmma_asm(256)
    + r"""
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(bar) : "memory");
}

// Persistent, warp-specialised: one thread of warpgroup 0 loads each stage by TMA (128-byte swizzle, rows past
// the end zero-filled) against the stage's "full" barrier; warpgroups 1 and 2 each multiply 64 rows of the 128-row
// tile by the N_TILE columns (m64nN_TILEk8) and free the stage on its "empty" barrier once their wgmma has read
// it. PROMOTE 1: each 32-deep tile's products are waited for and added into IEEE registers (FP32 accuracy; the
// other warpgroup's wgmma keeps the tensor cores busy meanwhile); 2: each tile goes into one of two accumulators in
// turn, the finished one added while the next one's wgmma runs; 0: the products accumulate in the tensor cores'
// accumulator with one group in flight.
template <int N_TILE, int STAGES, int PROMOTE>
__global__ void __launch_bounds__(384, 1) wgmma_ws(const __grid_constant__ CUtensorMap map_a,
                                                  const __grid_constant__ CUtensorMap map_b,
                                                  float* __restrict__ C, int M, int N, int K) {
  constexpr int BM = 128, A_BYTES = BM * 128, STAGE_BYTES = A_BYTES + N_TILE * 128, ACCN = N_TILE / 2;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * STAGES];
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars)), empty0 = full0 + 8 * STAGES;
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0)
    for (int s = 0; s < STAGES; ++s) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 8);
  __syncthreads();
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + N_TILE - 1) / N_TILE, tiles = tiles_m * tiles_n;
  const int KT = K / BK;
  constexpr int GROUP = 8;  // tiles walk 8 row tiles down a column of tiles (L2 reuse of B)
  auto coords = [&](int tile, int& m0, int& n0) {
    const int per_group = GROUP * tiles_n, first_m = (tile / per_group) * GROUP;
    const int rows_in_group = min(tiles_m - first_m, GROUP);
    m0 = (first_m + (tile % per_group) % rows_in_group) * BM;
    n0 = ((tile % per_group) / rows_in_group) * N_TILE;
  };
  int stage = 0, phase = 0;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid != 0) return;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int m0, n0;
      coords(tile, m0, n0);
      for (int kt = 0; kt < KT; ++kt) {
        mbar_wait(empty0 + 8 * stage, phase ^ 1);
        const uint32_t s = base + stage * STAGE_BYTES, full = full0 + 8 * stage;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "r"(STAGE_BYTES)
                     : "memory");
        tma_load(s, &map_a, kt * BK, m0, full);
        tma_load(s + A_BYTES, &map_b, kt * BK, n0, full);
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = wg - 1, lane = tid & 31, warp = (tid >> 5) & 3;
  float acc[2][ACCN], total[PROMOTE ? ACCN : 1];
#pragma unroll
  for (int i = 0; i < ACCN; ++i) acc[0][i] = 0.f, acc[1][i] = 0.f;
  auto multiply = [&](auto& d, int scale_first) {  // the stage's 32-deep tile into d, committed as one group
    mbar_wait(full0 + 8 * stage, phase);
    const uint32_t s = base + stage * STAGE_BYTES;
    const uint64_t da = smem_desc(s + consumer * 64 * 128), db = smem_desc(s + A_BYTES);
    fence_acc(d);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 8; ++kk) wgmma(d, da + 2 * kk, db + 2 * kk, kk > 0 || scale_first);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  auto promote = [&](auto& d) {
#pragma unroll
    for (int i = 0; i < ACCN; ++i) total[i] += d[i];
  };
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int m0, n0;
    coords(tile, m0, n0);
    if (PROMOTE) {
#pragma unroll
      for (int i = 0; i < ACCN; ++i) total[i] = 0.f;
    }
    int previous = -1;
    auto advance = [&]() {
      previous = stage;
      if (++stage == STAGES) stage = 0, phase ^= 1;
    };
    auto release_previous = [&]() {
      if (lane == 0) mbar_arrive(empty0 + 8 * previous);
    };
    if (PROMOTE == 1) {  // each tile waited for and promoted; the other warpgroup's wgmma fills the tensor cores
      for (int kt = 0; kt < KT; ++kt) {
        multiply(acc[0], 0);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_acc(acc[0]);
        previous = stage;
        release_previous();
        promote(acc[0]);
        advance();
      }
    } else if (PROMOTE == 2) {  // two tiles a trip (KT even), one an accumulator, each added while the other runs
      for (int kt = 0; kt < KT; kt += 2) {
        multiply(acc[0], 0);
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        fence_acc(acc[1]);
        if (kt > 0) release_previous(), promote(acc[1]);
        advance();
        multiply(acc[1], 0);
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        fence_acc(acc[0]);
        release_previous(), promote(acc[0]);
        advance();
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_acc(acc[0]);
      fence_acc(acc[1]);
      release_previous();
      promote(acc[1]);
    } else {
      for (int kt = 0; kt < KT; ++kt) {
        multiply(acc[0], kt > 0);
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kt > 0) release_previous();
        advance();
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_acc(acc[0]);
      release_previous();
    }
    const int row = m0 + consumer * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < ACCN / 4; ++j) {
      const int col = n0 + j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row + 8 * h;
        const float v0 = PROMOTE ? total[4 * j + 2 * h] : acc[0][4 * j + 2 * h];
        const float v1 = PROMOTE ? total[4 * j + 2 * h + 1] : acc[0][4 * j + 2 * h + 1];
        if (r >= M) continue;
        if (col + 1 < N && (N & 1) == 0) {
          *reinterpret_cast<float2*>(C + (size_t)r * N + col) = make_float2(v0, v1);
        } else {
          if (col < N) C[(size_t)r * N + col] = v0;
          if (col + 1 < N) C[(size_t)r * N + col + 1] = v1;
        }
      }
    }
  }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    cudaDriverEntryPointQueryResult found;
    TORCH_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&fn), 12000,
                                                 cudaEnableDefault, &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess,
                "cuTensorMapEncodeTiled not found");
  }
  return fn;
}

// (rows, K) row-major float32 as TMA boxes of 32 x box_rows, 128-byte swizzle, rows past the end read as zeros
static CUtensorMap tensor_map(const torch::Tensor& t, int box_rows) {
  CUtensorMap map;
  cuuint64_t dims[2] = {(cuuint64_t)t.size(1), (cuuint64_t)t.size(0)};
  cuuint64_t strides[1] = {(cuuint64_t)t.size(1) * sizeof(float)};
  cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, element_strides[2] = {1, 1};
  CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, t.data_ptr(), dims, strides, box,
                              element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed: ", (int)r);
  return map;
}

template <int N_TILE, int STAGES, int PROMOTE>
void launch(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c) {
  const int M = a.size(0), K = a.size(1), N = b.size(0);
  const size_t shm = STAGES * (128 + N_TILE) * 128 + 1024;
  auto kernel = wgmma_ws<N_TILE, STAGES, PROMOTE>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.get_device());
  const int tiles = ((M + 127) / 128) * ((N + N_TILE - 1) / N_TILE);
  kernel<<<std::min(tiles, sms), 384, shm, at::cuda::getCurrentCUDAStream()>>>(
      tensor_map(a, 128), tensor_map(b, N_TILE), c.data_ptr<float>(), M, N, K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor gemm(torch::Tensor a, torch::Tensor b, int64_t variant) {
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.size(1) == b.size(1) && a.size(1) % BK == 0, "operands");
  auto c = torch::empty({a.size(0), b.size(0)}, a.options());
  switch (variant) {
    case 0: launch<128, 6, 1>(a, b, c); break;
    case 1: TORCH_CHECK(a.size(1) % (2 * BK) == 0, "depth"); launch<128, 6, 2>(a, b, c); break;
    case 2: launch<128, 6, 0>(a, b, c); break;
    default: launch<256, 4, 0>(a, b, c); break;
  }
  return c;
}
"""
)
NAMES = {
    0: "wgmma 3xTF32, promoted every 32 (wait), 128 x 128 tiles",
    1: "wgmma 3xTF32, promoted every 32 (two accumulators), 128 x 128 tiles",
    2: "wgmma 3xTF32, no promotion, 128 x 128 tiles",
    3: "wgmma 3xTF32, no promotion, 128 x 256 tiles",
}


def main() -> None:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    ext = load_inline(
        "wgmma_probe",
        "torch::Tensor gemm(torch::Tensor a, torch::Tensor b, int64_t variant);",
        cuda_sources=SRC,
        functions=["gemm"],
        extra_cuda_cflags=["-O3", "-Xptxas", "-v"],
        verbose=os.environ.get("VERBOSE") == "1",
    )
    from semiring_ops.lazy import gemm_route

    def ours(variant: int):
        def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            a3, b3 = gemm_route._three_tf32(a, small_first=True), gemm_route._three_tf32(b, small_first=False)
            return ext.gemm(a3, b3, variant)

        return product

    products = {name: ours(variant) for variant, name in NAMES.items()}
    products["cuBLAS 3xTF32 (route_mm)"] = lambda a, b: gemm_route.route_mm(a, b.t(), gemm_route.THREE_TF32)
    products["cuBLAS SGEMM"] = lambda a, b: gemm_route.route_mm(a, b.t(), gemm_route.IEEE)
    torch.manual_seed(0)
    print("| D | product | max error of x.y | odd sizes | ms, 16,384^2 | TF32 work, TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for d in (128, 768):
        x, y = near_neighbours(d)
        ref = x.double() @ y.double().T
        odd_x, odd_y = torch.randn(1000, d, device="cuda"), torch.randn(777, d, device="cuda")
        odd_ref = odd_x.double() @ odd_y.double().T
        big_x, big_y = torch.randn(16384, d, device="cuda"), torch.randn(16384, d, device="cuda")
        flops = 2 * 16384 * 16384 * d
        for name, f in products.items():
            err = (f(x, y).double() - ref).abs().max().item()
            odd = (f(odd_x, odd_y).double() - odd_ref).abs().max().item()
            t = time_ms(lambda f=f, a=big_x, b=big_y: f(a, b), "cuda", 7)
            work = flops * (1 if "SGEMM" in name else 3)
            print(f"| {d} | {name} | {err:.1e} | {odd:.1e} | {t:.2f} | {work / t / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
