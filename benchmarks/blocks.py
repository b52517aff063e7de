"""The block engine (semiring_ops.blocks, issue 16): outputs larger than GPU memory written block by block into
host memory, measured against the machine's own bounds and the obvious torch loop, in one run.

Workloads (points: x (N, D) random normal, fp32, seed --seed; never zeros):
    1. dense   K = exp(-|x_i - x_j|^2 / (2 s^2)) of Vi(x), Vj(x) (semiring_ops.lazy), N x N fp32 (default
               N = 150,000: 90 GB, more than an 80 GB H100 holds), blocks.dense(K) into a fresh torch.empty
               output (the first touch of its pages is inside the time), on ONE device (the first of
               --devices; --dense-all-devices for all of them), as the issue asks.
               torch loop beside it: for 8192-row chunks, out[i:i+c].copy_(exp(-cdist(x[i:i+c], x)^2 /
               (2 s^2))) computed on the device with torch ops into another fresh torch.empty output (a
               synchronous copy into pageable memory: what a user writes by hand).
               With --reuse-out, blocks.dense(K, out) is timed a second time into the same output, now
               pre-faulted (NaN-filled before, so every cell must be written again): the row "dense
               Gaussian, into a reused output", the engine without the first touch of its pages.
    2. pdist   blocks.pdist of D = sqrt(sum((Vi(x) - Vj(x))^2)) on the same points and device(s): the
               condensed n (n - 1) / 2 vector in scipy.spatial.distance.pdist's layout, only the upper
               triangle's blocks computed. Its time is compared with workload 1's (dense) time: the two
               formulas differ by exp vs sqrt, and both are bound by moving bytes, not by that.
    3. matmul  blocks.matmul(a, b, "max") of a (n, k), b (k, n) random normal on the host, k = 64, on every
               device of --devices (default n = 200,000: 160 GB; the issue's run is on two GPUs).

Bounds, measured in the same run (each a time for the workload's output bytes):
    pinned D2H   bytes / the device-to-host bandwidth of a --bw-gb pinned buffer (tensor.copy_(non_blocking=
                 True), CUDA events, median of 5), summed over the devices the workload uses (an upper
                 bound: devices behind one PCIe switch share it). "-" on the CPU.
    host write   bytes / the host's multi-threaded write bandwidth: dst.copy_(src) between two --bw-gb CPU
                 tensors, dst pre-touched (no page faults), wall clock, median of 5, torch's thread count.
                 Printed beside it, not in the bound: the same with the dense writer's stream_copy (the CPU
                 extension's streaming-store copy, blocks/writers.py).
    compute      the same plan's blocks computed by the workload's policy on its devices and discarded (no
                 copy-out), second of two passes: CUDA events on one GPU, else wall clock after synchronising
                 every device.
    bound        max(compute, pinned D2H, host write): what a perfect pipeline would take.
Targets (issue 16): dense total <= 1.25 x bound and >= 10x faster than the torch loop; pdist time <= 0.6 x
the dense time. Matmul has no target: its row shows ours / bound only.

Times of blocks.* and of the torch loop are wall clock (perf_counter) around one call (--reps for more; the
median is shown); each call returns only when every block is in host memory. A small call of the same
formula runs first (kernel compilation and pinned staging are not timed). Correctness: --checks random
entries and one whole random row of every big result against float64 values computed from the points;
pdist on the first --subset points against scipy's pdist; matmul's random row blocks against
semiring_matmul on the first device.

Memory: the big outputs are made one after another and freed in between (a 90 GB output and the torch
loop's second 90 GB output do not fit in the H100 machine's 128 GiB at once). When MemAvailable (psutil,
or /proc/meminfo) is short of an output plus a margin, N (or the matmul n) is shrunk with a printed note;
--loop-n runs the torch loop at a smaller N and scales its time by (N / loop_n)^2, said in the output.

Columns of the final table: N (matmul: n = m), GB = output bytes / 1e9, ours s, torch loop s, x faster =
loop / ours, GB/s = output bytes / ours, bound s (max of the three above), ours / bound, target, met?

Reproduce:
    python benchmarks/blocks.py                                      # H100: N = 150,000 on one GPU
    python benchmarks/blocks.py --devices cuda:0 cuda:1 --json blocks.json   # 2 x H200, matmul n = 200,000
    python benchmarks/blocks.py --sizes 50000 --matmul-n 50000       # quick, any GPU
    python benchmarks/blocks.py --device cpu                         # smoke test: N = 3,000, < 1 min on 2 cores
    python benchmarks/blocks.py --reuse-out                          # + dense into a pre-faulted output
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

import torch

from semiring_ops import blocks, semiring_matmul
from semiring_ops.blocks import condensed_index, engine, writers
from semiring_ops.blocks.engine import _compute_fitting, plan_for, resolve_devices
from semiring_ops.blocks.policies import LazyDensePolicy, MatmulPolicy
from semiring_ops.lazy import Vi, Vj

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import timed_runs

GPU_SIZES, CPU_SIZES = [150_000], [3_000]
GPU_MATMUL_N, CPU_MATMUL_N = 200_000, 3_000
GPU_BW_GB, CPU_BW_GB = 2.0, 0.25
RAM_MARGIN = 8e9  # bytes kept free besides an output (pinned staging, operands, the interpreter)
DENSE_TOTAL_X_BOUND, DENSE_X_LOOP, PDIST_X_DENSE = 1.25, 10.0, 0.6


# ---------------------------------------------------------------- helpers


def mem_available() -> int | None:
    """Host bytes available (psutil when installed, else /proc/meminfo's MemAvailable)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def fit_square(n: int, elem_bytes: int, what: str, notes: list[str], margin: float = RAM_MARGIN) -> int:
    """n, or the largest n whose n x n output (+ margin) fits the available host memory, with a note."""
    avail = mem_available()
    if avail is None or n * n * elem_bytes + margin <= avail:
        return n
    fit = math.isqrt(max(int((avail - margin) / elem_bytes), 1))
    fit = max(1, fit // 1000 * 1000 if fit >= 1000 else fit)
    note = (
        f"NOTE: {what}: N = {n:,} needs {n * n * elem_bytes / 1e9:.1f} GB of host memory + {margin / 1e9:.0f} GB "
        f"margin; {avail / 1e9:.1f} GB available: N shrunk to {fit:,} ({fit * fit * elem_bytes / 1e9:.1f} GB)"
    )
    print(note, flush=True)
    notes.append(note)
    return fit


def warm_host_memory(notes: list[str]) -> None:
    """Touches the available host memory (less a margin) once and frees it. On a virtual machine (the lent
    GPU machines are Firecracker VMs) the hypervisor backs guest memory on its first touch: a 90 GB output
    took 20.6-26.8 s in a fresh VM's first run and 6.4 s in a later run of the same code. That cost is the
    VM's, paid once per machine and by whichever workload comes first, so it is paid here, before any timing.
    Linux's own first touch of a fresh allocation (page faults, zeroing) stays inside every timed run."""
    avail = mem_available()
    if avail is None:
        return
    nbytes = int(max(0, avail - RAM_MARGIN - 4e9))
    start = time.perf_counter()
    buf = blocks.empty((nbytes // 4,), torch.float32)
    buf.fill_(1.0)
    del buf
    gc.collect()
    seconds = time.perf_counter() - start
    note = f"NOTE: host memory warmed before timing: {nbytes / 1e9:.1f} GB touched and freed in {seconds:.1f} s"
    print(note, flush=True)
    notes.append(note)


def sync(devs: Sequence[torch.device]) -> None:
    for d in {d for d in devs if d.type == "cuda"}:
        torch.cuda.synchronize(d)


def wall(fn: Callable[[], object], devs: Sequence[torch.device]) -> tuple[float, object]:
    """Seconds of fn() by the wall clock, every device synchronised before and after; and fn's result."""
    sync(devs)
    t0 = time.perf_counter()
    result = fn()
    sync(devs)
    return time.perf_counter() - t0, result


def free(*_: object) -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gaussian(x: torch.Tensor, s: float):
    return (-((Vi(x) - Vj(x)) ** 2).sum(-1) / (2 * s * s)).exp()


def euclid(x: torch.Tensor):
    return (((Vi(x) - Vj(x)) ** 2).sum(-1)).sqrt()


# ---------------------------------------------------------------- bounds


def d2h_gbps(dev: torch.device, nbytes: int, reps: int = 5) -> float:
    """Pinned device-to-host bandwidth of ``dev`` in GB/s: median of CUDA-event-timed copies."""
    n = nbytes // 4
    with torch.cuda.device(dev):
        src = torch.randn(n, device=dev)
        dst = torch.empty(n, pin_memory=True)
        dst.copy_(src, non_blocking=True)  # warm-up (and faults the pinned pages in)
        torch.cuda.synchronize(dev)
        ms = statistics.median(timed_runs(lambda: dst.copy_(src, non_blocking=True), "cuda", reps))
    src = dst = None
    free()
    return n * 4 / (ms / 1e3) / 1e9


def host_write_gbps(
    nbytes: int, reps: int = 5, copy: Callable[[torch.Tensor, torch.Tensor], object] | None = None
) -> float:
    """The host's multi-threaded write bandwidth in GB/s: copy(dst, src) (default dst.copy_(src)) into a
    pre-touched dst, wall clock."""
    copy = copy or torch.Tensor.copy_
    n = nbytes // 4
    src = torch.randn(n)
    dst = torch.zeros(n)  # pre-touched: every page faulted in before timing
    copy(dst, src)
    ms = statistics.median(timed_runs(lambda: copy(dst, src), "cpu", reps))
    src = dst = None
    free()
    return n * 4 / (ms / 1e3) / 1e9


def stream_write_gbps(nbytes: int, reps: int = 5) -> float | None:
    """host_write_gbps of the dense writer's stream_copy (streaming stores); None without the CPU kernels."""
    stream_copy = writers.compiled_stream_copy()
    return None if stream_copy is None else host_write_gbps(nbytes, reps, stream_copy)


def compute_only_s(policy, grid, devs: Sequence[torch.device]) -> float:
    """Seconds to compute every block of ``grid`` with ``policy`` on ``devs`` (one thread each, one shared
    queue, as the engine) and discard it: no copy-out, no host write. The second of two passes (the first
    warms the allocator and the kernels at the plan's block sizes)."""
    _compute_pass(policy, grid, devs)
    return _compute_pass(policy, grid, devs)


def _compute_pass(policy, grid, devs: Sequence[torch.device]) -> float:
    queue, lock = list(reversed(grid.blocks)), threading.Lock()
    errors: list[BaseException] = []

    def work(dev: torch.device) -> None:
        try:
            with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
                state = policy.prepare(dev)
                while True:
                    with lock:
                        if not queue:
                            break
                        block = queue.pop()
                    pieces = _compute_fitting(policy, state, block, dev)
                    del pieces
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
        except BaseException as exc:
            errors.append(exc)

    if len(devs) == 1 and devs[0].type == "cuda":
        with torch.cuda.device(devs[0]):
            seconds = timed_runs(lambda: work(devs[0]), "cuda", 1)[0] / 1e3
    else:
        threads = [threading.Thread(target=work, args=(d,)) for d in devs]
        sync(devs)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
    free()
    if errors:
        raise errors[0]
    return seconds


def bound_parts(nbytes: int, compute_s: float, d2h: float | None, host: float) -> dict:
    parts = {"compute_s": compute_s, "d2h_s": nbytes / 1e9 / d2h if d2h else None, "host_write_s": nbytes / 1e9 / host}
    parts["bound_s"] = max(v for v in parts.values() if v is not None)
    return parts


# ---------------------------------------------------------------- checks


def check(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, what: str) -> dict:
    """got vs float64 ref: the max abs error, and whether every entry is within atol + rtol |ref| and finite,
    and the values are not all zero."""
    got, ref = got.double(), ref.double()
    err = (got - ref).abs()
    ok = bool(torch.isfinite(got).all() and (err <= atol + rtol * ref.abs()).all() and (got != 0).any())
    return {"what": what, "n": got.numel(), "max_abs_err": err.max().item(), "ok": ok}


def check_dense(out: torch.Tensor, x: torch.Tensor, s: float, k: int, gen: torch.Generator, what: str) -> dict:
    n = x.shape[0]
    i, j = torch.randint(0, n, (k,), generator=gen), torch.randint(0, n, (k,), generator=gen)
    row = int(torch.randint(0, n, (1,), generator=gen))
    xd = x.double()
    ref = torch.cat([((xd[i] - xd[j]) ** 2).sum(-1), ((xd[row] - xd) ** 2).sum(-1)]).div(-2 * s * s).exp()
    return check(torch.cat([out[i, j], out[row]]), ref, 1e-5, 1e-4, what)


def check_condensed(out: torch.Tensor, x: torch.Tensor, k: int, gen: torch.Generator, what: str) -> dict:
    n = x.shape[0]
    a, b = torch.randint(0, n, (k,), generator=gen), torch.randint(0, n, (k,), generator=gen)
    keep = a != b
    i, j = torch.minimum(a, b)[keep], torch.maximum(a, b)[keep]
    idx = torch.tensor([condensed_index(int(p), int(q), n) for p, q in zip(i, j, strict=True)], dtype=torch.long)
    xd = x.double()
    return check(out[idx], ((xd[i] - xd[j]) ** 2).sum(-1).sqrt(), 1e-5, 1e-5, what)


# ---------------------------------------------------------------- workloads


def torch_loop(x_dev: torch.Tensor, s: float, chunk: int) -> torch.Tensor:
    """The obvious loop: 8192-row chunks of the kernel computed on the device, copied into a fresh output."""
    n = x_dev.shape[0]
    out = torch.empty(n, n, dtype=x_dev.dtype)
    for i in range(0, n, chunk):
        block = torch.cdist(x_dev[i : i + chunk], x_dev).pow_(2).div_(-2 * s * s).exp_()
        out[i : i + chunk].copy_(block)
    return out


def median_wall(fn: Callable[[], torch.Tensor], devs, reps: int):
    """(median seconds of reps wall-clock calls, the last call's result, the last call's engine note); each
    earlier result is freed before the next call, so only one big output lives at a time."""
    times, result = [], None
    for _ in range(reps):
        result = None
        free()
        for d in {d for d in devs if d.type == "cuda"}:
            torch.cuda.reset_peak_memory_stats(d)
        seconds, result = wall(fn, devs)
        times.append(seconds)
    return statistics.median(times), result, engine_note(devs)


def engine_note(devs: Sequence[torch.device]) -> dict:
    """The last blocks call's RunStats (blocks.last_run()) and peak device memory (torch's allocator)."""
    st = blocks.last_run()
    gpus = sorted({d for d in devs if d.type == "cuda"}, key=str)
    return {
        "blocks": st.blocks,
        "write_s": st.write_seconds,
        "wait_s": st.wait_seconds,
        "write_gbps": st.write_gb_per_s,
        "peak_device_gb": max((torch.cuda.max_memory_allocated(d) / 1e9 for d in gpus), default=None),
        "budget_gb": min((torch.cuda.mem_get_info(d)[1] * 0.8 / 1e9 for d in gpus), default=None),
    }


def print_engine(e: dict, touch: str = "first touch included") -> None:
    peak = (
        ""
        if e["peak_device_gb"] is None
        else (
            f"; peak device memory {e['peak_device_gb']:.2f} GB (budget: 0.8 x free, at most {e['budget_gb']:.1f} GB)"
        )
    )
    print(
        f"  engine (blocks.last_run()): {e['blocks']} blocks; writer {e['write_s']:.2f} s "
        f"({e['write_gbps']:.1f} GB/s, {touch}), waiting for device-to-host copies {e['wait_s']:.2f} s"
        f"{peak}"
    )


def run_dense(n, args, devs, loop_dev, d2h_sum, host_bw, gen, notes) -> list[dict]:
    """Workloads 1 and 2 at N = n on ``devs``: [dense row, (with --reuse-out) the reused output's row, pdist
    row]."""
    x = torch.randn(n, args.dim, generator=gen)
    s = args.sigma
    gb = n * n * 4 / 1e9
    # warm-up: the same formulas on a small slice (kernel compilation, pinned staging, device contexts)
    x_small = x[: min(n, 2048)]
    blocks.dense(gaussian(x_small, s), devices=devs, progress=False)
    blocks.pdist(euclid(x_small), devices=devs, progress=False)
    free()

    K = gaussian(x, s)
    policy = LazyDensePolicy(K.formula, n, n, torch.float32)
    grid = plan_for(policy, devs, args.max_device_bytes)
    compute = compute_only_s(policy, grid, devs)
    bounds = bound_parts(n * n * 4, compute, d2h_sum, host_bw)

    ours, out, engine = median_wall(
        lambda: blocks.dense(K, devices=devs, max_device_bytes=args.max_device_bytes, progress=args.progress),
        devs,
        args.reps,
    )
    checks = [check_dense(out, x, s, args.checks, gen, "blocks.dense vs float64")]
    reuse_row = run_reused(K, out, args, devs, grid, bounds, gen, x) if args.reuse_out else None
    del out
    free()

    # the torch loop, after our output is freed (both at once need 2 x the RAM)
    loop_n = min(args.loop_n or n, n)
    xl = x[:loop_n].to(loop_dev)
    torch_loop(xl[: min(loop_n, 2 * args.chunk)], s, args.chunk)  # warm-up
    loop_raw, lout, _ = median_wall(lambda: torch_loop(xl, s, args.chunk), [loop_dev], args.reps)
    checks.append(check_dense(lout, x[:loop_n], s, args.checks, gen, "torch loop vs float64"))
    lout = xl = None
    free()
    loop = loop_raw * (n / loop_n) ** 2
    if loop_n != n:
        note = (
            f"NOTE: torch loop run at N = {loop_n:,} ({loop_raw:.2f} s) and scaled by (N / {loop_n:,})^2 to "
            f"{loop:.2f} s for N = {n:,}"
        )
        print(note)
        notes.append(note)
    dense_row = {
        "workload": "dense gaussian",
        "N": n,
        "D": args.dim,
        "devices": [str(d) for d in devs],
        "blocks": len(grid.blocks),
        "GB": gb,
        "ours_s": ours,
        "loop_s": loop,
        "loop_n": loop_n,
        "loop_raw_s": loop_raw,
        **bounds,
        "x_faster": loop / ours,
        "gbps": gb / ours,
        "ours_x_bound": ours / bounds["bound_s"],
        "target": f"<= {DENSE_TOTAL_X_BOUND} x bound, >= {DENSE_X_LOOP:g}x loop",
        "met": ours <= DENSE_TOTAL_X_BOUND * bounds["bound_s"] and loop / ours >= DENSE_X_LOOP,
        "met_bound": ours <= DENSE_TOTAL_X_BOUND * bounds["bound_s"],
        "met_loop": loop / ours >= DENSE_X_LOOP,
        "engine": engine,
        "checks": checks,
    }
    print_dense(dense_row, d2h_sum, host_bw)
    if reuse_row is not None:
        print_reused(reuse_row, ours, host_bw)

    # ---- 2. pdist
    Dk = euclid(x)
    size = n * (n - 1) // 2
    pgb = size * 4 / 1e9
    ppolicy = LazyDensePolicy(Dk.formula, n, n, torch.float32)
    pgrid = plan_for(ppolicy, devs, args.max_device_bytes, triangle="upper")
    pcompute = compute_only_s(ppolicy, pgrid, devs)
    pbounds = bound_parts(size * 4, pcompute, d2h_sum, host_bw)
    ptime, pout, pengine = median_wall(
        lambda: blocks.pdist(Dk, devices=devs, max_device_bytes=args.max_device_bytes, progress=args.progress),
        devs,
        args.reps,
    )
    pchecks = [check_condensed(pout, x, args.checks, gen, "blocks.pdist vs float64")]
    del pout
    free()
    pchecks.append(scipy_subset(x, min(args.subset, n), devs))
    pdist_row = {
        "workload": "pdist euclid",
        "N": n,
        "D": args.dim,
        "devices": [str(d) for d in devs],
        "blocks": len(pgrid.blocks),
        "GB": pgb,
        "ours_s": ptime,
        "loop_s": None,
        **pbounds,
        "x_faster": None,
        "gbps": pgb / ptime,
        "ours_x_bound": ptime / pbounds["bound_s"],
        "x_dense": ptime / ours,
        "target": f"<= {PDIST_X_DENSE} x dense time",
        "met": ptime <= PDIST_X_DENSE * ours,
        "engine": pengine,
        "checks": pchecks,
    }
    print_pdist(pdist_row, ours)
    return [dense_row, pdist_row] if reuse_row is None else [dense_row, reuse_row, pdist_row]


def run_reused(K, out: torch.Tensor, args, devs, grid, bounds: dict, gen, x: torch.Tensor) -> dict:
    """Workload 1 again into ``out``, the first run's output (pre-faulted; NaN-filled so every cell is
    written again): the engine's time without the first touch of the output's pages."""
    out.fill_(float("nan"))
    reused, _, engine_stats = median_wall(
        lambda: blocks.dense(K, out, devices=devs, max_device_bytes=args.max_device_bytes, progress=args.progress),
        devs,
        args.reps,
    )
    n, gb = out.shape[0], out.numel() * 4 / 1e9
    return {
        "workload": "dense Gaussian, into a reused output",
        "N": n,
        "D": args.dim,
        "devices": [str(d) for d in devs],
        "blocks": len(grid.blocks),
        "GB": gb,
        "ours_s": reused,
        "loop_s": None,
        **bounds,
        "x_faster": None,
        "gbps": gb / reused,
        "ours_x_bound": reused / bounds["bound_s"],
        "target": "-",
        "met": None,
        "engine": engine_stats,
        "checks": [check_dense(out, x, args.sigma, args.checks, gen, "blocks.dense (reused out) vs float64")],
    }


def scipy_subset(x: torch.Tensor, sub: int, devs) -> dict:
    try:
        from scipy.spatial.distance import pdist as scipy_pdist
    except ImportError:
        return {"what": f"pdist vs scipy (first {sub:,} points)", "ok": None, "note": "scipy unavailable"}
    xs = x[:sub]  # one tensor for Vi and Vj: blocks.pdist tells the formula is symmetric by tensor identity
    ours = blocks.pdist(euclid(xs), devices=devs, progress=False)
    ref = torch.from_numpy(scipy_pdist(xs.double().numpy()))
    result = check(ours, ref, 1e-5, 1e-5, f"blocks.pdist vs scipy pdist (first {sub:,} points)")
    result["same_shape"] = tuple(ours.shape) == tuple(ref.shape)
    result["ok"] = result["ok"] and result["same_shape"]
    return result


def run_matmul(n, args, devs, d2h_sum, host_bw, gen) -> dict:
    k = args.matmul_k
    a, b = torch.randn(n, k, generator=gen), torch.randn(k, n, generator=gen)
    gb = n * n * 4 / 1e9
    blocks.matmul(a[:2048], b[:, :2048], "max", devices=devs, progress=False)  # warm-up
    free()
    policy = MatmulPolicy(a, b, "max")
    grid = plan_for(policy, devs, args.max_device_bytes)
    compute = compute_only_s(policy, grid, devs)
    bounds = bound_parts(n * n * 4, compute, d2h_sum, host_bw)
    ours, out, mengine = median_wall(
        lambda: blocks.matmul(
            a, b, "max", devices=devs, max_device_bytes=args.max_device_bytes, progress=args.progress
        ),
        devs,
        args.reps,
    )
    # random entries and one row against float64; random row blocks against semiring_matmul on the first device
    i, j = torch.randint(0, n, (args.checks,), generator=gen), torch.randint(0, n, (args.checks,), generator=gen)
    ref = (a[i].double() + b[:, j].double().T).amax(1)
    checks = [check(out[i, j], ref, 1e-5, 1e-6, "blocks.matmul vs float64")]
    dev0 = devs[0]
    worst, same = 0.0, True
    b_dev = b.to(dev0)
    for _ in range(3):
        r0 = int(torch.randint(0, max(1, n - 64), (1,), generator=gen))
        want = semiring_matmul(a[r0 : r0 + 64].to(dev0), b_dev, "max").cpu()
        got = out[r0 : r0 + 64]
        worst = max(worst, (got - want).abs().max().item())
        same = same and torch.allclose(got, want, atol=1e-6, rtol=0)
    checks.append(
        {"what": f"3 blocks of 64 rows vs semiring_matmul on {dev0}", "n": 3 * 64 * n, "max_abs_err": worst, "ok": same}
    )
    del out, b_dev
    free()
    row = {
        "workload": f"matmul max k={k}",
        "N": n,
        "devices": [str(d) for d in devs],
        "blocks": len(grid.blocks),
        "GB": gb,
        "ours_s": ours,
        "loop_s": None,
        **bounds,
        "x_faster": None,
        "gbps": gb / ours,
        "ours_x_bound": ours / bounds["bound_s"],
        "target": "-",
        "met": None,
        "engine": mengine,
        "checks": checks,
    }
    print_matmul(row, d2h_sum, host_bw)
    return row


# ---------------------------------------------------------------- printing


def _f(value, digits: int = 3, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "met" if value else "MISSED"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -(digits - 1):
            return f"{value:.2e}{unit}"
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _side(title: str, rows: list[tuple[str, object, object, str]]) -> None:
    """One workload's side-by-side table: quantity | time s | GB/s | note."""
    print(f"\n== {title} ==")
    print(f"  {'quantity':<38s} {'time s':>10s} {'GB/s':>9s}  note")
    for name, secs, gbps, note in rows:
        print(f"  {name:<38s} {_f(secs):>10s} {_f(gbps, 2):>9s}  {note}")


def _checks(row: dict) -> None:
    for c in row["checks"]:
        status = "ok" if c["ok"] else ("n/a" if c["ok"] is None else "FAILED")
        extra = c.get("note") or f"{c.get('n', '')} values, max abs err {_f(c['max_abs_err'])}".strip()
        print(f"  check {c['what']}: {extra}: {status}")


def _bound_rows(r: dict, d2h_sum, host_bw, devs_note: str) -> list:
    gb = r["GB"]
    return [
        (f"pinned D2H ({devs_note})", r["d2h_s"], d2h_sum, "bytes / pinned device-to-host bandwidth"),
        (f"host write ({torch.get_num_threads()} threads)", r["host_write_s"], host_bw, "bytes / pre-faulted copy_"),
        ("compute only (no copy-out)", r["compute_s"], gb / r["compute_s"], f"{r['blocks']} blocks, discarded"),
        ("bound = max of the three", r["bound_s"], gb / r["bound_s"], ""),
    ]


def print_dense(r: dict, d2h_sum, host_bw) -> None:
    devs = ", ".join(r["devices"])
    loop_note = "8192-row chunks, cdist, copy_ to pageable" if r["loop_n"] == r["N"] else "SCALED from N = "
    if r["loop_n"] != r["N"]:
        loop_note += f"{r['loop_n']:,} by (N / n)^2"
    _side(
        f"1. dense Gaussian kernel: N = {r['N']:,}, D = {r['D']}, fp32, {r['GB']:.2f} GB into host memory, on {devs}",
        [
            *_bound_rows(r, d2h_sum, host_bw, devs),
            ("ours: blocks.dense (fresh out)", r["ours_s"], r["gbps"], "first touch included"),
            ("torch loop (fresh out)", r["loop_s"], r["GB"] / r["loop_s"], loop_note),
        ],
    )
    print(
        f"  target: total <= {DENSE_TOTAL_X_BOUND} x bound: ours / bound = {r['ours_x_bound']:.2f}: "
        f"{_f(r['met_bound'])}; >= {DENSE_X_LOOP:g}x faster than the torch loop: {r['x_faster']:.2f}x: "
        f"{_f(r['met_loop'])}"
    )
    print_engine(r["engine"])
    _checks(r)


def print_reused(r: dict, fresh_s: float, host_bw: float) -> None:
    _side(
        f"1b. dense Gaussian, into a reused output: N = {r['N']:,}, {r['GB']:.2f} GB (--reuse-out)",
        [
            ("host write bound", r["host_write_s"], host_bw, "bytes / pre-faulted copy_"),
            ("bound (workload 1's)", r["bound_s"], r["GB"] / r["bound_s"], "max(compute, D2H, host write)"),
            ("ours: blocks.dense (reused out)", r["ours_s"], r["gbps"], "pre-faulted: no first touch"),
            ("ours: blocks.dense (fresh out)", fresh_s, r["GB"] / fresh_s, "workload 1, first touch included"),
        ],
    )
    print(f"  ours / bound = {r['ours_x_bound']:.2f} (no target set)")
    print_engine(r["engine"], "pre-faulted output")
    _checks(r)


def print_pdist(r: dict, dense_s: float) -> None:
    devs = ", ".join(r["devices"])
    _side(
        f"2. pdist (Euclidean, condensed, scipy layout): N = {r['N']:,}, {r['GB']:.2f} GB, on {devs}",
        [
            ("pinned D2H bound", r["d2h_s"], None, ""),
            ("host write bound", r["host_write_s"], None, ""),
            ("compute only (upper-triangle blocks)", r["compute_s"], r["GB"] / r["compute_s"], f"{r['blocks']} blocks"),
            ("bound = max of the three", r["bound_s"], r["GB"] / r["bound_s"], ""),
            ("ours: blocks.pdist", r["ours_s"], r["gbps"], "fresh out"),
            ("dense (workload 1) for comparison", dense_s, None, "full N x N Gaussian"),
        ],
    )
    print(
        f"  target: pdist time <= {PDIST_X_DENSE} x dense time: {r['x_dense']:.2f} x: {_f(r['met'])}"
        f" (ours / bound = {r['ours_x_bound']:.2f})"
    )
    print_engine(r["engine"])
    _checks(r)


def print_matmul(r: dict, d2h_sum, host_bw) -> None:
    devs = ", ".join(r["devices"])
    _side(
        f"3. semiring product (max): m = n = {r['N']:,}, {r['workload'].split()[-1]}, {r['GB']:.2f} GB, on {devs}",
        [*_bound_rows(r, d2h_sum, host_bw, devs), ("ours: blocks.matmul", r["ours_s"], r["gbps"], "fresh out")],
    )
    print(f"  ours / bound = {r['ours_x_bound']:.2f} (no target set)")
    print_engine(r["engine"])
    _checks(r)


HEADER = ("workload", "N", "GB", "ours s", "loop s", "x faster", "GB/s", "bound s", "ours/bound", "target", "met?")
WIDTHS = (16, 9, 8, 8, 8, 8, 7, 8, 10, 30, 14)


def _line(cells, widths=WIDTHS) -> str:
    return " ".join(
        f"{c:<{w}s}" if i in (0, 9, 10) else f"{c:>{w}s}" for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def summary(rows: list[dict]) -> None:
    print("\n== summary (times in s; GB = output bytes / 1e9; bound = max(compute, pinned D2H, host write)) ==")
    widths = (max(WIDTHS[0], *(len(r["workload"]) for r in rows)), *WIDTHS[1:])
    print(_line(HEADER, widths))
    print("-" * len(_line(HEADER, widths)))
    for r in rows:
        met = "-" if r["met"] is None else ("met" if r["met"] else "MISSED")
        if r["workload"] == "dense gaussian" and not r["met"]:
            met = f"bound {_f(r['met_bound'])}, loop {_f(r['met_loop'])}"
        checks_ok = all(c["ok"] is not False for c in r["checks"])
        print(
            _line(
                (
                    r["workload"],
                    f"{r['N']:,}",
                    f"{r['GB']:.2f}",
                    _f(r["ours_s"]),
                    _f(r["loop_s"]) + ("*" if r.get("loop_n", r["N"]) != r["N"] else ""),
                    "-" if r["x_faster"] is None else f"{r['x_faster']:.2f}x",
                    _f(r["gbps"], 2),
                    _f(r["bound_s"]),
                    f"{r['ours_x_bound']:.2f}",
                    r["target"] + (f" ({r['x_dense']:.2f}x)" if "x_dense" in r else ""),
                    met + ("" if checks_ok else " CHECK FAILED"),
                ),
                widths,
            )
        )


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument(
        "--devices", nargs="+", default=None, help="GPUs to use, e.g. cuda:0 cuda:1 (default: every visible GPU)"
    )
    parser.add_argument("--dense-all-devices", action="store_true", help="workloads 1-2 on all --devices, not one")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help=f"N of workloads 1-2 (default {GPU_SIZES} GPU, {CPU_SIZES} CPU)",
    )
    parser.add_argument(
        "--matmul-n", type=int, default=None, help=f"m = n (default {GPU_MATMUL_N:,}; CPU {CPU_MATMUL_N:,})"
    )
    parser.add_argument("--matmul-k", type=int, default=64)
    parser.add_argument("--no-matmul", action="store_true", help="skip workload 3")
    parser.add_argument(
        "--reuse-out", action="store_true", help="time workload 1 again into its (now pre-faulted) output"
    )
    parser.add_argument(
        "--cold-host", action="store_true", help="skip the host memory warm-up (warm_host_memory) on a GPU run"
    )
    parser.add_argument("--dim", type=int, default=3, help="D of the points (default 3)")
    parser.add_argument("--sigma", type=float, default=1.0, help="the Gaussian kernel's s (default 1)")
    parser.add_argument("--chunk", type=int, default=8192, help="the torch loop's rows per chunk (default 8192)")
    parser.add_argument("--loop-n", type=int, default=None, help="N of the torch loop (time scaled to N); default N")
    parser.add_argument("--subset", type=int, default=2000, help="points of the scipy pdist check (default 2,000)")
    parser.add_argument("--checks", type=int, default=256, help="random entries checked per result (default 256)")
    parser.add_argument(
        "--bw-gb", type=float, default=None, help=f"bandwidth buffers, GB ({GPU_BW_GB} GPU, {CPU_BW_GB} CPU)"
    )
    parser.add_argument("--max-device-bytes", type=int, default=None, help="the engine's per-device budget")
    parser.add_argument("--reps", type=int, default=1, help="calls of each big run (median shown; default 1)")
    parser.add_argument("--progress", action="store_true", help="show the engine's progress bar")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    parser.add_argument("--chunk-mb", type=int, default=None, help="engine.STAGING_CHUNK_BYTES in MiB (a tuning run)")
    parser.add_argument("--slots", type=int, default=None, help="engine.STAGING_SLOTS (a tuning run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.chunk_mb:
        engine.STAGING_CHUNK_BYTES = args.chunk_mb << 20
    if args.slots:
        engine.STAGING_SLOTS = args.slots
    print(f"engine: staging chunks of {engine.STAGING_CHUNK_BYTES >> 20} MiB x {engine.STAGING_SLOTS} per GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(args.seed)

    if gpu:
        devs = resolve_devices(args.devices)
        if any(d.type != "cuda" for d in devs):
            parser.error("--device cuda takes CUDA --devices only")
    else:
        if args.devices and any(torch.device(d).type != "cpu" for d in args.devices):
            parser.error("--device cpu takes cpu --devices only")
        devs = [torch.device("cpu")] * (
            len(args.devices) if args.devices else max(1, min(4, (os.cpu_count() or 1) // 2))
        )
    dense_devs = devs if args.dense_all_devices else devs[:1]
    bw_bytes = int((args.bw_gb or (GPU_BW_GB if gpu else CPU_BW_GB)) * 1e9)

    notes: list[str] = []
    where = ", ".join(sorted({torch.cuda.get_device_name(d) for d in devs})) if gpu else "CPU"
    avail = mem_available()
    print(
        f"device: {where} x {len(devs)} ({', '.join(map(str, devs))}) | host: {os.cpu_count()} cores, torch "
        f"{torch.get_num_threads()} threads, {'?' if avail is None else f'{avail / 1e9:.1f}'} GB available | "
        f"torch {torch.__version__} | fp32"
    )
    if not gpu and (load := os.getloadavg()[0]) > (os.cpu_count() or 1) - 0.5:
        print(f"WARNING: load average {load:.1f} on {os.cpu_count()} cores: other processes compete")

    # ---- machine bounds
    d2h = {str(d): d2h_gbps(d, bw_bytes) for d in devs} if gpu else {}
    host_bw = host_write_gbps(bw_bytes)
    stream_bw = stream_write_gbps(bw_bytes)
    print(f"\n== machine bounds ({bw_bytes / 1e9:.2f} GB buffers, median of 5) ==")
    for d, v in d2h.items():
        print(f"  pinned D2H {d}: {v:.2f} GB/s (tensor.copy_(non_blocking=True) into pinned memory, CUDA events)")
    if not gpu:
        print("  pinned D2H: - (CPU run)")
    print(
        f"  host write: {host_bw:.2f} GB/s (copy_ into pre-touched memory, {torch.get_num_threads()} threads, "
        "wall clock)"
    )
    if stream_bw is None:
        print("  host write, stream_copy: - (the CPU kernels are not compiled)")
    else:
        print(f"  host write, stream_copy: {stream_bw:.2f} GB/s (the dense writer's streaming stores; not in bound)")

    def d2h_sum(ds) -> float | None:
        return sum(d2h[str(d)] for d in ds) if gpu else None

    if gpu and not args.cold_host:
        warm_host_memory(notes)
    rows: list[dict] = []
    for n in args.sizes or (GPU_SIZES if gpu else CPU_SIZES):
        n = fit_square(n, 4, "dense", notes)
        rows += run_dense(n, args, dense_devs, dense_devs[0], d2h_sum(dense_devs), host_bw, gen, notes)
    if not args.no_matmul:
        # matmul's margin adds the pinned staging of its blocks (two per GPU) and the transposed copy of b
        mn = fit_square(
            args.matmul_n or (GPU_MATMUL_N if gpu else CPU_MATMUL_N), 4, "matmul", notes, RAM_MARGIN + 16e9 * len(devs)
        )
        rows.append(run_matmul(mn, args, devs, d2h_sum(devs), host_bw, gen))

    summary(rows)
    if any(r.get("loop_n", r["N"]) != r["N"] for r in rows):
        print("* torch loop time scaled from a smaller N (see the NOTE)")
    for note in notes:
        print(note)
    failed = [c["what"] for r in rows for c in r["checks"] if c["ok"] is False]
    print("checks:", "all passed" if not failed else f"FAILED: {failed}")
    if args.json:
        meta = {
            "device": where,
            "devices": [str(d) for d in devs],
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "host_available_gb": None if avail is None else avail / 1e9,
            "d2h_gbps": d2h,
            "host_write_gbps": host_bw,
            "host_stream_write_gbps": stream_bw,
            "notes": notes,
            "date": date.today().isoformat(),
            "args": vars(args),
        }
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        print("wrote", args.json)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
