"""Structures beyond chains (issue 18): ours beside torch-struct 0.5 in one run, per structure and size.

For each structure at the issue's sizes (random log-potentials, fixed seed; never zeros): the log-partition's
forward + backward (the marginals) and the argmax, milliseconds (CUDA events on a GPU, wall clock on the CPU;
median of --reps after warm-up) and peak memory above the inputs (GPU only), ours and torch-struct's side by
side, the ratio, and a check that both give the same log Z. torch-struct rows say why when it cannot run
(its DepTree raises on current torch, its Alignment needs genbmm, an out-of-memory error is reported as OOM).
Target (issue 18): ours >= 10x faster than torch-struct wherever it runs, and running where it does not.

    python benchmarks/structures.py                  # GPU: the issue's sizes
    python benchmarks/structures.py --device cpu     # smoke test: small sizes, < 1 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from semiring_ops.structures import Alignment, CKYTree, DependencyTree, LinearChain, SemiMarkov

TARGET = 10.0

# name: (our structure, torch-struct class name, GPU shapes, CPU shapes); shapes are the potentials' (B, ...)
CASES = {
    "semi-Markov": (SemiMarkov(), "SemiMarkov", [(32, 127, 8, 16, 16), (32, 255, 16, 32, 32)], [(4, 31, 4, 4, 4)]),
    "dependency": (DependencyTree(), "DepTree", [(32, 40, 40), (32, 100, 100)], [(4, 12, 12)]),
    "CKY": (CKYTree(), "CKY_CRF", [(16, 30, 30, 30), (16, 60, 60, 30)], [(4, 10, 10, 4)]),
    "alignment": (Alignment(), "Alignment", [(32, 100, 100, 3), (32, 400, 400, 3)], [(4, 12, 12, 3)]),
    "linear chain": (LinearChain(), "LinearChain", [(32, 127, 32, 32), (32, 255, 128, 128)], [(4, 31, 8, 8)]),
}


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def ours_calls(structure, pot: torch.Tensor) -> dict[str, Callable[[], object]]:
    def fwd_bwd():
        p = pot.detach().requires_grad_()
        structure.partition(p).sum().backward()

    return {"log Z fwd+bwd": fwd_bwd, "argmax": lambda: structure.argmax(pot)}


def theirs_calls(ts, cls_name: str, pot: torch.Tensor) -> dict[str, Callable[[], object]]:
    cls = getattr(ts, cls_name)

    def fwd_bwd():
        p = pot.detach().clone().requires_grad_()
        cls(ts.LogSemiring).sum(p).sum().backward()

    return {"log Z fwd+bwd": fwd_bwd, "argmax": lambda: cls(ts.MaxSemiring).marginals(pot.detach().clone())}


def measure(calls: dict, device: torch.device, reps: int) -> dict:
    out = {}
    for op, fn in calls.items():
        try:
            out[op] = {"ms": timed(fn, device, reps), "peak_mib": peak_mib(fn, device)}
        except torch.cuda.OutOfMemoryError:
            out[op] = {"ms": None, "why": "OOM"}
            torch.cuda.empty_cache()
        except Exception as exc:  # torch-struct's own failures, reported as they are
            out[op] = {"ms": None, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--structures", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    reps = args.reps or (20 if device.type == "cuda" else 3)
    try:
        import torch_struct as ts
    except ImportError:
        ts = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    anchor = "torch-struct 0.5" if ts else "torch-struct not installed"
    print(f"{name} | torch {torch.__version__} | {args.dtype} | {anchor} | {date.today()}")
    rows = []
    for label in args.structures:
        structure, ts_name, gpu_shapes, cpu_shapes = CASES[label]
        for shape in gpu_shapes if device.type == "cuda" else cpu_shapes:
            g = torch.Generator().manual_seed(0)
            pot = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
            ours = measure(ours_calls(structure, pot), device, reps)
            theirs = measure(theirs_calls(ts, ts_name, pot), device, reps) if ts else {}
            check = None
            if ts and theirs.get("log Z fwd+bwd", {}).get("ms") is not None:
                want = getattr(ts, ts_name)(ts.LogSemiring).sum(pot.clone().requires_grad_()).detach()
                check = (structure.partition(pot) - want).abs().max().item()
            for op in ours:
                t = theirs.get(op, {"ms": None, "why": "torch-struct not installed"})
                ratio = t["ms"] / ours[op]["ms"] if t.get("ms") and ours[op]["ms"] else None
                rows.append({"structure": label, "shape": list(shape), "op": op, "ours_ms": ours[op]["ms"],
                             "ours_peak_mib": ours[op].get("peak_mib"), "theirs_ms": t.get("ms"),
                             "theirs_peak_mib": t.get("peak_mib"), "theirs_why": t.get("why"), "x_faster": ratio,
                             "log_z_max_abs_diff": check})  # fmt: skip
    print(f"\n{'structure':<13} {'shape':<22} {'op':<14} {'ours ms':>9} {'theirs ms':>10} {'x faster':>9}  note")
    for r in rows:
        ours_ms = f"{r['ours_ms']:.3f}" if r["ours_ms"] is not None else "-"
        theirs_ms = f"{r['theirs_ms']:.3f}" if r["theirs_ms"] is not None else "-"
        ratio = f"{r['x_faster']:.2f}x" if r["x_faster"] else "-"
        note = r["theirs_why"] or (
            f"|dlogZ| {r['log_z_max_abs_diff']:.1e}" if r["log_z_max_abs_diff"] is not None else ""
        )
        if r["x_faster"]:
            note += f"  target >= {TARGET:g}x: {'met' if r['x_faster'] >= TARGET else 'MISSED'}"
        shape = str(tuple(r["shape"]))
        print(f"{r['structure']:<13} {shape:<22} {r['op']:<14} {ours_ms:>9} {theirs_ms:>10} {ratio:>9}  {note}")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "dtype": args.dtype, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
