"""k-best reductions (argKmin / Kmin_argKmin ...) of semiring_ops.lazy beside pykeops, and on a GPU beside the
same formula's min reduction (issue 30's targets).

Definitions: x (M, D), y (N, D), fp32 torch.randn (seeded), the same tensors for every system, the KeOps
spelling D_ij = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1), then
D_ij.argKmin(K, dim=1) -> (M, K) int64.

    CPU rows   M x N = 10,000 x 1,000 (D = 2, K = 1, 10, 50), 100,000 x 1,000 and 1,000 x 100,000 (D = 2, K = 50):
               ours and pykeops (same process, CPU), timed in alternation (benchmarks/timing.paired_ms: one call
               of each per round after warm-up, the median), ratio = pykeops / ours (> 1: ours faster).
    GPU row    (CUDA only) M = N = 1,000,000, D = 3: ours argKmin(10) beside ours D_ij.min(dim=1) and
               D_ij.argmin(dim=1), ratio = argKmin / min (target: <= 1.5); pykeops with --pykeops-gpu only
               (pykeops 2.3 can crash on its first GPU reduction on CUDA 13, see benchmarks/lazy.py).

Check per row: ours against a float64 reference (torch.sort, stable, of the float64 distances) on the first 200
rows: the values within 1e-5 relative, and the chosen indices' float64 distances equal to the reference's
K best up to that tolerance (two points at float32-equal distances may come in either order: float32 rounds
them to a tie); and ours against pykeops: rows whose indices differ (such rows are float32 rounding ties:
g++ fuses the formula into FMAs, pykeops does not).

Usage:
    python benchmarks/lazy_kbest.py                      # CPU rows (GPU row too when CUDA is present)
    python benchmarks/lazy_kbest.py --device cuda        # the GPU row only
    python benchmarks/lazy_kbest.py --device cuda --kbest-rows 2   # CUDA policy: output rows per thread
    python benchmarks/lazy_kbest.py --device cuda --gpu-k 32 --kbest-register-words 0   # K = 32, lists in memory
    python benchmarks/lazy_kbest.py --quick              # small sizes, a smoke test (~10 s)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_ms

CPU_ROWS = [(10_000, 1_000, 2, 1), (10_000, 1_000, 2, 10), (10_000, 1_000, 2, 50), (100_000, 1_000, 2, 50)]
CPU_ROWS += [(1_000, 100_000, 2, 50)]
QUICK_ROWS = [(2_000, 500, 2, 1), (2_000, 500, 2, 10), (2_000, 500, 2, 50)]
GPU_SHAPE = (1_000_000, 1_000_000, 3, 10)
GPU_TARGET = 1.5  # argKmin(10) / min at the GPU shape


def sqdist(LT, x: torch.Tensor, y: torch.Tensor):
    """The KeOps spelling of |x_i - y_j|^2 for a LazyTensor class ``LT``, x (M, D), y (N, D)."""
    return ((LT(x[:, None, :]) - LT(y[None, :, :])) ** 2).sum(-1)


def data(m: int, n: int, d: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x (m, d), y (n, d): fp32 standard normal, seeded by the shape."""
    gen = torch.Generator().manual_seed(seed + m + 7 * n + d)
    return torch.randn(m, d, generator=gen).to(device), torch.randn(n, d, generator=gen).to(device)


def check(x: torch.Tensor, y: torch.Tensor, k: int, vals: torch.Tensor, idx: torch.Tensor, rows: int = 200) -> str:
    """'ok' when ours (vals, idx: (M, K)) is the float64 k-best of the first ``rows`` rows (module docstring),
    else what differs."""
    d = torch.cdist(x[:rows].double(), y.double(), compute_mode="donot_use_mm_for_euclid_dist") ** 2
    ref = torch.sort(d, dim=1, stable=True).values[:, :k]
    got = d.gather(1, idx[:rows].to(d.device))
    tol = 1e-5 * ref.abs().clamp_min(1e-6)
    if not torch.all((vals[:rows].double() - ref).abs() <= tol):
        return "VALUES DIFFER"
    if not torch.all((got - ref).abs() <= tol):
        return "INDICES DIFFER"
    picked = torch.sort(idx[:rows], dim=1).values
    if k > 1 and bool((picked[:, 1:] == picked[:, :-1]).any()):
        return "REPEATED INDICES"
    return "ok"


def cpu_row(ours_cls, pykeops_cls, m: int, n: int, d: int, k: int, reps: int) -> str:
    """One CPU row: ours (and pykeops' unless ``pykeops_cls`` is None) argKmin at (m, n, d, k), timed in
    alternation, with the checks."""
    x, y = data(m, n, d, "cpu")
    fns: list[Callable[[], torch.Tensor]] = [lambda: sqdist(ours_cls, x, y).argKmin(k, dim=1)]
    vals, idx = sqdist(ours_cls, x, y).Kmin_argKmin(k, dim=1)
    note = check(x, y, k, vals.reshape(m, k), idx.reshape(m, k))
    if pykeops_cls is not None:
        fns.append(lambda: sqdist(pykeops_cls, x, y).argKmin(k, dim=1))
        differ = int((fns[0]().reshape(m, k) != fns[1]().reshape(m, k)).any(1).sum())
        note += f", {differ} of {m} rows' indices differ from pykeops'"
    times = paired_ms(fns, "cpu", reps)
    t_ours, t_pk = times[0], (times[1] if len(times) > 1 else float("nan"))
    return f"{m:>8,} x {n:>7,} {d:>2} {k:>3}  {t_ours:>9.1f} {t_pk:>10.1f} {t_pk / t_ours:>6.2f}  {note}"


def cpu_table(rows: list[tuple[int, int, int, int]], reps: int) -> None:
    """The CPU rows: ours beside pykeops (when importable), one line each."""
    from semiring_ops.lazy import LazyTensor as Ours

    try:
        from pykeops.torch import LazyTensor as PyKeOps
    except ImportError as exc:  # pykeops is optional: ours alone
        print(f"pykeops unavailable ({exc}): ours only")
        PyKeOps = None
    print(f"{'M x N':>18} {'D':>2} {'K':>3}  {'ours ms':>9} {'pykeops ms':>10} {'ratio':>6}  check / vs pykeops")
    for m, n, d, k in rows:
        print(cpu_row(Ours, PyKeOps, m, n, d, k, reps), flush=True)


def gpu_row(reps: int, with_pykeops: bool, k: int) -> None:
    """The GPU row: ours argKmin(k) beside ours min / argmin of the same formula (and pykeops if asked)."""
    from semiring_ops.lazy import LazyTensor as Ours

    m, n, d, _ = GPU_SHAPE
    x, y = data(m, n, d, "cuda")
    fns: dict[str, Callable[[], object]] = {
        "min": lambda: sqdist(Ours, x, y).min(dim=1),
        "argmin": lambda: sqdist(Ours, x, y).argmin(dim=1),
        f"argKmin({k})": lambda: sqdist(Ours, x, y).argKmin(k, dim=1),
    }
    if with_pykeops:
        from pykeops.torch import LazyTensor as PyKeOps

        fns[f"pykeops argKmin({k})"] = lambda: sqdist(PyKeOps, x, y).argKmin(k, dim=1)
    vals, idx = sqdist(Ours, x, y).Kmin_argKmin(k, dim=1)
    note = check(x, y, k, vals, idx)
    times = dict(zip(fns, paired_ms(list(fns.values()), "cuda", reps), strict=True))
    print(f"GPU {torch.cuda.get_device_name()}: M = N = {m:,}, D = {d}; check {note}")
    for name, t in times.items():
        print(f"  {name:>22}: {t:9.1f} ms  ({m * n / t / 1e9:.2f}e12 cells/s)  / min = {t / times['min']:.2f}")
    ratio = times[f"argKmin({k})"] / times["min"]
    verdict = ("meets" if ratio <= GPU_TARGET else "MISSES") + f" the target (<= {GPU_TARGET} at K = {GPU_SHAPE[3]})"
    print(f"  argKmin({k}) / min = {ratio:.2f}" + (f": {verdict}" if k == GPU_SHAPE[3] else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda", "both"), default="both")
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per row")
    parser.add_argument("--quick", action="store_true", help="small CPU sizes, no GPU row")
    parser.add_argument("--gpu-k", type=int, default=GPU_SHAPE[3], help="K of the GPU row")
    parser.add_argument("--kbest-rows", type=int, default=None, help="CUDA: output rows per thread of the k-best")
    parser.add_argument(
        "--kbest-register-words", type=int, default=None, help="CUDA: most registers a row's lists take (else memory)"
    )
    parser.add_argument("--pykeops-gpu", action="store_true", help="also pykeops in the GPU row")
    args = parser.parse_args()
    if args.kbest_rows is not None:
        from semiring_ops.lazy import codegen

        codegen.KBEST_MAX_ROWS = args.kbest_rows
    if args.kbest_register_words is not None:
        from semiring_ops.lazy import reductions

        reductions.KBEST_REGISTER_WORDS["cuda"] = args.kbest_register_words
    torch.manual_seed(0)
    if args.device in ("cpu", "both"):
        print(f"CPU, {torch.get_num_threads()} threads")
        cpu_table(QUICK_ROWS if args.quick else CPU_ROWS, args.reps)
    if args.device in ("cuda", "both") and not args.quick:
        if torch.cuda.is_available():
            gpu_row(args.reps, args.pykeops_gpu, args.gpu_k)
        elif args.device == "cuda":
            raise SystemExit("--device cuda: CUDA is not available")


if __name__ == "__main__":
    main()
