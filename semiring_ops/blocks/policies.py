"""Per-operation policies of the block engine (engine.BlockPolicy): the output's size, the operand bytes a block
needs, and how one block is computed on a device with the library's existing kernels. Adding an operation
to the engine is adding a policy here.
"""

from __future__ import annotations

from typing import Any

import torch

from ..lazy.autograd import Extent, evaluate_dense
from ..lazy.formula import Formula, Var, substitute, variables
from .scheduler import Block

__all__ = ["LazyDensePolicy", "MatmulPolicy"]


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device, non_blocking=True)


class LazyDensePolicy:
    """The values of a lazy formula (a LazyTensor's) at every (i, j): a block is the formula with its i
    variables' rows [r0, r1) and its j variables' rows [c0, c1), evaluated densely (lazy.autograd's
    evaluate_dense) on the device. Parameters are uploaded once per device; the i / j rows of a block are
    uploaded with it, so operands need not fit the device whole."""

    def __init__(self, formula: Formula, m: int, n: int, dtype: torch.dtype) -> None:
        self.formula, self.m, self.n, self.dtype = formula, m, n, dtype
        self.value_dim = formula.dim
        tensors = [v for v in variables(formula) if v.tensor is not None]
        elem = torch.empty((), dtype=dtype).element_size()
        # one upload per (category, tensor), however often it is used (Vi(x) and Vj(x): two, rows and columns)
        self._vars = {(v.cat, id(v.tensor)): v for v in tensors}
        self.operand_row_bytes = elem * sum(v.dim for v in self._distinct("i"))
        self.operand_col_bytes = elem * sum(v.dim for v in self._distinct("j"))

    def _distinct(self, cat: str) -> list[Var]:
        return [v for v in self._vars.values() if v.cat == cat]

    def prepare(self, device: torch.device) -> dict[tuple[str, int], torch.Tensor]:
        return {key: _to(v.tensor, device) for key, v in self._vars.items() if v.cat == "p"}

    def compute(self, state: dict[tuple[str, int], torch.Tensor], block: Block, device: torch.device) -> torch.Tensor:
        sliced: dict[tuple[str, int], torch.Tensor] = dict(state)
        for key, v in self._vars.items():
            if v.cat == "i":
                sliced[key] = _to(v.tensor[block.r0 : block.r1], device)
            elif v.cat == "j":
                sliced[key] = _to(v.tensor[block.c0 : block.c1], device)
        part = substitute(self.formula, lambda v: Var(v.cat, v.dim, tensor=sliced[(v.cat, id(v.tensor))]))
        like = torch.empty(0, dtype=self.dtype, device=device)
        values = evaluate_dense(part, Extent((), block.rows, block.cols), like)  # (rows, cols, D)
        return values[..., 0] if self.value_dim == 1 else values


class MatmulPolicy:
    """A semiring product C = A (x) B of a (m, k) and b (k, n): a block is
    ``semiring_matmul(a[r0:r1], b[:, c0:c1], semiring)`` on the device (rows of a and columns of b uploaded
    with each block unless the operand is on that device already; a host b is transposed once, so a block's
    columns are one contiguous upload)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, semiring: Any) -> None:
        self.a, self.b, self.semiring = a, b, semiring
        self.m, self.n, self.dtype, self.value_dim = a.shape[0], b.shape[1], a.dtype, 1
        elem = a.element_size()
        self.operand_row_bytes = a.shape[1] * elem
        self.operand_col_bytes = b.shape[0] * elem
        # a host b transposed once, so that a block's columns are one contiguous slice to upload
        self._bt = b.t().contiguous() if b.device.type == "cpu" else None

    def prepare(self, device: torch.device) -> None:
        return None

    def compute(self, state: None, block: Block, device: torch.device) -> torch.Tensor:
        from ..ops.matmul import semiring_matmul

        a = _to(self.a[block.r0 : block.r1], device)
        cols = self._bt[block.c0 : block.c1] if self._bt is not None else self.b[:, block.c0 : block.c1].t()
        b = _to(cols, device).t()  # (k, cols), strided: the kernels take any strides
        return semiring_matmul(a, b, self.semiring)
