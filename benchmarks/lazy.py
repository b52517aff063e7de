"""Lazy kernel reductions (semiring_ops.lazy): ours beside torch dense and pykeops, in one run and one table.

Definitions (ANCHORS.md's "Kernel reductions (KeOps)" figures use the same ones, so the numbers compare):
    x, y (N, 3), b, g (N, 1): fp32 torch.randn, M = N; sigma = 0.5, eps = 0.1, K = 10; every system gets
    the same tensors, and its formula is written the same way (the KeOps spelling, one import line apart):
        D_ij = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    gauss fwd        a = (-D_ij / (2 sigma^2)).exp() @ b                    (M, 1)
    gauss fwd+bwd    a as above with x.requires_grad, then torch.autograd.grad(a, x, g)  (= a.backward(g))
    lse softmin      (-D_ij / eps).logsumexp(1)                             (M, 1)
    argmin (1-NN)    D_ij.argmin(1)                                         (M, 1) int64
    argKmin K=10     D_ij.argKmin(10, dim=1)                                (M, 10) int64
    compile          first call of a formula never seen (a random integer exponent in it) with an empty kernel
                     cache folder (SEMIRING_OPS_LAZY_CACHE pointed at a new temporary folder), minus a cached
                     call; measured in this (warm) process and in a new process (import excluded)
    compile_size     compile time vs formula size: F = D_ij + c_1 + ... + c_n, n distinct float numbers
                     (n = 10, 100, 1000, 2000 additions), N = M = 100 (the kernels' run is negligible),
                     an empty kernel cache folder: ms from building F to the first F.sum(1) (compile
                     included), and from building it again (x requiring grad) to the gradient of
                     F.logsumexp(1).sum() wrt x (two new kernels: the logsumexp and its symbolic
                     derivative, which holds F)
    call overhead    the Gaussian formula built and reduced at M = N = 1, host clock, mean of many calls (one
                     synchronize at the end), minus the kernels' own time (CUDA: torch.profiler's kernel times;
                     CPU: nothing subtracted, so the figure is an upper bound); also (ours) K @ b with K built
                     once, and the whole formula inside torch.compile(fullgraph=True)
    torch dense      the (M, N) matrix materialised: |x|^2 + |y|^2 - 2 x y^T (addmm), then exp_ / logsumexp /
                     argmin / topk; the fwd+bwd variant out of place, through autograd. Skipped ("skip") when
                     its estimated peak (1 to 4 M*N*4 bytes) is above --dense-cap-gb; "OOM" when it fails
    pykeops          with --pykeops only, run in a child process (pykeops 2.3 segfaults at its first GPU
                     reduction on H200 / CUDA 13, ANCHORS.md; a crash there costs only its column)

Times: median ms after warm-up (the first call, which may compile, is never timed); GPU: CUDA events around
each call, CPU: wall clock; fewer repetitions for calls slower than --budget-s / --reps. Random data, never
zeros. cells/s = M*N / time; % of ceiling against the exp ceiling (one exp per cell: 4.0e12/s on H100/H200,
ANCHORS.md; --measure-ceiling measures it with benchmarks/ceilings.py, which needs nvcc). "ratio" = anchor time
/ ours (> 1: ours faster); "pub" = the published KeOps figure (RTX 2080 Ti, JMLR 2021; on CPU: pykeops on the
2-core dev machine, ANCHORS.md) / ours. The check lines compare ours with float64 torch on 100 rows.

Usage:
    python benchmarks/lazy.py                              # GPU: N = 10k, 100k, 1M (~2-3 min on an H100)
    python benchmarks/lazy.py --device cpu                 # CPU: N = 10k, 50k (the 2-core target row)
    python benchmarks/lazy.py --device cpu --quick         # smoke test, small sizes, < 1 min
    python benchmarks/lazy.py --pykeops --out lazy.json --out lazy.md
    python benchmarks/lazy.py --only fwd fb --sizes 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import release, settle, timed_runs

SIGMA, EPS, K_NN = 0.5, 0.1, 10
KINDS = ("fwd", "fb", "lse", "argmin", "argk", "compile", "compile_size", "overhead")
COMPILE_SIZES = (10, 100, 1000, 2000)  # additions of the compile_size formula
LABELS = {
    "fwd": "Gaussian kernel matvec, fwd",
    "fb": "Gaussian, fwd + grad wrt x",
    "lse": "logsumexp softmin",
    "argmin": "argmin (1-NN)",
    "argk": f"argKmin K={K_NN}",
    "compile": "first call of a new formula",
    "compile_cold": "first call of a new formula, new process",
    "compile_size": "compile time vs formula size",
    "overhead": "cached call overhead, M=N=1",
}
# peak memory of the torch dense versions, in units of M*N*4 bytes (the estimate behind "skip")
DENSE_PEAK = {"fwd": 1.1, "fb": 4.0, "lse": 2.1, "argmin": 1.1, "argk": 2.1}
# published figures (ANCHORS.md), ms: KeOps on an RTX 2080 Ti; pykeops / torch dense on the 2-core CPU
PUB_GPU = {10_000: 0.7, 100_000: 15.0, 1_000_000: 1390.0}
PUB_CPU = {10_000: 370.0, 50_000: 9100.0}
DENSE_CPU = {10_000: 15.0, 50_000: 360.0}
GPU_TARGET_MS = {10_000: 0.25, 100_000: 6.0, 1_000_000: 400.0}
CPU_TARGET_MS = {50_000: 400.0}
EXP_CEILING = 4.0e12

Result = float | str  # ms, or "OOM" / "skip" / "ERR ..." / "n/a"


# ---------------------------------------------------------------- the systems


def lazy_formulas(LT) -> dict[str, Callable]:
    """The benchmark's formulas for a KeOps-style LazyTensor class (ours or pykeops')."""

    def sqdist(x, y):
        return ((LT(x[:, None, :]) - LT(y[None, :, :])) ** 2).sum(-1)

    return {
        "gauss": lambda x, y, b: (-sqdist(x, y) / (2 * SIGMA**2)).exp() @ b,
        "lse": lambda x, y, b: (-sqdist(x, y) / EPS).logsumexp(1),
        "argmin": lambda x, y, b: sqdist(x, y).argmin(1),
        "argk": lambda x, y, b: sqdist(x, y).argKmin(K_NN, dim=1),
        "kernel": lambda x, y: (-sqdist(x, y) / (2 * SIGMA**2)).exp(),
        # an integer exponent is part of the kernel: a new c is a new formula (a new compile); a number
        # (`* c`) would not be in ours, where numbers are call arguments
        "new": lambda x, y, b, c: ((-sqdist(x, y) / (2 * SIGMA**2)).exp() ** c) @ b,
    }


def _dense_sqdist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    d = torch.addmm((y * y).sum(1), x, y.T, alpha=-2.0)  # (M, N): |y_j|^2 - 2 x_i . y_j
    return d.add_((x * x).sum(1, keepdim=True)).clamp_min_(0.0)


def dense_formulas() -> dict[str, Callable]:
    """The same computations with the (M, N) matrix in memory (in place where autograd is not involved)."""

    def gauss_grad(x, y, b):  # out of place, differentiable
        d = (x * x).sum(1, keepdim=True) + (y * y).sum(1) - 2.0 * (x @ y.T)
        return torch.exp(d * (-1.0 / (2 * SIGMA**2))) @ b

    return {
        "gauss": lambda x, y, b: _dense_sqdist(x, y).mul_(-1.0 / (2 * SIGMA**2)).exp_() @ b,
        "gauss_grad": gauss_grad,
        "kernel": lambda x, y: _dense_sqdist(x, y).mul_(-1.0 / (2 * SIGMA**2)).exp_(),
        "lse": lambda x, y, b: torch.logsumexp(_dense_sqdist(x, y).mul_(-1.0 / EPS), 1, keepdim=True),
        "argmin": lambda x, y, b: _dense_sqdist(x, y).argmin(1, keepdim=True),
        "argk": lambda x, y, b: _dense_sqdist(x, y).topk(K_NN, dim=1, largest=False).indices,
    }


def ours_formulas() -> dict[str, Callable]:
    from semiring_ops.lazy import LazyTensor

    return lazy_formulas(LazyTensor)


def pykeops_formulas() -> dict[str, Callable]:
    from pykeops.torch import LazyTensor

    return lazy_formulas(LazyTensor)


# ---------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate" in text)


def bench(fn: Callable[[], object], device: str, reps: int, budget_s: float) -> Result:
    """Median ms of fn() after warm-up (the first call, which may compile, is never timed); fewer than
    ``reps`` timed calls, down to 1, when ``reps`` calls would take longer than ``budget_s``."""
    try:
        t0 = time.perf_counter()
        fn()
        sync(device)
        t_call = time.perf_counter() - t0
        more = (3 if t_call < 0.1 else 1) if device == "cuda" else (1 if t_call < 0.5 else 0)
        for _ in range(more):
            t0 = time.perf_counter()
            fn()
            sync(device)
            t_call = time.perf_counter() - t0
        settle(device)
        n = min(reps, max(1, int(budget_s / max(t_call, 1e-9))))
        return statistics.median(timed_runs(fn, device, n))
    except Exception as exc:
        if _is_oom(exc):
            return "OOM"
        return f"ERR {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
    finally:
        release(device)


def make_data(n: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed + n)
    t = {k: torch.randn(n, d, generator=gen) for k, d in (("x", 3), ("y", 3), ("b", 1), ("g", 1))}
    return {k: v.to(device) for k, v in t.items()}


def step(kind: str, impl: dict[str, Callable], data: dict[str, torch.Tensor]) -> Callable[[], object]:
    x, y, b, g = data["x"], data["y"], data["b"], data["g"]
    if kind == "fb":
        xr = x.detach().clone().requires_grad_()
        gauss = impl.get("gauss_grad", impl["gauss"])

        def run_fb():
            a = gauss(xr, y, b)
            return torch.autograd.grad(a, xr, g)

        return run_fb
    fn = impl["gauss" if kind == "fwd" else kind]

    def run():
        with torch.no_grad():
            return fn(x, y, b)

    return run


@contextlib.contextmanager
def empty_cache(cache_env: str | None) -> Iterator[None]:
    """The kernel cache folder variable ``cache_env`` (None: none) pointed at a new empty folder meanwhile."""
    old = os.environ.get(cache_env) if cache_env else None
    with tempfile.TemporaryDirectory(prefix="lazy_bench_cache_") as tmp:
        try:
            if cache_env:
                os.environ[cache_env] = tmp
            yield
        finally:
            if cache_env:
                if old is None:
                    os.environ.pop(cache_env, None)
                else:
                    os.environ[cache_env] = old


def compile_time(impl: dict[str, Callable], device: str, cache_env: str | None) -> Result:
    """ms of the first call of a never-seen formula minus the median of cached calls (N = 1000), with the
    kernel cache folder variable ``cache_env`` pointed at a new empty folder during the measurement."""
    data = make_data(1000, device)
    c = random.SystemRandom().randint(3, 10**9)
    with empty_cache(cache_env):
        try:
            x, y, b = data["x"], data["y"], data["b"]
            sync(device)
            t0 = time.perf_counter()
            impl["new"](x, y, b, c)
            sync(device)
            first = (time.perf_counter() - t0) * 1e3
            cached = []
            for _ in range(20):
                t0 = time.perf_counter()
                impl["new"](x, y, b, c)
                sync(device)
                cached.append((time.perf_counter() - t0) * 1e3)
            return first - statistics.median(cached)
        except Exception as exc:
            return f"ERR {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"


def compile_vs_size(device: str, cache_env: str | None) -> dict[int, dict[str, Result]]:
    """Per n of COMPILE_SIZES: {"fwd": ms, "grad": ms} of the compile_size formula (module docstring), each
    with an empty kernel cache folder (``cache_env``). Ours only (pykeops would take minutes per formula)."""
    from semiring_ops.lazy import Vi, Vj

    data = make_data(100, device)
    out: dict[int, dict[str, Result]] = {}
    for n in COMPILE_SIZES:
        numbers = [0.5 + k / (n + 1) for k in range(n)]  # distinct floats

        def chain(x: torch.Tensor, numbers: list[float] = numbers):
            f = ((Vi(x) - Vj(data["y"])) ** 2).sum(-1)
            for c in numbers:
                f = f + c
            return f

        row: dict[str, Result] = {}
        for what in ("fwd", "grad"):
            with empty_cache(cache_env):
                try:
                    sync(device)
                    t0 = time.perf_counter()
                    if what == "fwd":
                        chain(data["x"]).sum(1)
                    else:
                        x = data["x"].detach().clone().requires_grad_()
                        torch.autograd.grad(chain(x).logsumexp(1).sum(), x)
                    sync(device)
                    row[what] = (time.perf_counter() - t0) * 1e3
                except Exception as exc:
                    row[what] = f"ERR {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
        out[n] = row
    return out


_COLD_SNIPPET = """
import json, os, random, sys, time, torch
sys.path.insert(0, {bench_dir!r})
from lazy import make_data, ours_formulas, sync
dev = {device!r}
data = make_data(1000, dev)
impl = ours_formulas()
c = random.SystemRandom().randint(3, 10**9)
sync(dev)
t0 = time.perf_counter()
impl["new"](data["x"], data["y"], data["b"], c)
sync(dev)
first = time.perf_counter() - t0
t0 = time.perf_counter()
impl["new"](data["x"], data["y"], data["b"], c)
sync(dev)
print(json.dumps({{"ms": (first - (time.perf_counter() - t0)) * 1e3}}))
"""


def compile_time_cold(device: str) -> Result:
    """compile_time in a new process (torch / semiring_ops imported and the data on the device before the
    clock starts): what a user's first call of a new formula in a new script costs."""
    with tempfile.TemporaryDirectory(prefix="lazy_bench_cache_") as tmp:
        env = dict(os.environ, SEMIRING_OPS_LAZY_CACHE=tmp)
        code = _COLD_SNIPPET.format(bench_dir=str(Path(__file__).resolve().parent), device=device)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
            )
        except subprocess.TimeoutExpired:
            return "ERR timeout"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"ERR rc {proc.returncode}: {tail[:80]}"
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["ms"])


def kernel_us_per_call(fn: Callable[[], object], calls: int) -> float | None:
    """GPU time of the kernels fn() launches, µs per call (torch.profiler, CUPTI); None if unavailable."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        total = 0.0
        for ev in prof.events():
            if getattr(ev, "device_type", None) == DeviceType.CUDA:  # a kernel (or copy) on the device
                total += float(ev.device_time_total)
        return total / calls if total > 0 else None
    except Exception as exc:
        print(f"  (profiler unavailable: {type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _host_us(fn: Callable[[], object], device: str, calls: int) -> float:
    """Mean host µs per call of ``calls`` back-to-back calls, one synchronize at the end."""
    for _ in range(50):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def call_overhead(
    impl: dict[str, Callable], device: str, calls: int, with_compile: bool = False
) -> dict[str, float | None]:
    """At M = N = 1: host µs per call of the Gaussian formula built and reduced (``host_us``), of ``K @ b``
    with K built once (``prebuilt_us``), with ``with_compile`` of the first inside torch.compile(fullgraph=True)
    (``compiled_us``), the kernels' own µs per call (GPU only) and the difference."""
    data = make_data(1, device)
    x, y, b = data["x"], data["y"], data["b"]

    def full():
        with torch.no_grad():
            return impl["gauss"](x, y, b)

    with torch.no_grad():
        K = impl["kernel"](x, y)

    def prebuilt():
        with torch.no_grad():
            return K @ b

    host = _host_us(full, device, calls)
    pre = _host_us(prebuilt, device, calls)
    compiled = None
    if with_compile:
        gauss = torch.compile(impl["gauss"], fullgraph=True)

        def traced():
            with torch.no_grad():
                return gauss(x, y, b)

        compiled = _host_us(traced, device, calls)
    kernel = kernel_us_per_call(full, min(calls, 200)) if device == "cuda" else None
    overhead = host - (kernel or 0.0)
    return {"host_us": host, "prebuilt_us": pre, "compiled_us": compiled, "kernel_us": kernel, "overhead_us": overhead}


# ---------------------------------------------------------------- pykeops in a child process


def pykeops_worker(args: argparse.Namespace) -> None:
    """--pykeops-worker FILE: pykeops' cells, written to FILE after each one (a crash keeps the earlier)."""
    out: dict[str, Result | dict] = {}
    path = Path(args.pykeops_worker)

    def save():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, path)

    try:
        import pykeops

        out["version"] = getattr(pykeops, "__version__", "?")
        impl = pykeops_formulas()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        save()
        return
    save()
    for kind in args.only:
        if kind == "compile":
            out["compile"] = compile_time(impl, args.device, None)
            save()
        elif kind == "overhead":
            out["overhead"] = call_overhead(impl, args.device, 200)
            save()
    for n in args.sizes:
        data = make_data(n, args.device)
        for kind in ("fwd", "fb", "lse", "argmin", "argk"):
            if kind in args.only:
                out[f"{kind}|{n}"] = bench(step(kind, impl, data), args.device, args.reps, args.budget_s)
                print(f"  pykeops {kind} N={n}: {out[f'{kind}|{n}']}", file=sys.stderr, flush=True)
                save()


def run_pykeops(args: argparse.Namespace) -> tuple[dict, str]:
    """pykeops' results from a child process, and a note on how it went."""
    with tempfile.TemporaryDirectory(prefix="lazy_bench_pykeops_") as tmp:
        path = Path(tmp) / "pykeops.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--pykeops-worker", str(path), "--device", args.device]
        cmd += ["--sizes", *map(str, args.sizes), "--reps", str(args.reps), "--budget-s", str(args.budget_s)]
        cmd += ["--only", *args.only]
        note = ""
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.pykeops_timeout, check=False)
            if proc.returncode != 0:
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
                note = f"pykeops child process exited with status {proc.returncode}: {tail[:300]}"
        except subprocess.TimeoutExpired:
            note = f"pykeops child process timed out after {args.pykeops_timeout} s"
        res = json.loads(path.read_text()) if path.is_file() else {}
    if "error" in res:
        note = f"pykeops unavailable: {res['error'][:300]}"
    elif res and not note:
        note = f"pykeops {res.get('version', '?')}"
    return res, note


# ---------------------------------------------------------------- the table


def size_text(n: int) -> str:
    for unit, name in ((1_000_000, "M"), (1_000, "k")):
        if n >= unit and n % (unit // 10) == 0:
            v = n / unit
            return f"{v:g}{name}"
    return str(n)


def fmt_ms(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if v < 1000 else f"{v:.0f}"
    return "—" if v is None else str(v)


def ratio(anchor, ours) -> float | None:
    return anchor / ours if isinstance(anchor, float) and isinstance(ours, float) and ours > 0 else None


def build_rows(args, ours: dict, dense: dict, keops: dict, ceiling: float) -> list[dict]:
    gpu = args.device == "cuda"
    rows = []
    for n in args.sizes:
        sum_ms = ours.get(f"fwd|{n}")
        for kind in ("fwd", "fb", "lse", "argmin", "argk"):
            if kind not in args.only:
                continue
            o, d, k = ours.get(f"{kind}|{n}"), dense.get(f"{kind}|{n}"), keops.get(f"{kind}|{n}")
            parts = []
            for name, anchor in (("dense", d), ("pykeops", k)):
                r = ratio(anchor, o)
                if r is not None:
                    parts.append(f"{name} {r:.2g}x")
            cells = f"{n * n / (o * 1e-3):.3g}" if isinstance(o, float) and kind != "fb" else ""
            pct = ""
            if gpu and kind in ("fwd", "lse") and isinstance(o, float):
                pct = f"{100 * n * n / (o * 1e-3) / ceiling:.0f}%"
            target, met = "—", "—"
            if kind == "fwd":
                pub = (PUB_GPU if gpu else PUB_CPU).get(n)
                r = ratio(pub, o)
                if r is not None:
                    parts.append(f"pub {r:.2g}x")
                goal = (GPU_TARGET_MS if gpu else CPU_TARGET_MS).get(n)
                if gpu:
                    anchor_txt = f"KeOps {pub:g} ms on 2080 Ti" if pub else ""
                    if n == 1_000_000:
                        anchor_txt += "; bound ≈ 250-300 ms on H200"
                else:
                    anchor_txt = f"pykeops CPU {pub:g} ms, dense {DENSE_CPU[n]:g} ms (2 cores)" if pub else ""
                if goal is not None:
                    target = f"≤ {goal:g} ms" + (" in linear memory" if not gpu else "")
                    met = ("yes" if o <= goal else "no") if isinstance(o, float) else "—"
                if anchor_txt:
                    target = f"{target} ({anchor_txt})" if goal is not None else anchor_txt
            elif kind == "fb":
                r = ratio(o, sum_ms)
                target = "≤ 3× fwd"
                met = f"{'yes' if r <= 3 else 'no'} ({r:.2f}× fwd)" if r is not None else "—"
            elif kind in ("lse", "argmin"):
                r = ratio(o, sum_ms)
                judged = gpu and n >= 1_000_000
                target = "≤ 1.5× sum" + ("" if judged else " (target at 1M, GPU)")
                if r is not None:
                    met = f"{'yes' if r <= 1.5 else 'no'} ({r:.2f}× sum)" if judged else f"({r:.2f}× sum)"
            elif kind == "argk":
                r = ratio(o, sum_ms)
                met = f"({r:.2f}× sum)" if r is not None else "—"
            rows.append(
                dict(
                    benchmark=LABELS[kind],
                    size=f"N=M={size_text(n)}",
                    ours=o,
                    dense=d,
                    pykeops=k,
                    ratio=" · ".join(parts),
                    cells=cells,
                    pct=pct,
                    target=target,
                    met=met,
                )
            )
    if "compile" in args.only:
        for key in ("compile", "compile_cold"):
            o = ours.get(key)
            k = keops.get("compile") if key == "compile" else None
            r = ratio(k, o)
            rows.append(
                dict(
                    benchmark=LABELS[key],
                    size="N=M=1k",
                    ours=o,
                    dense="—",
                    pykeops=k,
                    ratio=f"pykeops {r:.2g}x" if r else "",
                    cells="",
                    pct="",
                    target="≤ 2000 ms (KeOps ~2.1 s on GPU, 6.7 s on CPU)",
                    met=(("yes" if o <= 2000 else "no") + f" ({o / 1e3:.2f} s)") if isinstance(o, float) else "—",
                )
            )
    for n, got in (ours.get("compile_size") or {}).items():
        fwd, grad = got["fwd"], got["grad"]
        rows.append(
            dict(
                benchmark=LABELS["compile_size"],
                size=f"N=M=100, {n} additions",
                ours=fwd,
                dense="—",
                pykeops=None,
                ratio="",
                cells="",
                pct="",
                target="≤ 5 s at 2,000 (formula to first result, empty cache)",
                met=(("yes" if fwd <= 5000 else "no") if n == 2000 and isinstance(fwd, float) else "")
                + f" (logsumexp + gradient: {fmt_ms(grad)} ms)",
            )
        )
    if "overhead" in args.only and isinstance(ours.get("overhead"), dict):
        ov = ours["overhead"]
        kov = keops.get("overhead") if isinstance(keops.get("overhead"), dict) else {}
        d = dense.get("overhead")
        host_k = kov.get("host_us")
        r = ratio(host_k, ov["host_us"])
        kern = ov["kernel_us"]
        detail = f"+{ov['overhead_us']:.0f} µs" + (f" over a {kern:.1f} µs kernel" if kern else ", host, kernel incl.")
        detail += f"; K @ b with K pre-built {ov['prebuilt_us']:.0f} µs"
        if ov.get("compiled_us") is not None:
            detail += f"; built and reduced in torch.compile(fullgraph=True) {ov['compiled_us']:.0f} µs"
        rows.append(
            dict(
                benchmark=LABELS["overhead"],
                size="N=M=1",
                ours=ov["host_us"] / 1e3,
                dense=d / 1e3 if isinstance(d, float) else d,
                pykeops=host_k / 1e3 if isinstance(host_k, float) else None,
                ratio=f"pykeops {r:.2g}x" if r else "",
                cells="",
                pct="",
                target="≤ 50 µs over the kernel (KeOps ~1.8 ms per cached call)",
                met=f"{'yes' if ov['overhead_us'] <= 50 else 'no'} ({detail})",
            )
        )
    return rows


HEADER = (
    "benchmark",
    "size",
    "ours ms",
    "torch dense ms",
    "pykeops ms",
    "ratio vs anchor",
    "cells/s",
    "% of ceiling",
    "target",
    "met?",
)


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = (
            r["benchmark"],
            r["size"],
            fmt_ms(r["ours"]),
            fmt_ms(r["dense"]),
            fmt_ms(r["pykeops"]),
            r["ratio"],
            r["cells"],
            r["pct"],
            r["target"],
            r["met"],
        )
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- checks against float64


def checks(impl: dict[str, Callable], data: dict[str, torch.Tensor], kinds, rows: int = 100) -> str:
    """Ours on all rows, compared on the first ``rows`` rows with float64 torch."""
    x, y, b, g = data["x"], data["y"], data["b"], data["g"]
    xs, y64, b64 = x[:rows].double(), y.double(), b.double()
    d64 = ((xs[:, None, :] - y64[None, :, :]) ** 2).sum(-1)
    out = []
    with torch.no_grad():
        if "fwd" in kinds:
            ref = torch.exp(-d64 / (2 * SIGMA**2)) @ b64
            got = impl["gauss"](x, y, b)[:rows].double()
            out.append(f"gauss rel err {((got - ref).abs().max() / ref.abs().max()).item():.1e}")
        if "lse" in kinds:
            ref = torch.logsumexp(-d64 / EPS, 1, keepdim=True)
            got = impl["lse"](x, y, b)[:rows].double()
            out.append(f"lse abs err {(got - ref).abs().max().item():.1e}")
        if "argmin" in kinds:
            got = impl["argmin"](x, y, b)[:rows].reshape(-1)
            out.append(f"argmin = float64's {100 * (got == d64.argmin(1)).double().mean().item():.0f}%")
        if "argk" in kinds:
            got = impl["argk"](x, y, b)[:rows].long()
            ref = d64.topk(K_NN, dim=1, largest=False).indices
            same = (got.sort(1).values == ref.sort(1).values).all(1).double().mean().item()
            out.append(f"argKmin sets = float64's {100 * same:.0f}%")
    if "fb" in kinds:
        xr = x.detach().clone().requires_grad_()
        (got,) = torch.autograd.grad(impl["gauss"](xr, y, b), xr, g)
        x64 = xs.detach().clone().requires_grad_()
        a64 = torch.exp(-((x64[:, None, :] - y64[None, :, :]) ** 2).sum(-1) / (2 * SIGMA**2)) @ b64
        (ref,) = torch.autograd.grad(a64, x64, g[:rows].double())
        err = ((got[:rows].double() - ref).abs().max() / ref.abs().max()).item()
        out.append(f"grad wrt x rel err {err:.1e}")
    return ", ".join(out)


# ---------------------------------------------------------------- main


def physical_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 8.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="N = M (GPU: 10k 100k 1M, CPU: 10k 50k)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per cell (default GPU 20, CPU 5)")
    parser.add_argument("--budget-s", type=float, default=8.0, help="fewer reps when reps calls exceed this")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS), help="which rows")
    parser.add_argument("--quick", action="store_true", help="smoke test: small sizes, 3 reps")
    parser.add_argument("--pykeops", action="store_true", help="also pykeops, in a child process")
    parser.add_argument("--pykeops-timeout", type=float, default=1800.0)
    parser.add_argument("--dense-cap-gb", type=float, default=None, help="skip torch dense above this peak")
    parser.add_argument("--exp-ceiling", type=float, default=EXP_CEILING, help="exp/s for the %% column")
    parser.add_argument("--measure-ceiling", action="store_true", help="measure the exp ceiling (needs nvcc)")
    parser.add_argument("--out", action="append", default=[], help="write FILE.json or FILE.md (repeatable)")
    parser.add_argument("--pykeops-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device (use --device cpu)")
    if args.sizes is None:
        if args.quick:
            args.sizes = [1000, 4000]
        else:
            args.sizes = [10_000, 100_000, 1_000_000] if dev == "cuda" else [10_000, 50_000]
    if args.reps is None:
        args.reps = 3 if args.quick else (20 if dev == "cuda" else 5)
    if args.pykeops_worker:
        pykeops_worker(args)
        return
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False

    from semiring_ops.lazy.dispatch import lazy_backend

    ours_impl, dense_impl = ours_formulas(), dense_formulas()
    if dev == "cuda":
        total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
        print("device:", torch.cuda.get_device_name(), f"({total_gb:.0f} GB) | torch", torch.__version__)
    else:
        total_gb = physical_memory_gb()
        print(f"device: cpu, {torch.get_num_threads()} threads, {total_gb:.0f} GB | torch", torch.__version__)
    cap_gb = args.dense_cap_gb if args.dense_cap_gb is not None else 0.55 * total_gb
    ceiling = args.exp_ceiling
    if args.measure_ceiling and dev == "cuda":
        from ceilings import measure

        ceiling = measure()["exp_per_s"]
    print(f"lazy kernels: {lazy_backend(dev)} | exp ceiling {ceiling:.3g}/s | torch dense cap {cap_gb:.1f} GB")

    ours: dict = {}
    dense: dict = {}
    notes: list[str] = []
    check_lines: list[str] = []

    def log(system: str, key: str, value) -> None:
        print(f"  {system:8s} {key:14s} {fmt_ms(value) if not isinstance(value, dict) else value}", file=sys.stderr)

    # ours first, every size, so the CPU's peak resident memory afterwards is ours alone
    if "compile" in args.only:
        ours["compile_cold"] = compile_time_cold(dev)
        log("ours", "compile_cold", ours["compile_cold"])
    for n in args.sizes:
        data = make_data(n, dev)
        for kind in ("fwd", "fb", "lse", "argmin", "argk"):
            if kind not in args.only:
                continue
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            ours[f"{kind}|{n}"] = bench(step(kind, ours_impl, data), dev, args.reps, args.budget_s)
            log("ours", f"{kind} N={n}", ours[f"{kind}|{n}"])
            if dev == "cuda" and kind == "fwd":
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                notes.append(f"ours fwd N={size_text(n)}: peak GPU memory above the inputs {peak:.1f} MiB")
        try:
            line = checks(ours_impl, data, args.only)
            if line:
                check_lines.append(f"N={size_text(n)}: {line}")
        except Exception as exc:
            check_lines.append(f"N={size_text(n)}: check failed: {type(exc).__name__}: {exc}")
        del data
        release(dev)
    if dev == "cpu":
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        biggest = max(args.sizes)
        notes.append(
            f"ours, every size: peak resident memory of the process {rss_mib:.0f} MiB "
            f"(one dense {size_text(biggest)}² fp32 matrix: {biggest * biggest * 4 / 2**20:.0f} MiB)"
        )
    if "compile" in args.only:
        ours["compile"] = compile_time(ours_impl, dev, "SEMIRING_OPS_LAZY_CACHE")
        log("ours", "compile", ours["compile"])
    if "compile_size" in args.only:
        ours["compile_size"] = compile_vs_size(dev, "SEMIRING_OPS_LAZY_CACHE")
        log("ours", "compile_size", ours["compile_size"])
    if "overhead" in args.only:
        ours["overhead"] = call_overhead(ours_impl, dev, 2000, with_compile=True)
        log("ours", "overhead", ours["overhead"])

    # torch dense
    for n in args.sizes:
        data = make_data(n, dev)
        for kind in ("fwd", "fb", "lse", "argmin", "argk"):
            if kind not in args.only:
                continue
            if n * n * 4 * DENSE_PEAK[kind] > cap_gb * 1e9:
                dense[f"{kind}|{n}"] = "skip"
            else:
                dense[f"{kind}|{n}"] = bench(step(kind, dense_impl, data), dev, args.reps, args.budget_s)
            log("dense", f"{kind} N={n}", dense[f"{kind}|{n}"])
        del data
        release(dev)
    if "overhead" in args.only:
        tiny = make_data(1, dev)
        dense["overhead"] = _host_us(lambda: dense_impl["gauss"](tiny["x"], tiny["y"], tiny["b"]), dev, 2000)

    keops: dict = {}
    if args.pykeops:
        keops, note = run_pykeops(args)
        notes.append(note)
    else:
        notes.append("pykeops not run (--pykeops runs it, in a child process)")

    rows = build_rows(args, ours, dense, keops, ceiling)
    table = markdown(rows)
    print()
    print(table)
    print()
    print("ratio = anchor ms / ours ms (> 1: ours faster); pub = published KeOps figure (ANCHORS.md) / ours")
    for line in notes:
        print("note:", line)
    print("checks vs float64 torch (first 100 rows):")
    for line in check_lines:
        print("  " + line)
    result = dict(
        device=dev,
        device_name=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        torch=torch.__version__,
        backend=list(lazy_backend(dev)),
        exp_ceiling=ceiling,
        sizes=args.sizes,
        ours=ours,
        dense=dense,
        pykeops=keops,
        rows=rows,
        notes=notes,
        checks=check_lines,
    )
    for path in args.out:
        if path.endswith(".json"):
            Path(path).write_text(json.dumps(result, indent=1, default=str))
        else:
            header = f"device: {result['device_name']}, torch {result['torch']}, lazy kernels: {result['backend']}\n\n"
            extra = "\n".join(f"- {line}" for line in notes + check_lines)
            Path(path).write_text(header + table + "\n\n" + textwrap.dedent(extra) + "\n")


if __name__ == "__main__":
    main()
