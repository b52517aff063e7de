"""Scale past one device (issue 17): one device against two, in one process and as two ranks, in one run.

Workloads (random data, fixed seeds; never zeros):
    1. lazy   a Gaussian kernel product K @ b, K_ij = exp(-|x_i - y_j|^2 / 2), x (M, 3), y (N, 3), b (N, 1), fp32
              (GPU default M = N = 1,000,000): one device; the same with devices=[every device] (one process,
              the i axis cut over the devices, lazy/multi_device.py); and as W ranks, each holding 1/W of y and b
              (K.__matmul__(b_shard, group=g): all_reduce SUM of the partial products).
    2. hmm    categorical HMM EM, 50 states, 20 symbols, S sequences x 200 steps (GPU default S = 20,000):
              one rank, then W ranks with 1/W of the sequences each (HMM.fit(group=g): one all_reduce of the
              statistics per iteration). Seconds per EM iteration in steady state: (fit of 1 + k iterations - fit of
              1) / k (n_iter fixed, no early stop); the whole fit's seconds per iteration, set-up included, beside.
    3. ddp    a linear-chain CRF tagger's train step (emissions by a 2-layer MLP over random features, the CRF's
              summed NLL, Adam) under DistributedDataParallel: one rank, then W ranks, each at the same batch
              per device: tokens per second.
Ranks are processes spawned here (torch.multiprocessing), NCCL on GPUs (rank r on cuda:r), gloo on the CPU.
Times: CUDA events on each rank (wall clock on the CPU), median of --reps after warm-up; a multi-rank time is
the slowest rank's. Target (issue 17, two GPUs): every two-device row >= 1.8x its one-device row.

Reproduce:
    python benchmarks/distributed.py                 # every visible GPU (the issue's run: nvidia-h200-x2)
    python benchmarks/distributed.py --device cpu    # smoke test: 2 gloo ranks, small sizes, < 1 min on 2 cores
Keep NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 on the lent GPU machines (set here by default).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from semiring_ops import HMM, LinearChainCRF
from semiring_ops.lazy import Vi, Vj

TARGET = 1.8


def timed(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 1) -> float:
    """Median seconds of fn() over reps calls after warmup calls (CUDA events on a GPU, else wall clock)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------- the workloads, on one rank (of `world`)


def lazy_points(m: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, 3, generator=g), torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g) + 0.5


def lazy_rank(rank: int, world: int, device: torch.device, cfg: dict) -> dict:
    x, y, b = lazy_points(cfg["m"], cfg["n"])
    lo, hi = rank * cfg["n"] // world, (rank + 1) * cfg["n"] // world  # this rank's shard of j
    x, y, b = x.to(device), y[lo:hi].to(device), b[lo:hi].to(device)
    K = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 2).exp()
    group = dist.group.WORLD if world > 1 else None
    result = K.__matmul__(b, group=group)
    seconds = timed(lambda: K.__matmul__(b, group=group), device, cfg["reps"])
    return {"seconds": seconds, "check": result[:8, 0].double().cpu().tolist()}


def hmm_data(n_seq: int, steps: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (n_seq * steps,), generator=g)


def hmm_rank(rank: int, world: int, device: torch.device, cfg: dict) -> dict:
    n_seq, steps = cfg["sequences"], cfg["steps"]
    X = hmm_data(n_seq, steps)
    lo, hi = rank * n_seq // world, (rank + 1) * n_seq // world
    X_r, lengths = X[lo * steps : hi * steps].to(device), [steps] * (hi - lo)
    group = dist.group.WORLD if world > 1 else None

    def fit(n_iter: int) -> HMM:
        model = HMM(50, "categorical", n_symbols=20, generator=torch.Generator().manual_seed(0)).to(device)
        return model.fit(X_r, lengths, n_iter=n_iter, tol=-float("inf"), group=group)

    reps, iters = max(1, cfg["reps"] // 2), cfg["iters"]
    first = timed(lambda: fit(1), device, reps)  # the set-up (model, data layout, agreement check) + 1 iteration
    whole = timed(lambda: fit(1 + iters), device, reps)
    return {
        "seconds": (whole - first) / iters,  # an EM iteration in steady state
        "whole_fit_per_iter": whole / (1 + iters),  # set-up included
        "check": fit(1 + iters).monitor_.history[-1],
    }


class Tagger(torch.nn.Module):
    def __init__(self, features: int, tags: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.ReLU(), torch.nn.Linear(256, tags))
        self.crf = LinearChainCRF(tags, batch_first=True)

    def forward(self, feats: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        return self.crf.nll(self.mlp(feats), tags, reduction="sum")


def ddp_rank(rank: int, world: int, device: torch.device, cfg: dict) -> dict:
    torch.manual_seed(0)
    model = Tagger(cfg["features"], cfg["tags"]).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.index is not None else None
        )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(10 + rank)
    B, T = cfg["batch"], cfg["length"]
    feats = torch.randn(B, T, cfg["features"], generator=g).to(device)
    tags = torch.randint(0, cfg["tags"], (B, T), generator=g).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(feats, tags)
        loss.backward()
        opt.step()

    seconds = timed(step, device, cfg["reps"], warmup=3)
    return {"seconds": seconds, "tokens_per_s": B * T / seconds}


COLLECTIVE_BYTES = (4, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 28)


def collectives_rank(rank: int, world: int, device: torch.device, cfg: dict) -> dict:
    """Seconds of one all_reduce (sum) and one all_gather of float32 tensors of COLLECTIVE_BYTES bytes: the
    latency and bandwidth terms of docs/scaling.md's cost model."""
    times = {}
    for nbytes in COLLECTIVE_BYTES:
        x = torch.rand(max(1, nbytes // 4), device=device)  # never zeros
        parts = [torch.empty_like(x) for _ in range(world)]
        times[nbytes] = (
            timed(lambda x=x: dist.all_reduce(x), device, cfg["reps"], warmup=3),
            timed(lambda x=x, parts=parts: dist.all_gather(parts, x), device, cfg["reps"], warmup=3),
        )
    return {"seconds": 0.0, "collectives": times}


def print_collectives(world: int, times: dict) -> None:
    """A table of the collectives' times and bus bandwidths (NCCL's convention: all_reduce moves 2(W-1)/W of
    the bytes per rank, all_gather (W-1)/W x W), then latency + bytes / bandwidth fitted to all_reduce."""
    print(f"\n{'bytes':>12} {'all_reduce us':>14} {'bus GB/s':>9} {'all_gather us':>14} {'bus GB/s':>9}")
    for nbytes, (t_ar, t_ag) in sorted(times.items()):
        bus_ar = nbytes * 2 * (world - 1) / world / t_ar / 1e9
        bus_ag = nbytes * (world - 1) / t_ag / 1e9
        print(f"{nbytes:12,d} {t_ar * 1e6:14.1f} {bus_ar:9.1f} {t_ag * 1e6:14.1f} {bus_ag:9.1f}")
    small, large = min(times), max(times)
    latency = times[small][0]
    bandwidth = large * 2 * (world - 1) / world / max(times[large][0] - latency, 1e-12)
    print(f"all_reduce ~ {latency * 1e6:.1f} us + bytes x 2(W-1)/W / {bandwidth / 1e9:.1f} GB/s (W = {world})")


WORKLOADS = {"lazy": lazy_rank, "hmm": hmm_rank, "ddp": ddp_rank, "collectives": collectives_rank}


def lazy_in_process(cfg: dict, world: int, gpu: bool, reps: int) -> tuple[str, float, dict]:
    """Workload 1 in this process with devices=[every device] (lazy/multi_device.py)."""
    x, y, b = lazy_points(cfg["m"], cfg["n"])
    devs = [f"cuda:{i}" for i in range(world)] if gpu else ["cpu"] * world
    home = torch.device(devs[0])
    x, y, b = x.to(home), y.to(home), b.to(home)
    K = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 2).exp()
    seconds = timed(lambda: K.__matmul__(b, devices=devs), home, reps)
    check = K.__matmul__(b, devices=devs)[:8, 0].double().cpu().tolist()
    return f"{world} devices, one process", seconds, {"check": check}


# ---------------------------------------------------------------- ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, gpu: bool, name: str, cfg: dict, out) -> None:
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        **({"device_id": device} if gpu else {}),
    )
    try:
        out.put((rank, WORKLOADS[name](rank, world, device, cfg)))
    finally:
        dist.destroy_process_group()


def run_ranks(name: str, world: int, gpu: bool, cfg: dict) -> list[dict]:
    """The workload on ``world`` spawned ranks: their results in rank order."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, gpu, name, cfg, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"{name}: a rank failed (exit codes {[p.exitcode for p in procs]})")
    results = dict(out.get() for _ in range(world))
    return [results[r] for r in range(world)]


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--world", type=int, default=None, help="devices / ranks (default: every GPU, 2 on the CPU)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--points", type=int, default=None, help="M = N of workload 1")
    parser.add_argument("--sequences", type=int, default=None, help="S of workload 2")
    parser.add_argument("--batch", type=int, default=None, help="sentences per device in workload 3")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    gpu = args.device == "cuda"
    world = args.world or (torch.cuda.device_count() if gpu else 2)
    if world < 2:
        sys.exit(f"distributed.py: {world} device(s); the comparison needs at least two")
    reps = args.reps or (10 if gpu else 3)
    cfgs = {
        "lazy": {
            "m": args.points or (1_000_000 if gpu else 20_000),
            "n": args.points or (1_000_000 if gpu else 20_000),
            "reps": reps,
        },
        "hmm": {"sequences": args.sequences or (20_000 if gpu else 200), "steps": 200, "iters": 5, "reps": reps},
        "ddp": {"batch": args.batch or (512 if gpu else 16), "length": 64, "features": 256, "tags": 32, "reps": reps},
        "collectives": {"reps": max(reps, 20)},
    }
    name = torch.cuda.get_device_name() if gpu else f"CPU, {os.cpu_count()} cores"
    print(f"{world} x {name} | torch {torch.__version__} | {'NCCL' if gpu else 'gloo'} ranks | {datetime.date.today()}")
    rows = []
    for w in args.workloads:
        cfg = cfgs[w]
        if w == "collectives":  # no one-device row: the cost model's terms
            print_collectives(world, run_ranks(w, world, gpu, cfg)[0]["collectives"])
            continue
        one = run_ranks(w, 1, gpu, cfg)[0]
        entries = [(f"1 {'GPU' if gpu else 'rank'}", one["seconds"], one)]
        if w == "lazy":
            entries.append(lazy_in_process(cfg, world, gpu, reps))
        many = run_ranks(w, world, gpu, cfg)
        slowest = max(r["seconds"] for r in many)
        entries.append((f"{world} ranks", slowest, many[0]))
        if "check" in one:  # every configuration's first values against one device's
            ref = one["check"] if isinstance(one["check"], list) else [one["check"]]
            worst = max(
                abs(a - b) / max(abs(b), 1e-30)
                for _, _, d in entries
                for a, b in zip(d["check"] if isinstance(d["check"], list) else [d["check"]], ref, strict=True)
            )
            print(f"{w}: every configuration agrees with one device to {worst:.1e} relative (checked values)")
        for label, secs, detail in entries:
            speed = one["seconds"] / secs
            if w == "ddp":  # throughput: each rank runs the same batch, so W ranks do W x the work
                speed *= 1 if label.startswith("1 ") else world
            rows.append(
                {
                    "workload": w,
                    "config": label,
                    "seconds": secs,
                    "speedup": speed,
                    "cfg": cfg,
                    **{k: v for k, v in detail.items() if k != "seconds"},
                }
            )
    print(f"\n{'workload':<8} {'config':<26} {'seconds':>10} {'speed-up':>9}  target >= {TARGET}x")
    for r in rows:
        met = "-" if r["config"].startswith("1 ") else ("met" if r["speedup"] >= TARGET else "MISSED")
        print(f"{r['workload']:<8} {r['config']:<26} {r['seconds']:10.4f} {r['speedup']:8.2f}x  {met}")
    whole = {r["config"]: r["whole_fit_per_iter"] for r in rows if "whole_fit_per_iter" in r}
    if whole:  # the hmm rows' set-up included: the whole fit of 1 + k iterations, per iteration
        one = next(iter(whole.values()))
        parts = ", ".join(f"{c} {t:.4f} s ({one / t:.2f}x)" for c, t in whole.items())
        print(f"hmm, whole fit per iteration (set-up included): {parts}")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "world": world, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
