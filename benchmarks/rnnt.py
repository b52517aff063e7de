"""The RNN-T loss beside torchaudio's (issue 43), in one run and one table: semiring_ops.rnnt_loss (the logits'
normaliser and gathers by torch, the lattice by the ctc family's kernel csrc/rnnt_dp.h, the gradient formed once)
against torchaudio.functional.rnnt_loss (when torchaudio loads: its compiled ops need torch 2.11), forward +
backward, fp32.

Inputs: logits = torch.randn (B, T, U + 1, V) float32 (never zeros), targets uniform in 0..V - 2 (blank -1 = V - 1),
every item of full length. Times: median ms (CUDA events on the GPU, wall clock on the CPU) after warm-up of the
loss's mean and .backward(). Peak: the most memory allocated during one forward + backward beyond the inputs
(the logits' gradient included).
"|diff|": the largest relative difference of the unreduced losses, ours against torchaudio's; "grad diff" the
largest absolute difference of the gradients.

Usage:
    python benchmarks/rnnt.py --device cuda      # the issue's GPU shape (B = 16, T = 500, U = 100, V = 1,024)
    python benchmarks/rnnt.py --device cpu       # a 2-core CPU shape
    python benchmarks/rnnt.py --device cuda --parts   # where one step of the first GPU shape goes
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import peak_mib, time_ms

import semiring_ops

GPU_SHAPES = ((16, 500, 100, 1024), (32, 200, 50, 512))
CPU_SHAPES = ((8, 200, 40, 50), (4, 100, 20, 500))


def _torchaudio():
    try:
        import torchaudio.functional as F

        one = torch.zeros(1, 1, 1, 2)
        F.rnnt_loss(
            one,
            one.new_zeros(1, 0, dtype=torch.int32),
            *[torch.tensor([1, 0], dtype=torch.int32)[i : i + 1] for i in (0, 1)],
        )
        return F.rnnt_loss
    except Exception as exc:  # not installed, or its compiled ops do not load next to this torch
        print(f"torchaudio: not available ({type(exc).__name__}: {str(exc)[:100]})")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--parts", action="store_true", help="time each part of one step of the first shape")
    args = parser.parse_args()
    device = args.device
    if args.parts:
        _parts((GPU_SHAPES if device == "cuda" else CPU_SHAPES)[0], device, args.reps)
        return
    theirs_fn = _torchaudio()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {datetime.date.today()}; fp32 forward + backward, ms")
    print("| B, T, U, V | ours | torchaudio | torchaudio / ours | peak MiB ours / torchaudio | |diff| | grad diff |")
    print("|---|---|---|---|---|---|---|")
    for shape in GPU_SHAPES if device == "cuda" else CPU_SHAPES:
        print("| " + " | ".join(_row(shape, device, args.reps, theirs_fn)) + " |", flush=True)


def _parts(shape: tuple[int, int, int, int], device: str, reps: int) -> None:
    """Milliseconds of each part of one step (docs/perf_notes.md, "RNN-T loss: where a step goes")."""
    from semiring_ops.alignment import rnnt as loss_module
    from semiring_ops.ops.rnnt_ops import rnnt_lattice

    B, T, U, V = shape
    g = torch.Generator().manual_seed(B + T + U + V)
    logits = torch.randn(B, T, U + 1, V, generator=g).to(device).requires_grad_()
    targets = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int32).to(device)
    frames = torch.full((B,), T, dtype=torch.int32, device=device)
    labels = torch.full((B,), U, dtype=torch.int32, device=device)
    moves = loss_module._move_labels(targets.long(), labels.long(), V - 1, T)
    pot, _ = loss_module._potentials(logits.detach(), moves, True)
    parts = {
        "one read + write pass over the logits (mul_(1.0))": lambda: logits.detach().mul_(1.0),
        "torch.logsumexp over V": lambda: torch.logsumexp(logits.detach(), -1),
        "the gathers (B, T, U + 1, 2)": lambda: logits.detach().gather(-1, moves),
        "the lattice kernel, total only": lambda: rnnt_lattice(pot, frames.long(), labels.long(), False, False),
        "the lattice kernel, with posteriors": lambda: rnnt_lattice(pot, frames.long(), labels.long(), False, True),
        "the forward (gradient wanted)": lambda: semiring_ops.rnnt_loss(logits, targets, frames, labels),
        "forward + backward": _step(semiring_ops.rnnt_loss, logits, [targets, frames, labels]),
    }
    for name, fn in parts.items():
        print(f"| {name} | {time_ms(fn, device, reps):.2f} |", flush=True)


def _step(loss, logits: torch.Tensor, rest: list[torch.Tensor]):
    """One forward + backward of ``loss`` (the mean over the batch)."""

    def step() -> None:
        logits.grad = None
        loss(logits, *rest).backward()

    return step


def _row(shape: tuple[int, int, int, int], device: str, reps: int, theirs_fn) -> list[str]:
    B, T, U, V = shape
    g = torch.Generator().manual_seed(B + T + U + V)
    logits = torch.randn(B, T, U + 1, V, generator=g).to(device).requires_grad_()
    targets = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int32).to(device)
    rest = [targets, torch.full((B,), T, dtype=torch.int32, device=device)]
    rest.append(torch.full((B,), U, dtype=torch.int32, device=device))
    ours = _step(semiring_ops.rnnt_loss, logits, rest)
    t_ours = time_ms(ours, device, reps)
    logits.grad = None  # the peak counts the gradient the step makes
    p_ours = peak_mib(ours, device)
    row = [f"{B}, {T}, {U}, {V}", f"{t_ours:.2f}"]
    if theirs_fn is None:
        return [*row, "-", "-", f"{p_ours:.0f}" if p_ours is not None else "-", "-", "-"]
    theirs = _step(theirs_fn, logits, rest)
    t_theirs = time_ms(theirs, device, reps)
    logits.grad = None
    p_theirs = peak_mib(theirs, device)
    with torch.no_grad():
        a = semiring_ops.rnnt_loss(logits, *rest, reduction="none")
        b = theirs_fn(logits, *rest, reduction="none")
    ours()
    grad_ours = logits.grad.clone()
    theirs()
    grad_diff = (grad_ours - logits.grad).abs().max().item()
    peaks = f"{p_ours:.0f} / {p_theirs:.0f}" if p_ours is not None else "-"
    diff = ((a - b).abs() / b.abs()).max().item()
    return [*row, f"{t_theirs:.2f}", f"{t_theirs / t_ours:.2f}", peaks, f"{diff:.1e}", f"{grad_diff:.1e}"]


if __name__ == "__main__":
    main()
