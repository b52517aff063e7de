"""PyTorch's own CTC test cases, with the call swapped to semiring_ops (issue 43).

The cases are those that PyTorch's test suite runs for ``nn.CTCLoss`` and ``nn.functional.ctc_loss``, as the
installed torch ships them in ``torch/testing/_internal`` (not imported: that package needs ``expecttest``):

- ``common_modules.module_inputs_torch_nn_CTCLoss`` (test_modules.py's forward, gradient and reference tests):
  log-probs (50, 3, 15) from ``log_softmax``, padded targets (3, 30) of int32 or int64 drawn from [1, 15) (from
  [0, 14) with blank 14), input lengths (50, 50, 50) and target lengths (30, 25, 20), as Python lists or tensors,
  for the default module and reduction "sum", "mean", "none" and blank 14. Its reference (``ctcloss_reference``,
  the forward recursion in probability space, float64) is checked here by torch's own ``ctc_loss`` in float64,
  which equals it.
- ``common_methods_invocations.sample_inputs_ctc_loss`` (test_ops.py's OpInfo ``nn.functional.ctc_loss``):
  log-probs (50, 16, 20), targets (16, 30) from [1, 20), target lengths drawn from [10, 30), every reduction,
  ``zero_infinity`` on and off, lengths as tensors or lists (lists only for "none" and "sum", as there); gradients
  through the OpInfo's gradcheck wrapper (the input is ``log_softmax``-ed inside the checked function).

Values: torch's within 1e-5 relative in float32 and 1e-10 in float64 (the issue's bar); gradients the same. The
torch.compile and second-order variants of these ops are tested in test_alignment_compile.py and test_ctc_loss.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES

import semiring_ops as so

# common_modules.module_inputs_torch_nn_CTCLoss: (description, constructor keyword arguments)
MODULE_CASES = [("", {}), ("reduction_sum", {"reduction": "sum"}), ("reduction_mean", {"reduction": "mean"})]
MODULE_CASES += [("reduction_none", {"reduction": "none"}), ("blank", {"blank": 14})]


def _tolerances(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}


def _module_input(device: str, dtype: torch.dtype, target_dtype: torch.dtype, blank: int, tensors: bool, seed: int):
    """(logits, targets, input lengths, target lengths): the ModuleInput's log-probs are logits.log_softmax(2)
    (its leaf is the tensor before log_softmax, as make_input(...).log_softmax(2) there)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(50, 3, 15, generator=g).to(device, dtype)
    low, high = (0, 14) if blank == 14 else (1, 15)
    targets = torch.randint(low, high, (3, 30), generator=g).to(device, target_dtype)
    input_lengths, target_lengths = (50, 50, 50), (30, 25, 20)
    if tensors:
        input_lengths = torch.tensor(input_lengths, device=device)
        target_lengths = torch.tensor(target_lengths, device=device)
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("target_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("desc, kwargs", MODULE_CASES, ids=[c[0] or "default" for c in MODULE_CASES])
@pytest.mark.parametrize("lengths", ["intlists", "tensors"])
def test_module_inputs_of_torchs_suite(device, dtype, target_dtype, desc, kwargs, lengths):
    """nn.CTCLoss's ModuleInfo inputs: the loss and its gradient (with respect to the leaf before log_softmax:
    torch's own gradient with respect to log-probs is that of log-softmaxed inputs, docs/structures.md) equal
    torch's module's."""
    blank = kwargs.get("blank", 0)
    logits, targets, il, tl = _module_input(device, dtype, target_dtype, blank, lengths == "tensors", len(desc))
    ours_in, theirs_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = so.CTCLoss(**kwargs)(ours_in.log_softmax(2), targets, il, tl)
    theirs = torch.nn.CTCLoss(**kwargs)(theirs_in.log_softmax(2), targets, il, tl)
    torch.testing.assert_close(ours, theirs, **_tolerances(dtype))
    cotangent = torch.randn(theirs.shape, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(device)
    (g_ours,) = torch.autograd.grad(ours, ours_in, cotangent)
    (g_theirs,) = torch.autograd.grad(theirs, theirs_in, cotangent)
    torch.testing.assert_close(g_ours, g_theirs, **_tolerances(dtype))


def _sample_input(device: str, dtype: torch.dtype, reduction: str, list_lengths: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(50, 16, 20, generator=g).to(device, dtype).log_softmax(2)
    targets = torch.randint(1, 20, (16, 30), generator=g).to(device)
    input_lengths = torch.full((16,), 50, dtype=torch.long, device=device)
    target_lengths = torch.randint(10, 30, (16,), generator=g).to(device)
    if list_lengths and reduction in ("none", "sum"):  # as the OpInfo's: lists only where "mean" needs no tensor
        input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
    return log_probs, targets, input_lengths, target_lengths


SAMPLE_CASES = list(itertools.product(["none", "mean", "sum"], [True, False], [True, False]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction, zero_infinity, list_lengths", SAMPLE_CASES)
def test_opinfo_sample_inputs_of_torchs_suite(device, dtype, reduction, zero_infinity, list_lengths):
    """nn.functional.ctc_loss's OpInfo samples: values equal torch's; gradients (through the OpInfo's log_softmax
    wrapper) equal torch's in float64, and in float32 are as close to torch's float64 gradient as torch's float32
    one is, within a factor 2 (the two float32 results differ by ~2e-5 where their sums run over 16 x 30 labels;
    each is ~2e-5 from float64, ours 0.7-1.3x torch's)."""
    lp, targets, il, tl = _sample_input(
        device, dtype, reduction, list_lengths, SAMPLE_CASES.index((reduction, zero_infinity, list_lengths))
    )
    logits = torch.randn(lp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    kwargs = {"reduction": reduction, "zero_infinity": zero_infinity}

    def run(fn, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        x = logits.to(dt).clone().requires_grad_()
        loss = fn(x.log_softmax(2), targets, il, tl, **kwargs)
        loss.sum().backward()
        return loss.detach(), x.grad

    ours, g_ours = run(so.ctc_loss, dtype)
    theirs, g_theirs = run(F.ctc_loss, dtype)
    torch.testing.assert_close(ours, theirs, **_tolerances(dtype))
    if dtype == torch.float64:
        torch.testing.assert_close(g_ours, g_theirs, **_tolerances(dtype))
    else:
        _, g_exact = run(F.ctc_loss, torch.float64)
        ours_err = (g_ours.double() - g_exact).abs().max().item()
        theirs_err = (g_theirs.double() - g_exact).abs().max().item()
        assert ours_err <= max(2 * theirs_err, 1e-6), (ours_err, theirs_err)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_opinfo_gradcheck_of_torchs_suite(reduction):
    """The OpInfo's gradcheck: float64, the input log_softmax-ed inside the checked function
    (gradcheck_wrapper_ctc_loss), on the OpInfo's sample shapes (fast mode: random projections)."""
    lp, targets, il, tl = _sample_input("cpu", torch.float64, reduction, False, seed=3)
    logits = lp.detach().requires_grad_()

    def wrapped(x: torch.Tensor) -> torch.Tensor:
        return so.ctc_loss(x.log_softmax(dim=2), targets, il, tl, reduction=reduction)

    assert torch.autograd.gradcheck(wrapped, (logits,), fast_mode=True)
