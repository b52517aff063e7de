"""Every CUDA kernel family once, at small odd sizes, under compute-sanitizer's four tools.

    python benchmarks/sanitize.py                      # all tools x all families, logs under $OUT or /tmp
    python benchmarks/sanitize.py --tools racecheck --split --jobs 6   # one process per family, 6 at once
    python benchmarks/sanitize.py --workload chain     # one family's workload, no sanitizer (what each run runs)

Each tool is one compute-sanitizer process over `--workload` of every family (with --split one process per
family, --jobs of them at once), each with its own time limit (--limit, 180 s) and its log written even when
the limit kills it. Racecheck runs the workloads' light form (--light: it costs seconds per cluster launch of
the chain kernel; the form drops C = 512, whose kernel is C = 260's template with one more block per
cluster); initcheck runs them without k-best decoding (--no-topk: TOOL_WORKLOAD_FLAGS says why). The
workloads first run once without the sanitizer, which checks their answers against float64 references and
leaves the kernels built and the lazy formulas compiled, so the sanitized runs time kernels,
not compilers. PyTorch's caching allocator is off under the sanitizer (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so
initcheck sees every output as a fresh allocation: an output element a kernel forgets to write is a read of
uninitialised memory in the check that follows. A run is clean when the sanitizer's summary reports 0 errors
(racecheck: 0 hazards) and the workload exits 0; the kernels named in a report are printed under its row.
The table printed last is what docs/perf_notes.md quotes; benchmarks/gpu_run.sh runs it as its sanitize stage.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TOOL_FLAGS = {
    "memcheck": ["--leak-check", "no", "--check-device-heap", "yes"],
    "racecheck": ["--racecheck-report", "all"],
    # the chain kernel's mbarriers are PTX, which the tool's automatic count of barrier objects per block
    # misses: "Detected overflow of tracked cuda::barrier structures", then a launch failure the tool
    # caused (clean at C = 260 and 512 with a table of 65,536)
    "synccheck": ["--num-cuda-barriers", "65536"],
    "initcheck": [],
}
# PyTorch's kernels the tools cannot check here (a substring of the kernel's name; ours are never matched):
# synccheck: with that barrier table the tool failed to launch PyTorch's own elementwise kernels ("Internal
# Sanitizer Error ... div_floor_kernel_cuda"), and no PyTorch kernel holds our barriers.
TOOL_EXCLUDE = {"synccheck": "native"}
# the workloads' flags per tool. racecheck: the light form (above). initcheck: no k-best decoding. The CRF's
# top-k (structures/chain.py chain_topk) is PyTorch operations only, no kernel of ours, and torch.topk's
# multi-block radix select (at::native::mbtopk::computeBlockDigitCounts) reads scratch counters it has not
# written: 263,168 reports for eight torch.topk calls alone on inputs made on the host (H100, torch 2.11).
# Excluding that kernel instead hides its writes from the tool, which then reports their reader (PyTorch's
# bitonicSortKVInPlace: 24,476 reports).
TOOL_WORKLOAD_FLAGS = {"racecheck": ["--light"], "initcheck": ["--no-topk"]}
NO_TOPK = False  # set by --no-topk


def _exclude_flags(tool: str) -> list[str]:
    """compute-sanitizer's kernel filter for TOOL_EXCLUDE (named --kernel-name-exclude since 2022, before that
    --kernel-regex-exclude)."""
    if tool not in TOOL_EXCLUDE:
        return []
    help_text = subprocess.run(["compute-sanitizer", "--help"], capture_output=True, text=True).stdout
    option = "--kernel-name-exclude" if "--kernel-name-exclude" in help_text else "--kernel-regex-exclude"
    return [option, f"kns={TOOL_EXCLUDE[tool]}"]


def _close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-4) -> None:
    got, want = got.double().cpu(), want.double().cpu()
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), finite) or not torch.allclose(
        got[finite], want[finite], rtol=tol, atol=tol
    ):
        raise AssertionError(f"{what}: max |difference| {(got[finite] - want[finite]).abs().max().item():.3g}")


# ------------------------------------------------------------------ the workloads, one per kernel family


def bmm(light: bool) -> None:
    """The tiled engine: log / max / min forward in every dtype, with argmax, the log backward (fused in float32,
    log_contract in float64) and double backward (log_contract), max / min backward; odd sizes straddling the
    tiles, a broadcast batch, strides."""
    import semiring_ops as so

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        a = torch.randn(3, 37, 45, generator=g).to("cuda", dtype)
        b = torch.randn(1, 29, 45, generator=g).to("cuda", dtype).transpose(1, 2)  # broadcast batch, strided
        a.requires_grad_()
        b.requires_grad_()
        terms = a.double()[..., :, :, None] + b.double()[..., None, :, :]
        for name, ref in (("log", terms.logsumexp(-2)), ("max", terms.amax(-2)), ("min", terms.amin(-2))):
            out = so.semiring_matmul(a, b, name)
            _close(out, ref, f"bmm {name} {dtype}", tol=2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4)
            out.float().sum().backward()
            if name != "log":
                so.semiring_matmul(a.detach(), b.detach(), name, return_argmax=True)
    # the fused float32 log gradient (log_grads_kernels.cu; forced: this size takes the contractions unasked) past
    # its 64-row and 128-column tiles and a partial chunk
    a = torch.randn(2, 70, 130, generator=g).cuda().requires_grad_()
    b = torch.randn(2, 130, 11, generator=g).cuda().requires_grad_()
    grad = torch.randn(2, 70, 11, generator=g).cuda()
    os.environ["SEMIRING_OPS_LOG_GRADS"] = "fused"
    try:
        got = torch.autograd.grad(so.logbmm(a, b), (a, b), grad)
    finally:
        del os.environ["SEMIRING_OPS_LOG_GRADS"]
    want = torch.autograd.grad(so.logbmm(a.double(), b.double()), (a, b), grad.double())
    for x, y, what in zip(got, want, ("grad_a", "grad_b"), strict=True):
        _close(x, y, f"fused log {what}")
    a = torch.randn(2, 19, 23, generator=g, dtype=torch.float64).cuda().requires_grad_()
    b = torch.randn(2, 23, 17, generator=g, dtype=torch.float64).cuda().requires_grad_()
    (ga,) = torch.autograd.grad(so.logbmm(a, b).pow(2).sum(), a, create_graph=True)
    ga.sum().backward()  # double backward: four more contractions


def packed(light: bool) -> None:
    """The packed family's select kernel (max / min without an index: FADD + FMNMX, HADD2 + HMNMX2), called directly:
    odd sizes (scalar reads), then aligned row-major and transposed operands (vector reads, both staging layouts;
    a partial last k-tile and a column tile past the edge take the scalar reads)."""
    from semiring_ops.build.backends import backend_for

    module = backend_for(torch.device("cuda")).family("packed")
    g = torch.Generator().manual_seed(1)
    cases = [((131, 67, 129), False), ((132, 68, 132), False), ((132, 68, 132), True)]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for (n, k, m), transposed in cases[1:] if light else cases:
            a = torch.randn(2, n, k, generator=g).to("cuda", dtype)
            b = torch.randn(2, k, m, generator=g).to("cuda", dtype)
            if transposed:
                a, b = a.mT.contiguous().mT, b.mT.contiguous().mT
            terms = a.double()[..., :, :, None] + b.double()[..., None, :, :]
            for is_max, ref in ((True, terms.amax(-2)), (False, terms.amin(-2))):
                what = f"packed {dtype} {n}x{k}x{m} transposed={transposed} max={is_max}"
                _close(module.bmm_packed_select(a, b, is_max), ref.to(dtype), what, tol=1e-2)


def fast(light: bool) -> None:
    """The log semiring's fast mode (TF32 mma.sync), 1 and 3 passes, called directly below its size threshold."""
    from semiring_ops.ops import fast_log

    g = torch.Generator().manual_seed(2)
    a = torch.randn(2, 67, 75, generator=g, device="cpu").cuda().requires_grad_()
    b = torch.randn(2, 75, 41, generator=g, device="cpu").cuda().requires_grad_()
    ref = (a.double()[..., :, :, None] + b.double()[..., None, :, :]).logsumexp(-2)
    for passes in (1, 3):
        out = fast_log.log_bmm_fast(a, b, passes=passes)
        _close(out, ref, f"fast log, {passes} passes", tol=5e-3)
        out.sum().backward()
    # the scaled tier's fused passes with k across two row blocks and several column parts, and 4-wide output rows
    a = torch.randn(1, 33, 600, generator=g, device="cpu").cuda()
    b = torch.randn(1, 600, 64, generator=g, device="cpu").cuda()
    ref = (a.double()[..., :, :, None] + b.double()[..., None, :, :]).logsumexp(-2)
    fast_log.reset_stats()
    _close(fast_log.log_bmm_fast(a, b), ref, "fast log, scaled tier, m = 64", tol=5e-3)
    assert fast_log.stats["scaled"] == 1, fast_log.stats


def chain(light: bool) -> None:
    """The fused chain kernels through the CRF: the loss (forward scan with gold paths) and its gradient (reverse
    scan, marginals, pair marginals), log Z, marginals, Viterbi, top-k, a mask with bad-free odd lengths; at
    C = 5 and 33 (one block per chain) and 260 and 512 (a cluster of blocks per chain on sm_90). The loss and
    its gradient run twice, so a block meets shared memory that an earlier launch's block used (racecheck
    reported a never-invalidated mbarrier that way); T = 7 wraps the cluster's 3-buffer mbarrier ring, so
    both parities of its phases are waited on. C = 512 is short (T = 3). ``light`` (racecheck, which costs
    seconds per cluster launch): C = 260 only for the cluster kernels (the same template as 512; one more
    block per cluster there) and no decode / log-partition repeats."""
    from semiring_ops.structures import LinearChainCRF

    g = torch.Generator().manual_seed(3)
    sizes = ((3, 7, 5), (2, 9, 33), (2, 7, 260)) + (() if light else ((2, 3, 512),))
    for B, T, C in sizes:
        crf = LinearChainCRF(C, batch_first=True).cuda()
        with torch.no_grad():
            for p in crf.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        em = torch.randn(B, T, C, generator=g).cuda().requires_grad_()
        tags = torch.randint(0, C, (B, T), generator=g).cuda()
        lengths = torch.tensor([T] + [max(1, T - 2 - i) for i in range(B - 1)])
        mask = (torch.arange(T)[None, :] < lengths[:, None]).cuda()
        for _ in range(2):
            loss = crf.nll(em, tags, mask)
            loss.backward()
        ref = LinearChainCRF(C, batch_first=True).double()
        ref.load_state_dict(crf.state_dict())
        _close(loss, ref.to("cpu").nll(em.detach().double().cpu(), tags.cpu(), mask.cpu()), f"CRF loss C={C}", 1e-3)
        crf.marginals(em.detach(), mask)
        crf.viterbi(em.detach(), mask)
        if not NO_TOPK:
            crf.viterbi(em.detach(), mask, top_k=3)
        if not light:
            crf.log_partition(em.detach(), mask)
            crf.decode(em.detach(), mask)


def _block_mask(rows_i: torch.Tensor, rows_j: torch.Tensor, keep: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The float64 (M, N) mask of a block-sparse pattern: 1 on the kept (row block, column block) pairs."""
    mask = torch.zeros(shape, dtype=torch.float64)
    for k, (a, b) in enumerate(rows_i.tolist()):
        for m, (c, d) in enumerate(rows_j.tolist()):
            mask[a:b, c:d] = float(keep[k, m])
    return mask


def lazy(light: bool) -> None:
    """Generated lazy reductions (NVRTC): Gaussian kernel sum and its gradient, logsumexp, argmin, k-best, and a
    block-sparse (ranges=) sum with its gradient and argmin."""
    from semiring_ops.lazy import LazyTensor, Vi, Vj
    from semiring_ops.lazy.cluster import from_matrix

    g = torch.Generator().manual_seed(4)
    x = torch.randn(301, 3, generator=g).cuda().requires_grad_()
    y = torch.randn(157, 3, generator=g).cuda()
    v = torch.randn(157, 2, generator=g).cuda()
    D = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    dense = ((x.double()[:, None] - y.double()[None]) ** 2).sum(-1)
    out = (-D).exp() @ v
    _close(out, (-dense).exp() @ v.double(), "lazy K @ v")
    out.sum().backward()
    _close((-D).logsumexp(dim=1), (-dense).logsumexp(1, keepdim=True), "lazy logsumexp")
    D.argmin(dim=1)
    D.argKmin(5, dim=0)
    # block-sparse: 301 rows in blocks of 100 (the last 1 row in none), 157 columns in 3; a checkerboard kept
    rows_i = torch.tensor([[0, 100], [100, 200], [200, 300]])
    rows_j = torch.tensor([[0, 60], [60, 120], [120, 157]])
    keep = (torch.arange(3)[:, None] + torch.arange(3)[None, :]) % 2 == 0
    ranges = from_matrix(rows_i, rows_j, keep)
    mask = _block_mask(rows_i, rows_j, keep, (301, 157))
    sparse = ((-D).exp() * Vj(v)).sum(1, ranges=ranges)
    _close(sparse, ((-dense).exp() * mask.cuda()) @ v.double(), "lazy block-sparse K @ v")
    sparse.sum().backward()
    D.argmin(dim=0, ranges=ranges)
    # short segments (15 blocks of 20 rows): one live warp per block, small staging tiles cut into many j ranges
    # (cuda_kernels.ranged_tile)
    short_i = torch.stack([torch.arange(0, 300, 20), torch.arange(20, 301, 20)], 1)
    short_keep = torch.rand(15, 3, generator=g) < 0.5
    short_keep[:, 0] = True
    short = from_matrix(short_i, rows_j, short_keep)
    short_mask = _block_mask(short_i, rows_j, short_keep, (301, 157))
    _close(((-D).exp() * Vj(v)).sum(1, ranges=short), ((-dense).exp() * short_mask.cuda()) @ v.double(), "lazy short")
    # long rows: 1,500 terms a row, cut over several blocks on the GPU and merged (the 2-D scheme)
    y2 = torch.randn(1500, 3, generator=g).cuda()
    wide = from_matrix(torch.tensor([[0, 300]]), torch.tensor([[0, 700], [700, 1500]]), torch.tensor([[True, True]]))
    D2 = ((Vi(x) - Vj(y2)) ** 2).sum(-1)
    dense2 = ((x.double()[:, None] - y2.double()[None]) ** 2).sum(-1)[:300]
    _close((-D2).logsumexp(dim=1, ranges=wide)[:300], (-dense2).logsumexp(1, keepdim=True), "lazy block-sparse lse")
    # a wide formula: its 80-component sum is a loop over the components (lazy/wide.py), the route off
    os.environ["SEMIRING_OPS_LAZY_GEMM"] = "off"
    x80, y80 = torch.randn(301, 80, generator=g).cuda(), torch.randn(157, 80, generator=g).cuda()
    D80 = ((Vi(x80) - Vj(y80)) ** 2).sum(-1)
    dense80 = ((x80.double()[:, None] - y80.double()[None]) ** 2).sum(-1)
    _close(D80.min(dim=1), dense80.amin(1, keepdim=True), "lazy wide min")
    D80.argKmin(4, dim=1)
    # sums that no GEMM computes, in chunks of components (lazy/wide_chunks.py): an L1 distance at D = 97 (a
    # tail chunk; rows not 16-byte aligned: the scalar loads) and 784 (16-byte loads), a gradient (y read in
    # and out of the sum: staged whole), block-sparse k-best
    for d, offset in ((97, 1), (784, 0)):
        xl = torch.randn(301 * d + 1, generator=g).cuda()[offset:][: 301 * d].view(301, d).requires_grad_()
        yl = torch.randn(157, d, generator=g).cuda()
        L1 = (Vi(xl) - Vj(yl)).abs().sum(-1)
        dense_l1 = (xl.detach().double()[:, None] - yl.double()[None]).abs().sum(-1)
        _close(L1.min(dim=1), dense_l1.amin(1, keepdim=True), f"lazy chunked min D={d}")
        laplace = (-L1 / d).exp() @ v
        _close(laplace, (-dense_l1 / d).exp() @ v.double(), f"lazy chunked K @ v D={d}")
        laplace.sum().backward()
        L1.min_argmin(dim=1, ranges=ranges)
    # the matrix-unit route (lazy/gemm_route.py) at D = 128, 784, 2048: GEMMs in blocks of 256 rows (the last
    # short), the kernels reading their matrix; near-duplicate rows take the exact re-summation; on Hopper the sums
    # past D = 128 take hopper_gemm's promoted GEMM, and the fused k-best runs at every D (tf32x3_*.cuh)
    os.environ["SEMIRING_OPS_LAZY_GEMM"] = "on"
    for d in (128, 784, 2048):
        yd = torch.randn(157, d, generator=g).cuda()
        xd = torch.cat(
            [yd[:40] + 1e-3 * torch.randn(40, d, generator=g).cuda(), torch.randn(261, d, generator=g).cuda()]
        )
        xd.requires_grad_()
        Dd = ((Vi(xd) - Vj(yd)) ** 2).sum(-1)
        dense_d = ((xd.detach().double()[:, None] - yd.double()[None]) ** 2).sum(-1)
        _close(Dd.min(dim=1), dense_d.amin(1, keepdim=True), f"lazy route min D={d}")
        gauss = (-Dd / d).exp() @ v
        _close(gauss, (-dense_d / d).exp() @ v.double(), f"lazy route K @ v D={d}")
        gauss.sum().backward()
        Dd.argKmin(5, dim=1)
        (Vi(xd) | Vj(yd)).max(dim=0)
        # (Hopper) the sums above ran on hopper_gemm's promoted GEMM; the fused k-best (by default up to D = 256) here
        os.environ["SEMIRING_OPS_LAZY_FUSED_KBEST"] = "1"
        Dd.argKmin(5, dim=1)
        (Vi(xd) | Vj(yd)).argKmax(3, dim=1)
        del os.environ["SEMIRING_OPS_LAZY_FUSED_KBEST"]
        wd = torch.rand(d, generator=g).cuda() + 0.5
        weighted = ((xd.detach().double()[:, None] - yd.double()[None]) ** 2 * wd.double()).sum(-1)
        _close(Vi(xd).weightedsqdist(Vj(yd), LazyTensor(wd)).min(dim=1), weighted.amin(1, keepdim=True), "lazy wsq")
    # (Hopper) the fused k-best's later tiles, filtered in registers and merged from their masks, with near duplicates
    # summed again there: 32 row tiles on 9 parts of 4 column tiles each
    yk = torch.randn(4608, 128, generator=g).cuda()
    xk = torch.randn(4000, 128, generator=g).cuda()
    xk[:100] = yk[3000:3100] + 1e-3 * torch.randn(100, 128, generator=g).cuda()
    nearest = ((Vi(xk) - Vj(yk)) ** 2).sum(-1).argKmin(5, dim=1)
    if not (nearest[:100, 0] == torch.arange(3000, 3100, device="cuda")).all():
        raise AssertionError("lazy fused k-best: a near duplicate missed")
    (Vi(xk) | Vj(yk)).argKmax(3, dim=1)
    del os.environ["SEMIRING_OPS_LAZY_GEMM"]


def sequence(light: bool) -> None:
    """sequence_lengths: masks (with a hole, marked rather than raised), lengths, tags."""
    from semiring_ops.ops.chain_ops import sequence_lengths

    B, T, C = 5, 11, 4
    lengths = torch.tensor([11, 0, 3, 7, 1], device="cuda")
    mask = torch.arange(T, device="cuda")[None, :] < lengths[:, None]
    tags = torch.randint(0, C, (B, T), device="cuda")
    assert torch.equal(sequence_lengths(mask, None, tags, B, T, C, True), lengths)
    sequence_lengths(None, lengths, tags, B, T, C, True)
    mask[2, 5] = True  # a hole
    got = sequence_lengths(mask, None, tags, B, T, C, False)
    assert got[2].item() == -1, "a mask with a hole is marked"


def span(light: bool) -> None:
    """The span kernels (Eisner's, CKY's and the semi-Markov inside and adjoint; the linear chain's passes with
    staged tiles at 5 and 33 labels (8 lanes a label), 100 (a warp a label) and tiles read in place at 150;
    the alignment's, global and local, with a second sequence longer and shorter than the first: 64 and 32
    threads) under log, max and min, float32 and float64, mixed lengths straddling the warp width, one-root and
    multi-root, against the PyTorch programs."""
    from semiring_ops.semirings import LogSemiring, MaxSemiring, MinSemiring
    from semiring_ops.structures import Alignment, CKYTree, DependencyTree, LinearChain, SemiMarkov
    from semiring_ops.structures.fused import generic_only

    B, N = (3, 37) if light else (4, 45)
    lengths = torch.tensor([N, 1, 33, 17][:B], device="cuda")
    for dtype in (torch.float32, torch.float64):
        arc = torch.randn(B, N, N, device="cuda", dtype=dtype)
        span_scores = torch.randn(B, N, N, 3, device="cuda", dtype=dtype)
        edge = torch.randn(B, N - 1, 5, 9, 9, device="cuda", dtype=dtype)
        chains = [torch.randn(B, N - 1, C, C, device="cuda", dtype=dtype) for C in (5, 33, 100, 150)]
        matches = [torch.randn(B, N, M, 3, device="cuda", dtype=dtype) for M in (N + 20, 7)]
        for structure, pot in (
            (DependencyTree(True), arc),
            (DependencyTree(False), arc),
            (CKYTree(), span_scores),
            (SemiMarkov(), edge),
            *((LinearChain(), chain) for chain in chains),
            *((Alignment(local), match) for match in matches for local in (False, True)),
        ):
            for semiring in (LogSemiring, MaxSemiring, MinSemiring):
                p = pot.clone().requires_grad_()
                total = structure.logpartition(p, lengths, semiring)
                (grad,) = torch.autograd.grad(total.sum(), p)
                if dtype == torch.float64 and not light:  # the reference on the CPU: only the span kernels
                    with generic_only():  # run on the GPU (the semi-Markov program's semiring products there
                        q = pot.cpu().requires_grad_()  # are the bmm family's, and synccheck's barrier table
                        want = structure.logpartition(q, lengths.cpu(), semiring)  # failed to launch them)
                        (want_grad,) = torch.autograd.grad(want.sum(), q)
                    _close(total.cpu(), want, f"span {structure.name} {semiring.name}", 1e-8)
                    _close(grad.cpu(), want_grad, f"span {structure.name} {semiring.name} grad", 1e-8)


def ctc(light: bool) -> None:
    """CTC's kernels: the log program with and without occupancies, their collection (weighted), and the best path,
    float32 and float64, targets of 0 to 600 labels (repeats included: chains of a label's states), items of 0, 1,
    odd and full frame counts, an impossible one, 97 states (four warps), 1,201 in float32 and 1,001 in float64
    (past a block's threads: strided), against the CPU kernels; on sm_90+ the log program over clusters of 2 and 8
    blocks an item too."""
    from semiring_ops.ops import ctc_ops

    cases = [(23, 5, 6, 7, dtype) for dtype in (torch.float32, torch.float64)]
    cases += [(9, 3, 30, 48, torch.float32)] if light else [(41, 4, 30, 48, torch.float64)]
    cases += [] if light else [(700, 2, 9, 600, torch.float32)]
    cases += [] if light else [(300, 2, 9, 500, torch.float64)]  # (past 512 states: the float64 blocks' width)
    for T, N, C, S, dtype in cases:
        g = torch.Generator().manual_seed(T)
        lp = torch.randn(T, N, C, generator=g, dtype=dtype).log_softmax(-1)
        targets = torch.randint(1, min(C, 4), (N, S), generator=g)
        il = torch.tensor([T, 0, 1, T - 2, T // 2][:N])
        tl = torch.tensor([S, 0, 0, S - 1, S // 2][:N])
        args = [x.cuda() for x in (lp, targets, il, tl)]
        total = ctc_ops.ctc_log(*args, 0, False)[0]
        want, want_occupancy = ctc_ops.ctc_occupancy(lp, targets, il, tl, 0)
        _close(total, want, f"ctc log {T}", 1e-5)
        total, occupancy = ctc_ops.ctc_occupancy(*args, 0)
        _close(total, want, f"ctc log {T}", 1e-5)
        _close(occupancy.cpu(), want_occupancy, f"ctc occupancy {T}", 1e-4)
        _, states = ctc_ops.ctc_log(*args, 0, True)
        weight = torch.linspace(-2, 2, N, dtype=dtype).cuda()
        scaled = ctc_ops.ctc_collect(*args, 0, total, states, weight)
        _close(scaled.cpu(), want_occupancy * weight.cpu()[None, :, None], f"ctc collection {T}", 1e-4)
        for blocks in ("2", "8") if torch.cuda.get_device_capability()[0] >= 9 else ():
            os.environ["SEMIRING_OPS_CTC_CLUSTER"] = blocks  # the log program over a cluster's blocks
            try:
                total, occupancy = ctc_ops.ctc_occupancy(*args, 0)
            finally:
                del os.environ["SEMIRING_OPS_CTC_CLUSTER"]
            _close(total, want, f"ctc log {T}, {blocks} blocks", 1e-5)
            _close(occupancy.cpu(), want_occupancy, f"ctc occupancy {T}, {blocks} blocks", 1e-4)
        score, states = ctc_ops.ctc_viterbi(*args, 0)
        want_score, want_states = ctc_ops.ctc_viterbi(lp, targets, il, tl, 0)
        _close(score, want_score, f"ctc max {T}", 1e-5)
        assert torch.equal(states.cpu(), want_states), f"ctc best path {T}"
    ctc_bad_input()
    rnnt(light)


def ctc_bad_input() -> None:
    """ctc_loss on the GPU runs its kernels before the host has checked the values (alignment/ctc.py,
    checked_inputs' defer): lengths past the shapes and labels out of range, made safe on the device, then refused."""
    import semiring_ops

    lp = torch.randn(12, 3, 5, device="cuda").log_softmax(-1)
    targets = torch.tensor([[1, 2, 3], [4, 4, 1], [2, 3, 4]], device="cuda")
    il, tl = torch.tensor([12, 12, 12], device="cuda"), torch.tensor([3, 3, 3], device="cuda")
    bad = [
        (targets, il + 30, tl),  # frames past T
        (targets, il, tl + 40),  # labels past the columns
        (targets - 9, il, tl),  # labels below 0
        (targets + 90, il, tl),  # labels past C
        (targets, il - 99, tl - 99),  # negative lengths
    ]
    for tg, input_lengths, target_lengths in bad:
        try:
            semiring_ops.ctc_loss(lp.requires_grad_(), tg, input_lengths, target_lengths)
        except ValueError:
            continue
        raise AssertionError("ctc_loss took bad input")
    torch.cuda.synchronize()


def rnnt(light: bool) -> None:
    """RNN-T's lattice kernel (the ctc family's): log and max, with and without posteriors, float32 and float64,
    items of one frame, of no label, an impossible one, and 700 labels (past a block's 512 threads: strided),
    against the CPU kernel."""
    from semiring_ops.ops.rnnt_ops import rnnt_lattice

    cases = [(9, 6, 5, torch.float32), (9, 6, 5, torch.float64)] + ([] if light else [(40, 3, 700, torch.float32)])
    for T, B, U, dtype in cases:
        g = torch.Generator().manual_seed(T + U)
        pot = torch.randn(B, T, U + 1, 2, generator=g, dtype=dtype).log_softmax(-1)
        pot[1] = -torch.inf
        frames = torch.tensor([T, T, 1, T - 2, T // 2, 3][:B])
        labels = torch.tensor([U, U, 0, U - 1, U // 2, 0][:B])
        for semiring_max in (False, True):
            for need in (True, False):
                total, post = rnnt_lattice(pot.cuda(), frames.cuda(), labels.cuda(), semiring_max, need)
                want, want_post = rnnt_lattice(pot, frames, labels, semiring_max, need)
                _close(total, want, f"rnnt {T} {U} max={semiring_max}", 1e-5)
                _close(post.cpu(), want_post, f"rnnt {T} {U} posteriors max={semiring_max}", 1e-5)


FAMILIES: dict[str, Callable[[bool], None]] = {
    "bmm": bmm,
    "packed": packed,
    "fast": fast,
    "chain": chain,
    "lazy": lazy,
    "sequence": sequence,
    "span": span,
    "ctc": ctc,
}


# ------------------------------------------------------------------ the driver


def _summary(tool: str, log: str) -> int | None:
    """Errors (hazards for racecheck) in a sanitizer log, None when it has no summary line."""
    pattern = r"RACECHECK SUMMARY: (\d+) hazard" if tool == "racecheck" else r"ERROR SUMMARY: (\d+) error"
    found = re.findall(pattern, log)
    return sum(int(n) for n in found) if found else None


def _kernels(log: str) -> str:
    """The kernels the reports name, most reported first (what to look at when a run is not clean)."""
    names = Counter(m.group(1)[:90] for m in re.finditer(r" at (?:void )?([^\s(]+)[^\n]*\+0x[0-9a-f]+", log))
    return ", ".join(f"{name} x{n}" for name, n in names.most_common(4))


def run_one(tool: str, families: list[str], out: Path, limit: float) -> tuple[str, float, str, str]:
    """One compute-sanitizer process over the families' workloads; its log is written whatever happens."""
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1"}
    label = "all" if families == list(FAMILIES) else "+".join(families)
    log_path = out / f"sanitize_{tool}_{label}.log"
    cmd = ["compute-sanitizer", "--tool", tool, *TOOL_FLAGS[tool], *_exclude_flags(tool), "--print-limit", "100"]
    cmd += [sys.executable, __file__, "--workload", *families, *TOOL_WORKLOAD_FLAGS.get(tool, [])]
    start = time.perf_counter()
    # its own process group: on the time limit the tool and the workload under it are killed together
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=limit)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, code = proc.communicate()[0], None
    seconds = time.perf_counter() - start
    log_path.write_text(f"$ {' '.join(cmd)}\n{text}")
    errors = _summary(tool, text)
    if code is None:
        verdict = f"TIMEOUT ({limit:.0f} s)"
    elif errors is None:
        verdict = f"no summary (exit {code})"
    elif errors or code:
        verdict = f"{errors} {'hazards' if tool == 'racecheck' else 'errors'} (exit {code})"
    else:
        verdict = "clean"
    return verdict, seconds, log_path.name, _kernels(text) if verdict != "clean" else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", nargs="+", choices=FAMILIES, help="run these families' workloads (no sanitizer)")
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--light", action="store_true", help="the workloads' lighter form (racecheck's)")
    parser.add_argument("--no-topk", action="store_true", help="no k-best decoding (initcheck's: PyTorch ops only)")
    parser.add_argument("--split", action="store_true", help="one sanitizer process per family (default: one per tool)")
    parser.add_argument("--jobs", type=int, default=1, help="sanitizer processes at once (with --split)")
    parser.add_argument("--limit", type=float, default=180.0, help="seconds per sanitizer process (default 180)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="folder for the logs")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sanitize.py: no CUDA GPU", file=sys.stderr)
        return 2
    global NO_TOPK
    NO_TOPK = args.no_topk
    if args.workload:
        for family in args.workload:
            start = time.perf_counter()
            FAMILIES[family](args.light)
            torch.cuda.synchronize()
            print(f"workload {family}: ok ({time.perf_counter() - start:.1f} s)", flush=True)
        print(f"workloads {' '.join(args.workload)}: ok")
        return 0
    for family in args.families:  # answers checked, kernels built and formulas compiled, unsanitized
        FAMILIES[family](False)  # (the light form is a subset)
    torch.cuda.synchronize()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups = [[f] for f in args.families] if args.split else [list(args.families)]
    print(f"compute-sanitizer on {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    print(f"{'tool':<10} {'families':<32} {'result':<24} {'seconds':>8}  log", flush=True)
    clean = True
    for tool in args.tools:
        start = time.perf_counter()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each thread waits on its own sanitizer process
            results = list(pool.map(lambda group, tool=tool: run_one(tool, group, out, args.limit), groups))
        for group, (verdict, seconds, log, kernels) in zip(groups, results, strict=True):
            clean &= verdict == "clean"
            print(f"{tool:<10} {' '.join(group):<32} {verdict:<24} {seconds:8.1f}  {log}", flush=True)
            if kernels:
                print(f"{'':<10} reported in: {kernels}", flush=True)
        if len(groups) > 1:
            print(f"{tool:<10} {'(wall clock, all families)':<32} {'':<24} {time.perf_counter() - start:8.1f}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
