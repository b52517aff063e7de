"""One fast-mode log matmul (issue 29 item 1's shape, B = 1, n = k = m = 4096, float32) for Nsight Compute: warm-up
and a CUDA-event timing outside the profiled range, then one call between cudaProfilerStart / Stop.

    ncu --profile-from-start off --set full -o fast_log python benchmarks/ncu_fast_log.py
    ncu -i fast_log.ncu-rep --page details
"""

from __future__ import annotations

import argparse

import torch

import semiring_ops as so


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    a = torch.randn(args.batch, args.n, args.n, device="cuda") * 3
    b = torch.randn(args.batch, args.n, args.n, device="cuda") * 3
    for _ in range(3):
        so.logbmm(a, b, precision="fast")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        so.logbmm(a, b, precision="fast")
    end.record()
    torch.cuda.synchronize()
    print(f"fast log B={args.batch} n={args.n}: {start.elapsed_time(end) / 10:.3f} ms per call (CUDA events, 10 calls)")
    torch.cuda.cudart().cudaProfilerStart()
    so.logbmm(a, b, precision="fast")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
