"""Measured hardware ceilings for the semiring kernels on the GPU in use: ex2 (MUFU) throughput,
fp32 max-plus cells (FADD + FMNMX), packed f16x2 max-plus cells (HADD2 + HMNMX2, two cells each) and fp32
SGEMM cells. benchmarks/bmm.py reports % of these."""

from __future__ import annotations

import torch
from timing import time_ms

_SOURCE = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
__global__ void ex2_probe(float* out, int iters) {
  float x0 = threadIdx.x * 1e-6f, x1 = x0 + 1e-3f, x2 = x0 + 2e-3f, x3 = x0 + 3e-3f;
  for (int i = 0; i < iters; ++i) {
    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x0));
    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x1));
    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x2));
    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x3));
    x0 = -x0; x1 = -x1; x2 = -x2; x3 = -x3;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3;
}
__global__ void maxplus_probe(float* out, int iters) {
  float a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b = 0.25f;
  float m0 = -1e30f, m1 = -1e30f, m2 = -1e30f, m3 = -1e30f;
  for (int i = 0; i < iters; ++i) {
    m0 = fmaxf(m0, a0 + b); m1 = fmaxf(m1, a1 + b); m2 = fmaxf(m2, a2 + b); m3 = fmaxf(m3, a3 + b);
    b += 1e-7f;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = m0 + m1 + m2 + m3;
}
__global__ void maxplus_half2_probe(float* out, int iters) {
  const float t = threadIdx.x * 1e-3f;
  __half2 a0 = __floats2half2_rn(t, t + 1), a1 = __floats2half2_rn(t + 2, t + 3);
  __half2 a2 = __floats2half2_rn(t + 4, t + 5), a3 = __floats2half2_rn(t + 6, t + 7);
  __half2 b = __float2half2_rn(0.25f), m0 = __float2half2_rn(-6e4f), m1 = m0, m2 = m0, m3 = m0;
  const __half2 step = __float2half2_rn(1e-3f);
  for (int i = 0; i < iters; ++i) {
    m0 = __hmax2_nan(m0, __hadd2(a0, b)); m1 = __hmax2_nan(m1, __hadd2(a1, b));
    m2 = __hmax2_nan(m2, __hadd2(a2, b)); m3 = __hmax2_nan(m3, __hadd2(a3, b));
    b = __hadd2(b, step);
  }
  const float2 s = __half22float2(__hadd2(__hadd2(m0, m1), __hadd2(m2, m3)));
  out[blockIdx.x * blockDim.x + threadIdx.x] = s.x + s.y;
}
void probe(int64_t which, torch::Tensor out, int64_t blocks, int64_t threads, int64_t iters) {
  if (which == 0) ex2_probe<<<blocks, threads>>>(out.data_ptr<float>(), iters);
  else if (which == 1) maxplus_probe<<<blocks, threads>>>(out.data_ptr<float>(), iters);
  else maxplus_half2_probe<<<blocks, threads>>>(out.data_ptr<float>(), iters);
}
"""


def measure() -> dict[str, float]:
    """{'exp_per_s', 'maxplus_cells_per_s', 'maxplus16_cells_per_s', 'sgemm_cells_per_s'}, measured now on
    cuda:0 (maxplus16: two cells per HADD2 + HMNMX2 pair)."""
    from torch.utils.cpp_extension import load_inline

    from semiring_ops.build.jit import _exclusive, cache_root

    major, minor = torch.cuda.get_device_capability()
    folder = cache_root() / f"ceiling_probe-torch{torch.__version__}-sm{major}{minor}"
    folder.mkdir(parents=True, exist_ok=True)
    # torch's own build lock (a FileBaton: a `lock` file) stays behind when a run is killed mid-build and
    # makes the next run wait forever; under our fcntl lock no one else is building, so a leftover goes
    with _exclusive(folder.parent / f"{folder.name}.lock"):
        (folder / "lock").unlink(missing_ok=True)
        mod = load_inline(
            "semiring_ops_ceiling_probe",
            cpp_sources="void probe(int64_t, torch::Tensor, int64_t, int64_t, int64_t);",
            cuda_sources=_SOURCE,
            functions=["probe"],
            extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
            build_directory=str(folder),
        )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, threads, iters = sms * 16, 256, 4096
    out = torch.empty(blocks * threads, device="cuda")
    work = blocks * threads * iters * 4

    def rate(which: int, per_lane: int) -> float:
        return per_lane * work / (time_ms(lambda: mod.probe(which, out, blocks, threads, iters), "cuda", 20) * 1e-3)

    res = {"exp_per_s": rate(0, 1), "maxplus_cells_per_s": rate(1, 1), "maxplus16_cells_per_s": rate(2, 2)}
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(8192, 8192, device="cuda")
    res["sgemm_cells_per_s"] = 8192**3 / (time_ms(lambda: a @ a, "cuda", 10) * 1e-3)
    torch.backends.cuda.matmul.allow_tf32 = allow
    return res
