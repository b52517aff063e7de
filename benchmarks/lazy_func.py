"""torch.func over lazy reductions: vmap's batching rule against a Python loop, and a jvp against a vjp.

Gaussian kernel product sum_j exp(-|x_i - y_j|^2 / 2) b_j with x (B, M, 3), y (N, 3), b (N, 1) float32 (random
normal data), M = N = --size. Rows:
- vmap: torch.func.vmap over the B batch entries of x (one reduction with a batch dimension, one launch);
- loop: the same B reductions one by one from Python (what vmap would cost without a batching rule);
- jvp: torch.func.jvp of one reduction with respect to x (the forward-mode rule: one more sum reduction);
- vjp: the reverse-mode gradient with respect to x of the same reduction (forward and backward).
Wall clock (CPU) or CUDA-synchronised (GPU), min of --reps after a warm-up call.

Usage:
    python benchmarks/lazy_func.py                     # CPU
    python benchmarks/lazy_func.py --device cuda --size 20000
"""

from __future__ import annotations

import argparse
import datetime

import torch
from timing import best_wall_ms

from semiring_ops.lazy import Vi, Vj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    n, batch = args.size, args.batch
    x = torch.randn(batch, n, 3, generator=g).to(args.device)
    y = torch.randn(n, 3, generator=g).to(args.device)
    b = torch.randn(n, 1, generator=g).to(args.device)
    tx = torch.randn(n, 3, generator=g).to(args.device)

    def gauss(x):
        return (-Vi(x).sqdist(Vj(y)) / 2).exp() @ b

    def vjp():
        x0 = x[0].detach().requires_grad_()
        torch.autograd.grad(gauss(x0).sum(), x0)

    rows = {
        "vmap": lambda: torch.func.vmap(gauss)(x),
        "loop": lambda: torch.stack([gauss(x[k]) for k in range(batch)]),
        "jvp": lambda: torch.func.jvp(gauss, (x[0],), (tx,)),
        "vjp (forward + backward)": vjp,
    }
    print(
        f"lazy torch.func, {args.device}, M = N = {n}, B = {batch}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, {datetime.date.today()}"
    )
    print("| what | ms | pairs/s |")
    print("|---|---|---|")
    for name, f in rows.items():
        ms = best_wall_ms(f, args.device, args.reps)
        pairs = n * n * (batch if name in ("vmap", "loop") else 1)
        print(f"| {name} | {ms:.2f} | {pairs / ms * 1e3:.2e} |")


if __name__ == "__main__":
    main()
