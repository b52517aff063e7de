"""The log fast mode's two tiers side by side (semiring_ops/ops/fast_log.py): the scaled tier (one scale per row
and column, one cuBLAS TF32 product) with its fused passes and with its ATen passes, the tile kernel alone, the
public precision="fast" (which picks), 3xTF32 and the exact kernel, in one run, on a (B, n, n) and
b (B, n, n) = scale * randn float32; and the scaled tier's floor, cuBLAS's TF32 bmm of its factors alone.

Columns: forward ms (CUDA events, median of --reps after warm-up), cells/s (B n^3 / time), the share of the floor's
time (the floor over the row's time), the max |fast - exact| over the whole output, and how many outputs each tier
flagged for the exact recompute. --scales 1 3 30: at 30 the scaled tier flags most outputs and the public entry runs
the tile kernel.

--profile: instead, the scaled tier's CUDA kernels per call (torch.profiler), fused and ATen.

Usage:
    python benchmarks/fast_log_tiers.py                        # B=1 n=4096 and B=8 n=1024, scales 1 and 3
    python benchmarks/fast_log_tiers.py --shapes 1x4096 --scales 3 30
    python benchmarks/fast_log_tiers.py --shapes 1x4096 --scales 3 --profile
"""

from __future__ import annotations

import argparse
import datetime

import torch
from timing import time_ms

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.ops import fast_log
from semiring_ops.ops.fast_log_scaled import scaled_product, tf32_matmul


def tiled(a, b, passes=1):
    fast_log.SCALED_TIER = False
    try:
        return fast_log.log_bmm_fast(a, b, passes=passes)
    finally:
        fast_log.SCALED_TIER = True


def floor(a, b, kernels):
    """The scaled tier's floor: a function running cuBLAS's TF32 bmm of its factors alone."""
    fa, fb = kernels.log_bmm_fast_scales(a, b)[:2]

    def gemm():
        with tf32_matmul():
            return torch.bmm(fa, fb)

    return gemm


def profile(B: int, n: int, scale: float, kernels) -> None:
    """Kernel times per call of the scaled tier, fused and in ATen passes, largest first, and its floor."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    g = torch.Generator(device="cuda").manual_seed(0)
    a = scale * torch.randn(B, n, n, device="cuda", generator=g)
    b = scale * torch.randn(B, n, n, device="cuda", generator=g)
    for name, module in (("fused", kernels), ("ATen passes", None)):
        for _ in range(3):
            scaled_product(a, b, module)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                scaled_product(a, b, module)
            torch.cuda.synchronize()
        rows = [
            (e.key, e.device_time_total / 10, e.count // 10) for e in prof.key_averages() if e.device_time_total > 0
        ]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows) / 1e3
        print(f"scaled tier ({name}), B={B} n={n} scale={scale:g}: {total:.3f} ms of kernels per call")
        for key, us, count in rows:
            print(f"  {us / 1e3:7.3f} ms  x{count}  {key[:100]}")
    ms = time_ms(floor(a, b, kernels), "cuda", 20)
    print(f"TF32 bmm of the factors alone: {ms:.3f} ms, {2 * B * n**3 / ms / 1e9:.0f} TFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["1x4096", "8x1024"], help="BxN")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="the scaled tier's kernels (see above)")
    args = parser.parse_args()
    kernels = backend_for(torch.device("cuda")).family("fast_log")
    if args.profile:
        for shape in args.shapes:
            for scale in args.scales:
                profile(*(int(v) for v in shape.split("x")), scale, kernels)
        return
    print(f"fast log tiers, {torch.cuda.get_device_name()}, torch {torch.__version__}, {datetime.date.today()}")
    print("| B | n | scale | impl | fwd ms | cells/s | floor / time | max abs err vs exact | flagged |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        B, n = (int(v) for v in shape.split("x"))
        for scale in args.scales:
            g = torch.Generator(device="cuda").manual_seed(0)
            a = scale * torch.randn(B, n, n, device="cuda", generator=g)
            b = scale * torch.randn(B, n, n, device="cuda", generator=g)
            exact = so.logbmm(a, b)
            floor_ms = time_ms(floor(a, b, kernels), "cuda", args.reps)
            impls = {
                "scaled tier, fused": lambda a=a, b=b: scaled_product(a, b, kernels)[0],
                "scaled tier, ATen passes": lambda a=a, b=b: scaled_product(a, b)[0],
                "tile kernel": lambda a=a, b=b: tiled(a, b),
                'precision="fast"': lambda a=a, b=b: so.logbmm(a, b, precision="fast"),
                "3xTF32 (tile)": lambda a=a, b=b: tiled(a, b, 3),
                "exact": lambda a=a, b=b: so.logbmm(a, b),
            }
            for name, fn in impls.items():
                ms = time_ms(fn, "cuda", args.reps)
                fast_log.reset_stats()
                out = fn()
                if name.startswith("scaled tier"):
                    _, flags, count = scaled_product(a, b, kernels if name.endswith("fused") else None)
                    flagged = str(int(count))
                    out = torch.where(flags, exact, out)  # what the repair would write
                else:
                    flagged = "-" if name == "exact" else str(fast_log.stats["flagged"])
                    if name == 'precision="fast"':
                        flagged += " (scaled)" if fast_log.stats["scaled"] else " (tile)"
                err = (out - exact)[torch.isfinite(exact)].abs().max().item()
                rate = B * n**3 / ms * 1e3
                share = f"{floor_ms / ms:.0%}"
                print(f"| {B} | {n} | {scale:g} | {name} | {ms:.3f} | {rate:.2e} | {share} | {err:.2e} | {flagged} |")
            rate = B * n**3 / floor_ms * 1e3
            name = "TF32 bmm of the factors (floor)"
            print(f"| {B} | {n} | {scale:g} | {name} | {floor_ms:.3f} | {rate:.2e} | 100% | - | - |")


if __name__ == "__main__":
    main()
