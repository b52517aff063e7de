"""Lazy reductions at every vector dimension (issue 42): k-NN and Gaussian kernel products of D-vectors, ours (the
matrix-unit route, gemm_route.py), ours without it (SEMIRING_OPS_LAZY_GEMM=off: the plain generated kernel), the
torch code a user would otherwise write, and pykeops, in one run and one table.

Definitions: x (M, D), y (N, D), b (N, E) fp32 torch.randn (never zeros); D_ij = ((x_i - y_j) ** 2).sum(-1)
written the KeOps way (LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])); with --metric l1,
D_ij = (x_i - y_j).abs().sum(-1), which no GEMM computes (the generated kernel's wide sums alone,
lazy/wide_chunks.py on the GPU; the torch code is torch.cdist(p=1)).
    knn       D_ij.argKmin(10, dim=1)                                 (M, 10) int64
    gauss E   (-D_ij / D).exp() @ b, b of width E (gauss1, gauss16, any gaussE)  (M, E)
    grad      the gradient of gauss 1 wrt x (torch.autograd.grad with a random cotangent)
    torch     |x|^2 + |y|^2 - 2 x y^T materialised by addmm (TF32 off, as torch's default), then topk(10,
              largest=False) / exp_() @ b; rows in chunks of --torch-chunk so that 50,000^2 fits ("the torch code");
              torch.cdist(p=1) for l1
    pykeops   with --pykeops, in a child process per row (a crash costs only its cell), one build folder for the
              run; "KeOps first s" its first call of the row's formula beyond a warm one (the compile). pykeops 2.3
              segfaults with CUDA 13's NVRTC: benchmarks/keops_cuda12.sh runs this script with CUDA 12.9's NVRTC
              for it
    fast      with --fast: ours with precision="fast" (plain TF32 GEMMs on the GPU)
    high      with --high: ours with precision="high" (3xTF32 GEMMs for the sums too on the GPU)
    plain     ours with SEMIRING_OPS_LAZY_GEMM=off (the generated kernel alone), up to --plain-max-d

Times: median ms of CUDA events (GPU) or wall clock (CPU) after warm-up. Bounds, measured in this run: TF32 and
fp32 (SIMT / SGEMM) GEMM rates of an 8192^3 torch.mm. Ours runs 3xTF32 on the GPU for k-NN (bound 2 M N (3 D) /
TF32 rate) and the SGEMM for the sums (bound 2 M N D / SGEMM rate); both are printed (l1: 2 instructions per term,
4 M N D / SGEMM rate, the SIMT pipe's bound). "first" is a new formula's first call
(compile included) in a fresh process with an empty kernel cache, minus a warm call.

Usage:
    python benchmarks/lazy_dims.py --device cuda                     # N = M = 50,000 (20,000 at D = 2048)
    python benchmarks/lazy_dims.py --device cpu --m 4000 --n 2000 --wide-n 0   # the 2-core CPU rows of the issue
    python benchmarks/lazy_dims.py --device cuda --dims 784 --m 10000 --n 60000   # KeOps's MNIST k-NN shape
    python benchmarks/lazy_dims.py --device cuda --metric l1 --plain-max-d 0      # formulas no GEMM computes
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_ms, time_ms

DIMS = (3, 16, 64, 128, 256, 784, 2048)
K = 10

_FIRST_CALL = r"""
import json, sys, time, torch
from semiring_ops.lazy import LazyTensor
device, d, metric = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x, y = torch.randn(2000, d, device=device), torch.randn(2000, d, device=device)
torch.mm(x, y.t())  # the BLAS / cuBLAS start-up is paid once per process, not per formula
if device != "cpu":
    torch.cuda.synchronize()
def run():
    diff = LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])
    D = diff.abs().sum(-1) if metric == "l1" else (diff ** 2).sum(-1)
    out = D.argKmin(10, dim=1)
    if device != "cpu":
        torch.cuda.synchronize()
t = time.perf_counter(); run(); first = time.perf_counter() - t
t = time.perf_counter(); run(); warm = time.perf_counter() - t
print(json.dumps({"first": first - warm}))
"""

_KEOPS = r"""
import json, os, statistics, sys, time, torch
import pykeops  # built into KEOPS_CACHE_FOLDER (pykeops 2.3's set_build_folder moves its .nfo files, not its cubins)
from pykeops.torch import LazyTensor
device, kind, metric = sys.argv[1], sys.argv[5], sys.argv[7]
m, n, d, reps = (int(a) for a in sys.argv[2:5] + sys.argv[6:7])
g = torch.Generator().manual_seed(0)
x, y = torch.randn(m, d, generator=g).to(device), torch.randn(n, d, generator=g).to(device)
b = torch.randn(n, int(kind[5:]) if kind.startswith("gauss") else 1, generator=g).to(device)
cot = torch.randn(m, 1, generator=g).to(device)
xs = x.requires_grad_(kind == "grad")
diff = LazyTensor(xs[:, None, :]) - LazyTensor(y[None, :, :])
D = diff.abs().sum(-1) if metric == "l1" else (diff ** 2).sum(-1)
if kind == "knn":
    run = lambda: D.argKmin(10, dim=1)
elif kind == "grad":
    run = lambda: torch.autograd.grad((-D / d).exp() @ b, xs, cot)[0]
else:
    run = lambda: (-D / d).exp() @ b
sync = (lambda: None) if device == "cpu" else torch.cuda.synchronize
t = time.perf_counter(); run(); sync(); first = time.perf_counter() - t  # the formula's compile included
times = []
for _ in range(reps):
    t = time.perf_counter(); run(); sync(); times.append((time.perf_counter() - t) * 1e3)
    if sum(times) > 20e3:  # calls of seconds (KeOps's gradient at D = 784): the median of those made in 20 s
        break
print(json.dumps({"ms": statistics.median(times), "first": first - statistics.median(times) * 1e-3}))
"""


def _child(code: str, args: list[str], env: dict) -> dict | None:
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else None


def first_call_s(device: str, d: int, metric: str) -> float | None:
    with tempfile.TemporaryDirectory() as cache:
        # the driver's compute cache off too: with it, a source NVRTC compiled before can come back in 0.03 s
        # (docs/benchmarks.md, "First call"), as in benchmarks/lazy_first_call.py
        env = dict(os.environ, SEMIRING_OPS_CACHE=cache, SEMIRING_OPS_LAZY_CACHE=cache, CUDA_CACHE_DISABLE="1")
        r = _child(_FIRST_CALL, [device, str(d), metric], env)
    return None if r is None else r["first"]


def keops_ms(device: str, m: int, n: int, d: int, kind: str, reps: int, metric: str, cache: str) -> dict | None:
    """pykeops's median ms and its first call beyond a warm one (s), in a child process with the build folder
    cache (one for the run: its formulas are new to it, its compiled binder is not)."""
    argv = [device, str(m), str(n), str(d), kind, str(reps), metric]
    return _child(_KEOPS, argv, dict(os.environ, KEOPS_CACHE_FOLDER=cache))


def gemm_rates(device: str) -> tuple[float, float]:
    """(TF32, fp32) flop/s of torch.mm at 8192^3 (CPU: fp32 twice, 2048^3)."""
    s = 8192 if device == "cuda" else 2048
    a, b = torch.randn(s, s, device=device), torch.randn(s, s, device=device)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = device == "cuda"
        tf32 = 2 * s**3 / (time_ms(lambda: torch.mm(a, b), device, 5) * 1e-3)
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = 2 * s**3 / (time_ms(lambda: torch.mm(a, b), device, 5) * 1e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return tf32, fp32


def torch_form(x: torch.Tensor, y: torch.Tensor, b: torch.Tensor | None, chunk: int, metric: str) -> torch.Tensor:
    """The torch code: distances by addmm (l1: cdist), then topk or exp @ b, chunk rows at a time."""
    yy = (y * y).sum(1)
    out = []
    for lo in range(0, x.shape[0], chunk):
        xc = x[lo : lo + chunk]
        if metric == "l1":
            dist = torch.cdist(xc, y, p=1)
        else:
            dist = torch.addmm(yy[None, :], xc, y.t(), alpha=-2).add_((xc * xc).sum(1, keepdim=True))
        if b is None:
            out.append(dist.topk(K, dim=1, largest=False).indices)
        else:
            out.append(dist.div_(-x.shape[1]).exp_() @ b)
    return torch.cat(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--m", type=int, default=50_000)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--dims", type=int, nargs="+", default=list(DIMS))
    parser.add_argument("--wide-n", type=int, default=20_000, help="M = N at D >= 2048 (0: --m, --n)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--kinds", nargs="+", default=["knn", "gauss1", "gauss16", "grad"])
    parser.add_argument("--torch-chunk", type=int, default=8192)
    parser.add_argument("--plain-max-d", type=int, default=784, help="ours without the route up to this D only")
    parser.add_argument("--pykeops", action="store_true")
    parser.add_argument("--fast", action="store_true", help='also ours with precision="fast"')
    parser.add_argument("--high", action="store_true", help='also ours with precision="high"')
    parser.add_argument("--first-call", action="store_true", help="also a new formula's first call per D")
    parser.add_argument("--metric", choices=["sqdist", "l1"], default="sqdist")
    parser.add_argument("--torch-max-d", type=int, default=1 << 30, help="the torch code up to this D only")
    parser.add_argument(
        "--paired", action="store_true", help="time ours and the torch form alternately (timing.paired_ms), for ratios"
    )
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    from semiring_ops.lazy import LazyTensor

    dev = args.device
    tf32, fp32 = gemm_rates(dev)
    name = torch.cuda.get_device_name() if dev == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}, torch {torch.__version__}, {datetime.date.today()}; GEMM rates: TF32 {tf32:.3g}, fp32 {fp32:.3g}")
    print(
        "| D | M x N | kind | ours ms | high ms | fast ms | plain ms | torch ms | KeOps ms | torch / ours "
        "| KeOps / ours | bound 3xTF32 % | bound fp32 % | first s | KeOps first s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    keops_cache = tempfile.TemporaryDirectory()
    for d in args.dims:
        m, n = (args.wide_n, args.wide_n) if d >= 2048 and args.wide_n > 0 else (args.m, args.n)
        g = torch.Generator().manual_seed(d)
        x, y = torch.randn(m, d, generator=g).to(dev), torch.randn(n, d, generator=g).to(dev)
        first = first_call_s(dev, d, args.metric) if args.first_call else None
        for kind in args.kinds:
            b = torch.randn(n, int(kind[5:]) if kind.startswith("gauss") else 1, generator=g).to(dev)
            cot = torch.randn(m, 1, generator=g).to(dev)

            def ours(x=x, y=y, b=b, kind=kind, cot=cot, d=d, precision="exact"):
                xs = x.detach().requires_grad_(kind == "grad")
                diff = LazyTensor(xs[:, None, :]) - LazyTensor(y[None, :, :])
                D = diff.abs().sum(-1) if args.metric == "l1" else (diff**2).sum(-1)
                if kind == "knn":
                    return D.argKmin(K, dim=1, precision=precision)
                out = (-D / d).exp().__matmul__(b, precision=precision)
                return torch.autograd.grad(out, xs, cot)[0] if kind == "grad" else out

            t_ours = time_ms(ours, dev, args.reps)
            t_fast = t_high = None
            if args.fast and kind != "grad":
                t_fast = time_ms(lambda ours=ours: ours(precision="fast"), dev, args.reps)
            if args.high and kind != "grad":
                t_high = time_ms(lambda ours=ours: ours(precision="high"), dev, args.reps)
            t_plain = None
            if d <= args.plain_max_d:
                os.environ["SEMIRING_OPS_LAZY_GEMM"] = "off"
                try:
                    t_plain = time_ms(ours, dev, max(1, args.reps // 2))
                finally:
                    del os.environ["SEMIRING_OPS_LAZY_GEMM"]
            t_torch = None
            if kind != "grad" and d <= args.torch_max_d:

                def theirs(x=x, y=y, b=b, kind=kind):
                    return torch_form(x, y, None if kind == "knn" else b, args.torch_chunk, args.metric)

                if args.paired:  # ours and the torch form alternated, one call of each per round
                    t_ours, t_torch = paired_ms([ours, theirs], dev, args.reps)
                else:
                    t_torch = time_ms(theirs, dev, args.reps)
            keops = keops_ms(dev, m, n, d, kind, args.reps, args.metric, keops_cache.name) if args.pykeops else None
            t_keops = None if keops is None else keops["ms"]
            flops = 2 * m * n * d
            b3 = 100 * 3 * flops / tf32 / (t_ours * 1e-3)
            bf = 100 * flops / fp32 / (t_ours * 1e-3)
            if args.metric == "l1":  # no GEMM: 2 instructions per term on the SIMT pipe (fp32 / 2 per second)
                b3, bf = float("nan"), 100 * 2 * flops / fp32 / (t_ours * 1e-3)
            fmt = lambda t: "-" if t is None else f"{t:.2f}"  # noqa: E731
            ratio = lambda t, t_ours=t_ours: "-" if t is None else f"{t / t_ours:.2f}"  # noqa: E731
            print(
                f"| {d} | {m} x {n} | {kind} | {t_ours:.2f} | {fmt(t_high)} | {fmt(t_fast)} | {fmt(t_plain)} "
                f"| {fmt(t_torch)} "
                f"| {fmt(t_keops)} "
                f"| {ratio(t_torch)} | {ratio(t_keops)} | {'-' if b3 != b3 else f'{b3:.0f}'} | {bf:.0f} | "
                f"{'-' if first is None else f'{first:.2f}'} | {fmt(None if keops is None else keops['first'])} |",
                flush=True,
            )
            rows.append(
                dict(
                    d=d,
                    metric=args.metric,
                    m=m,
                    n=n,
                    kind=kind,
                    ours=t_ours,
                    fast=t_fast,
                    high=t_high,
                    plain=t_plain,
                    torch=t_torch,
                    keops=t_keops,
                    first=first,
                    keops_first=None if keops is None else keops["first"],
                )
            )
            first = None
        del x, y
        if dev == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
