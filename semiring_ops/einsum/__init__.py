"""Semiring einsum: any contraction over any semiring, planned, on the fused semiring matmul kernels.

    import semiring_ops as so
    so.einsum("bik,bkj->bij", a, b, semiring="log")            # logsumexp_k a[b,i,k] + b[b,k,j]
    so.einsum("ai,ij,jk->ak", x, W1, W2, semiring="max")       # Viterbi through two matrices, best order
    v, arg = so.einsum("ij,jk->ik", x, y, semiring="max", return_argmax=True)   # arg[..., 0]: the best j

docs/einsum.md has the grammar, the planner, the numerics and the drop-in for torch-semiring-einsum
(semiring_ops.semiring_einsum).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring, resolve_semiring
from .equation import bind, bind_cached, parse
from .execute import contract

__all__ = ["einsum"]


def _check_operands(source: str, operands: tuple) -> None:
    for i, t in enumerate(operands):
        if not isinstance(t, Tensor):
            raise TypeError(f"einsum: equation {source!r}: operand {i} is a {type(t).__name__}, not a Tensor")
    if not operands:
        raise ValueError(f"einsum: equation {source!r}: no operands")
    first = operands[0]
    for i, t in enumerate(operands):
        if t.device != first.device:
            raise ValueError(
                f"einsum: equation {source!r}: operands on different devices: operand 0 on {first.device}, "
                f"operand {i} on {t.device}"
            )
        if not t.is_floating_point():
            raise TypeError(
                f"einsum: equation {source!r}: operand {i} has dtype {t.dtype}; semiring einsum takes floating "
                f"tensors (float16, bfloat16, float32, float64)"
            )
        if t.dtype != first.dtype:
            raise TypeError(
                f"einsum: equation {source!r}: operands of different dtypes: operand 0 is {first.dtype}, "
                f"operand {i} is {t.dtype}"
            )


def einsum(
    equation: str,
    *operands: Tensor,
    semiring: str | type[Semiring] = "log",
    memory: int | None = None,
    return_argmax: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """out[output labels] = (+)_{summed labels} (x)_operands operand[its labels], in a semiring.

    Args:
        equation: torch.einsum's grammar: "bik,bkj->bij", an implicit output ("ij,jk"), "..." for unlabelled
            dimensions, a label repeated within an operand for its diagonal; sizes broadcast (equal, or 1).
        operands: floating tensors of one dtype and device, any strides.
        semiring: "log" (logsumexp, +), "max" (max, +), "min" (min, +), "std" (+, x), or a Semiring subclass
            (one without compiled kernels runs on the blocked PyTorch path).
        memory: a budget in bytes for the intermediates: the planner takes an order whose intermediates fit
            when there is one (docs/einsum.md).
        return_argmax: max / min only: also return, for each output cell, the winning value of every summed
            label, (*out_shape, number of summed labels) int64, the labels in order of first appearance (the
            layout of torch-semiring-einsum's log_viterbi_einsum_forward).

    Returns:
        The result in the operands' dtype, or (result, argmax). 16-bit operands accumulate in float32 within each
        pairwise step (semiring_matmul's kernels) and each intermediate is rounded to their dtype, as torch.einsum
        does; under torch.autocast the log / max / min steps run in float32.
        A summed label of size 0 gives the semiring's zero. Differentiable: log and std to second order;
        max / min route the gradient to the winning terms (the first of ties, within each pairwise step).
    """
    S = resolve_semiring(semiring)
    compiling = torch.compiler.is_compiling()
    parsed = (parse.__wrapped__ if compiling else parse)(equation)  # (dynamo: no lru_cache)
    _check_operands(equation, operands)
    if return_argmax and not S.selects:
        raise ValueError(f"einsum: return_argmax needs a selecting semiring (max, min), got {S.name!r}")
    if memory is not None and (not isinstance(memory, int) or memory <= 0):
        raise ValueError(f"einsum: memory must be a positive number of bytes, got {memory!r}")
    shapes = tuple([tuple(t.shape) for t in operands])
    bound = bind(parsed, shapes) if compiling else bind_cached(parsed, shapes)
    budget = None if memory is None else max(1, memory // operands[0].element_size())
    value, arg = contract(bound, operands, S, track=return_argmax, budget_elements=budget)
    return (value, arg) if return_argmax else value
