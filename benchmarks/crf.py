"""Linear-chain CRF: ours (semiring_ops.structures.LinearChainCRF) beside pytorch-crf, torch-struct and a
hand-written PyTorch loop, in one run and one table.

Definitions (the same as the anchor figures in ANCHORS.md, so the numbers compare):
    emissions (B, T, C) random normal, fp32, requires_grad; tags uniform in [0, C); mask all true
    (or, with --ragged, prefix masks of random lengths in 1..T, the first sequence full length).
    train  = one loss forward + backward, gradients reaching the emissions and the CRF parameters:
             ours         crf.nll(em, tags, mask).backward()              (LinearChainCRF(C, batch_first=True))
             pytorch-crf  (-crf(em, tags, mask)).backward()                (torchcrf.CRF(C, batch_first=True))
             torch-struct LinearChainCRF(em[:, 1:, :, None] + trans).partition.sum().backward()
                          (log-partition only, no gold-path score; lengths= when ragged)
             torch loop   alpha_t = logsumexp(alpha_{t-1}[:, :, None] + trans, 1) + em[:, t], then
                          logsumexp(alpha_T).sum().backward()   (what a user writes by hand)
             ours no-check the same step with crf.validate = False: no validation round trip, so no
                          synchronisation (a bad sequence would get NaN instead of an error; GPU only)
             ours compiled the same step with crf.nll (and crf.viterbi) under torch.compile(mode=
                          "reduce-overhead"): inductor's CUDA graphs, no manual capture (GPU only)
             ours graphed the same step captured once in a CUDA graph (benchmarks/timing.py graphed) and
                          replayed: no Python or launch overhead, nothing else changed (GPU only; possible
                          because nothing in our step synchronises with the host under capture)
    decode = best tag sequences under no_grad:
             ours         crf.viterbi(em, mask) -> tag tensor (B, T);  row "ours .decode": crf.decode -> lists;
                          rows "ours no-check", "ours compiled" and "ours graphed" as for train
             pytorch-crf  crf.decode(em, mask) -> lists
             torch-struct LinearChainCRF(...).argmax -> one-hot edge tensor (B, T-1, C, C)
    Gradients accumulate across repetitions in every system (nothing is zeroed), as in the anchors' script.

Columns: train / decode medians in ms (GPU: CUDA events after warm-up, benchmarks/timing.py; CPU: wall
clock); "x ours" = anchor time / our time (> 1: ours is faster; decode is compared with ours.viterbi,
whose tensors are what "ours .decode" turns into lists);
Gcell/s = B*T*C^2 / train time; peak MiB = torch.cuda.max_memory_allocated during one train step, above
what was allocated before it (inputs, parameters, accumulated gradients); "beats all?" on our row: whether
our train (decode) time is below every available anchor's for that shape. The check lines compare our
NLL and Viterbi tags with pytorch-crf's, loaded with our parameters.

Reproduce:
    python benchmarks/crf.py                                 # GPU: the five anchor shapes, < 3 min on an H200
    python benchmarks/crf.py --ragged --json crf.json
    python benchmarks/crf.py --device cpu --shapes 4,32,8 8,64,32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

from semiring_ops.info import kernel_summary
from semiring_ops.structures import LinearChainCRF

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import graphed, peak_mib, release, time_or_failure

GPU_SHAPES = [(32, 128, 8), (32, 128, 32), (32, 128, 128), (32, 512, 32), (8, 128, 512)]
CPU_SHAPES = [(4, 32, 8), (8, 64, 32)]
ANCHORS = ("pytorch-crf", "torch-struct", "torch loop")
# timed repetitions (after timing.py's 3 warm-up runs): {system: (GPU, CPU)}; the slow anchors get few
REPS = {"ours": (50, 10), "pytorch-crf": (3, 3), "torch-struct": (10, 3), "torch loop": (5, 3)}


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        B, T, C = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be B,T,C (e.g. 32,128,8), got {text!r}") from None
    if min(B, T, C) < 1:
        raise argparse.ArgumentTypeError(f"B, T, C must be positive, got {text!r}")
    return B, T, C


# ---------------------------------------------------------------- systems: name -> (train step, decode) or None


def ours_fns(em, tags, mask, C, device):
    crf = LinearChainCRF(C, batch_first=True).to(device)

    def train():
        crf.nll(em, tags, mask).backward()

    def decode():
        with torch.no_grad():
            return crf.viterbi(em, mask)

    def decode_lists():
        with torch.no_grad():
            return crf.decode(em, mask)

    return crf, train, decode, decode_lists


def pytorch_crf_fns(em, tags, mask, C, device):
    from torchcrf import CRF

    crf = CRF(C, batch_first=True).to(device)

    def train():
        (-crf(em, tags, mask)).backward()

    def decode():
        with torch.no_grad():
            return crf.decode(em, mask)

    return crf, train, decode


def torch_struct_fns(em, lengths, C, device, ragged):
    import torch_struct

    warnings.filterwarnings("ignore", message=".*arg_constraints", category=UserWarning)
    trans = torch.randn(C, C, device=device, requires_grad=True)
    lens = lengths if ragged else None

    def dist():
        return torch_struct.LinearChainCRF(em[:, 1:, :, None] + trans, lengths=lens)

    def train():
        dist().partition.sum().backward()

    def decode():
        with torch.no_grad():
            return dist().argmax

    return train, decode


def torch_loop_fns(em, lengths, C, device, ragged):
    trans = torch.randn(C, C, device=device, requires_grad=True)
    T = em.shape[1]

    def train():
        alpha = em[:, 0]
        for t in range(1, T):
            nxt = torch.logsumexp(alpha[:, :, None] + trans, dim=1) + em[:, t]
            alpha = torch.where((t < lengths)[:, None], nxt, alpha) if ragged else nxt
        torch.logsumexp(alpha, dim=-1).sum().backward()

    return train


# ---------------------------------------------------------------- one shape


def run_shape(B: int, T: int, C: int, device: str, ragged: bool, gpu: bool) -> tuple[list[dict], str]:
    gen = torch.Generator().manual_seed(1000 * B + 10 * T + C)
    em = torch.randn(B, T, C, generator=gen).to(device).requires_grad_()
    tags = torch.randint(0, C, (B, T), generator=gen).to(device)
    if ragged:
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        lengths[0] = T
    else:
        lengths = torch.full((B,), T)
    lengths = lengths.to(device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    reps = {name: r[0] if gpu else r[1] for name, r in REPS.items()}
    cells = B * T * C * C

    def row(system, train=None, decode=None, peak=None):
        return {"B": B, "T": T, "C": C, "system": system, "train_ms": train, "decode_ms": decode, "peak_mib": peak}

    rows = []
    crf, train, decode, decode_lists = ours_fns(em, tags, mask, C, device)
    ours_train = time_or_failure(train, device, reps["ours"])
    rows.append(row("ours", ours_train, time_or_failure(decode, device, reps["ours"])))
    rows[-1]["peak_mib"] = peak_mib(train, device)
    rows.append(row("ours .decode", None, time_or_failure(decode_lists, device, reps["ours"])))
    if gpu:
        # without the validation's synchronisation (what the captures below leave out too)
        crf.validate = False
        rows.append(row("ours no-check", *(time_or_failure(fn, device, reps["ours"]) for fn in (train, decode))))
        crf.validate = True
        # torch.compile's own CUDA graphs (reduce-overhead): the one-line way to the manual capture below
        compiled = _compiled(crf, em, tags, mask)
        rows.append(row("ours compiled", *(time_or_failure(fn, device, reps["ours"]) for fn in compiled)))
        # the same train step and decode captured in CUDA graphs (no Python or launch overhead)
        rows.append(row("ours graphed", *(_time_graphed(fn, device, reps["ours"]) for fn in (train, decode))))

    check = ""
    try:
        ptc, ptc_train, ptc_decode = pytorch_crf_fns(em, tags, mask, C, device)
        rows.append(row("pytorch-crf", time_or_failure(ptc_train, device, reps["pytorch-crf"])))
        rows[-1]["decode_ms"] = time_or_failure(ptc_decode, device, reps["pytorch-crf"])
        rows[-1]["peak_mib"] = peak_mib(ptc_train, device)
        try:
            check = agreement(crf, ptc, em, tags, mask)
        except Exception as exc:  # a check that cannot run (e.g. OOM) must not stop the timings
            check = f"check failed: {type(exc).__name__}"
            release(device)
    except ImportError:
        rows.append(row("pytorch-crf", "unavailable", "unavailable"))
    try:
        ts_train, ts_decode = torch_struct_fns(em, lengths, C, device, ragged)
        rows.append(row("torch-struct", time_or_failure(ts_train, device, reps["torch-struct"])))
        rows[-1]["decode_ms"] = time_or_failure(ts_decode, device, reps["torch-struct"])
        rows[-1]["peak_mib"] = peak_mib(ts_train, device)
    except ImportError:
        rows.append(row("torch-struct", "unavailable", "unavailable"))
    loop_train = torch_loop_fns(em, lengths, C, device, ragged)
    rows.append(row("torch loop", time_or_failure(loop_train, device, reps["torch loop"])))
    rows[-1]["peak_mib"] = peak_mib(loop_train, device)

    ours_train, ours_decode = rows[0]["train_ms"], rows[0]["decode_ms"]
    for r in rows:
        r["train_x_ours"] = _ratio(r["train_ms"], ours_train)
        r["decode_x_ours"] = _ratio(r["decode_ms"], ours_decode) if r["system"] != "ours .decode" else None
        r["gcells_per_s"] = cells / (r["train_ms"] * 1e-3) / 1e9 if isinstance(r["train_ms"], float) else None
    rows[0]["beats_all_train"] = _beats(ours_train, [r["train_ms"] for r in rows if r["system"] in ANCHORS])
    rows[0]["beats_all_decode"] = _beats(ours_decode, [r["decode_ms"] for r in rows if r["system"] in ANCHORS])
    del em, tags, mask
    release(device)
    return rows, check


def _compiled(crf: LinearChainCRF, em, tags, mask) -> tuple[Callable[[], object], Callable[[], object]]:
    """(train, decode) with the CRF's calls under torch.compile(mode="reduce-overhead"); the first calls
    (inside time_or_failure's warm-up) compile and capture."""
    torch._dynamo.reset()
    loss_fn = torch.compile(lambda e: crf.nll(e, tags, mask), mode="reduce-overhead", fullgraph=True)
    viterbi = torch.compile(lambda e: crf.viterbi(e, mask), mode="reduce-overhead", fullgraph=True)

    def train():
        loss_fn(em).backward()

    def decode():
        with torch.no_grad():
            return viterbi(em)

    return train, decode


def _time_graphed(fn: Callable[[], object], device: str, reps: int) -> float | str:
    """time_or_failure of fn's CUDA-graph replay, or 'ERR ...' when capturing it fails."""
    try:
        replay = graphed(fn)
    except Exception as exc:
        release(device)
        return f"ERR capture {type(exc).__name__}: {str(exc)[:50]}"
    return time_or_failure(replay, device, reps)


def agreement(ours: LinearChainCRF, theirs, em, tags, mask) -> str:
    """Our NLL and Viterbi tags against pytorch-crf's with our parameters loaded into it."""
    theirs.load_state_dict(ours.state_dict())
    with torch.no_grad():
        a = ours.nll(em, tags, mask, reduction="none").double()
        b = (-theirs(em, tags, mask, reduction="none")).double()
        rel = ((a - b).abs() / b.abs().clamp_min(1e-6)).max().item()
        ours_tags = ours.decode(em, mask)
        their_tags = theirs.decode(em, mask)
    same = sum(x == y for x, y in zip(ours_tags, their_tags, strict=True)) / len(ours_tags)
    return f"NLL max rel. diff vs pytorch-crf {rel:.1e}; identical Viterbi paths {same:.0%}"


def _ratio(theirs, ours) -> float | None:
    return theirs / ours if isinstance(theirs, float) and isinstance(ours, float) else None


def _beats(ours, anchors: list) -> str:
    times = [t for t in anchors if isinstance(t, float)]
    if not isinstance(ours, float):
        return "n/a"
    if not times:
        return "no anchors"
    return "yes" if ours < min(times) else f"no ({min(times) / ours:.2f}x)"


# ---------------------------------------------------------------- table

HEADER = ("B,T,C", "system", "train ms", "decode ms", "train x", "decode x", "Gcell/s", "peak MiB", "beats all? t/d")
WIDTHS = (13, 13, 9, 10, 8, 9, 8, 9, 22)


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isfinite(value) and value != 0 and abs(value) < 10 ** -(digits - 1):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _line(cells) -> str:
    return " ".join(
        f"{c:<{w}s}" if i in (0, 1, 8) else f"{c:>{w}s}" for i, (c, w) in enumerate(zip(cells, WIDTHS, strict=True))
    )


def render(r: dict) -> str:
    beats = ""
    if r["system"] == "ours":
        beats = f"{r['beats_all_train']} / {r['beats_all_decode']}"
    ratio = (lambda x: f"{x:.2f}x" if x is not None else "-") if r["system"] != "ours" else (lambda x: "1")
    return _line(
        (
            f"{r['B']},{r['T']},{r['C']}",
            r["system"],
            _fmt(r["train_ms"]),
            _fmt(r["decode_ms"]),
            ratio(r["train_x_ours"]),
            ratio(r["decode_x_ours"]),
            _fmt(r["gcells_per_s"], 2),
            _fmt(r["peak_mib"], 1),
            beats,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=None,
        metavar="B,T,C",
        help=f"default on GPU: {' '.join(','.join(map(str, s)) for s in GPU_SHAPES)}; "
        f"on CPU: {' '.join(','.join(map(str, s)) for s in CPU_SHAPES)}",
    )
    parser.add_argument("--ragged", action="store_true", help="random lengths in 1..T instead of full masks")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is available")
    gpu = dev == "cuda"
    shapes = args.shapes or (GPU_SHAPES if gpu else CPU_SHAPES)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)

    where = torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {where} | torch {torch.__version__} | fp32 | {'ragged' if args.ragged else 'full'} masks")
    if not gpu and (load := os.getloadavg()[0]) > (os.cpu_count() or 1) - 0.5:
        print(
            f"WARNING: load average {load:.1f} on {os.cpu_count()} cores: other processes compete; times are inflated"
        )
    print("kernels:", kernel_summary())
    print("train x / decode x: anchor time / our time (> 1: ours faster); Gcell/s = B*T*C^2 / train time")
    print(_line(HEADER))
    print("-" * len(_line(HEADER)))
    all_rows, checks = [], []
    for B, T, C in shapes:
        rows, check = run_shape(B, T, C, dev, args.ragged, gpu)
        for r in rows:
            print(render(r), flush=True)
        all_rows += rows
        checks.append(f"  {B},{T},{C}: {check or 'pytorch-crf unavailable'}")
    print("checks:")
    print("\n".join(checks))
    if args.json:
        meta = {"device": where, "torch": torch.__version__, "ragged": args.ragged, "date": date.today().isoformat()}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": all_rows}, indent=1))
        print("wrote", args.json)


if __name__ == "__main__":
    main()
