"""Semiring batched matmul: ours beside the alternatives, in one run.

Rows: semiring_ops (log, max, min, std), torch naive (logsumexp / amax of the materialised
a[..., :, :, None] + b[..., None, :, :]), torch.bmm, and genbmm / torch-semiring-einsum when they import.
Times are medians of CUDA-event-timed runs after warm-up (CPU: wall clock), on fresh random inputs.
Cells = B*n*k*m. On the GPU the % column is against ceilings measured in the same run
(benchmarks/ceilings.py): ex2 throughput for log, fp32 max-plus for max/min, SGEMM for std.
The JSON rows also hold fwd_peak_mib / fwd_bwd_peak_mib: torch.cuda.max_memory_allocated during one
forward (one forward + backward) above the inputs, in MiB (null on the CPU); benchmarks/plots.py draws them.

Usage:
    python benchmarks/bmm.py                       # GPU if present, B=8, n=k=m in 64..1024
    python benchmarks/bmm.py --device cpu --sizes 64 128 256
    python benchmarks/bmm.py --json results.json
    python benchmarks/bmm.py --ops log --batch 1 --sizes 4096 --fast-check   # the log fast mode at its target size
    python benchmarks/bmm.py --ops max min --dtype float16 --sizes 1024      # 16-bit max / min (packed kernel)

With --dtype float16 / bfloat16 the inputs are 16-bit: max / min forwards run the packed kernel
(csrc/cuda/packed_select_kernels.cu) and their % column is against the packed f16x2 max-plus ceiling.

On the GPU the log op has two more rows, its fast mode (semiring_ops/ops/fast_log.py): "semiring_ops fast"
(logbmm(..., precision="fast"), fast_log.DEFAULT_PASSES TF32 passes) and "semiring_ops fast3" (3xTF32);
--fast-check prints their max |fast - exact| on inputs like the benchmark's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import semiring_ops as so
from semiring_ops.info import kernel_summary

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crf import peak_mib
from timing import time_or_failure


def naive_log(a, b):
    return torch.logsumexp(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


def naive_max(a, b):
    return (a.unsqueeze(-1) + b.unsqueeze(-3)).amax(dim=-2)


def implementations() -> dict[str, dict[str, Callable]]:
    """op -> {implementation name -> fn(a, b)}; anchors only when they import."""
    impls: dict[str, dict[str, Callable]] = {
        "log": {"semiring_ops": so.logbmm, "torch naive": naive_log},
        "max": {"semiring_ops": so.maxbmm, "torch naive": naive_max},
        "min": {"semiring_ops": so.minbmm},
        "std": {"semiring_ops": so.stdbmm, "torch.bmm": torch.bmm},
    }
    try:
        import genbmm

        impls["log"]["genbmm"] = genbmm.logbmm
        impls["max"]["genbmm"] = genbmm.maxbmm
    except ImportError:
        pass
    try:
        import torch_semiring_einsum as tse

        eq = tse.compile_equation("bik,bkj->bij")
        impls["log"]["semiring-einsum"] = lambda a, b: tse.log_einsum(eq, a, b, block_size=16)
        impls["max"]["semiring-einsum"] = lambda a, b: tse.log_viterbi_einsum_forward(eq, a, b, block_size=16)[0]
    except ImportError:
        pass
    return impls


def fast_impls() -> dict[str, Callable]:
    """The log semiring's fast mode (CUDA): the public precision="fast" (its scaled tier on such inputs), the
    tile kernel alone (fast_log.SCALED_TIER off) and the 3xTF32 variant (the tile kernel's)."""
    from semiring_ops.ops import fast_log

    def tiled(a, b):
        fast_log.SCALED_TIER = False
        try:
            return fast_log.log_bmm_fast(a, b, passes=1)
        finally:
            fast_log.SCALED_TIER = True

    return {
        "semiring_ops fast": lambda a, b: so.logbmm(a, b, precision="fast"),
        "semiring_ops fast tiled": tiled,
        "semiring_ops fast3": lambda a, b: fast_log.log_bmm_fast(a, b, passes=3),
    }


def fast_check(B: int, sizes: list[int], device: str) -> None:
    """--fast-check: max |fast - exact| of the log fast mode on inputs like the benchmark's (randn), for each
    size and pass count, with the number of outputs the kernel flagged (and the host recomputed)."""
    from semiring_ops.ops import fast_log

    for n in sizes:
        a = torch.randn(B, n, n, device=device)
        b = torch.randn(B, n, n, device=device)
        exact = so.logbmm(a, b)
        for passes in (1, 3):
            fast_log.reset_stats()
            err = (fast_log.log_bmm_fast(a, b, passes) - exact).abs().max().item()
            flagged, tier = fast_log.stats["flagged"], "scaled" if fast_log.stats["scaled"] else "tiled"
            line = f"fast-check B={B} n={n} passes={passes} ({tier}): max |fast - exact| = {err:.3g}, {flagged} flagged"
            print(line, flush=True)


def run_one(
    fn, B: int, n: int, device: str, reps: int, backward: bool, dtype: torch.dtype = torch.float32
) -> tuple[float | str, float | str | None]:
    """(median ms, peak MiB above the inputs of one call; None off CUDA) of fn's forward or forward + backward."""
    a = torch.randn(B, n, n, device=device, dtype=dtype, requires_grad=backward)
    b = torch.randn(B, n, n, device=device, dtype=dtype, requires_grad=backward)
    if backward:
        g = torch.randn(B, n, n, device=device, dtype=dtype)

        def step():
            out = fn(a, b)
            return torch.autograd.grad(out, (a, b), g)
    else:

        def step():
            with torch.no_grad():
                return fn(a, b)

    return time_or_failure(step, device, reps), peak_mib(step, device)


CEILING_KEY = {
    "log": "exp_per_s",
    "max": "maxplus_cells_per_s",
    "min": "maxplus_cells_per_s",
    "std": "sgemm_cells_per_s",
}
HEADER = ("op", "B", "n", "impl", "fwd ms", "fwd+bwd ms", "Gcell/s", "% ceil", "x ours fwd", "x ours f+b")
WIDTHS = (4, 2, 5, 18, 9, 11, 9, 7, 10, 10)


def _fmt(value, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _ratio(theirs, ours) -> str:
    return f"{theirs / ours:.2f}x" if isinstance(theirs, float) and isinstance(ours, float) else ""


def _row(cells) -> str:
    return " ".join(
        f"{c:<{w}s}" if i in (0, 3) else f"{c:>{w}s}" for i, (c, w) in enumerate(zip(cells, WIDTHS, strict=True))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--ops", nargs="+", default=["log", "max", "min", "std"])
    parser.add_argument("--reps", type=int, default=None, help="timed runs per cell (default 30 GPU, 5 CPU)")
    parser.add_argument("--naive-limit-gb", type=float, default=8.0, help="skip torch naive above this")
    parser.add_argument("--json", default=None)
    parser.add_argument("--fast-check", action="store_true", help="print the log fast mode's max |fast - exact|")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = args.device
    reps = args.reps or (30 if dev == "cuda" else 5)
    torch.backends.cuda.matmul.allow_tf32 = False
    ceilings = {}
    if dev == "cuda":
        from ceilings import measure

        ceilings = measure()
        print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
        print("ceilings:", ", ".join(f"{k} {v:.3g}" for k, v in ceilings.items()))
    print("kernels:", kernel_summary())
    impls = implementations()
    if dev == "cuda":
        impls["log"].update(fast_impls())
    if args.fast_check and dev == "cuda":
        fast_check(args.batch, args.sizes, dev)
    rows = []
    print(_row(HEADER))
    print("-" * len(_row(HEADER)))
    for op in args.ops:
        for n in args.sizes:
            B = args.batch
            cells = B * n**3
            ours = {}
            for name, fn in impls[op].items():
                fwd_mib = fb_mib = None
                if name == "torch naive" and cells * 4 > args.naive_limit_gb * 1e9:
                    fwd = fb = "skip"
                else:
                    fwd, fwd_mib = run_one(fn, B, n, dev, reps, backward=False, dtype=dtype)
                    nograd = name == "semiring-einsum" and op == "max"
                    fb_reps = max(3, reps // 2)
                    fb, fb_mib = ("n/a", None) if nograd else run_one(fn, B, n, dev, fb_reps, True, dtype)
                if name == "semiring_ops":
                    ours = {"fwd": fwd, "fb": fb}
                rate = cells / (fwd * 1e-3) if isinstance(fwd, float) else None
                ceil_key = CEILING_KEY[op]
                if dtype != torch.float32 and op in ("max", "min"):
                    ceil_key = "maxplus16_cells_per_s"
                ceil = ceilings.get(ceil_key)
                pct = f"{100 * rate / ceil:.1f}%" if rate and ceil else ""
                gcell = f"{rate / 1e9:.1f}" if rate else ""
                line = (op, str(B), str(n), name, _fmt(fwd), _fmt(fb), gcell, pct)
                print(_row((*line, _ratio(fwd, ours.get("fwd")), _ratio(fb, ours.get("fb")))), flush=True)
                row = dict(op=op, B=B, n=n, impl=name, dtype=args.dtype, fwd_ms=fwd, fwd_bwd_ms=fb, cells_per_s=rate)
                rows.append({**row, "fwd_peak_mib": fwd_mib, "fwd_bwd_peak_mib": fb_mib})
    if args.json:
        gpu = torch.cuda.get_device_name() if dev == "cuda" else None
        run = {"gpu": gpu, "torch": torch.__version__, "date": datetime.date.today().isoformat()}
        with open(args.json, "w") as fh:
            json.dump({"device": dev, **run, "ceilings": ceilings, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
