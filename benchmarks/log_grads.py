"""The log semiring's backward on one device: both gradients from the backend's log_bmm_grads against the two
log_contract calls (one per gradient) it replaces, beside the forward, in one run.

Rows, on torch.randn float32 a (B, n, k), b (B, k, m) and a random output gradient g:
    log_contract x 2   grad_a and grad_b as two contractions, each forming every cell's exponential
    log_bmm_grads      both from one exponential per cell (the CPU's one pass; CUDA's fused float32 kernel)
    grad_a only, grad_b only, forward (logbmm)
Times are medians of --reps runs after warm-up, timed in alternation (benchmarks/timing.py); cells = B*n*k*m.

Usage:
    python benchmarks/log_grads.py --device cpu --threads 1 2          # docs/perf_notes.md, "CPU log backward"
    python benchmarks/log_grads.py --device cuda --batch 8 --size 1024
"""

from __future__ import annotations

import argparse
import datetime

import ceilings
import torch
from timing import paired_ms

import semiring_ops as so
from semiring_ops.build.backends import backend_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=256, help="n = k = m")
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    B, n = args.batch, args.size
    a, b = (torch.randn(B, n, n, generator=gen).to(args.device) for _ in range(2))
    c = so.logbmm(a, b)
    g = torch.randn(B, n, n, generator=gen).to(args.device)
    bmm = backend_for(c.device).family("bmm")
    negc = torch.where(c == -torch.inf, c, -c)
    cases = {
        "log_contract x 2": lambda: (
            bmm.log_contract(negc, g, b.transpose(1, 2), None, a),
            bmm.log_contract(a.transpose(1, 2), None, negc, g, b),
        ),
        "log_bmm_grads": lambda: bmm.log_bmm_grads(a, b, c, g, True, True),
        "grad_a only": lambda: bmm.log_bmm_grads(a, b, c, g, True, False),
        "grad_b only": lambda: bmm.log_bmm_grads(a, b, c, g, False, True),
        "forward (logbmm)": lambda: so.logbmm(a, b),
    }
    ga, gb = cases["log_bmm_grads"]()
    ra, rb = cases["log_contract x 2"]()
    diff = max(((x - y).abs().max() / y.abs().max()).item() for x, y in ((ga, ra), (gb, rb)))

    cells = B * n**3
    # the MUFU ex2 ceiling measured now (benchmarks/ceilings.py): one exponential per cell and gradient is the
    # contractions' cost, one per cell the fused kernel's
    ex2 = ceilings.measure()["exp_per_s"] if args.device == "cuda" else None
    print(f"log backward, {args.device}, B={B}, n=k=m={n}, float32, median of {args.reps}, {datetime.date.today()}")
    print(f"max relative difference, log_bmm_grads vs two log_contracts: {diff:.2e}")
    if ex2:
        print(f"ex2 ceiling measured now: {ex2:.3e}/s; '% of ex2': cells (both gradients) / time / ceiling")
    print("| threads | " + " | ".join(f"{name} ms" for name in cases) + " | speed-up | cells/s (both) | % of ex2 |")
    print("|---" * (len(cases) + 4) + "|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = paired_ms(list(cases.values()), args.device, args.reps)
        two, fused = times[0], times[1]
        row = " | ".join(f"{t:.2f}" for t in times)
        share = "-"
        if ex2:
            share = f"{100 * cells / fused * 1e3 / ex2:.0f}% (two contractions: {200 * cells / two * 1e3 / ex2:.0f}%)"
        print(f"| {threads} | {row} | {two / fused:.2f}x | {cells / fused * 1e3:.2e} | {share} |")


if __name__ == "__main__":
    main()
