"""Semiring einsum (issue 27): semiring_ops.einsum beside torch-semiring-einsum 1.2 and beside the same pairwise
steps called by hand on semiring_ops' bmm kernels, in one run and one table.

Cases (random float32 inputs, fixed seed, torch.randn; never zeros):
    bmm      'bik,bkj->bij'          CPU b=8, n=256 (256^3 per batch);  GPU b=8, n=1024
    chain    'ai,ij,jk->ak'          CPU a=64, i=j=k=256;  GPU: a chain of 4 matrices, 'ij,jk,kl,lm->im', 1024^2 each
Modes: log fwd, log fwd+bwd (the gradient of every input, weighted by a random output gradient), max fwd, and on
the GPU max fwd+bwd (the gradient goes to the argmax; torch-semiring-einsum has no max gradient: "n/a").
Systems:
    ours        semiring_ops.einsum(equation, ..., semiring=...)
    by hand     the pairwise steps ours plans, written as semiring_ops.semiring_matmul calls (bmm: one call; chain:
                ((x W1) W2) ...): ours should be within 1.1x of it (the planning and reshaping overhead); the two
                are timed again in alternation, a call of each per round, and those medians are reported
    drop-in     semiring_ops.semiring_einsum, torch-semiring-einsum's API on ours (its log and max forwards compute
                in float64 for float32 inputs and round once: docs/einsum.md), AUTOMATIC_BLOCK_SIZE
    tse         torch-semiring-einsum with its AUTOMATIC_BLOCK_SIZE: log_einsum (fwd+bwd), log_einsum_forward,
                max_tropical_einsum_forward (1.2.0 has none: log_viterbi_einsum_forward, which also finds the argmax)
"ratio" = tse time / ours (> 1: ours faster); "ours/hand" = ours / by hand. cells/s = the cells the planned steps
compute (sum over steps of batch * n * k * m) / ours' time.

Peak memory (log fwd+bwd, the issue's "at no more memory"), above the inputs: CUDA: torch.cuda.max_memory_allocated
minus the memory allocated before the call; CPU: a child process per system runs a small warm-up (libraries loaded),
then resets the kernel's resident-set high-water mark (/proc/self/clear_refs) and reads VmHWM - VmRSS around one
call. Each system's output is checked against ours (max |difference|).

Usage:
    pip install torch-semiring-einsum==1.2.0                 # the anchor (or: pip install -e .[bench])
    python benchmarks/einsum.py --device cpu                 # the 2-core targets: ~3 min, most of it tse's chain
    python benchmarks/einsum.py                              # GPU (H100): the scaled-up shapes, log and max
    python benchmarks/einsum.py --quick                      # smoke test: small shapes, 1 rep
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_ms, release, time_ms

import semiring_ops as so
from semiring_ops.einsum.equation import bind, parse
from semiring_ops.einsum.plan import plan_contractions
from semiring_ops.info import kernel_summary

# name: (equation, CPU shapes, GPU shapes, quick shapes)
CASES = {
    "bmm": (
        "bik,bkj->bij",
        [(8, 256, 256), (8, 256, 256)],
        [(8, 1024, 1024), (8, 1024, 1024)],
        [(2, 32, 32), (2, 32, 32)],
    ),
    "chain": (
        None,  # per device: a chain of 3 (CPU) or 4 (GPU) matrices
        [(64, 256), (256, 256), (256, 256)],
        [(1024, 1024)] * 4,
        [(8, 32), (32, 32), (32, 32)],
    ),
}
MODES = ("log fwd", "log fwd+bwd", "max fwd", "max fwd+bwd")
SEMIRING = {"log": so.LogSemiring, "max": so.MaxSemiring}
LETTERS = "ijklmnop"


def equation_of(case: str, shapes: list[tuple[int, ...]]) -> str:
    if case == "bmm":
        return CASES["bmm"][0]
    labels = ["a" + LETTERS[0]] + [LETTERS[i] + LETTERS[i + 1] for i in range(len(shapes) - 1)]
    if shapes[0][0] == shapes[0][1] and len(shapes) == 4:  # the GPU's square chain: 'ij,jk,kl,lm->im'
        labels = [LETTERS[i] + LETTERS[i + 1] for i in range(len(shapes))]
    return ",".join(labels) + "->" + labels[0][0] + labels[-1][1]


def inputs(shapes, device: str, grad: bool) -> list[torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(27)
    return [torch.randn(s, generator=gen).to(device).requires_grad_(grad) for s in shapes]


def total_terms(equation: str, shapes) -> int:
    """The terms an einsum sums with every label at once (torch-semiring-einsum's work): the product of all sizes."""
    bound = bind(parse(equation), shapes)
    n = 1
    for size in bound.sizes.values():
        n *= size
    return n


def scaled_down(equation: str, shapes, limit: float) -> list[tuple[int, ...]]:
    """The shapes with every dimension above 8 halved until the total terms are within `limit` (or none is left)."""
    while total_terms(equation, shapes) > limit and any(d > 8 for s in shapes for d in s):
        shapes = [tuple(d // 2 if d > 8 else d for d in s) for s in shapes]
    return shapes


def planned_cells(equation: str, shapes) -> int:
    bound = bind(parse(equation), shapes)
    return plan_contractions(bound.inputs, bound.output, dict(bound.sizes)).cells


# ------------------------------------------------------------------ the three systems


def ours(equation: str, semiring: str) -> Callable:
    return lambda *xs: so.einsum(equation, *xs, semiring=semiring)


def by_hand(case: str, semiring: str) -> Callable:
    S = SEMIRING[semiring]
    if case == "bmm":
        return lambda a, b: so.semiring_matmul(a, b, S)

    def chain(*xs):
        out = xs[0]
        for w in xs[1:]:
            out = so.semiring_matmul(out, w, S)
        return out

    return chain


def drop_in(equation: str, mode: str) -> Callable | None:
    """semiring_ops.semiring_einsum (torch-semiring-einsum's API: float64 inside for float32 inputs) as its users
    call it, AUTOMATIC_BLOCK_SIZE."""
    from semiring_ops import semiring_einsum as d

    eq = d.compile_equation(equation)
    if mode == "log fwd+bwd":
        return lambda *xs: d.log_einsum(eq, *xs)
    if mode == "log fwd":
        return lambda *xs: d.log_einsum_forward(eq, *xs)
    if mode == "max fwd":
        return lambda *xs: d.max_tropical_einsum_forward(eq, *xs)
    return None


def tse(equation: str, mode: str, block: int | None = None) -> Callable | None:
    """torch-semiring-einsum's call for the mode, with its AUTOMATIC_BLOCK_SIZE (or a fixed `block`)."""
    try:
        import torch_semiring_einsum as t
    except ImportError:
        return None
    eq = t.compile_equation(equation)
    bs = t.AUTOMATIC_BLOCK_SIZE if block is None else block
    if mode == "log fwd+bwd":
        return lambda *xs: t.log_einsum(eq, *xs, block_size=bs)
    if mode == "log fwd":
        return lambda *xs: t.log_einsum_forward(eq, *xs, block_size=bs)
    if mode == "max fwd" and hasattr(t, "max_tropical_einsum_forward"):  # after the 1.2.0 release
        return lambda *xs: t.max_tropical_einsum_forward(eq, *xs, block_size=bs)
    if mode == "max fwd":  # 1.2.0: the max comes with its argmax
        return lambda *xs: t.log_viterbi_einsum_forward(eq, *xs, block_size=bs)[0]
    return None  # no gradient for max in torch-semiring-einsum


def tse_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch-semiring-einsum")
    except Exception:
        return "not installed"


def system(name: str, case: str, equation: str, mode: str) -> Callable | None:
    semiring = mode.split()[0]
    if name == "ours":
        return ours(equation, semiring)
    if name == "drop-in":
        return drop_in(equation, mode)
    if name == "by hand":
        return by_hand(case, semiring)
    return tse(equation, mode)


def call(fn: Callable, xs: list[torch.Tensor], mode: str, out_grad: torch.Tensor | None) -> torch.Tensor:
    """One forward (no graph kept) or forward + backward (the gradients of every input)."""
    if "bwd" not in mode:
        with torch.no_grad():
            return fn(*xs)
    out = fn(*xs)
    torch.autograd.grad(out, xs, out_grad)
    return out.detach()


# ------------------------------------------------------------------ memory


def cuda_peak_mb(fn, xs, mode, out_grad) -> float:
    torch.cuda.synchronize()
    release("cuda")
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call(fn, xs, mode, out_grad)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def cpu_peak_worker(spec: str) -> None:
    """In a child process: warm up on small inputs, then the resident-set growth of one call (MiB) on stdout."""
    name, case, mode, shapes = json.loads(spec)
    shapes = [tuple(s) for s in shapes]
    equation = equation_of(case, shapes)
    fn = system(name, case, equation, mode)
    small = [tuple(min(d, 4) for d in s) for s in shapes]
    xs = inputs(small, "cpu", "bwd" in mode)
    out = fn(*xs)
    call(fn, xs, mode, torch.ones_like(out))
    xs = inputs(shapes, "cpu", "bwd" in mode)
    bound = bind(parse(equation), shapes)
    out_shape = tuple(bound.sizes[lab] for lab in bound.output)
    out_grad = torch.randn(out_shape) if "bwd" in mode else None
    Path("/proc/self/clear_refs").write_text("5")
    base = _kib("VmRSS")
    call(fn, xs, mode, out_grad)
    print(json.dumps((_kib("VmHWM") - base) / 1024))


def cpu_peak_mb(name: str, case: str, mode: str, shapes) -> float | str:
    if not Path("/proc/self/clear_refs").exists():
        return "n/a"
    spec = json.dumps([name, case, mode, [list(s) for s in shapes]])
    res = subprocess.run(
        [sys.executable, __file__, "--peak-worker", spec], capture_output=True, text=True, timeout=1800
    )
    if res.returncode:
        return f"ERR {res.stderr.strip().splitlines()[-1][:60] if res.stderr.strip() else res.returncode}"
    return float(res.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the run


def fmt(v) -> str:
    if isinstance(v, str):
        return v
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per cell (default GPU 20, CPU 3)")
    parser.add_argument("--quick", action="store_true", help="smoke test: small shapes, 1 rep")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory column")
    parser.add_argument("--no-tse", action="store_true", help="skip torch-semiring-einsum")
    parser.add_argument("--out", action="append", default=[], help="write FILE.json or FILE.md (repeatable)")
    parser.add_argument(
        "--tse-max-terms",
        type=float,
        default=4e10,
        help="beyond this many terms (the product of all sizes) torch-semiring-einsum is timed on the shapes scaled "
        "down to it and its time scaled up by the ratio of terms, marked ~ (default 4e10: the GPU's 4-matrix chain)",
    )
    parser.add_argument(
        "--tse-block",
        type=int,
        default=32,
        help="where torch-semiring-einsum's automatic block runs out of GPU memory (the scaled-down chain), it is "
        "timed again with this fixed block_size, marked 'block N'",
    )
    parser.add_argument("--peak-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_worker:
        cpu_peak_worker(args.peak_worker)
        return

    dev = args.device
    reps = 1 if args.quick else (args.reps or (20 if dev == "cuda" else 3))
    modes = MODES if dev == "cuda" else MODES[:3]
    names = ["ours", "by hand", "drop-in"] + ([] if args.no_tse else ["tse"])
    have_tse = tse("ij,jk->ik", "log fwd") is not None
    print(f"semiring_ops {so.__version__} | torch {torch.__version__} | torch-semiring-einsum {tse_version()}")
    print(f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'} | reps {reps}")
    if not have_tse and not args.no_tse:
        print("torch-semiring-einsum is not installed: pip install torch-semiring-einsum==1.2.0 (its column: n/a)")

    rows = []
    for case, (_, cpu_shapes, gpu_shapes, quick_shapes) in CASES.items():
        shapes = quick_shapes if args.quick else (gpu_shapes if dev == "cuda" else cpu_shapes)
        equation = equation_of(case, shapes)
        cells = planned_cells(equation, shapes)
        for mode in modes:
            bwd = "bwd" in mode
            xs = inputs(shapes, dev, bwd)
            with torch.no_grad():
                ref = so.einsum(equation, *xs, semiring=mode.split()[0])
            out_grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(dev) if bwd else None
            row = {"case": case, "equation": equation, "shapes": shapes, "mode": mode, "cells": cells}
            for name in names:
                fn = system(name, case, equation, mode)
                if fn is None:
                    row[name] = row[f"{name} diff"] = "n/a"
                    continue
                try:
                    if name == "tse" and total_terms(equation, shapes) > args.tse_max_terms:
                        row["tse estimated from"] = scaled_down(equation, shapes, args.tse_max_terms)
                        try:
                            row[name], row[f"{name} diff"] = tse_estimate(fn, equation, shapes, mode, dev, args)
                        except torch.cuda.OutOfMemoryError:  # its automatic block passed the GPU's memory
                            release(dev)
                            row["tse block"] = args.tse_block
                            fn = tse(equation, mode, args.tse_block)
                            row[name], row[f"{name} diff"] = tse_estimate(fn, equation, shapes, mode, dev, args)
                        continue
                    out = call(fn, xs, mode, out_grad)
                    row[f"{name} diff"] = float((out.double() - ref.double()).abs().nan_to_num(0.0).max())
                    row[name] = time_ms(lambda fn=fn, xs=xs, mode=mode, g=out_grad: call(fn, xs, mode, g), dev, reps)
                except torch.cuda.OutOfMemoryError:
                    row[name] = row[f"{name} diff"] = "OOM"
                except Exception as exc:
                    row[name] = row[f"{name} diff"] = f"ERR {type(exc).__name__}: {str(exc)[:50]}"
                finally:
                    release(dev)
                if mode == "log fwd+bwd" and not args.no_memory and not isinstance(row[name], str):
                    row[f"{name} MiB"] = (
                        cuda_peak_mb(fn, xs, mode, out_grad) if dev == "cuda" else cpu_peak_mb(name, case, mode, shapes)
                    )
                    release(dev)
            if isinstance(row.get("ours"), float) and isinstance(row.get("by hand"), float):  # their ratio, paired
                fns = [system(n, case, equation, mode) for n in ("ours", "by hand")]
                timed = [lambda fn=fn, xs=xs, mode=mode, g=out_grad: call(fn, xs, mode, g) for fn in fns]
                row["ours"], row["by hand"] = paired_ms(timed, dev, reps)
                release(dev)
            rows.append(row)
            print(line(row, names), flush=True)

    print(f"kernels: {kernel_summary()}")
    table = render(rows, names, dev, reps)
    print()
    print(table)
    for path in args.out:
        if path.endswith(".json"):
            Path(path).write_text(json.dumps({"date": str(date.today()), "device": dev, "rows": rows}, indent=1))
        else:
            Path(path).write_text(table + "\n")


def tse_estimate(fn, equation: str, shapes, mode: str, dev: str, args) -> tuple[float, float]:
    """torch-semiring-einsum's time where its every-label-at-once sum would run for hours (the GPU's chain of four
    1024^2 matrices: 1024^5 terms): timed on the shapes scaled down to --tse-max-terms terms and scaled back up by
    the ratio of terms (its blocks make its time linear in them) -> (ms, max difference from ours there)."""
    small = scaled_down(equation, shapes, args.tse_max_terms)
    xs = inputs(small, dev, "bwd" in mode)
    with torch.no_grad():
        ref = so.einsum(equation, *xs, semiring=mode.split()[0])
    out_grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(dev) if "bwd" in mode else None
    out = call(fn, xs, mode, out_grad)
    diff = float((out.double() - ref.double()).abs().nan_to_num(0.0).max())
    ms = time_ms(lambda: call(fn, xs, mode, out_grad), dev, max(1, min(args.reps or 3, 3)))
    return ms * total_terms(equation, shapes) / total_terms(equation, small), diff


def _ratio(a, b) -> str:
    return f"{a / b:.1f}x" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def line(row: dict, names: list[str]) -> str:
    times = " | ".join(f"{n} {fmt(row[n])} ms" for n in names)
    return f"{row['case']:6s} {row['mode']:12s} {times}"


def render(rows: list[dict], names: list[str], dev: str, reps: int) -> str:
    head = ["case", "equation", "mode"] + [f"{n} ms" for n in names] + ["ratio tse/ours", "ours/hand", "cells/s"]
    head += [f"{n} MiB" for n in names] + ["max diff vs ours"]
    out = [
        f"einsum, {dev}, median of {reps}, {date.today()}",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        o = r["ours"]
        cells = f"{r['cells'] / (o * 1e-3):.3g}" if isinstance(o, float) else "-"
        diffs = ", ".join(f"{n} {fmt(r[f'{n} diff'])}" for n in names if n != "ours")
        vals = [r["case"], f"`{r['equation']}`", r["mode"]]
        vals += [("~" if n == "tse" and "tse estimated from" in r else "") + fmt(r[n]) for n in names]
        vals += [_ratio(r.get("tse"), o), _ratio(o, r["by hand"]), cells]
        vals += [fmt(r.get(f"{n} MiB", "-")) for n in names] + [diffs]
        out.append("| " + " | ".join(vals) + " |")
    for r in rows:
        if "tse estimated from" in r:
            block = (
                f"; its AUTOMATIC_BLOCK_SIZE ran out of GPU memory there, so block_size={r['tse block']}"
                if "tse block" in r
                else ""
            )
            out.append(
                f"~ {r['case']} {r['mode']}: torch-semiring-einsum timed on shapes {r['tse estimated from']} and "
                f"scaled by the ratio of terms (it sums all {total_terms(r['equation'], r['shapes']):.3g} at once)"
                + block
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
