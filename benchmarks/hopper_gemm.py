"""The route's Hopper GEMMs (semiring_ops/lazy/hopper_gemm.py) beside cuBLAS, one run: the promoted 3xTF32 GEMM
(gemm_route.PROMOTED, precision="exact" sums past D = 128) against cuBLAS's 3xTF32 (THREE_TF32) and SGEMM (IEEE), each
through gemm_route.route_mm (operands split per call, as the route's linear sums do), on 16,384^2 outputs of randn
operands (median of 7 CUDA-event timings; TF32 work: 3x the SGEMM's flops); and the max error of x.y against
float64 on unit-norm near neighbours (cosine ~0.96, 2,048 x 4,096, tf32_promotion_probe.near_neighbours).

    python benchmarks/hopper_gemm.py      # on an sm_90 GPU (H100, H200)
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from tf32_promotion_probe import near_neighbours
from timing import time_ms

from semiring_ops.lazy import gemm_route, hopper_gemm

MODES = (
    ("promoted 3xTF32 (ours)", gemm_route.PROMOTED),
    ("cuBLAS 3xTF32", gemm_route.THREE_TF32),
    ("cuBLAS SGEMM", gemm_route.IEEE),
)


def main() -> None:
    if not hopper_gemm.available(torch.device("cuda")):
        raise SystemExit("hopper_gemm needs an sm_90 GPU and an NVRTC for sm_90a")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| D | product | max error of x.y, near neighbours | ms, 16,384^2 | TF32 work, TFLOP/s |")
    print("|---|---|---|---|---|")
    for d in (128, 256, 768, 2048):
        x, y = near_neighbours(d)
        ref = x.double() @ y.double().T
        a, b = torch.randn(16384, d, device="cuda"), torch.randn(16384, d, device="cuda")
        flops = 2 * 16384**2 * d
        for name, mode in MODES:
            err = (gemm_route.route_mm(x, y.T, mode).double() - ref).abs().max().item()
            t = time_ms(lambda mode=mode, a=a, b=b: gemm_route.route_mm(a, b.T, mode), "cuda", 7)
            work = flops * (1 if mode == gemm_route.IEEE else 3)
            print(f"| {d} | {name} | {err:.1e} | {t:.2f} | {work / t / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
