"""CTC beside its anchors (issue 43), in one run and one table: semiring_ops.ctc_loss (the fused kernels,
csrc/ctc_dp.h) against torch.nn.functional.ctc_loss (its native kernels, and cuDNN's where cuDNN applies: blank
0, int32 concatenated targets on the CPU with lengths as lists, every input of full length, targets of at most
256 labels), forward and backward; the Viterbi loss (semiring="max"); forced_align batched against a loop of
torchaudio's (when torchaudio loads: its compiled ops need torch 2.11).

Inputs: log_probs = log_softmax of torch.randn (T, N, C) float32 (never zeros), targets uniform in 1..C - 1 of
length S, every item of full length. Times: median ms of CUDA events (GPU) or wall clock (CPU) after warm-up,
forward + backward (the loss's mean, then .backward()), each call from an idle device; "in a loop": per call of
20 made back to back, as a training loop makes them (the host's work overlapping the device's). Peak: the most
memory allocated during one forward + backward beyond the inputs (torch.cuda.max_memory_allocated). "|diff|": the
largest relative difference of the unreduced losses, ours against torch's native kernel.

Usage:
    python benchmarks/ctc.py --device cuda       # the issue's GPU shapes, and forced_align N = 32
    python benchmarks/ctc.py --device cpu        # the issue's 2-core CPU shape
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import loop_ms, peak_mib, time_ms

import semiring_ops

GPU_SHAPES = ((1000, 32, 1000, 200), (4000, 16, 100, 800))
CPU_SHAPES = ((200, 8, 50, 40),)


def _inputs(T: int, N: int, C: int, S: int, device: str):
    g = torch.Generator().manual_seed(T + N + C + S)
    lp = torch.randn(T, N, C, generator=g).log_softmax(-1).to(device)
    targets = torch.randint(1, C, (N, S), generator=g)
    return lp, targets, torch.full((N,), T, dtype=torch.long), torch.full((N,), S, dtype=torch.long)


def _fwd_bwd(loss_fn, lp: torch.Tensor):
    def run():
        x = lp.detach().requires_grad_()
        loss_fn(x).backward()

    return run


def _mib(value: float | str | None) -> str:
    return "—" if value is None else value if isinstance(value, str) else f"{value:.0f}"


def ctc_rows(shapes, device: str, reps: int) -> None:
    print(
        "| T | N | C | S | ours ms | torch native ms | cuDNN ms | native / ours | cuDNN / ours "
        "| in a loop: ours / native ms | native / ours | Viterbi ms | peak ours / native MB | max rel |diff| |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for T, N, C, S in shapes:
        print(_ctc_row(T, N, C, S, device, reps))


def _ctc_row(T: int, N: int, C: int, S: int, device: str, reps: int) -> str:
    lp, targets, il, tl = _inputs(T, N, C, S, device)
    dev_targets, dev_il, dev_tl = targets.to(device), il.to(device), tl.to(device)
    ours = _fwd_bwd(lambda x: semiring_ops.ctc_loss(x, dev_targets, dev_il, dev_tl), lp)
    viterbi = _fwd_bwd(lambda x: semiring_ops.ctc_loss(x, dev_targets, dev_il, dev_tl, semiring="max"), lp)

    def native_loss(x):
        with torch.backends.cudnn.flags(enabled=False):
            return F.ctc_loss(x, dev_targets, dev_il, dev_tl)

    native = _fwd_bwd(native_loss, lp)
    t_ours, t_native, t_viterbi = (time_ms(f, device, reps) for f in (ours, native, viterbi))
    loop_ours, loop_native = (loop_ms(f, device, 2 * reps) for f in (ours, native))
    t_cudnn = float("nan")
    if device == "cuda" and S <= 256:  # cuDNN's arguments: int32 concatenated targets and lengths on the CPU
        flat, il_list, tl_list = targets.reshape(-1).int(), il.tolist(), tl.tolist()
        t_cudnn = time_ms(_fwd_bwd(lambda x: F.ctc_loss(x, flat, il_list, tl_list), lp), device, reps)
    peak_ours, peak_native = (peak_mib(f, device) for f in (ours, native))
    with torch.no_grad():
        mine = semiring_ops.ctc_loss(lp, dev_targets, dev_il, dev_tl, reduction="none")
        with torch.backends.cudnn.flags(enabled=False):
            theirs = F.ctc_loss(lp, dev_targets, dev_il, dev_tl, reduction="none")
        diff = ((mine - theirs).abs() / theirs.abs()).max().item()
    return (
        f"| {T} | {N} | {C} | {S} | {t_ours:.3f} | {t_native:.3f} | {t_cudnn:.3f} | {t_native / t_ours:.2f} "
        f"| {t_cudnn / t_ours:.2f} | {loop_ours:.3f} / {loop_native:.3f} | {loop_native / loop_ours:.2f} "
        f"| {t_viterbi:.3f} | {_mib(peak_ours)} / {_mib(peak_native)} | {diff:.1e} |"
    )


def forced_align_rows(device: str, reps: int, N: int = 32, T: int = 500, C: int = 30, L: int = 100) -> None:
    try:
        import torchaudio.functional as AF

        AF.forced_align(torch.zeros(1, 3, 3, device=device).log_softmax(-1), torch.tensor([[1]], device=device))
    except Exception as exc:  # torchaudio absent, or its compiled ops not for this torch
        print(f"forced_align: torchaudio unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        AF = None
    g = torch.Generator().manual_seed(7)
    lp = torch.randn(N, T, C, generator=g).log_softmax(-1).to(device)
    targets = torch.randint(1, C, (N, L), generator=g).to(device)
    t_ours = time_ms(lambda: semiring_ops.forced_align(lp, targets), device, reps)
    line = f"forced_align N = {N}, T = {T}, C = {C}, L = {L}: ours batched {t_ours:.3f} ms"
    if AF is not None:

        def loop():
            return [AF.forced_align(lp[n : n + 1], targets[n : n + 1]) for n in range(N)]

        t_loop = time_ms(loop, device, reps)
        theirs = torch.cat([a for a, _ in loop()])
        same = torch.equal(theirs, semiring_ops.forced_align(lp, targets)[0])
        line += f", torchaudio loop {t_loop:.3f} ms ({t_loop / t_ours:.1f}x), same alignments: {same}"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}, torch {torch.__version__}, {datetime.date.today()}")
    ctc_rows(GPU_SHAPES if args.device == "cuda" else CPU_SHAPES, args.device, args.reps)
    forced_align_rows(args.device, args.reps, *((32, 500, 30, 100) if args.device == "cuda" else (8, 200, 30, 40)))


if __name__ == "__main__":
    main()
