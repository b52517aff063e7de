"""Linear chains in torch-struct's LinearChain layout, on the chain engine (structures/chain.py).

Potentials ``edge`` (B, N - 1, C, C): edge[b, n, c, c'] scores label c at position n + 1 after label c' at
position n. A structure of an item of length L is a label sequence z_0 .. z_{L-1}; its score is the semiring
product of edge[b, n, z_{n+1}, z_n]. Under log, max and min the span kernels run it (csrc/chain_dp.h: the
forward and backward recursions side by side, each step's edges staged ahead; the gradient in one pass over the
edges); other semirings of the compiled kernels use ``chain_sum`` (one semiring matrix product per step), and
any other semiring the recursion written with its operations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.span_ops import LINEARCHAIN
from ..semirings import Semiring
from .base import Structure, check_lengths
from .chain import chain_sum
from .fused import span_fast_path, span_gradient, span_totals

__all__ = ["LinearChain"]

MAX_KERNEL_LABELS = 2048  # the CUDA kernel keeps two rows of C labels in shared memory


class LinearChain(Structure):
    """Label sequences (module docstring), generic over the semiring."""

    name = "linear chain"

    @staticmethod
    def check(edge: Tensor, lengths: Tensor | None, lead: int = 0) -> tuple[int, int, int, Tensor]:
        """(B, N, C, lengths (B,) int64 on edge's device), or ValueError naming the argument; ``lead``: the
        semiring value's leading dims, skipped."""
        shape = tuple(edge.shape[lead:]) if isinstance(edge, Tensor) else None
        if shape is None or len(shape) != 4 or shape[2] != shape[3]:
            got = shape if isinstance(edge, Tensor) else type(edge).__name__
            raise ValueError(f"LinearChain: edge must be (B, N - 1, C, C), got {got}")
        B, N1, C, _ = shape
        return B, N1 + 1, C, check_lengths(lengths, B, N1 + 1, edge.device, "LinearChain")

    @staticmethod
    def _fused(edge: Tensor, semiring: type[Semiring]) -> bool:
        return span_fast_path(edge, semiring) and edge.shape[-1] <= MAX_KERNEL_LABELS

    def _fused_gradient(self, edge: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor | None:
        lengths = self.check(edge, lengths, semiring.lead)[-1]
        return span_gradient(edge, lengths, LINEARCHAIN, semiring, False) if self._fused(edge, semiring) else None

    def logpartition(self, edge: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        B, N, C, lengths = self.check(edge, lengths, S.lead)
        N1 = N - 1
        if self._fused(edge, S):
            return span_totals(edge, lengths, LINEARCHAIN, S, False)
        if S.kernel_id is not None and S.lead == 0:  # the four semirings of the compiled kernels
            start = S.ones((B, C), like=edge)
            return chain_sum(start, edge.transpose(-1, -2), None, lengths, S)  # the engine's [from, to]
        alphas = [S.ones((B, C), like=edge)]  # any other semiring: the recursion written with its operations
        for n in range(N1):
            alphas.append(S.sum(S.times(alphas[-1].unsqueeze(-2), edge[..., n, :, :]), -1))
        chart = torch.stack(alphas, -2)  # (..., B, N, C)
        return S.sum(chart[..., torch.arange(B, device=edge.device), lengths - 1, :], -1)
