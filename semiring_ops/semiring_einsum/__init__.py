"""torch-semiring-einsum's API on semiring_ops: ``from semiring_ops import semiring_einsum`` (or ``from
semiring_ops.semiring_einsum import ...``) where code had ``torch_semiring_einsum``.

The built-in semirings (real, log, Viterbi, max / min tropical, Boolean) run on semiring_ops.einsum: contracted two
operands at a time in a planned order, each step on the fused semiring matmul kernels, instead of every label summed
at once in blocks of terms. ``block_size`` is honoured as a memory budget (blocks.py). ``semiring_einsum_forward``
and ``combine`` (user semirings given by callbacks) run on the blocked generic engine (generic.py).

Differences from torch-semiring-einsum 1.2 (docs/einsum.md):
  - equations may use torch.einsum's whole grammar: an implicit output, '...', a label repeated within an operand,
    size-1 dimensions broadcast (torch-semiring-einsum accepts none of these);
  - a summed label of size 0 gives the semiring's zero (-inf, 0, +inf, False) instead of raising StopIteration;
  - ``save_max`` / ``save_sumexpsub`` of log_einsum are accepted and change nothing (no such tensors are kept:
    the backward is semiring_ops'), and log_einsum_forward's ``return_max`` / ``return_sumexpsub`` are computed
    on request (one more einsum) with torch-semiring-einsum's meaning;
  - ties in log_viterbi_einsum_forward go to the first index within each pairwise step of the plan;
  - the log, Viterbi and tropical forwards (and the log backward) of float16 / bfloat16 / float32 inputs are computed
    in float64 and rounded once to the inputs' dtype, so a result does not depend on the plan's order of additions
    (torch-semiring-einsum's tests compare to the last float32 ulp); semiring_ops.einsum itself keeps the inputs'
    dtype (16-bit inputs accumulate in float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..einsum.equation import BoundEquation
from ..einsum.execute import contract
from ..semirings import LogSemiring, MaxSemiring, MinSemiring, Semiring, StdSemiring
from .blocks import AUTOMATIC_BLOCK_SIZE, AutomaticBlockSize, Equation, budget_bytes, compile_equation
from .generic import combine, semiring_einsum_forward

__all__ = [
    "AUTOMATIC_BLOCK_SIZE",
    "AutomaticBlockSize",
    "Equation",
    "boolean_einsum_forward",
    "combine",
    "compile_equation",
    "einsum",
    "log_einsum",
    "log_einsum_backward",
    "log_einsum_forward",
    "log_viterbi_einsum_forward",
    "max_tropical_einsum_forward",
    "min_tropical_einsum_forward",
    "real_einsum_backward",
    "real_einsum_forward",
    "semiring_einsum_forward",
]

BlockSize = int | AutomaticBlockSize


def _run(equation, args, S: type[Semiring], block_size: BlockSize, track: bool = False):
    """semiring_ops.einsum's contraction of `args` under `equation` -> (bound equation, result, winning indices)."""
    if isinstance(equation, str):
        equation = Equation(equation)
    args = list(args)
    bound = equation.bind(args)
    element = args[0].element_size() if args else 4
    budget = budget_bytes(block_size, bound, args, element + (8 if track else 0))
    value, won = contract(bound, args, S, track=track, budget_elements=max(1, budget // element))
    return bound, value, won


def _check_backward(bound: BoundEquation, args, needs_grad, grad: Tensor) -> None:
    if len(args) != len(needs_grad):
        raise ValueError("length of args is not equal to length of needs_grad")
    expected = tuple(bound.sizes[lab] for lab in bound.output)
    if tuple(grad.shape) != expected:
        raise ValueError(f"size of gradient {tuple(grad.shape)} does not match expected size {expected}")


def _grads(equation, args, needs_grad, grad, S: type[Semiring], block_size: BlockSize) -> tuple:
    """The gradients of the einsum's output (times `grad`) with respect to the args that need one."""
    with torch.enable_grad():
        leaves = [a.detach().requires_grad_(bool(n)) for a, n in zip(args, needs_grad, strict=False)]
        bound, value, _ = _run(equation, leaves, S, block_size)
        _check_backward(bound, args, needs_grad, grad)
        wanted = [leaf for leaf, n in zip(leaves, needs_grad, strict=True) if n]
        found = iter(torch.autograd.grad(value, wanted, grad, allow_unused=True) if wanted else ())
    grads = []
    for leaf, n in zip(leaves, needs_grad, strict=True):
        g = next(found) if n else None
        grads.append(torch.zeros_like(leaf) if n and g is None else g)
    return bound, value, grads


# ---------------------------------------------------------------- the real semiring


def real_einsum_forward(equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE) -> Tensor:
    """Einsum where addition and multiplication have their usual meanings."""
    return _run(equation, args, StdSemiring, block_size)[1]


def real_einsum_backward(
    equation: Equation,
    args: Sequence[Tensor],
    needs_grad: Sequence[bool],
    grad: Tensor,
    block_size: BlockSize = AUTOMATIC_BLOCK_SIZE,
) -> list[Tensor | None]:
    """The gradients of real_einsum_forward's output, weighted by `grad`, with respect to each arg that needs one
    (None for the others)."""
    return _grads(equation, args, needs_grad, grad, StdSemiring, block_size)[2]


def einsum(equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE) -> Tensor:
    """Differentiable real einsum (to any order: autograd through the planned contraction)."""
    return _run(equation, args, StdSemiring, block_size)[1]


# ---------------------------------------------------------------- the log semiring


def log_einsum_forward(
    equation: Equation,
    *args: Tensor,
    block_size: BlockSize = AUTOMATIC_BLOCK_SIZE,
    return_max: bool = False,
    return_sumexpsub: bool = False,
) -> Tensor | tuple[Tensor, ...]:
    """Log-space einsum: addition is logsumexp, multiplication is +. With ``return_max`` also the maximum term of
    each output (+-inf clipped to the largest finite floats), with ``return_sumexpsub`` also the sum of exp(term -
    that maximum). Computed in float64 for narrower inputs and rounded once to their dtype (a planned contraction
    rounds after each pairwise step: 2 ulp in float32 where torch-semiring-einsum's one-pass sum rounds once)."""
    output = _log_forward(equation, args, block_size)
    extra = []
    if return_max or return_sumexpsub:
        maximum = torch.nan_to_num(_tropical(equation, args, MaxSemiring, block_size), nan=math.nan)
        if return_max:
            extra.append(maximum)
        if return_sumexpsub:
            extra.append((output - maximum).exp())
    return (output, *extra) if extra else output


def _widened(args: Sequence[Tensor]) -> list[Tensor]:
    """Narrower floating args in float64: the result is rounded once, not after every pairwise step (nor through
    the GPU's approximate exponential)."""
    return [a.double() if a.is_floating_point() and a.dtype != torch.float64 else a for a in args]


def _rounded_once(equation, args: Sequence[Tensor], S: type[Semiring], block_size: BlockSize, track: bool = False):
    """_run on the args in float64 (_widened), the result rounded once to their dtype -> (result, winners)."""
    dtype = args[0].dtype if args else torch.float32
    _, value, won = _run(equation, _widened(args), S, block_size, track)
    return value.to(dtype), won


def _log_forward(equation, args: Sequence[Tensor], block_size: BlockSize) -> Tensor:
    return _rounded_once(equation, args, LogSemiring, block_size)[0]


def _nan_where_all_neg_inf(bound: BoundEquation, output: Tensor, i: int, grad: Tensor) -> Tensor:
    """Operand i's gradient with NaN at every element that enters an output of -inf (every term -inf: softmax's
    denominator 0, as torch.logsumexp's gradient has it)."""
    dead = torch.isneginf(output)
    if not bool(dead.any()):
        return grad
    labels = bound.inputs[i]
    if len(set(labels)) < len(labels):  # (a diagonal: the mark is taken from the full term shape, through max)
        raise NotImplementedError("grad_of_neg_inf=nan with a repeated label: pass grad_of_neg_inf=0.0")
    out = list(bound.output)
    gone = [d for d, lab in enumerate(out) if lab not in labels]
    mark = dead.any(dim=gone) if gone else dead  # over the outputs this operand's element does not name
    kept = [lab for lab in out if lab in labels]
    view = mark.permute([kept.index(lab) for lab in labels if lab in kept]) if kept else mark
    shape = [grad.shape[d] if lab in kept else 1 for d, lab in enumerate(labels)]
    return torch.where(view.reshape(shape).expand(grad.shape), math.nan, grad)


def log_einsum_backward(
    equation: Equation,
    args: Sequence[Tensor],
    needs_grad: Sequence[bool],
    grad: Tensor,
    block_size: BlockSize = AUTOMATIC_BLOCK_SIZE,
    grad_of_neg_inf: float | str = math.nan,
    saved_max: Tensor | None = None,
    saved_sumexpsub: Tensor | None = None,
) -> list[Tensor | None]:
    """The gradients of log_einsum_forward's output, weighted by `grad`: softmax weights of the terms, computed in
    float64 for narrower inputs and returned in the inputs' dtypes. Where every term of an output is -inf,
    ``grad_of_neg_inf`` decides: NaN (the default, as torch.logsumexp) or 0.0. ``saved_max`` / ``saved_sumexpsub``
    are accepted and not needed."""
    if isinstance(grad_of_neg_inf, float):
        if not math.isnan(grad_of_neg_inf) and grad_of_neg_inf != 0.0:
            raise NotImplementedError("setting grad_of_neg_inf to a constant other than 0 is not implemented")
    elif grad_of_neg_inf == "uniform":
        raise NotImplementedError("grad_of_neg_inf='uniform' is not implemented")
    else:
        raise ValueError(f"invalid choice for grad_of_neg_inf: {grad_of_neg_inf}")
    # in float64 for narrower inputs: the softmax weights exp(term - output) then come out correctly rounded, as
    # torch-semiring-einsum's exp(term - max) / sum does (a float32 output of size 12 is off by 1e-6 relative)
    dtypes = [a.dtype for a in args]
    bound, output, grads = _grads(equation, _widened(args), needs_grad, grad.double(), LogSemiring, block_size)
    grads = [g if g is None else g.to(dtype) for g, dtype in zip(grads, dtypes, strict=True)]
    if math.isnan(grad_of_neg_inf):
        grads = [g if g is None else _nan_where_all_neg_inf(bound, output.detach(), i, g) for i, g in enumerate(grads)]
    return grads


class _LogEinsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, equation, block_size, grad_of_neg_inf, *args):
        ctx.equation, ctx.block_size, ctx.grad_of_neg_inf = equation, block_size, grad_of_neg_inf
        ctx.save_for_backward(*args)
        return _log_forward(equation, args, block_size)

    @staticmethod
    def backward(ctx, grad):
        grads = log_einsum_backward(
            ctx.equation, ctx.saved_tensors, ctx.needs_input_grad[3:], grad, ctx.block_size, ctx.grad_of_neg_inf
        )
        return (None, None, None, *grads)


def log_einsum(
    equation: Equation,
    *args: Tensor,
    block_size: BlockSize = AUTOMATIC_BLOCK_SIZE,
    save_max: bool = True,
    save_sumexpsub: bool = True,
    grad_of_neg_inf: float | str = math.nan,
) -> Tensor:
    """Differentiable log-space einsum (log_einsum_forward with log_einsum_backward's gradient)."""
    return _LogEinsum.apply(equation, block_size, grad_of_neg_inf, *args)


# ---------------------------------------------------------------- Viterbi, tropical, Boolean


def log_viterbi_einsum_forward(
    equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE
) -> tuple[Tensor, Tensor]:
    """(max, argmax): addition is (max, argmax), multiplication +. argmax is (*out_shape, k) int64: the value of
    each of the k summed labels at the maximum, the labels in order of first appearance."""
    return _rounded_once(equation, args, MaxSemiring, block_size, track=True)


def max_tropical_einsum_forward(
    equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE
) -> Tensor:
    """Addition is max, multiplication +."""
    return _tropical(equation, args, MaxSemiring, block_size)


def min_tropical_einsum_forward(
    equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE
) -> Tensor:
    """Addition is min, multiplication +."""
    return _tropical(equation, args, MinSemiring, block_size)


def _tropical(equation, args: Sequence[Tensor], S: type[Semiring], block_size: BlockSize) -> Tensor:
    """The max / min of sums, each sum computed in float64 for narrower inputs and rounded once (as the log
    semiring's: a term's value does not depend on the plan's order of additions)."""
    return _rounded_once(equation, args, S, block_size)[0]


def boolean_einsum_forward(equation: Equation, *args: Tensor, block_size: BlockSize = AUTOMATIC_BLOCK_SIZE) -> Tensor:
    """Addition is or, multiplication and: the real einsum of the 0 / 1 values is positive exactly where some
    term holds (sums of non-negative numbers: no rounding turns one to 0), in the args' dtype."""
    dtype = args[0].dtype if args else torch.bool
    counts = _run(equation, [a.to(torch.float32) for a in args], StdSemiring, block_size)[1]
    return (counts > 0).to(dtype)
