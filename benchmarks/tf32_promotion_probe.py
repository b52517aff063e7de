"""Feasibility of the fused route kernel (issue 42): our own mma.sync m16n8k8 TF32 GEMM C = A B^T (A (M, K), B (N, K),
float32), 3xTF32 with the products of each k8 step (or each 32-deep tile) promoted into IEEE float32 registers,
beside the same kernel without promotion, 1xTF32, cuBLAS's 3xTF32 (gemm_route.route_mm: one TF32 GEMM of depth 3 K)
and cuBLAS's SGEMM. Accuracy: max |error| of x.y against float64 for unit-norm near neighbours (cosine ~0.96,
2,048 x 4,096); time: 16,384^2 outputs, median of 7 CUDA-event timings (randn operands).

The kernel is a plain one (128 x 128 x 32 tiles, 8 warps of 64 x 32, cp.async double buffering, operands split into
TF32 hi and lo in registers by every warp that reads them): what it shows is the accuracy of promotion and the
throughput of mma.sync on Hopper, not a tuned GEMM. Needs nvcc (torch.utils.cpp_extension.load_inline).

    python benchmarks/tf32_promotion_probe.py      # on a CUDA GPU (sm_90 by default: TORCH_CUDA_ARCH_LIST)
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(__file__))
from timing import time_ms

SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int BM = 128, BN = 128, BK = 32, LD = BK + 4, THREADS = 256;

__device__ __forceinline__ unsigned tf32(float v) {
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v)); return r;
}
__device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void cp16(float* s, const float* g) {
  unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(s));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(sa), "l"(g));
}

// MODE 0: 1xTF32; 1: 3xTF32 into the accumulator (as cuBLAS); 2: 3xTF32, promoted every k8 step;
// 3: 3xTF32, promoted every BK tile
template <int MODE>
__global__ void __launch_bounds__(THREADS) gemm_nt(const float* __restrict__ A, const float* __restrict__ B,
                                                   float* __restrict__ C, int M, int N, int K) {
  extern __shared__ float smem[];
  float* As = smem;                  // [2][BM][LD]
  float* Bs = smem + 2 * BM * LD;    // [2][BN][LD]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, each 64 x 32
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[4][4][4];
  float tmp[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f, tmp[i][j][r] = 0.f;
  auto load = [&](int stage, int k0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      int chunk = tid + c * THREADS;  // 1024 chunks of 4 floats per tile
      int row = chunk >> 3, col = (chunk & 7) * 4;
      cp16(As + stage * BM * LD + row * LD + col, A + (size_t)(m0 + row) * K + k0 + col);
      cp16(Bs + stage * BN * LD + row * LD + col, B + (size_t)(n0 + row) * K + k0 + col);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  const int tiles = K / BK;
  load(0, 0);
  for (int kt = 0; kt < tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < tiles) {
      load(stage ^ 1, (kt + 1) * BK);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const float* as = As + stage * BM * LD + (wm * 64) * LD;
    const float* bs = Bs + stage * BN * LD + (wn * 32) * LD;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      unsigned ah[4][4], al[4][4], bh[4][2], bl[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* p = as + (i * 16) * LD + kk;
        float v[4] = {p[g * LD + t], p[(g + 8) * LD + t], p[g * LD + t + 4], p[(g + 8) * LD + t + 4]};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          ah[i][r] = tf32(v[r]);
          al[i][r] = tf32(v[r] - __uint_as_float(ah[i][r]));
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float* p = bs + (j * 8) * LD + kk;
        float v[2] = {p[g * LD + t], p[g * LD + t + 4]};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          bh[j][r] = tf32(v[r]);
          bl[j][r] = tf32(v[r] - __uint_as_float(bh[j][r]));
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (MODE == 0) {
            mma(acc[i][j], ah[i], bh[j]);
          } else if (MODE == 1) {
            mma(acc[i][j], al[i], bh[j]); mma(acc[i][j], ah[i], bl[j]); mma(acc[i][j], ah[i], bh[j]);
          } else if (MODE == 2) {
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            mma(d, al[i], bh[j]); mma(d, ah[i], bl[j]); mma(d, ah[i], bh[j]);
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] += d[r];
          } else {
            mma(tmp[i][j], al[i], bh[j]); mma(tmp[i][j], ah[i], bl[j]); mma(tmp[i][j], ah[i], bh[j]);
          }
        }
    }
    if (MODE == 3) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] += tmp[i][j][r], tmp[i][j][r] = 0.f;
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int row = m0 + wm * 64 + i * 16 + g, col = n0 + wn * 32 + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(C + (size_t)row * N + col) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(C + (size_t)(row + 8) * N + col) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

// the operands split once (hi, lo: TF32 bit patterns, by the caller), 128 x 256 x 16 tiles, 8 warps of 64 x 64,
// each k8 step's three products promoted into IEEE float32 registers
constexpr int PM = 128, PN = 256, PK = 16, PLD = PK + 4;

__global__ void __launch_bounds__(THREADS, 1)
    gemm_nt_presplit(const float* __restrict__ Ah, const float* __restrict__ Al, const float* __restrict__ Bh,
                     const float* __restrict__ Bl, float* __restrict__ C, int M, int N, int K) {
  extern __shared__ float smem[];
  // per stage: Ah, Al [PM][PLD], Bh, Bl [PN][PLD]
  constexpr int STAGE = 2 * PM * PLD + 2 * PN * PLD;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * PM, n0 = blockIdx.x * PN;
  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  auto load = [&](int stage, int k0) {
    float* base = smem + stage * STAGE;
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // A: 512 chunks of 4 floats each for hi and lo
      int chunk = tid + c * THREADS, row = chunk >> 2, col = (chunk & 3) * 4;
      cp16(base + row * PLD + col, Ah + (size_t)(m0 + row) * K + k0 + col);
      cp16(base + PM * PLD + row * PLD + col, Al + (size_t)(m0 + row) * K + k0 + col);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // B: 1024 chunks each
      int chunk = tid + c * THREADS, row = chunk >> 2, col = (chunk & 3) * 4;
      cp16(base + 2 * PM * PLD + row * PLD + col, Bh + (size_t)(n0 + row) * K + k0 + col);
      cp16(base + 2 * PM * PLD + PN * PLD + row * PLD + col, Bl + (size_t)(n0 + row) * K + k0 + col);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  const int tiles = K / PK;
  load(0, 0);
  for (int kt = 0; kt < tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < tiles) {
      load(stage ^ 1, (kt + 1) * PK);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const float* base = smem + stage * STAGE;
    const float* ah_s = base + (wm * 64) * PLD;
    const float* al_s = base + PM * PLD + (wm * 64) * PLD;
    const float* bh_s = base + 2 * PM * PLD + (wn * 64) * PLD;
    const float* bl_s = base + 2 * PM * PLD + PN * PLD + (wn * 64) * PLD;
#pragma unroll
    for (int kk = 0; kk < PK; kk += 8) {
      unsigned ah[4][4], al[4][4], bh[8][2], bl[8][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int o = (i * 16) * PLD + kk;
        const int idx[4] = {o + g * PLD + t, o + (g + 8) * PLD + t, o + g * PLD + t + 4, o + (g + 8) * PLD + t + 4};
#pragma unroll
        for (int r = 0; r < 4; ++r) ah[i][r] = __float_as_uint(ah_s[idx[r]]), al[i][r] = __float_as_uint(al_s[idx[r]]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int o = (j * 8) * PLD + kk + g * PLD + t;
        bh[j][0] = __float_as_uint(bh_s[o]), bh[j][1] = __float_as_uint(bh_s[o + 4]);
        bl[j][0] = __float_as_uint(bl_s[o]), bl[j][1] = __float_as_uint(bl_s[o + 4]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          mma(d, al[i], bh[j]); mma(d, ah[i], bl[j]); mma(d, ah[i], bh[j]);
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] += d[r];
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int row = m0 + wm * 64 + i * 16 + g, col = n0 + wn * 64 + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(C + (size_t)row * N + col) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(C + (size_t)(row + 8) * N + col) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

torch::Tensor gemm_presplit(torch::Tensor ah, torch::Tensor al, torch::Tensor bh, torch::Tensor bl) {
  int M = ah.size(0), K = ah.size(1), N = bh.size(0);
  TORCH_CHECK(M % PM == 0 && N % PN == 0 && K % PK == 0, "sizes");
  auto c = torch::empty({M, N}, ah.options());
  size_t shm = 2 * (2 * PM * PLD + 2 * PN * PLD) * sizeof(float);
  cudaFuncSetAttribute(gemm_nt_presplit, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
  gemm_nt_presplit<<<dim3(N / PN, M / PM), THREADS, shm, at::cuda::getCurrentCUDAStream()>>>(
      ah.data_ptr<float>(), al.data_ptr<float>(), bh.data_ptr<float>(), bl.data_ptr<float>(), c.data_ptr<float>(), M,
      N, K);
  return c;
}

torch::Tensor gemm(torch::Tensor a, torch::Tensor b, int64_t mode) {
  int M = a.size(0), K = a.size(1), N = b.size(0);
  TORCH_CHECK(M % BM == 0 && N % BN == 0 && K % BK == 0, "sizes");
  auto c = torch::empty({M, N}, a.options());
  dim3 grid(N / BN, M / BM);
  size_t shm = 2 * (BM + BN) * LD * sizeof(float);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    kernel<<<grid, THREADS, shm, stream>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
  };
  if (mode == 0) launch(gemm_nt<0>);
  else if (mode == 1) launch(gemm_nt<1>);
  else if (mode == 2) launch(gemm_nt<2>);
  else launch(gemm_nt<3>);
  return c;
}
"""
CPP = (
    "torch::Tensor gemm(torch::Tensor a, torch::Tensor b, int64_t mode);"
    "torch::Tensor gemm_presplit(torch::Tensor ah, torch::Tensor al, torch::Tensor bh, torch::Tensor bl);"
)
NAMES = {
    0: "ours 1xTF32",
    1: "ours 3xTF32 (no promotion)",
    2: "ours 3xTF32, promoted every k8",
    3: "ours 3xTF32, promoted every 32",
}


def near_neighbours(d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (2048, d), y (4096, d)) unit-norm, in clusters of 64, x near points of y (cosine ~0.96)."""
    c = torch.randn(64, d, device="cuda")
    c /= c.norm(dim=1, keepdim=True)
    y = c.repeat_interleave(64, 0) + 0.2 * torch.randn(4096, d, device="cuda") / d**0.5
    y /= y.norm(dim=1, keepdim=True)
    x = y[torch.randperm(4096, device="cuda")[:2048]] + 0.05 * torch.randn(2048, d, device="cuda") / d**0.5
    return x / x.norm(dim=1, keepdim=True), y


def main() -> None:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    ext = load_inline(
        "tf32_promotion_probe", CPP, cuda_sources=SRC, functions=["gemm", "gemm_presplit"], extra_cuda_cflags=["-O3"]
    )
    from semiring_ops.lazy import gemm_route

    products = {name: (lambda a, b, mode=mode: ext.gemm(a, b, mode)) for mode, name in NAMES.items()}

    def presplit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        (ah, al), (bh, bl) = gemm_route._split_tf32(a), gemm_route._split_tf32(b)
        return ext.gemm_presplit(ah, al.contiguous(), bh, bl.contiguous())

    products["ours 3xTF32 split once, 64 x 64 warps, promoted every k8"] = presplit
    products["cuBLAS 3xTF32 (route_mm)"] = lambda a, b: gemm_route.route_mm(a, b.t(), gemm_route.THREE_TF32)
    products["cuBLAS SGEMM"] = lambda a, b: gemm_route.route_mm(a, b.t(), gemm_route.IEEE)
    torch.manual_seed(0)
    print("| D | product | max error of x.y | ms, 16,384^2 | TF32 work, TFLOP/s |")
    print("|---|---|---|---|---|")
    for d in (128, 768):
        x, y = near_neighbours(d)
        ref = x.double() @ y.double().T
        big_x, big_y = torch.randn(16384, d, device="cuda"), torch.randn(16384, d, device="cuda")
        flops = 2 * 16384 * 16384 * d
        for name, f in products.items():
            err = (f(x, y).double() - ref).abs().max().item()
            t = time_ms(lambda f=f, a=big_x, b=big_y: f(a, b), "cuda", 7)
            work = flops * (1 if ("1x" in name or "SGEMM" in name) else 3)
            print(f"| {d} | {name} | {err:.1e} | {t:.2f} | {work / t / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
