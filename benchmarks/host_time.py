"""Host time of the hot ops (issue 29, item 4), ours beside PyTorch's own in one process.

CPU, one thread, shapes where compute is nil (best of rounds of back-to-back calls, alternated so drift falls on
every row alike):
    torch.bmm (1,4,4) fwd+bwd           the yardstick
    logbmm / maxbmm (1,4,4) fwd+bwd     ours: target <= 1.5x the yardstick
    CRF (1,2,3) train step              LinearChainCRF forward + backward: target <= 1.7x the yardstick
    CRF node alone (1,2,3)              the chain family's C++ node called directly on prepared inputs, then
                                        .sum().backward(): the step's kernels and autograd engine (four leaves)
                                        without the module's Python, i.e. what moving that Python out would leave
GPU (--device cuda): the CRF train step (B, T, C) eager (validate=False: no round trip, as a graph needs) beside the
same step replayed from a CUDA graph (target: eager <= 1.5x graph), and max / log (B, n, n) fwd+bwd beside the naive
torch expression (broadcast sum, then max / logsumexp over k), wall time of back-to-back steps, synchronised at the
ends only.

    python benchmarks/host_time.py                       # CPU rows
    python benchmarks/host_time.py --device cuda         # GPU rows (CRF 32,128,32; n = 64)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from timing import graphed

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.structures import LinearChainCRF


def per_call_us(fns: dict[str, Callable[[], object]], device: str, calls: int, rounds: int) -> dict[str, float]:
    """Best over `rounds` of the mean wall time of `calls` back-to-back calls, each function in turn per round."""
    for fn in fns.values():
        for _ in range(max(10, calls // 10)):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def crf_step(B: int, T: int, C: int, device: str) -> tuple[Callable[[], object], LinearChainCRF]:
    g = torch.Generator().manual_seed(0)
    em = torch.randn(B, T, C, generator=g).to(device).requires_grad_()
    tags = torch.randint(0, C, (B, T), generator=g).to(device)
    crf = LinearChainCRF(C, batch_first=True).to(device)
    return (lambda: crf(em, tags).backward()), crf


def cpu_rows(calls: int, rounds: int) -> list[tuple[str, float, float]]:
    torch.set_num_threads(1)
    a = torch.randn(1, 4, 4, requires_grad=True)
    b = torch.randn(1, 4, 4, requires_grad=True)
    step, crf = crf_step(1, 2, 3, "cpu")
    node = backend_for(torch.device("cpu")).autograd_node("chain", "crf_log_likelihood_autograd", wait=True)
    em = torch.randn(1, 2, 3, requires_grad=True)
    lengths, tags = torch.tensor([2]), torch.tensor([[0, 2]])
    node_args = (em, crf.transitions, crf.start_transitions, crf.end_transitions, lengths, tags)
    fns = {
        "torch.bmm (1,4,4) fwd+bwd": lambda: torch.bmm(a, b).sum().backward(),
        "logbmm (1,4,4) fwd+bwd": lambda: so.logbmm(a, b).sum().backward(),
        "maxbmm (1,4,4) fwd+bwd": lambda: so.maxbmm(a, b).sum().backward(),
        "CRF (1,2,3) train step": step,
    }
    if node is not None:  # the compiled chain family (not the PyTorch reference)
        fns["CRF node alone (1,2,3)"] = lambda: node(*node_args)[0].sum().backward()
    us = per_call_us(fns, "cpu", calls, rounds)
    base = us["torch.bmm (1,4,4) fwd+bwd"]
    return [(name, t, t / base) for name, t in us.items()]


def gpu_rows(B: int, T: int, C: int, n: int, calls: int, rounds: int) -> list[tuple[str, float, float]]:
    step, crf = crf_step(B, T, C, "cuda")
    crf.validate = False  # no validation round trip: the step a CUDA graph can hold
    replay = graphed(step)
    a = torch.randn(8, n, n, device="cuda", requires_grad=True)
    b = torch.randn(8, n, n, device="cuda", requires_grad=True)
    naive_max = lambda: (a[:, :, :, None] + b[:, None]).amax(2).sum().backward()  # noqa: E731
    naive_log = lambda: torch.logsumexp(a[:, :, :, None] + b[:, None], 2).sum().backward()  # noqa: E731
    fns = {
        f"CRF ({B},{T},{C}) train step, CUDA graph": replay,
        f"CRF ({B},{T},{C}) train step, eager": step,
        f"naive max (8,{n},{n}) fwd+bwd": naive_max,
        f"maxbmm (8,{n},{n}) fwd+bwd": lambda: so.maxbmm(a, b).sum().backward(),
        f"naive logsumexp (8,{n},{n}) fwd+bwd": naive_log,
        f"logbmm (8,{n},{n}) fwd+bwd": lambda: so.logbmm(a, b).sum().backward(),
    }
    us = per_call_us(fns, "cuda", calls, rounds)
    names = list(us)
    out = []
    for i, name in enumerate(names):
        base = us[names[i - i % 2]]  # each pair: the first row is the yardstick of the second
        out.append((name, us[name], us[name] / base))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--crf", default="32,128,32", help="B,T,C of the GPU CRF step")
    parser.add_argument("--n", type=int, default=64, help="n of the GPU (8, n, n) products")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    if args.device == "cpu":
        rows = cpu_rows(args.calls, args.rounds)
        print(f"CPU, one thread, torch {torch.__version__}: best of {args.rounds} rounds of {args.calls} calls")
        head = "x torch.bmm"
    else:
        B, T, C = (int(x) for x in args.crf.split(","))
        rows = gpu_rows(B, T, C, args.n, args.calls, args.rounds)
        name = torch.cuda.get_device_name()
        print(f"{name}, torch {torch.__version__}: best of {args.rounds} rounds of {args.calls} calls")
        head = "x row above"
    print(f"| {'what':<40} | {'us / call':>9} | {head:>11} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 13}|")
    for name, us, ratio in rows:
        print(f"| {name:<40} | {us:9.1f} | {ratio:11.2f} |")


if __name__ == "__main__":
    main()
