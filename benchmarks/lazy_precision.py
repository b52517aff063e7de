"""The lazy route's precisions against float64 on the data that shows their differences: unit-norm embeddings in
clusters of 100 (cosine ~0.96 and ~0.84 to the 10 nearest), where |x|^2 + |y|^2 - 2 x.y cancels, and random
points, where it does not (issue 42; gemm_route.py, winners.py, docs/lazy.md "Precision").

For D in --dims, 2,048 query rows against N points: the median relative error of the 10 nearest squared distances
(k-NN values) and of a Gaussian sum exp(-g D_ij) @ b (each row's error over its largest term, g = 1 / the median
10th distance), for ours with precision="exact" (the default), "high" and "fast", the plain kernel
(SEMIRING_OPS_LAZY_GEMM=off) and the torch form (|x|^2 + |y|^2 - 2 x y^T by addmm, TF32 off), and the share of
rows whose 10 nearest are float64's.

    python benchmarks/lazy_precision.py --device cuda
"""

from __future__ import annotations

import argparse
import os

import torch


def unit_neighbours(n: int, d: int, spread: float, device: str, gen: torch.Generator):
    centres = torch.randn(n // 100, d, generator=gen)
    centres /= centres.norm(dim=1, keepdim=True)
    y = centres.repeat_interleave(100, 0) + spread * torch.randn(n, d, generator=gen) / d**0.5
    y /= y.norm(dim=1, keepdim=True)
    x = y[torch.randint(0, n, (2048,), generator=gen)] + 0.05 * torch.randn(2048, d, generator=gen) / d**0.5
    return (x / x.norm(dim=1, keepdim=True)).to(device), y.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 256, 784, 2048])
    args = parser.parse_args()
    from semiring_ops.lazy import Vi, Vj

    dev = args.device
    print("| D | data | what | ours exact | high | fast | plain kernel | torch form |")
    print("|---|---|---|---|---|---|---|---|")
    for d in args.dims:
        n = args.n if d < 2048 else min(args.n, 20_000)
        gen = torch.Generator().manual_seed(d)
        layouts = {"cos 0.96": 0.2, "cos 0.84": 0.45, "random": None}
        for name, spread in layouts.items():
            if spread is None:
                x, y = torch.randn(2048, d, generator=gen).to(dev), torch.randn(n, d, generator=gen).to(dev)
            else:
                x, y = unit_neighbours(n, d, spread, dev, gen)
            full = torch.cdist(x.double(), y.double()).square_()
            ref, ref_idx = full.topk(10, dim=1, largest=False)
            g = 1.0 / ref[:, -1].median().item()
            b = torch.randn(n, 1, generator=gen).to(dev)
            ref_sum = (-g * full).exp() @ b.double()
            del full
            f = ((Vi(x) - Vj(y)) ** 2).sum(-1)
            knn, sums, rows = {}, {}, {}
            for p in ("exact", "high", "fast"):
                knn[p] = f.Kmin_argKmin(10, dim=1, precision=p)
                sums[p] = (-g * f).exp().__matmul__(b, precision=p)
            os.environ["SEMIRING_OPS_LAZY_GEMM"] = "off"
            try:
                knn["plain"], sums["plain"] = f.Kmin_argKmin(10, dim=1), (-g * f).exp() @ b
            finally:
                del os.environ["SEMIRING_OPS_LAZY_GEMM"]
            dd = torch.addmm((y * y).sum(1)[None], x, y.T, alpha=-2).add_((x * x).sum(1, keepdim=True))
            knn["torch"], sums["torch"] = dd.topk(10, dim=1, largest=False), (-g * dd).exp() @ b
            del dd
            for p, (_, i) in knn.items():
                rows[p] = (i.sort(1).values == ref_idx.sort(1).values).all(1).float().mean().item()
            kerr = {p: ((v.double() - ref).abs() / ref).median().item() for p, (v, _) in knn.items()}
            serr = {
                p: ((s.double() - ref_sum).abs().amax(1) / ref_sum.abs().amax(1)).median().item()
                for p, s in sums.items()
            }
            cols = ("exact", "high", "fast", "plain", "torch")
            print(f"| {d} | {name} | k-NN values | " + " | ".join(f"{kerr[c]:.1e}" for c in cols) + " |")
            print(f"| {d} | {name} | Gaussian sum | " + " | ".join(f"{serr[c]:.1e}" for c in cols) + " |")
            print(
                f"| {d} | {name} | rows with float64's 10 | "
                + " | ".join(f"{100 * rows[c]:.2f}%" for c in cols)
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
