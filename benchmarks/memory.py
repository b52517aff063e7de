"""Peak memory of the semiring matmul, forward + backward, against what materialising the
(B, n, k, m) terms would take (as torch naive does).

GPU: torch.cuda.max_memory_allocated above the inputs; CPU: growth of the process's peak RSS.
Usage: python benchmarks/memory.py [--device cpu|cuda] [--sizes 256 512 1024]
"""

from __future__ import annotations

import argparse
import resource

import torch

import semiring_ops as so


def peak_mib(op: str, B: int, n: int, device: str) -> float:
    a = torch.randn(B, n, n, device=device, requires_grad=True)
    b = torch.randn(B, n, n, device=device, requires_grad=True)
    g = torch.randn(B, n, n, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = so.semiring_matmul(a, b, op)
    torch.autograd.grad(out, (a, b), g)
    if device == "cuda":
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    args = parser.parse_args()
    peak_mib("log", args.batch, 16, args.device)  # load kernels and warm the allocator
    print(f"{'op':4s} {'B':>2s} {'n':>5s} {'peak MiB':>9s} {'materialised MiB':>17s}")
    for op in ("log", "max"):
        for n in args.sizes:
            mib = peak_mib(op, args.batch, n, args.device)
            full = args.batch * n**3 * 4 / 2**20
            print(f"{op:4s} {args.batch:2d} {n:5d} {mib:9.1f} {full:17.0f}", flush=True)


if __name__ == "__main__":
    main()
