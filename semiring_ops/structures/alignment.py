"""Monotone alignments of two sequences (torch-struct's AlignmentCRF potentials): Needleman-Wunsch (global)
or Smith-Waterman (local), optionally banded.

Potentials ``match`` (B, N, M, 3): match[b, i, j, op] scores entering cell (i, j) by op 0 from (i, j - 1)
(a skip in the first sequence), op 1 from (i - 1, j - 1) (a match) or op 2 from (i - 1, j) (a skip in the
second). A global alignment of an item whose first sequence has length L is a path of cells from (0, 0) to
(L - 1, M - 1) by those moves, its first cell entered by op 1; a local one starts (by op 1) and ends at any
cells. Its score: the semiring product of the potentials of the ops that enter its cells. ``max_gap``: cells
with |i - j| > max_gap are not allowed (a band).

    alpha[i, j] = (alpha[i, j - 1] (x) m[i, j, 0]) (+) (alpha[i - 1, j - 1] (x) m[i, j, 1])
                  (+) (alpha[i - 1, j] (x) m[i, j, 2])
    with alpha[-1, -1] = one (local: one before every cell);
    total = alpha[L - 1, M - 1] (local: (+) of every cell)

One step per anti-diagonal i + j (all its cells at once): N + M - 1 steps, memory O(B N M). Under log, max and
min a fused kernel runs the recursion and its adjoint in one launch each (csrc/alignment_dp.h through
structures/fused.py), the band applied first as the semiring's zero outside it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.span_ops import ALIGNMENT
from ..semirings import Semiring
from .base import Structure, check_lengths
from .fused import span_fast_path, span_gradient, span_totals
from .spans import at_length

__all__ = ["Alignment"]


class Alignment(Structure):
    """The alignment dynamic program (module docstring), generic over the semiring."""

    name = "alignment"

    def __init__(self, local: bool = False, max_gap: int | None = None) -> None:
        if max_gap is not None and (isinstance(max_gap, bool) or not isinstance(max_gap, int) or max_gap < 0):
            raise ValueError(f"Alignment: max_gap must be None or an int >= 0, got {max_gap!r}")
        self.local, self.max_gap = local, max_gap

    @staticmethod
    def check(match: Tensor, lengths: Tensor | None, lead: int = 0) -> tuple[int, int, int, Tensor]:
        """(B, N, M, lengths (B,) int64 on match's device), or ValueError naming the argument; ``lead``: the
        semiring value's leading dims, skipped."""
        shape = tuple(match.shape[lead:]) if isinstance(match, Tensor) else None
        if shape is None or len(shape) != 4 or shape[3] != 3:
            got = shape if isinstance(match, Tensor) else type(match).__name__
            raise ValueError(f"Alignment: match must be (B, N, M, 3), got {got}")
        B, N, M, _ = shape
        if N < 1 or M < 1:
            raise ValueError(f"Alignment: match must have N, M >= 1, got {shape}")
        return B, N, M, check_lengths(lengths, B, N, match.device, "Alignment")

    def _banded(self, match: Tensor, semiring: type[Semiring]) -> Tensor:
        """``match`` with the semiring's zero at the cells outside the band (as it is without one)."""
        if self.max_gap is None:
            return match
        i = torch.arange(match.shape[1], device=match.device)[:, None]
        j = torch.arange(match.shape[2], device=match.device)[None, :]
        outside = ((i - j).abs() > self.max_gap)[:, :, None]
        return match.masked_fill(outside, semiring.zero)

    def _fused_gradient(self, match: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor | None:
        lengths = self.check(match, lengths, semiring.lead)[-1]
        if not span_fast_path(match, semiring):
            return None
        return span_gradient(self._banded(match, semiring), lengths, ALIGNMENT, semiring, self.local)

    def logpartition(self, match: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        B, N, M, lengths = self.check(match, lengths, S.lead)
        if span_fast_path(match, S):
            return span_totals(self._banded(match, S), lengths, ALIGNMENT, S, self.local)
        i = torch.arange(N, device=match.device)
        zero, one, zero_row = S.zeros((B, N), like=match), S.ones((B, N), like=match), S.zeros((B, 1), like=match)

        def shift(a: Tensor) -> Tensor:  # row i takes row i - 1's value (row 0: zero)
            return torch.cat([zero_row, a[..., :-1]], -1)

        prev2, prev1, diagonals = zero, zero, []
        for d in range(N + M - 1):
            j = d - i
            ok = (j >= 0) & (j < M)
            if self.max_gap is not None:
                ok = ok & ((i - j).abs() <= self.max_gap)
            m = S.mask(ok[:, None], match[..., i, j.clamp(0, M - 1), :])  # (..., B, N, 3): row i, column d - i
            start = one if self.local else (one if d == 0 else zero)  # alpha[-1, -1] = one before (0, 0)
            terms = [
                S.times(prev1, m[..., 0]),  # from (i, j - 1)
                S.times(shift(prev2) if d else start, m[..., 1]),  # from (i - 1, j - 1)
                S.times(shift(prev1), m[..., 2]),  # from (i - 1, j)
            ]
            if self.local and d:
                terms.append(S.times(start, m[..., 1]))
            cur = S.sum(torch.stack(terms, -1), -1)
            diagonals.append(cur)
            prev2, prev1 = prev1, cur
        chart = torch.stack(diagonals, -2)  # (..., B, N + M - 1, N): [diagonal, row]
        if self.local:
            live = i[None, :] < lengths[:, None]  # (B, N): rows within the first sequence's length
            return S.sum(S.mask(live[:, None, :], chart).flatten(-2), -1)
        batch = torch.arange(B, device=match.device)
        at_end = chart[..., batch, lengths - 1 + M - 1, :]  # (..., B, N): the last diagonal of each item
        return at_length(at_end, lengths - 1)
