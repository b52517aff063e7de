"""The fused span kernels, registered with torch.library (contracts in csrc/ops.h, dynamic programs in
csrc/span_dp.h):

    semiring_ops::span_inside(potentials, lengths, structure, semiring_id, multiroot) -> (total (B,), charts)
        the inside algorithm of a structure over spans (0: Eisner's projective dependency trees, potentials
        (B, N, N) arc scores; 1: CKY's binary span trees, potentials (B, N, N) label-summed span scores; 2:
        semi-Markov segments, potentials (B, N - 1, D, C, C) edges; 3: linear chains, potentials (B, N - 1, C, C)
        edges; 4: monotone alignments, potentials (B, N, M, 3) match scores) in one launch, under log, max or
        min; differentiable through ``total`` by span_adjoint. ``multiroot``: Eisner's several root children,
        the alignment's local mode (unused by the others)
    semiring_ops::span_adjoint(potentials, lengths, structure, semiring_id, multiroot, charts, grad) -> dpotentials
        d sum_b grad[b] total[b] / d potentials in one launch (the outside pass, recomputing each span's sum);
        its own gradient (double backward) is computed by the structure's PyTorch dynamic program

``lengths``: (B,) int64 in 1..N on the potentials' device; float32 or float64.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..build.backends import backend_for
from ..hooks import Hook

# The totals by the structure's PyTorch dynamic program, (potentials, lengths, structure, semiring_id, multiroot) ->
# (B,): what the double backward differentiates (structures/fused.py installs it).
generic_totals = Hook("the span kernels' double backward", "semiring_ops.structures")

__all__ = [
    "ALIGNMENT",
    "CKY",
    "EISNER",
    "LINEARCHAIN",
    "SEMIMARKOV",
    "direct_call_ok",
    "span_adjoint",
    "span_inside",
    "span_total",
]

EISNER, CKY, SEMIMARKOV, LINEARCHAIN, ALIGNMENT = 0, 1, 2, 3, 4


def _chart_shape(potentials: Tensor, structure: int) -> tuple[int, int, int, int]:
    B, N = potentials.shape[0], potentials.shape[1]
    if structure == ALIGNMENT:  # alpha over (N, M), the local row totals in column M
        return (B, 1, N, potentials.shape[2] + 1)
    if structure in (SEMIMARKOV, LINEARCHAIN):  # edges (B, N - 1, ..., C): charts over N positions
        return (B, 2 if structure == LINEARCHAIN else 1, N + 1, potentials.shape[-1])
    return (B, 4, N + 1, N + 1) if structure == EISNER else (B, 1, N, N)


@torch.library.custom_op("semiring_ops::span_inside", mutates_args=())
def span_inside(
    potentials: Tensor, lengths: Tensor, structure: int, semiring_id: int, multiroot: bool
) -> tuple[Tensor, Tensor]:
    """(total (B,), charts): see the module docstring."""
    return tuple(
        backend_for(potentials.device)
        .family("span")
        .span_inside(potentials, lengths, structure, semiring_id, multiroot)
    )


@span_inside.register_fake
def _(potentials, lengths, structure, semiring_id, multiroot):
    return potentials.new_empty(potentials.shape[:1]), potentials.new_empty(_chart_shape(potentials, structure))


def _inside_setup_context(ctx, inputs, output):
    potentials, lengths, structure, semiring_id, multiroot = inputs
    ctx.args = (structure, semiring_id, multiroot)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(potentials, lengths, output[1])


def _inside_backward(ctx, grad_total, _grad_charts):
    if grad_total is None:
        return (None,) * 5
    potentials, lengths, charts = ctx.saved_tensors
    grad = grad_total.to(potentials.dtype)
    return span_adjoint(potentials, lengths, *ctx.args, charts, grad), None, None, None, None


span_inside.register_autograd(_inside_backward, setup_context=_inside_setup_context)


@torch.library.custom_op("semiring_ops::span_adjoint", mutates_args=())
def span_adjoint(
    potentials: Tensor, lengths: Tensor, structure: int, semiring_id: int, multiroot: bool, charts: Tensor, grad: Tensor
) -> Tensor:
    """d sum_b grad[b] total[b] / d potentials (B, N, N): see the module docstring."""
    module = backend_for(potentials.device).family("span")
    return module.span_adjoint(potentials, lengths, structure, semiring_id, multiroot, charts, grad)


@span_adjoint.register_fake
def _(potentials, lengths, structure, semiring_id, multiroot, charts, grad):
    return potentials.new_empty(potentials.shape)


def _adjoint_setup_context(ctx, inputs, output):
    potentials, lengths, structure, semiring_id, multiroot, _charts, grad = inputs
    ctx.args = (structure, semiring_id, multiroot)
    ctx.save_for_backward(potentials, lengths, grad)


def _adjoint_backward(ctx, v):
    """Second derivatives by the structure's PyTorch dynamic program (structures/fused.py): with t the totals,
    d <v, grad . dt/dp> / dp = d^2 (grad . t) / dp^2 v, and / d grad_b = <v_b, dt_b / dp_b>."""
    potentials, lengths, grad = ctx.saved_tensors
    with torch.enable_grad():
        p = potentials.detach().requires_grad_()
        totals = generic_totals(p, lengths, *ctx.args)
        (first,) = torch.autograd.grad(totals.sum(), p, create_graph=True)  # dt_b / dp_b, items independent
        weighted = first * grad.detach().view(-1, *(1,) * (potentials.dim() - 1))
        (second,) = torch.autograd.grad(weighted, p, v, allow_unused=True)
    g_pot = torch.zeros_like(potentials) if second is None else second
    g_grad = (v * first.detach()).flatten(1).sum(1)
    return g_pot, None, None, None, None, None, g_grad


span_adjoint.register_autograd(_adjoint_backward, setup_context=_adjoint_setup_context)


class _EagerSpanTotal(torch.autograd.Function):
    """span_inside's totals in eager mode, the extension called directly: the custom op's Python dispatch layers
    cost more than the kernels at small sizes (a linear chain of 32 x 127 x 32 labels: about 40 us of host time
    a call on top of 0.2 ms of kernels). The backward is the custom op's (_inside_backward)."""

    @staticmethod
    def forward(ctx, potentials, lengths, structure, semiring_id, multiroot):
        module = backend_for(potentials.device).family("span")
        total, charts = module.span_inside(potentials, lengths, structure, semiring_id, multiroot)
        _inside_setup_context(ctx, (potentials, lengths, structure, semiring_id, multiroot), (total, charts))
        return total

    @staticmethod
    def backward(ctx, grad_total):
        potentials, lengths, charts = ctx.saved_tensors
        if grad_total is None or torch.is_grad_enabled() or not direct_call_ok(potentials):
            return _inside_backward(ctx, grad_total, None)  # (a graph of the gradient: the custom op's autograd)
        module = backend_for(potentials.device).family("span")
        grad = grad_total.to(potentials.dtype)
        return module.span_adjoint(potentials, lengths, *ctx.args, charts, grad), None, None, None, None


def direct_call_ok(tensor: Tensor) -> bool:
    """Whether the extension may be called directly on ``tensor``: a plain tensor and no tracing (torch.compile,
    export, FakeTensor and make_fx need the custom ops)."""
    plain = type(tensor) is Tensor or type(tensor) is torch.nn.Parameter
    return plain and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None


def span_total(potentials: Tensor, lengths: Tensor, structure: int, semiring_id: int, multiroot: bool) -> Tensor:
    """span_inside's totals (B,), differentiable (twice): by the extension directly (_EagerSpanTotal) in eager
    mode, else by the custom op, with the same backward."""
    if not direct_call_ok(potentials):
        return span_inside(potentials, lengths, structure, semiring_id, multiroot)[0]
    return _EagerSpanTotal.apply(potentials, lengths, structure, semiring_id, multiroot)
