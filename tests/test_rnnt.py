"""The RNN-T loss (semiring_ops.rnnt_loss, torchaudio's interface) and its lattice structure (structures/rnnt.py).

Against brute-force enumeration of every alignment on tiny inputs, in the log and max semirings; against the
costs and gradients that torchaudio's own test suite states (its rnnt_utils.py: the B1_T2_U3_D5 and B2_T4_U3_D3
cases, and warp-transducer's basic example); gradcheck in float64 with and without the fused log-softmax; padding
poisoned with NaN; half precision; the reductions, the module and clamp; bad input.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_ops as so
from semiring_ops.semirings import LogSemiring, MaxSemiring
from semiring_ops.structures import RNNT

DEVICES = ["cpu", CUDA]


def alignments(frames: int, labels: int):
    """Every alignment of an item as its moves [(t, u, move)], move 0 a blank and 1 a label: the T - 1 blanks and
    U labels before the final blank, in any order."""
    for at in itertools.combinations(range(frames - 1 + labels), labels):
        t = u = 0
        moves = []
        for k in range(frames - 1 + labels):
            moves.append((t, u, int(k in at)))
            t, u = (t, u + 1) if k in at else (t + 1, u)
        yield [*moves, (frames - 1, labels, 0)]


def brute_force(log_probs: torch.Tensor, targets: torch.Tensor, frames: int, labels: int, blank: int) -> torch.Tensor:
    """Every alignment's score of one item, from log_probs (T, U + 1, V)."""
    return torch.stack(
        [
            sum(log_probs[t, u, targets[u] if move else blank] for t, u, move in moves)
            for moves in alignments(frames, labels)
        ]
    )


def random_case(seed: int, B: int, T: int, U: int, V: int, device: str = "cpu", dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype).to(device)
    targets = torch.randint(0, V, (B, U), generator=g, dtype=torch.int32).to(device)
    frames = torch.randint(1, T + 1, (B,), generator=g, dtype=torch.int32).to(device)
    labels = torch.randint(0, U + 1, (B,), generator=g, dtype=torch.int32).to(device)
    return logits, targets, frames, labels


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 3),
    T=st.integers(1, 4),
    U=st.integers(0, 3),
    V=st.integers(2, 5),
    blank=st.sampled_from([0, -1, 1]),
    semiring=st.sampled_from(["log", "max"]),
)
def test_costs_match_brute_force_enumeration(seed, B, T, U, V, blank, semiring):
    logits, targets, frames, labels = random_case(seed, B, T, U, V)
    got = so.rnnt_loss(logits, targets, frames, labels, blank=blank, reduction="none", semiring=semiring)
    log_probs = logits.log_softmax(-1)
    want = []
    for b in range(B):
        scores = brute_force(log_probs[b], targets[b], int(frames[b]), int(labels[b]), blank % V)
        want.append(-(scores.logsumexp(0) if semiring == "log" else scores.max()))
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_gradients_match_autograd_of_the_enumeration(device, semiring):
    logits, targets, frames, labels = random_case(3, 3, 4, 3, 5, device)
    frames[0], labels[0] = 4, 3  # one item over the whole lattice
    x = logits.clone().requires_grad_()
    got = so.rnnt_loss(x, targets, frames, labels, blank=0, reduction="sum", semiring=semiring)
    (g,) = torch.autograd.grad(got, x)
    y = logits.clone().requires_grad_()
    log_probs = y.log_softmax(-1)
    total = 0
    for b in range(3):
        scores = brute_force(log_probs[b], targets[b], int(frames[b]), int(labels[b]), 0)
        total = total - (scores.logsumexp(0) if semiring == "log" else scores.max())
    (want,) = torch.autograd.grad(total, y)
    torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-12)


def test_torchaudio_reference_cases():
    """The costs and gradients torchaudio's tests assert (rnnt_utils.py), float32 and float16."""
    # B1_T2_U3_D5, blank -1
    logits = torch.tensor(
        [0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 0.1,
         0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.7, 0.1, 0.2, 0.1, 0.1]
    ).reshape(1, 2, 3, 5)  # fmt: skip
    ref_grad = torch.tensor(
        [0.17703132, -0.39992708, 0.17703132, 0.17703132, -0.13116692, 0.12247062, 0.12247062, -0.181684,
         0.12247062, -0.1857276, 0.06269141, 0.06269141, 0.06928471, 0.12624498, -0.32091248, 0.05456069,
         -0.2182428, 0.05456069, 0.05456069, 0.05456069, 0.12073967, 0.12073967, -0.48295838, 0.12073967,
         0.12073967, 0.30741188, 0.16871123, 0.18645471, 0.16871123, -0.83128875]
    ).reshape(1, 2, 3, 5)  # fmt: skip
    args = (torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        x = logits.to(dtype).detach().requires_grad_()
        cost = so.rnnt_loss(x, args[0], args[1], args[1], blank=-1, reduction="none")
        cost.sum().backward()
        assert cost.dtype == dtype and x.grad.dtype == dtype
        torch.testing.assert_close(cost.float(), torch.tensor([5.09566688538]), rtol=rtol, atol=0)
        torch.testing.assert_close(x.grad.float(), ref_grad, rtol=rtol, atol=rtol)
    # B2_T4_U3_D3, blank 0
    logits = torch.tensor(
        [0.065357, 0.787530, 0.081592, 0.529716, 0.750675, 0.754135, 0.609764, 0.868140, 0.622532, 0.668522,
         0.858039, 0.164539, 0.989780, 0.944298, 0.603168, 0.946783, 0.666203, 0.286882, 0.094184, 0.366674,
         0.736168, 0.166680, 0.714154, 0.399400, 0.535982, 0.291821, 0.612642, 0.324241, 0.800764, 0.524106,
         0.779195, 0.183314, 0.113745, 0.240222, 0.339470, 0.134160, 0.505562, 0.051597, 0.640290, 0.430733,
         0.829473, 0.177467, 0.320700, 0.042883, 0.302803, 0.675178, 0.569537, 0.558474, 0.083132, 0.060165,
         0.107958, 0.748615, 0.943918, 0.486356, 0.418199, 0.652408, 0.024243, 0.134582, 0.366342, 0.295830,
         0.923670, 0.689929, 0.741898, 0.250005, 0.603430, 0.987289, 0.592606, 0.884672, 0.543450, 0.660770,
         0.377128, 0.358021]
    ).reshape(2, 4, 3, 3).requires_grad_()  # fmt: skip
    ref_grad = torch.tensor(
        [-0.186844, -0.062555, 0.249399, -0.203377, 0.202399, 0.000977, -0.141016, 0.079123, 0.061893, -0.011552,
         -0.081280, 0.092832, -0.154257, 0.229433, -0.075176, -0.246593, 0.146405, 0.100188, -0.012918, -0.061593,
         0.074512, -0.055986, 0.219831, -0.163845, -0.497627, 0.209240, 0.288387, 0.013605, -0.030220, 0.016615,
         0.113925, 0.062781, -0.176706, -0.667078, 0.367659, 0.299419, -0.356344, -0.055347, 0.411691, -0.096922,
         0.029459, 0.067463, -0.063518, 0.027654, 0.035863, -0.154499, -0.073942, 0.228441, -0.166790, -0.000088,
         0.166878, -0.172370, 0.105565, 0.066804, 0.023875, -0.118256, 0.094381, -0.104707, -0.108934, 0.213642,
         -0.369844, 0.180118, 0.189726, 0.025714, -0.079462, 0.053748, 0.122328, -0.238789, 0.116460, -0.598687,
         0.302203, 0.296484]
    ).reshape(2, 4, 3, 3)  # fmt: skip
    targets = torch.tensor([[1, 2], [1, 1]], dtype=torch.int32)
    cost = so.rnnt_loss(logits, targets, torch.tensor([4, 4]), torch.tensor([2, 2]), blank=0, reduction="none")
    cost.sum().backward()
    torch.testing.assert_close(cost, torch.tensor([4.2806528590890736, 3.9384369822503591]), rtol=1e-6, atol=0)
    torch.testing.assert_close(logits.grad, ref_grad, rtol=0, atol=2e-6)


def test_warp_transducer_basic_example_through_the_module():
    """torchaudio.transforms.RNNTLoss's docstring example (warp-transducer's), blank 0: cost 4.495666 as
    warp-transducer's test states it; the mean reduction of one item is that cost."""
    logits = torch.tensor(
        [[[[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.2, 0.8, 0.1]],
          [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.1, 0.1], [0.7, 0.1, 0.2, 0.1, 0.1]]]],
        requires_grad=True,
    )  # fmt: skip
    targets, lengths = torch.tensor([[1, 2]], dtype=torch.int), torch.tensor([2], dtype=torch.int)
    loss = so.RNNTLoss(blank=0)(logits, targets, lengths, lengths)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(4.495666), rtol=1e-6, atol=0)
    assert torch.isfinite(logits.grad).all()
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(1, 2, 3), rtol=0, atol=1e-6)  # softmax's sum


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_fused_and_not(device):
    logits, targets, frames, labels = random_case(5, 3, 3, 2, 4, device)
    x = logits.clone().requires_grad_()
    for fused in (True, False):
        assert torch.autograd.gradcheck(
            lambda z, fused=fused: so.rnnt_loss(z, targets, frames, labels, blank=1, fused_log_softmax=fused), (x,)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_unfused_takes_log_probabilities_as_given(device):
    """fused_log_softmax=False on log_softmax(logits) gives the fused loss; its gradient is the posteriors'
    alone (no softmax term), as torchaudio's non-fused kernel."""
    logits, targets, frames, labels = random_case(7, 4, 5, 3, 6, device)
    fused = so.rnnt_loss(logits, targets, frames, labels, reduction="none")
    unfused = so.rnnt_loss(logits.log_softmax(-1), targets, frames, labels, reduction="none", fused_log_softmax=False)
    torch.testing.assert_close(unfused, fused)
    lp = logits.log_softmax(-1).requires_grad_()
    (g,) = torch.autograd.grad(so.rnnt_loss(lp, targets, frames, labels, fused_log_softmax=False, reduction="sum"), lp)
    assert (g <= 0).all()  # minus the moves' posteriors
    occupancy = -g.sum(-1)  # each used cell's posterior mass: between 0 and 1
    assert (occupancy <= 1 + 1e-9).all() and (occupancy >= 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_padding_past_the_lengths_is_never_read(device):
    logits, targets, frames, labels = random_case(11, 4, 6, 4, 5, device)
    frames[:], labels[:] = torch.tensor([6, 3, 1, 4]), torch.tensor([4, 2, 0, 1])
    clean = so.rnnt_loss(logits, targets, frames, labels, reduction="none")
    poisoned = logits.clone()
    for b in range(4):
        poisoned[b, int(frames[b]) :] = float("nan")
        poisoned[b, :, int(labels[b]) + 1 :] = float("nan")
        targets[b, int(labels[b]) :] = -7  # padding labels need not be labels
    x = poisoned.requires_grad_()
    got = so.rnnt_loss(x, targets, frames, labels, reduction="none")
    torch.testing.assert_close(got, clean)
    (g,) = torch.autograd.grad(got.sum(), x)
    for b in range(4):
        assert (g[b, int(frames[b]) :] == 0).all() and (g[b, :, int(labels[b]) + 1 :] == 0).all()
        assert torch.isfinite(g[b, : int(frames[b]), : int(labels[b]) + 1]).all()


def test_reductions_clamp_and_half_precision():
    logits, targets, frames, labels = random_case(13, 5, 7, 4, 6, dtype=torch.float32)
    costs = so.rnnt_loss(logits, targets, frames, labels, reduction="none")
    assert costs.shape == (5,)
    torch.testing.assert_close(so.rnnt_loss(logits, targets, frames, labels), costs.mean())
    torch.testing.assert_close(so.rnnt_loss(logits, targets, frames, labels, reduction="sum"), costs.sum())
    x = logits.clone().requires_grad_()
    so.rnnt_loss(x, targets, frames, labels, reduction="sum", clamp=0.05).backward()
    y = logits.clone().requires_grad_()
    so.rnnt_loss(y, targets, frames, labels, reduction="sum").backward()
    assert x.grad.abs().max() <= 0.05 and y.grad.abs().max() > 0.05
    torch.testing.assert_close(x.grad, y.grad.clamp(-0.05, 0.05))
    for dtype in (torch.float16, torch.bfloat16):
        half = so.rnnt_loss(logits.to(dtype), targets, frames, labels, reduction="none")
        assert half.dtype == dtype
        torch.testing.assert_close(half.float(), so.rnnt_loss(logits.to(dtype).float(), targets, frames, labels,
                                                              reduction="none"), rtol=1e-2, atol=0)  # fmt: skip


def test_the_structure_in_other_semirings():
    """RNNT.logpartition in the log and max semirings against the enumeration of raw potentials, and its
    marginals (each move's posterior) summing to the frames + labels of the item."""
    g = torch.Generator().manual_seed(17)
    pot = torch.randn(2, 3, 4, 2, generator=g, dtype=torch.float64)
    frames, labels = torch.tensor([3, 2]), torch.tensor([3, 1])
    structure = RNNT(labels)
    for S, combine in ((LogSemiring, torch.logsumexp), (MaxSemiring, lambda x, d: x.max(d).values)):
        total = structure.logpartition(pot, frames, S)
        for b in range(2):
            scores = [
                sum(pot[b, t, u, move] for t, u, move in moves)
                for moves in alignments(*map(int, (frames[b], labels[b])))
            ]
            torch.testing.assert_close(total[b], combine(torch.stack(scores), 0))
    marg = structure.marginals(pot, frames)
    torch.testing.assert_close(marg.sum((1, 2, 3)), (frames + labels).double())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "logits": a["logits"][0]}, "logits must be a"),
        (lambda a: {**a, "targets": a["targets"][:, :1]}, "targets must be an integer tensor of shape"),
        (lambda a: {**a, "targets": a["targets"].float()}, "targets must be an integer"),
        (lambda a: {**a, "logit_lengths": a["logit_lengths"] * 0}, "logit_lengths must be in"),
        (lambda a: {**a, "target_lengths": a["target_lengths"] + 5}, "target_lengths must be in"),
        (lambda a: {**a, "blank": 9}, "blank must be in"),
        (lambda a: {**a, "targets": a["targets"] + 40}, "targets must be labels"),
        (lambda a: {**a, "reduction": "avg"}, "reduction should be one of"),
        (lambda a: {**a, "semiring": "min"}, "semiring must be one of"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    logits, targets, frames, labels = random_case(1, 2, 3, 2, 4)
    labels[:] = 2
    args = dict(logits=logits, targets=targets, logit_lengths=frames, target_lengths=labels, blank=0)
    with pytest.raises(ValueError, match=message):
        so.rnnt_loss(**change(args))


def test_empty_batch():
    out = so.rnnt_loss(
        torch.zeros(0, 3, 2, 4, requires_grad=True),
        torch.zeros(0, 1, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        reduction="none",
    )
    assert out.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_program_equals_the_structure(device, dtype):
    """The ctc family's lattice kernel (csrc/rnnt_dp.h) against the structure's PyTorch program and its autograd:
    totals and posteriors in log and max, ties (constant potentials: the blank taken, as MaxSemiring's first index),
    an impossible item (-inf everywhere: zero posteriors), items of one frame and of no label."""
    from semiring_ops.ops.ctc_ops import ctc_kernels
    from semiring_ops.ops.rnnt_ops import rnnt_lattice

    if ctc_kernels(torch.device(device)) is None:
        pytest.skip("no compiled ctc family here")
    g = torch.Generator().manual_seed(23)
    B, T, U = 6, 9, 5
    frames, labels = torch.tensor([9, 3, 1, 6, 9, 4]), torch.tensor([5, 2, 0, 5, 1, 3])
    cases = [torch.randn(B, T, U + 1, 2, generator=g, dtype=dtype), torch.zeros(B, T, U + 1, 2, dtype=dtype)]
    cases[0][3] = -torch.inf
    for pot in cases:
        pot, fr, lb = pot.to(device), frames.to(device), labels.to(device)
        for semiring, S in (("log", LogSemiring), ("max", MaxSemiring)):
            total, post = rnnt_lattice(pot, fr, lb, semiring == "max", True)
            p = pot.clone().requires_grad_()
            want = RNNT(lb).logpartition(p, fr, S)
            (grad,) = torch.autograd.grad(want.sum(), p)
            grad = torch.where(torch.isfinite(want)[:, None, None, None], grad, torch.zeros_like(grad))
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            torch.testing.assert_close(total, want.detach(), rtol=tol, atol=tol)
            torch.testing.assert_close(post, grad, rtol=tol, atol=tol)
            alone, empty = rnnt_lattice(pot, fr, lb, semiring == "max", False)
            torch.testing.assert_close(alone, total)
            assert empty.numel() == 0


def test_torchaudio_on_random_data():
    """Beside torchaudio.functional.rnnt_loss where it loads (its compiled ops need the torch it was built for):
    costs and gradients on random data of torchaudio's own test shapes (rnnt_utils.get_random_data's ranges),
    blank -1, fused and not, on the CPU and the GPU."""
    torchaudio_f = pytest.importorskip("torchaudio.functional")
    one, frames, labels = torch.zeros(1, 1, 1, 2), torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    try:
        torchaudio_f.rnnt_loss(one, labels[:, None][:, :0], frames, labels)
    except Exception as exc:  # its compiled ops load only next to the torch it was built for
        pytest.skip(f"torchaudio's rnnt_loss does not run here: {type(exc).__name__}: {exc}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    g = torch.Generator().manual_seed(29)
    for device in devices:
        for fused in (True, False):
            B, T, U, V = 7, 60, 20, 30
            frames = torch.randint(5, T + 1, (B,), generator=g, dtype=torch.int32)
            labels = torch.randint(5, U + 1, (B,), generator=g, dtype=torch.int32)
            T, U = int(frames.max()), int(labels.max())
            targets = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int32)
            logits = torch.rand(B, T, U + 1, V, generator=g)
            if not fused:
                logits = logits.log_softmax(-1)
            args = [t.to(device) for t in (targets, frames, labels)]
            mine, theirs = logits.to(device).requires_grad_(), logits.to(device).requires_grad_()
            a = so.rnnt_loss(mine, *args, reduction="none", fused_log_softmax=fused)
            b = torchaudio_f.rnnt_loss(theirs, *args, reduction="none", fused_log_softmax=fused)
            a.sum().backward()
            b.sum().backward()
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_torchaudio_suite_cases_without_torchaudio():
    """The cases of torchaudio's own rnnt_loss tests that need no torchaudio: the basic example's forward without
    gradients (it once crashed there) and with, and its random data's ranges (B < 8, T in 5..127, U in 5..31,
    D in 2..39, blank -1, five seeds, fused and not) against the structure's PyTorch program, an independent route
    (the fused kernel where the ctc family is built)."""
    logits = torch.rand(1, 2, 3, 5)
    lengths = torch.tensor([2], dtype=torch.int32)
    so.rnnt_loss(logits, torch.tensor([[1, 2]], dtype=torch.int32), lengths, lengths)  # no gradient asked
    from semiring_ops.alignment import rnnt as rnnt_module

    for seed in range(777, 782):
        g = torch.Generator().manual_seed(seed)
        B, T, U, D = (int(torch.randint(lo, hi, (), generator=g)) for lo, hi in ((1, 8), (5, 128), (5, 32), (2, 40)))
        frames = torch.randint(5, T + 1, (B,), generator=g, dtype=torch.int32)
        labels = torch.randint(5, U + 1, (B,), generator=g, dtype=torch.int32)
        targets = torch.randint(0, D - 1, (B, int(labels.max())), generator=g, dtype=torch.int32)
        for fused in (True, False):
            logits = torch.rand(B, int(frames.max()), int(labels.max()) + 1, D, generator=g)
            if not fused:
                logits = logits.log_softmax(-1)
            x = logits.clone().requires_grad_()
            got = so.rnnt_loss(x, targets, frames, labels, reduction="none", fused_log_softmax=fused)
            (grad,) = torch.autograd.grad(got.sum(), x)
            y = logits.double().requires_grad_()
            with pytest.MonkeyPatch.context() as mp:  # the structure's program: no compiled family
                mp.setattr(rnnt_module, "ctc_kernels", lambda device: None)
                want = so.rnnt_loss(y, targets, frames, labels, reduction="none", fused_log_softmax=fused)
            (want_grad,) = torch.autograd.grad(want.sum(), y)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(grad.double(), want_grad, rtol=1e-2, atol=1e-6)  # torchaudio tests: same
