"""CTC (semiring_ops.ctc_loss, structures.CTC): torch.nn.functional.ctc_loss's results on random inputs of every
format (padded and concatenated targets, unbatched, every reduction, zero_infinity, any blank, impossible
alignments), its gradients through log_softmax, a brute-force enumeration of the alignments under the log and max
semirings, gradcheck / gradgradcheck, the occupancies, 16-bit inputs and bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops import CTCLoss, ctc_loss
from semiring_ops.semirings import LogSemiring
from semiring_ops.structures import CTC
from tests.structure_enumeration import assert_derived, ctc_alignments, expectations

F64 = torch.float64


def _case(seed: int, T: int, N: int, C: int, S: int, blank: int, device="cpu"):
    """log_probs (T, N, C) float64, padded targets (N, S) avoiding the blank, input and target lengths."""
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(T, N, C, generator=g, dtype=F64).log_softmax(-1)
    labels = torch.tensor([c for c in range(C) if c != blank])
    targets = labels[torch.randint(0, len(labels), (N, S), generator=g)]
    input_lengths = torch.randint(1, T + 1, (N,), generator=g)
    target_lengths = torch.randint(0, S + 1, (N,), generator=g)
    return log_probs.to(device), targets.to(device), input_lengths, target_lengths


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**16),
    T=st.integers(1, 10),
    N=st.integers(1, 4),
    C=st.integers(2, 6),
    S=st.integers(0, 5),
    blank_at=st.floats(0, 0.999),
    reduction=st.sampled_from(["none", "sum", "mean"]),
    zero_infinity=st.booleans(),
    concatenated=st.booleans(),
)
def test_matches_torch(seed, T, N, C, S, blank_at, reduction, zero_infinity, concatenated):
    blank = int(blank_at * C)
    log_probs, targets, il, tl = _case(seed, T, N, C, S, blank)
    want = F.ctc_loss(log_probs, targets, il, tl, blank, reduction, zero_infinity)
    if concatenated:
        targets = torch.cat([targets[n, : tl[n]] for n in range(N)])
    got = ctc_loss(log_probs, targets, il.tolist(), tuple(tl.tolist()), blank, reduction, zero_infinity)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_through_log_softmax_match_torch(device):
    """The gradient with respect to the logits (the loss used after log_softmax), impossible items zeroed."""
    g = torch.Generator().manual_seed(1)
    T, N, C, S = 30, 5, 7, 8
    logits = torch.randn(T, N, C, generator=g, dtype=F64).to(device).requires_grad_()
    targets = torch.randint(1, C, (N, S), generator=g).to(device)
    il = torch.tensor([30, 25, 9, 30, 4])
    tl = torch.tensor([8, 5, 8, 0, 3])  # item 2: 9 frames for 8 labels with repeats may be impossible
    targets[1, 1] = targets[1, 0]  # a repeat: needs a blank between
    for reduction in ("none", "sum", "mean"):
        for semiring_ops_first in (True, False):
            lp = logits.log_softmax(-1)
            fn = ctc_loss if semiring_ops_first else F.ctc_loss
            out = fn(lp, targets, il, tl, 0, reduction, True)
            cot = torch.ones_like(out) if reduction != "none" else torch.arange(1.0, N + 1, dtype=F64, device=device)
            (grad,) = torch.autograd.grad(out, logits, cot)
            if semiring_ops_first:
                ours, ours_out = grad, out.detach()
            else:
                torch.testing.assert_close(ours_out, out.detach(), rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(ours, grad, rtol=1e-9, atol=1e-10)


def _brute_force(log_probs: torch.Tensor, target: list[int], frames: int, blank: int) -> tuple[float, float]:
    """(log-sum-exp, max) over every CTC alignment of one item, by enumerating frame labelings."""
    scores = []
    for path in itertools.product(range(log_probs.shape[-1]), repeat=frames):
        collapsed = [c for i, c in enumerate(path) if c != blank and (i == 0 or c != path[i - 1])]
        if collapsed == target:
            scores.append(sum(float(log_probs[t, c]) for t, c in enumerate(path)))
    if not scores:
        return -math.inf, -math.inf
    return float(torch.tensor(scores, dtype=F64).logsumexp(0)), max(scores)


@pytest.mark.parametrize("seed", range(6))
def test_log_and_max_against_every_alignment(seed):
    """Both semirings against the enumeration of the frame labelings that collapse to the target (T <= 5)."""
    g = torch.Generator().manual_seed(seed)
    T, N, C = 5, 3, 3
    blank = seed % C
    log_probs = torch.randn(T, N, C, generator=g, dtype=F64)  # not normalised: any scores
    others = [c for c in range(C) if c != blank]
    targets = torch.tensor([[others[0], others[0]], [others[1], others[0]], [others[1], others[1]]])
    il, tl = torch.tensor([5, 4, 2]), torch.tensor([2, 1 + seed % 2, 2])
    log = ctc_loss(log_probs, targets, il, tl, blank, "none")
    best = ctc_loss(log_probs, targets, il, tl, blank, "none", semiring="max")
    for n in range(N):
        want_log, want_max = _brute_force(log_probs[:, n], targets[n, : tl[n]].tolist(), int(il[n]), blank)
        torch.testing.assert_close(-log[n], torch.tensor(want_log, dtype=F64))
        torch.testing.assert_close(-best[n], torch.tensor(want_max, dtype=F64))


def test_gradcheck_and_second_order():
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(6, 2, 4, generator=g, dtype=F64).requires_grad_()
    targets, il, tl = torch.tensor([[1, 2, 2], [3, 1, 0]]), torch.tensor([6, 5]), torch.tensor([3, 2])
    fn = lambda x: ctc_loss(x, targets, il, tl, reduction="none")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (lp,))
    assert torch.autograd.gradgradcheck(fn, (lp,))


@settings(max_examples=20)
@given(seed=st.integers(0, 999), T=st.integers(1, 5), S=st.integers(0, 2), blank=st.integers(0, 2))
def test_every_quantity_of_the_structure_equals_enumeration(seed, T, S, blank):
    """log Z, max, marginals, count, entropy and argmax of structures.CTC over random emissions (any scores),
    lengths and targets with and without repeats, against the enumeration of the state paths."""
    g = torch.Generator().manual_seed(seed)
    B, C = 3, 3
    others = torch.tensor([c for c in range(C) if c != blank])
    targets = others[torch.randint(0, 2, (B, S), generator=g)]
    target_lengths = torch.randint(0, S + 1, (B,), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    ctc = CTC(targets, target_lengths, blank)
    emissions = torch.randn(B, T, 2 * S + 1, generator=g, dtype=F64)
    paths = [ctc_alignments(T, 2 * S + 1, int(lengths[b]), targets[b, : target_lengths[b]].tolist()) for b in range(B)]
    assert_derived(ctc, emissions, lengths, expectations(list(emissions), paths))


def test_kmax_topk_and_samples():
    """The k best alignments' scores and parts (KMax semiring, leading dims), and exact samples (folded into the
    batch: the topology repeated), against the enumeration."""
    g = torch.Generator().manual_seed(8)
    targets, tl, il = torch.tensor([[1, 2], [1, 1]]), torch.tensor([2, 2]), torch.tensor([5, 4])
    ctc = CTC(targets, tl, 0)
    em = torch.randn(2, 5, 5, generator=g, dtype=F64)
    kmax, top = ctc.kmax(em, 3, il), ctc.topk(em, 3, il)
    samples = ctc.sample(em, 400, il, generator=g)
    for b in range(2):
        paths = ctc_alignments(5, 5, int(il[b]), targets[b].tolist())
        scores = torch.stack([(p * em[b]).sum() for p in paths]).sort(descending=True).values
        torch.testing.assert_close(kmax[:, b], scores[:3])
        torch.testing.assert_close((top[:, b] * em[b]).sum((-1, -2)), scores[:3])
        valid = {tuple(p.flatten().tolist()) for p in paths}
        assert all(tuple(x.flatten().tolist()) in valid for x in samples[:, b])
    assert (samples.mean(0) - ctc.marginals(em, il)).abs().max() < 0.1


def test_occupancies_are_the_marginals():
    """d log Z / d emissions: each frame of an item's length is in exactly one state (sums to 1), none after."""
    log_probs, targets, _, _ = _case(4, 12, 3, 5, 4, 0)
    il, tl = torch.tensor([12, 7, 10]), torch.tensor([4, 2, 0])
    ctc = CTC(targets, tl, blank=0)
    em = ctc.emissions(log_probs.transpose(0, 1)).requires_grad_()
    (occupancy,) = torch.autograd.grad(ctc.logpartition(em, il, LogSemiring).sum(), em)
    per_frame = occupancy.sum(-1)
    live = torch.arange(12)[None, :] < il[:, None]
    torch.testing.assert_close(per_frame[live], torch.ones(int(live.sum()), dtype=F64))
    assert (per_frame[~live] == 0).all()
    assert (occupancy[2, :, 1:] == 0).all()  # an empty target: the blank state only


def test_unbatched_16_bit_and_the_module():
    log_probs, targets, il, tl = _case(5, 20, 1, 6, 5, 2)
    tl[0] = 5
    want = F.ctc_loss(log_probs[:, 0], targets[0], il[0], tl[0], blank=2)
    torch.testing.assert_close(ctc_loss(log_probs[:, 0], targets[0], int(il[0]), int(tl[0]), blank=2), want)
    module = CTCLoss(blank=2, reduction="sum")
    torch.testing.assert_close(module(log_probs, targets, il, tl), F.ctc_loss(log_probs, targets, il, tl, 2, "sum"))
    for dtype in (torch.float16, torch.bfloat16):
        got = ctc_loss(log_probs.to(dtype), targets, il, tl, blank=2)
        assert got.dtype == dtype
        want32 = ctc_loss(log_probs.to(dtype).float(), targets, il, tl, blank=2)  # the same inputs, in float32
        torch.testing.assert_close(got.float(), want32, rtol=1e-2, atol=1e-2)


def test_bad_input_names_the_argument():
    lp, targets, il, tl = _case(6, 8, 2, 4, 3, 0)
    with pytest.raises(ValueError, match="log_probs"):
        ctc_loss(lp[0, 0], targets, il, tl)
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(lp, targets, torch.tensor([9, 3]), tl)
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(lp, targets, torch.tensor([1.0, 2.0]), tl)
    with pytest.raises(ValueError, match="target_lengths"):
        ctc_loss(lp, targets, il, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="target labels"):
        ctc_loss(lp, torch.zeros_like(targets), il, torch.tensor([1, 1]))  # the blank as a label
    with pytest.raises(ValueError, match="targets"):
        ctc_loss(lp, targets[:, :1], il, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="reduction"):
        ctc_loss(lp, targets, il, tl, reduction="avg")
    with pytest.raises(ValueError, match="semiring"):
        ctc_loss(lp, targets, il, tl, semiring="min")
    with pytest.raises(ValueError, match="blank"):
        ctc_loss(lp, targets, il, tl, blank=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("host_checks", [True, False], ids=["checked on the host", "checked on the device"])
def test_the_checks_name_the_same_values_wherever_they_run(device, host_checks, monkeypatch):
    """A GPU call's lengths and labels are checked on the host (one transfer) up to _HOST_CHECKED_LABELS labels and
    on the device past it: the same losses, the same messages with the same values."""
    import semiring_ops.alignment.ctc as ctc_module

    monkeypatch.setattr(ctc_module, "_HOST_CHECKED_LABELS", 1 << 16 if host_checks else -1)
    lp, targets, il, tl = _case(6, 8, 2, 4, 3, 0, device)
    il, tl = il.to(device), tl.to(device)
    want = F.ctc_loss(lp.cpu(), targets.cpu(), il.cpu(), tl.cpu(), reduction="none")
    torch.testing.assert_close(ctc_loss(lp, targets, il, tl, reduction="none").cpu(), want, rtol=1e-10, atol=1e-10)
    t = torch.tensor
    cases = [
        ((targets, t([9, 3]), tl), "input_lengths must be <= T = 8, got [9, 3]"),
        ((targets, t([-1, 3]), tl), "input_lengths must be >= 0, got [-1, 3]"),
        ((targets, il, t([-2, 1])), "target_lengths must be >= 0, got [-2, 1]"),
        ((torch.zeros_like(targets), il, t([1, 1])), "target labels must be in [0, C = 4) and not the blank (0)"),
        ((targets + 4, il, t([1, 1])), "target labels must be in [0, C = 4) and not the blank (0)"),
        ((targets[:, :1], il, t([2, 2])), "target_lengths [2, 2] exceed targets' 1 columns"),
    ]
    for (tg, input_lengths, target_lengths), message in cases:
        with pytest.raises(ValueError) as raised:
            ctc_loss(lp, tg.to(device), input_lengths.to(device), target_lengths.to(device))
        assert str(raised.value) == f"ctc_loss: {message}"


@pytest.mark.parametrize("device", DEVICES)
def test_columns_past_every_target_are_ignored_whatever_they_hold(device):
    """Targets padded past the longest length with labels out of range (a GPU call's kernels then run on all the
    columns while the host checks the values, checked_inputs' defer): torch's losses and gradients."""
    _, targets, il, _ = _case(11, 12, 3, 5, 4, 0, device)
    tl = torch.tensor([4, 2, 3])
    wide = torch.cat([targets, torch.full((3, 3), 99, device=device)], 1)
    logits = torch.randn(12, 3, 5, dtype=F64, generator=torch.Generator().manual_seed(3))
    ours, theirs = logits.to(device, copy=True).requires_grad_(), logits.requires_grad_()
    got = ctc_loss(ours.log_softmax(-1), wide, il.to(device), tl.to(device), reduction="none")
    want = F.ctc_loss(theirs.log_softmax(-1), targets.cpu(), il, tl, reduction="none")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(ours.grad.cpu(), theirs.grad, rtol=1e-8, atol=1e-10)


def test_empty_inputs_and_targets():
    """0 frames with an empty target: loss 0; with labels: inf (0 under zero_infinity); an empty batch."""
    lp = torch.randn(3, 2, 4, dtype=F64).log_softmax(-1)
    targets = torch.tensor([[1, 2], [1, 2]])
    got = ctc_loss(lp, targets, torch.tensor([0, 0]), torch.tensor([0, 2]), reduction="none")
    assert got[0] == 0 and math.isinf(got[1])
    zeroed = ctc_loss(lp, targets, torch.tensor([0, 0]), torch.tensor([0, 2]), reduction="none", zero_infinity=True)
    assert (zeroed == 0).all()
    empty = ctc_loss(
        lp[:, :0], targets[:0], torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), reduction="sum"
    )
    assert empty == 0
