"""Einsum in a semiring given by callbacks (torch-semiring-einsum's extension API), on a blocked PyTorch engine.

``semiring_einsum_forward(equation, args, block_size, func)`` calls ``func(compute_sum)``; ``compute_sum(add_in_place,
sum_block, multiply_in_place, include_indexes=False, output_dtypes=(None,))`` runs one pass over the terms:

  for each block of values of the summed labels (a range per label, in order of first appearance):
      term = the operands, each indexed by the block and laid out as (output labels..., summed labels...),
             combined with multiply_in_place (the first one copied to the block's full shape);
      part = sum_block(term, dims of the summed labels[, the block's ranges])
      result = part for the first block, else add_in_place(result, part)

The blocks hold at most the budget ``block_size`` stands for (blocks.py): memory stays within the operands, the
output and one block whatever the equation. This is the path for semirings without a fused kernel; the built-in
ones (__init__.py) run on semiring_ops.einsum's planned, fused contractions instead.

``combine(forward, backward)`` makes an autograd function of a forward and its backward, as in
torch-semiring-einsum.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .blocks import AutomaticBlockSize, Equation, budget_bytes

__all__ = ["combine", "semiring_einsum_forward"]


def _bits(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 8
    try:
        return torch.finfo(dtype).bits
    except TypeError:
        return torch.iinfo(dtype).bits


def _block_sizes(sizes: Sequence[int], elements: int) -> list[int]:
    """Block sizes, one per summed label, whose product stays within `elements`: the smallest labels whole first,
    then as much of the next as fits, the rest 1."""
    blocks = [1] * len(sizes)
    product = 1
    for d in sorted(range(len(sizes)), key=lambda d: sizes[d]):
        if product * sizes[d] <= elements:
            blocks[d] = max(1, sizes[d])
            product *= max(1, sizes[d])
        else:
            blocks[d] = max(1, elements // product)
            break
    return blocks


def _layout(arg: Tensor, labels: Sequence[str], order: Sequence[str]) -> tuple[Tensor, list[int]]:
    """arg viewed as (order...) with size-1 dimensions for the labels it lacks -> (view, its dim per label in order
    or -1 when absent)."""
    present = [lab for lab in order if lab in labels]
    view = arg.permute([labels.index(lab) for lab in present]) if labels else arg
    shape, where, k = [], [], 0
    for lab in order:
        if lab in labels:
            shape.append(view.shape[k])
            where.append(len(shape) - 1)
            k += 1
        else:
            shape.append(1)
            where.append(-1)
    return view.reshape(shape), where


def semiring_einsum_forward(
    equation: Equation,
    args: Sequence[Tensor],
    block_size: int | AutomaticBlockSize,
    func: Callable,
):
    """Calls ``func(compute_sum)`` and returns what it returns (the module docstring says what compute_sum does)."""
    if isinstance(equation, str):
        equation = Equation(equation)
    args = list(args)
    bound = equation.bind(args)
    operands = []
    for arg, labels in zip(args, bound.inputs, strict=True):
        labels = list(labels)
        while len(set(labels)) < len(labels):  # a repeated label: its diagonal
            label = next(lab for i, lab in enumerate(labels) if lab in labels[:i])
            first, second = labels.index(label), len(labels) - 1 - labels[::-1].index(label)
            arg = torch.diagonal(arg, dim1=first, dim2=second)
            labels = [lab for d, lab in enumerate(labels) if d not in (first, second)] + [label]
        operands.append((arg, labels))
    order = [*bound.output, *bound.summed]
    out_sizes = [bound.sizes[lab] for lab in bound.output]
    summed_sizes = [bound.sizes[lab] for lab in bound.summed]
    reduced_dims = tuple(range(len(bound.output), len(order)))
    views = [_layout(arg, labels, order) for arg, labels in operands]

    def compute_sum(add_in_place, sum_block, multiply_in_place, include_indexes=False, output_dtypes=(None,)):
        dtype = args[0].dtype if args else torch.float32
        out_bytes = sum(_bits(dtype if d is None else d) // 8 for d in output_dtypes)
        budget = budget_bytes(block_size, bound, args, out_bytes)
        per_term = max(1, math.prod(out_sizes)) * (_bits(dtype) // 8)
        blocks = _block_sizes(summed_sizes, max(1, budget // per_term))
        ranges = [
            [range(lo, min(lo + b, size)) for lo in range(0, size, b)] or [range(0, 0)]
            for size, b in zip(summed_sizes, blocks, strict=True)
        ]
        result = None
        for values in itertools.product(*ranges) if ranges else [()]:
            term = None
            for view, where in views:
                index = [slice(None)] * view.dim()
                for s, d in enumerate(where[len(bound.output) :]):
                    if d >= 0 and view.shape[d] != 1:
                        index[d] = slice(values[s].start, values[s].stop)
                factor = view[tuple(index)]
                if term is None:
                    shape = [*out_sizes, *(len(r) for r in values)]
                    term = factor.expand(shape).clone()
                else:
                    multiply_in_place(term, factor)
            if term is None:  # no operand: the empty product is not defined by the callbacks
                raise ValueError("einsum needs at least one operand")
            part = sum_block(term, reduced_dims, values) if include_indexes else sum_block(term, reduced_dims)
            if result is None:
                result = part
            else:
                add_in_place(result, part)
        return result

    return func(compute_sum)


def combine(
    forward: Callable,
    backward: Callable,
    forward_options: tuple[str, ...] = (),
    backward_options: tuple[str, ...] = (),
) -> Callable:
    """An autograd function ``f(equation, *args, block_size, **options)`` of ``forward(equation, *args, block_size,
    ...)`` and ``backward(equation, args, needs_grad, grad, block_size, ...)`` (which returns one gradient per
    argument, None where not needed); ``forward_options`` / ``backward_options`` name the keyword arguments each
    takes."""

    class EinsumFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, equation, forward_kwargs, backward_kwargs, *args):
            ctx.equation, ctx.backward_kwargs = equation, backward_kwargs
            ctx.save_for_backward(*args)
            return forward(equation, *args, **forward_kwargs)

        @staticmethod
        def backward(ctx, grad):
            grads = backward(ctx.equation, ctx.saved_tensors, ctx.needs_input_grad[3:], grad, **ctx.backward_kwargs)
            return (None, None, None, *grads)

    def apply(equation, *args, block_size, **kwargs):
        forward_kwargs = {k: kwargs.pop(k) for k in forward_options if k in kwargs}
        backward_kwargs = {k: kwargs.pop(k) for k in backward_options if k in kwargs}
        if kwargs:
            raise TypeError(f"got an unexpected keyword argument {next(iter(kwargs))!r}")
        forward_kwargs["block_size"] = backward_kwargs["block_size"] = block_size
        return EinsumFunction.apply(equation, forward_kwargs, backward_kwargs, *args)

    return apply
