"""Block-sparse lazy reductions (KeOps' ranges=, issue 30 item 4) against the dense one, same formula, same data.

x, y: N points uniform in the unit cube (fp32), b (N, 1) randn; clusters of a grid of side --eps (grid_cluster),
points sorted by cluster; the cluster pairs kept are the third closest by centroid distance (from_matrix), so the
block pairs cover ~1/3 of the matrix. Kernel: K_ij = exp(-|x_i - y_j|^2 / 0.01); timed: K @ b, dense and with
K.ranges set. Wall clock (CPU) or CUDA-synchronised (GPU), min of --reps after a warm-up call; on the GPU also the
median of 20 --reps rounds of one dense and one sparse call in turn ("paired": a noisy host's bursts fall on both),
and the two products replayed from CUDA graphs (CUDA events, median: the device's time without the host's). The
check column is the largest |sparse - reference| over the outputs, relative to the largest |reference|: the float64
dense matvec with the dropped pairs zeroed (N <= 20,000). With pykeops installed, its LazyTensor runs the same two
products on the same data in the same run (up to --pykeops-max points; its first call compiles, outside the timing).

--attribute (GPU): where a call's time goes instead: per product, the synchronised wall time of one call, the
host time of a call when calls run back to back (host-bound when it matches the wall time), and the CUDA kernels
of one call (torch.profiler).

Usage:
    python benchmarks/lazy_ranges.py                       # CPU, N = 2000 and 20000
    python benchmarks/lazy_ranges.py --device cuda --sizes 20000 200000
    python benchmarks/lazy_ranges.py --device cuda --sizes 200 2000 --attribute
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
from timing import best_wall_ms, graphed, paired_wall_ms, time_ms

from semiring_ops.lazy import LazyTensor
from semiring_ops.lazy.cluster import cluster_ranges_centroids, from_matrix, grid_cluster, sort_clusters


def attribute(name: str, f, reps: int) -> None:
    """--attribute: one product's synchronised wall time, its host time back to back, and its CUDA kernels."""
    from torch.profiler import ProfilerActivity, profile

    wall = best_wall_ms(f, "cuda", reps)
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        f()
    host = (time.perf_counter() - t0) / 200 * 1e3
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            f()
        torch.cuda.synchronize()
    kernels = "; ".join(
        f"{e.key[:30]} {e.device_time_total / 20:.1f} us" for e in prof.key_averages() if e.device_time_total > 0
    )
    print(f"| {name} | {wall * 1e3:.1f} us | {host * 1e3:.1f} us | {kernels} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--eps", type=float, default=0.25)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--pykeops-max", type=int, default=20000, help="largest N timed with pykeops too (if installed)"
    )
    parser.add_argument("--attribute", action="store_true", help="where the time of a call goes (GPU; see above)")
    args = parser.parse_args()
    print(
        f"lazy ranges=, {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"{datetime.date.today()}"
    )
    try:
        from pykeops.torch import LazyTensor as KeOpsLazyTensor
    except ImportError:  # pykeops is optional: its columns read "-"
        KeOpsLazyTensor = None
    if args.attribute:
        print("| product | wall, synchronised | host per call, back to back | CUDA kernels of one call |")
        print("|---|---|---|---|")
    columns = ["N", "clusters", "pairs kept", "dense ms", "sparse ms", "dense / sparse", "check"]
    columns += ["pykeops dense ms", "pykeops sparse ms"]
    if args.device == "cuda":
        columns += ["paired dense / sparse", "graphs: dense us", "graphs: sparse us"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for n in args.sizes:
        g = torch.Generator().manual_seed(0)
        x, y, b = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g), torch.randn(n, 1, generator=g)
        x_lab, y_lab = grid_cluster(x, args.eps), grid_cluster(y, args.eps)
        x_ranges, x_centres, _ = cluster_ranges_centroids(x, x_lab)
        y_ranges, y_centres, _ = cluster_ranges_centroids(y, y_lab)
        x, x_lab = sort_clusters(x, x_lab)
        y, y_lab = sort_clusters(y, y_lab)
        d = ((x_centres[:, None, :] - y_centres[None, :, :]) ** 2).sum(2)
        keep = d <= d.flatten().kthvalue(max(1, d.numel() // 3)).values
        ranges = tuple(r.to(args.device) for r in from_matrix(x_ranges, y_ranges, keep))
        x, y, b = x.to(args.device), y.to(args.device), b.to(args.device)
        times = []
        for lazy in (LazyTensor, KeOpsLazyTensor):
            if lazy is None or (lazy is KeOpsLazyTensor and n > args.pykeops_max):
                times += [None, None]
                continue
            K = (-((lazy(x[:, None, :]) - lazy(y[None, :, :])) ** 2).sum(-1) / 0.01).exp()
            if args.attribute and lazy is LazyTensor:
                attribute(f"N = {n}, dense", lambda K=K, b=b: K @ b, args.reps)
            times.append(best_wall_ms(lambda K=K, b=b: K @ b, args.device, args.reps))
            K.ranges = ranges
            if args.attribute and lazy is LazyTensor:
                attribute(f"N = {n}, block-sparse", lambda K=K, b=b: K @ b, args.reps)
            times.append(best_wall_ms(lambda K=K, b=b: K @ b, args.device, args.reps))
            if lazy is LazyTensor:
                ours = K
                dense_K = (-((lazy(x[:, None, :]) - lazy(y[None, :, :])) ** 2).sum(-1) / 0.01).exp()
                pair = [lambda K=dense_K, b=b: K @ b, lambda K=K, b=b: K @ b]
        dense, sparse, keops_dense, keops_sparse = times
        extra = ""
        if args.device == "cuda":
            paired = paired_wall_ms(pair, "cuda", 20 * args.reps)
            replays = [f"{time_ms(graphed(f), 'cuda', 20 * args.reps) * 1e3:.1f}" for f in pair]
            extra = f" {paired[0] / paired[1]:.2f} | {replays[0]} | {replays[1]} |"
        mask = keep[x_lab][:, y_lab].to(x.dtype).to(args.device) if n <= 20000 else None
        check = "-"
        if mask is not None:
            xd, yd = x.double(), y.double()
            want = (torch.exp(-((xd[:, None] - yd[None]) ** 2).sum(-1) / 0.01) * mask.double()) @ b.double()
            check = f"{float((ours @ b - want).abs().max() / want.abs().max()):.1e}"
        theirs = " | ".join("-" if t is None else f"{t:.1f}" for t in (keops_dense, keops_sparse))
        print(
            f"| {n} | {len(x_ranges)} x {len(y_ranges)} | {int(keep.sum())} ({float(keep.float().mean()):.2f}) | "
            f"{dense:.1f} | {sparse:.1f} | {dense / sparse:.2f} | {check} | {theirs} |{extra}"
        )


if __name__ == "__main__":
    main()
