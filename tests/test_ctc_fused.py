"""CTC's fused kernels (csrc/ctc_dp.h through ops/ctc_ops.py) against the CTC structure's PyTorch program and a
scalar transcription of the best-path rule: the loss and its occupancies, the best path and its ties, the label
posteriors and forced_align, on CPU and CUDA; odd sizes (one frame, empty targets, impossible items, repeated
labels), non-contiguous inputs, gradcheck / gradgradcheck, torch.compile."""

from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import DEVICES, assert_ctc_loss_matches
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops import ctc_loss, ctc_posteriors, forced_align
from semiring_ops.alignment.ctc import cuda_max_labels, fused_ok, reference_log_partition
from semiring_ops.ops import ctc_ops
from semiring_ops.structures.fused import generic_only


def _batch(seed: int, T: int, N: int, C: int, S: int, device: str = "cpu", dtype=torch.float64, ties: bool = False):
    """log_probs (T, N, C), targets (N, S) (labels past an item's length are never read; blank 0, few labels so
    that repeats occur), input_lengths, target_lengths."""
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: ties between moves everywhere
        lp = torch.randint(-3, 1, (T, N, C), generator=g).to(dtype)
    else:
        lp = torch.randn(T, N, C, generator=g, dtype=torch.float64).log_softmax(-1).to(dtype)
    targets = torch.randint(1, C, (N, S), generator=g)
    target_lengths = torch.randint(0, S + 1, (N,), generator=g)
    input_lengths = torch.randint(0, T + 1, (N,), generator=g)
    return lp.to(device), targets.to(device), input_lengths.to(device), target_lengths.to(device)


def _kernels_or_skip(device: str):
    if ctc_ops.ctc_kernels(torch.device(device)) is None:
        pytest.fail(f"no compiled ctc kernels for {device}")


@settings(max_examples=25)
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(0, 13),
    N=st.integers(1, 5),
    C=st.integers(2, 5),
    S=st.integers(0, 6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
@pytest.mark.parametrize("device", DEVICES)
def test_log_program_matches_the_structure(device, seed, T, N, C, S, dtype):
    _kernels_or_skip(device)
    lp, targets, il, tl = _batch(seed, T, N, C, S, device, dtype)
    total, occupancy = ctc_ops.ctc_occupancy(lp, targets, il, tl, 0)
    x = lp.double().requires_grad_()
    ref = reference_log_partition(x, targets, il, tl, 0, "log")
    (grad,) = torch.autograd.grad(ref, x, torch.isfinite(ref).double())
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    assert torch.equal(torch.isinf(total), torch.isinf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(total.double()[finite], ref.detach()[finite], rtol=tol, atol=tol)
    torch.testing.assert_close(occupancy.double(), grad, rtol=tol, atol=tol)
    forward_only = ctc_ops.ctc_log(lp, targets, il, tl, 0, False)
    assert torch.equal(forward_only[0], total) and forward_only[1].numel() == 0
    # the backward's collection: the occupancies times each item's weight, every entry written (the output
    # poisoned first: tests/conftest.py), NaN where a weight is not finite, as the product with a tensor of zeros
    weight = torch.randn(N, dtype=dtype, generator=torch.Generator().manual_seed(seed)).to(device)
    weight[0] = float("inf") if seed % 2 else weight[0]
    _, states = ctc_ops.ctc_log(lp, targets, il, tl, 0, True)
    scaled = ctc_ops.ctc_collect(lp, targets, il, tl, 0, total, states, weight)
    torch.testing.assert_close(scaled, occupancy * weight[None, :, None], rtol=tol, atol=tol, equal_nan=True)


def _best_path_scalar(lp: torch.Tensor, target: list[int], frames: int, blank: int) -> tuple[float, list[int]]:
    """The best path of one item by scalar loops, with forced_align's ties (a skip only when strictly better than
    both other moves, a step only when strictly better than staying, the final blank only when strictly better than
    the last label): (score, states of its frames)."""
    ext = [blank]
    for label in target:
        ext += [label, blank]
    K, neg = len(ext), float("-inf")
    alpha = [float(lp[0, ext[s]]) if s < 2 else neg for s in range(K)]
    moves = [[0] * K]
    for t in range(1, frames):
        row, back = [], []
        for s in range(K):
            x0, x1 = alpha[s], alpha[s - 1] if s >= 1 else neg
            x2 = alpha[s - 2] if s >= 3 and s % 2 == 1 and ext[s] != ext[s - 2] else neg
            if x2 > x1 and x2 > x0:
                best, move = x2, 2
            elif x1 > x0:
                best, move = x1, 1
            else:
                best, move = x0, 0
            row.append(best + float(lp[t, ext[s]]))
            back.append(move)
        alpha = row
        moves.append(back)
    s = K - 2 if K >= 2 and not alpha[K - 1] > alpha[K - 2] else K - 1
    score, states = alpha[s], []
    for t in range(frames - 1, -1, -1):
        states.append(s)
        s -= moves[t][s]
    return score, states[::-1]


@settings(max_examples=25)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 12), N=st.integers(1, 4), S=st.integers(0, 5), ties=st.booleans())
@pytest.mark.parametrize("device", DEVICES)
def test_best_path_and_its_ties(device, seed, T, N, S, ties):
    _kernels_or_skip(device)
    lp, targets, il, tl = _batch(seed, T, N, 4, S, device, ties=ties)
    score, states = ctc_ops.ctc_viterbi(lp, targets, il, tl, 0)
    from semiring_ops.structures.ctc import CTC

    structure = CTC(targets, tl, 0)
    ref_score, ref_states = structure.best_path(structure.emissions(lp.transpose(0, 1)), il.clamp(min=1))
    for n in range(N):
        L, target = int(il[n]), targets[n, : int(tl[n])].tolist()
        if L == 0:
            assert score[n] == (0.0 if not target else float("-inf")) and (states[n] == -1).all()
            continue
        best, path = _best_path_scalar(lp[:, n].cpu(), target, L, 0)
        assert float(score[n]) == pytest.approx(best) and float(ref_score[n]) == pytest.approx(best)
        if best == float("-inf"):
            assert (states[n] == -1).all() and (ref_states[n] == -1).all()
            continue
        assert states[n, :L].tolist() == path == ref_states[n, :L].tolist()
        assert (states[n, L:] == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_loss_and_gradients_fused_against_generic(device):
    _kernels_or_skip(device)
    lp, targets, il, tl = _batch(3, 40, 6, 5, 9, device, torch.float32)
    lp[:, 2] = lp[:, 2].flip(0)
    for semiring in ("log", "max"):
        for reduction in ("none", "mean", "sum"):
            x = lp.clone().requires_grad_()
            loss = ctc_loss(x, targets, il, tl, reduction=reduction, zero_infinity=True, semiring=semiring)
            (g,) = torch.autograd.grad(loss.sum(), x)
            with generic_only():
                y = lp.clone().requires_grad_()
                ref = ctc_loss(y, targets, il, tl, reduction=reduction, zero_infinity=True, semiring=semiring)
                (gr,) = torch.autograd.grad(ref.sum(), y)
            torch.testing.assert_close(loss, ref, rtol=2e-5, atol=2e-5)
            torch.testing.assert_close(g, gr, rtol=2e-5, atol=2e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("more_items_than_multiprocessors", [False, True])
def test_both_register_budgets_of_the_cuda_log_kernel(dtype, more_items_than_multiprocessors):
    """ctc_log_kernel is built for one block a multiprocessor (items <= multiprocessors) and for two (more items):
    each against the structure's program in float64 (loss and gradient) and torch's ctc_loss (loss: its gradient
    is taken as if through a log_softmax)."""
    _kernels_or_skip("cuda")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    N = 2 * sms + 3 if more_items_than_multiprocessors else min(sms, 7)
    lp, targets, il, tl = _batch(11, 23, N, 6, 7, "cuda", dtype)
    assert_ctc_loss_matches(lp, targets, il, tl, 1e-10 if dtype == torch.float64 else 2e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_long_targets(device):
    _kernels_or_skip(device)
    T, N, C, S = 70, 3, 40, 30
    g = torch.Generator().manual_seed(5)
    base = torch.randn(N, C, T, generator=g, dtype=torch.float64).log_softmax(1).to(device)
    lp = base.permute(2, 0, 1)  # (T, N, C), no unit stride on C
    targets = torch.randint(1, C, (N, S), generator=g).to(device)
    il, tl = torch.tensor([T, 65, 61], device=device), torch.tensor([S, 29, 1], device=device)
    total, occupancy = ctc_ops.ctc_occupancy(lp, targets, il, tl, 0)
    total_c, occupancy_c = ctc_ops.ctc_occupancy(lp.contiguous(), targets, il, tl, 0)
    assert torch.equal(total, total_c) and torch.equal(occupancy, occupancy_c)
    ref = reference_log_partition(lp, targets, il, tl, 0, "log")
    torch.testing.assert_close(total, ref, rtol=1e-10, atol=1e-10)
    # the posteriors of every frame sum to one within the item's frames
    sums = occupancy.sum(-1)
    frames = torch.arange(T, device=device)[:, None] < il[None]
    torch.testing.assert_close(sums[frames], torch.ones_like(sums[frames]))
    assert (sums[~frames] == 0).all()


def test_gradcheck_and_gradgradcheck():
    lp = _batch(11, 6, 3, 4, 3)[0]
    targets = torch.tensor([[1, 1, 0], [2, 3, 2], [3, 0, 0]])
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([2, 3, 1])
    x = lp.clone().requires_grad_()
    assert fused_ok(x, targets)

    def loss(v):
        return ctc_ops.ctc_log(v, targets, il, tl, 0, True)[0]

    assert torch.autograd.gradcheck(loss, (x,))
    assert torch.autograd.gradgradcheck(loss, (x,))


def test_posteriors_are_minus_the_loss_gradient_and_match_generic():
    lp, targets, il, tl = _batch(2, 25, 4, 6, 7)
    posteriors = ctc_posteriors(lp, targets, il, tl)
    x = lp.clone().requires_grad_()
    (g,) = torch.autograd.grad(ctc_loss(x, targets, il, tl, reduction="sum", zero_infinity=True), x)
    torch.testing.assert_close(posteriors, -g)
    with generic_only():
        torch.testing.assert_close(ctc_posteriors(lp, targets, il, tl), posteriors)
    one = ctc_posteriors(lp[:, 0], targets[0], il[0], tl[0])
    torch.testing.assert_close(one, posteriors[:, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_forced_align_batched_equals_one_by_one(device):
    lp, targets, _, _ = _batch(9, 30, 5, 6, 6, device, torch.float32, ties=True)
    lp = lp.transpose(0, 1)  # (N, T, C)
    il = torch.tensor([30, 22, 17, 30, 12], device=device)
    tl = torch.tensor([6, 4, 5, 0, 3], device=device)
    alignments, scores = forced_align(lp, targets, il, tl)
    assert alignments.dtype == targets.dtype and scores.dtype == lp.dtype
    with generic_only():
        ref_alignments, ref_scores = forced_align(lp, targets, il, tl)
    assert torch.equal(alignments, ref_alignments) and torch.equal(scores, ref_scores)
    for n in range(5):
        L, S = int(il[n]), int(tl[n])
        one, one_scores = forced_align(lp[n : n + 1, :L], targets[n : n + 1, :S].int())
        assert one.dtype == torch.int32
        assert torch.equal(one[0].long(), alignments[n, :L]) and torch.equal(one_scores[0], scores[n, :L])
        assert (alignments[n, L:] == 0).all() and (scores[n, L:] == 0).all()
        _, states = _best_path_scalar(lp[n].cpu(), targets[n, :S].tolist(), L, 0)
        ext = [0]
        for c in targets[n, :S].tolist():
            ext += [c, 0]
        assert alignments[n, :L].tolist() == [ext[s] for s in states]


def test_forced_align_16_bit_and_bad_input():
    lp = torch.randn(1, 9, 5).log_softmax(-1)
    targets = torch.tensor([[1, 3, 3]])
    a32, _ = forced_align(lp, targets)
    a16, s16 = forced_align(lp.half(), targets)
    assert s16.dtype == torch.float16 and torch.equal(a16, forced_align(lp.half().float(), targets)[0])
    assert a32.shape == (1, 9)
    with pytest.raises(ValueError, match="fewer frames"):
        forced_align(lp[:, :3], targets)
    with pytest.raises(ValueError, match="not the blank"):
        forced_align(lp, torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="int32 or int64"):
        forced_align(lp, targets.float())
    with pytest.raises(ValueError, match=r"\(N, T, C\)"):
        forced_align(lp[0], targets)


def test_kernel_entry_points_name_bad_arguments():
    module = ctc_ops.ctc_kernels(torch.device("cpu"))
    lp, targets, il, tl = _batch(1, 5, 2, 4, 3)
    with pytest.raises(ValueError, match="log_probs"):
        module.ctc_log(lp.int(), targets, il, tl, 0, False)
    with pytest.raises(ValueError, match="targets"):
        module.ctc_log(lp, targets.int(), il, tl, 0, False)
    with pytest.raises(ValueError, match="input_lengths"):
        module.ctc_viterbi(lp, targets, il[:1], tl, 0)
    with pytest.raises(ValueError, match="blank"):
        module.ctc_viterbi(lp, targets, il, tl, 9)
    # lengths and labels out of range: NaN, no stray access
    total, _ = module.ctc_log(lp, targets, il + 10, tl, 0, True)
    assert torch.isnan(total).all()
    total, _ = module.ctc_log(lp, targets + 10, il, tl.clamp(min=1), 0, True)
    assert torch.isnan(total).all()


def test_torch_compile_fullgraph():
    lp, targets, il, tl = _batch(4, 12, 3, 5, 4, dtype=torch.float32)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(x):
        return ctc_ops.ctc_log(x, targets, il, tl, 0, True)[0].sum()

    x = lp.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(x), x)
    y = lp.clone().requires_grad_()
    (gr,) = torch.autograd.grad(ctc_ops.ctc_log(y, targets, il, tl, 0, True)[0].sum(), y)
    torch.testing.assert_close(g, gr)


@pytest.mark.parametrize("device", DEVICES)
def test_targets_past_the_cuda_limit_run_the_structure(device):
    """Past 1,023 labels (float32) the CUDA kernels' rows leave shared memory: ctc_loss takes the structure's
    program there, with the same results as on the CPU kernels; the raw op refuses, naming the limit."""
    T, N, C, S = 1100, 1, 5, 1030
    lp, targets, _, _ = _batch(8, T, N, C, S, device, torch.float32)
    il, tl = torch.tensor([T], device=device), torch.tensor([S], device=device)
    assert fused_ok(lp, targets) == (device == "cpu")
    loss = ctc_loss(lp, targets, il, tl, reduction="none")
    want = ctc_loss(lp.cpu(), targets.cpu(), il.cpu(), tl.cpu(), reduction="none")
    torch.testing.assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-3)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="targets too long"):
            ctc_ops.ctc_kernels(lp.device).ctc_log(lp, targets, il, tl, 0, False)


def test_forced_align_top_k_against_every_alignment():
    """top_k's alignments are the k best of all (enumerated), best first, their per-frame scores summing to
    each one's score; slot 0 is forced_align's path (no ties on continuous inputs); missing slots are -inf."""
    from tests.structure_enumeration import ctc_alignments

    g = torch.Generator().manual_seed(3)
    N, T, C = 3, 6, 4
    lp = torch.randn(N, T, C, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.tensor([[1, 2], [3, 3], [2, 0]])
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([2, 2, 1])
    alignments, scores = forced_align(lp, targets, il, tl, top_k=40)
    best, _ = forced_align(lp, targets, il, tl)
    assert alignments.shape == (N, 40, T) and torch.equal(alignments[:, 0], best)
    for n in range(N):
        labels = targets[n, : int(tl[n])].tolist()
        ext = [0]
        for c in labels:
            ext += [c, 0]
        every = ctc_alignments(T, len(ext), int(il[n]), labels)
        want = sorted((float((lp[n].T[ext][:, :][parts.T.bool()]).sum()) for parts in every), reverse=True)
        got = scores[n].sum(-1)
        k = min(len(want), 40)
        torch.testing.assert_close(got[:k], torch.tensor(want[:k], dtype=torch.float64))
        assert torch.isinf(got[k:]).all() and (alignments[n, k:] == 0).all()
    with pytest.raises(ValueError, match="top_k"):
        forced_align(lp, targets, il, tl, top_k=0)


def test_the_shared_memory_bound_mirrors_the_kernels_scratch():
    """alignment/ctc.py's cuda_max_labels computes the CUDA kernels' scratch bytes (csrc/ctc_dp.h,
    ctc_scratch_bytes) on its own: the two agree at every K, and the bound on GPUs of 99 KiB a block (compute
    capability 8.6 / 8.9: the fused kernels' launch failed past ~630 labels there) and of the A100's / H100's."""
    from semiring_ops.lazy.host_compiler import compile_host_library, host_compiler_available

    if not host_compiler_available():
        pytest.skip("no C++ compiler")
    source = """#include "ctc_dp.h"
extern "C" long long ctc_bytes(long long K, int is_double) {
  return is_double ? semiring_ops::ctc_scratch_bytes<double>(K) : semiring_ops::ctc_scratch_bytes<float>(K);
}"""
    i64, i32 = ctypes.c_longlong, ctypes.c_int
    fn = compile_host_library(source, ["ctc_bytes"]).function("ctc_bytes", [i64, i32], i64)
    for dtype, is_double in ((torch.float32, 0), (torch.float64, 1)):
        for shared in (49152, 101376, 166912, 232448, *range(20000, 240000, 7919)):
            S = cuda_max_labels(shared, dtype)
            assert S == -1 or fn.call(2 * S + 1, is_double) <= shared
            bound = {torch.float32: 1023, torch.float64: 511}[dtype]
            assert bound == S or fn.call(2 * S + 3, is_double) > shared
    assert (cuda_max_labels(101376, torch.float32), cuda_max_labels(101376, torch.float64)) == (631, 340)
    assert (cuda_max_labels(166912, torch.float32), cuda_max_labels(166912, torch.float64)) == (1023, 511)
