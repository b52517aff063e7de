"""The alignment losses under torch.compile(fullgraph=True): ctc_loss (padded and concatenated targets, both
semirings, every reduction), forced_align and rnnt_loss (both semirings) trace into one graph (the values checks
that read the inputs are left to eager calls) and give the eager call's values and gradients. The aot_eager
backend: dynamo's graph and AOT autograd's joint graph, without inductor's code generation (CI's CPU time)."""

from __future__ import annotations

import pytest
import torch

import semiring_ops as so


def _compiled(fn):
    torch._dynamo.reset()  # each case traces afresh (no graph of another case reused with guards)
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def _ctc_inputs(device: str, concatenated: bool):
    g = torch.Generator().manual_seed(3)
    T, N, C = 14, 3, 7
    lp = torch.randn(T, N, C, generator=g).log_softmax(-1).to(device).requires_grad_()
    target_lengths = torch.tensor([4, 0, 2])
    targets = torch.randint(1, C, (N, 4), generator=g)
    if concatenated:
        targets = torch.cat([targets[n, : int(k)] for n, k in enumerate(target_lengths)])
    return lp, targets.to(device), torch.tensor([14, 9, 5]).to(device), target_lengths.to(device)


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("concatenated", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_ctc_loss(device, semiring, concatenated, reduction):
    lp, targets, il, tl = _ctc_inputs(device, concatenated)

    def loss(x):
        return so.ctc_loss(x, targets, il, tl, reduction=reduction, zero_infinity=True, semiring=semiring)

    got, want = _compiled(loss)(lp), loss(lp)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(*(torch.autograd.grad(out, lp, g)[0] for out in (got, want)))


def test_forced_align(device):
    lp, targets, il, tl = _ctc_inputs(device, False)
    lp = lp.detach().transpose(0, 1)
    got = _compiled(so.forced_align)(lp, targets, il, tl)
    want = so.forced_align(lp, targets, il, tl)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("semiring", ["log", "max"])
def test_rnnt_loss(device, semiring):
    g = torch.Generator().manual_seed(5)
    B, T, U, V = 2, 6, 3, 5
    logits = torch.randn(B, T, U + 1, V, generator=g).to(device).requires_grad_()
    targets = torch.randint(1, V, (B, U), generator=g, dtype=torch.int32).to(device)
    frames, labels = torch.tensor([6, 4], dtype=torch.int32).to(device), torch.tensor([3, 1]).to(device)

    def loss(x):
        return so.rnnt_loss(x, targets, frames, labels, blank=0, reduction="none", semiring=semiring)

    got, want = _compiled(loss)(logits), loss(logits)
    torch.testing.assert_close(got, want)
    gout = torch.rand_like(want)
    torch.testing.assert_close(*(torch.autograd.grad(out, logits, gout)[0] for out in (got, want)))


def test_a_traced_graph_without_the_kernels_says_what_is_missing(monkeypatch):
    """A compiled graph takes the ctc family's kernels to be there (eager calls fall back to the PyTorch program);
    where they are not, the op says so instead of failing on None."""
    from semiring_ops.ops import ctc_ops

    monkeypatch.setattr(ctc_ops, "ctc_kernels", lambda device: None)
    lp, targets, il, tl = _ctc_inputs("cpu", False)
    with pytest.raises(RuntimeError, match=r"ctc_log: no compiled ctc kernels for cpu .*under torch\.compile"):
        ctc_ops.ctc_log(lp.detach(), targets, il, tl, 0, False)
