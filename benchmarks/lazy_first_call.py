"""Where a new lazy formula's first call goes (issue 42 item 3): one fresh process with an empty kernel cache,
the compile, module load, code generation and the matrix-unit route's host steps timed by wrapping them.

Prints one line: the first call minus a warm call, the first and warm calls, and the time inside each wrapped
step (synchronised). The routed path needs at least 2^22 pairs on CUDA (--n 3000); --n 2000 takes the plain
kernel. Each run must be a new process (the kernels are memoised per process).

Usage:
    python benchmarks/lazy_first_call.py --d 784 --n 3000                 # routed squared-distance k-NN
    python benchmarks/lazy_first_call.py --d 784 --n 3000 --kind gauss    # routed Gaussian K @ b
    python benchmarks/lazy_first_call.py --d 784 --metric l1              # wide sums in chunks (no GEMM)
    SEMIRING_OPS_LAZY_TIERS=0 python benchmarks/lazy_first_call.py ...    # no quick compile first (nvrtc.py's tiers)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=784)
    parser.add_argument("--n", type=int, default=3000, help="points on each side")
    parser.add_argument("--metric", choices=["sqdist", "l1"], default="sqdist")
    parser.add_argument("--kind", choices=["knn", "gauss"], default="knn")
    args = parser.parse_args()
    cache = tempfile.mkdtemp()
    os.environ["SEMIRING_OPS_CACHE"] = os.environ["SEMIRING_OPS_LAZY_CACHE"] = cache
    # NVRTC's results are kept across processes by the driver's compute cache (~/.nv/ComputeCache): without this a
    # formula compiled by an earlier run (the tests, another benchmark) would be timed as a cache hit
    os.environ.setdefault("CUDA_CACHE_DISABLE", "1")
    import torch

    from semiring_ops.lazy import LazyTensor, cuda_kernels, gemm_route, nvrtc

    spent: dict[str, float] = {}

    def wrap(module, name: str, label: str) -> None:
        real = getattr(module, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = real(*a, **k)
            torch.cuda.synchronize()
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
            return out

        setattr(module, name, timed)

    wrap(nvrtc, "_nvrtc_compile", "NVRTC")
    wrap(nvrtc, "_load_module", "module load")
    wrap(cuda_kernels, "cuda_source", "codegen")
    wrap(gemm_route, "_inner_side", "route: inner side")
    wrap(gemm_route, "_block_matrix", "route: GEMM blocks")
    d, n = args.d, args.n
    x, y = torch.randn(n, d, device="cuda"), torch.randn(n, d, device="cuda")
    b = torch.randn(n, 1, device="cuda")
    torch.mm(x, y.t())  # cuBLAS's start-up is paid once per process, not per formula
    torch.cuda.synchronize()

    def run() -> None:
        diff = LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])
        dist = diff.abs().sum(-1) if args.metric == "l1" else (diff**2).sum(-1)
        if args.kind == "gauss":
            (-dist / d).exp() @ b
        else:
            dist.argKmin(10, dim=1)
        torch.cuda.synchronize()

    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    inside = dict(spent)
    t0 = time.perf_counter()
    run()
    warm = time.perf_counter() - t0
    steps = ", ".join(f"{k} {v:.3f} s" for k, v in inside.items())
    print(f"D = {d}, {n}^2, {args.metric} {args.kind}: first call {first - warm:.3f} s beyond a warm one ({steps})")


if __name__ == "__main__":
    main()
