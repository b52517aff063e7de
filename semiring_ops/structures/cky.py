"""Binary span trees (torch-struct's CKY_CRF / TreeCRF layout), by the CKY inside algorithm.

Potentials ``span`` (B, N, N, NT): span[b, i, j, t] scores the span of words i .. j (inclusive, i <= j)
labelled t; the labels are summed by the semiring first. A structure of an item of length L is a full binary
bracketing of words 0 .. L - 1 (every word a leaf span, the whole item the top span) with a label per span;
its score is the semiring product of its labelled spans' potentials.

    beta[i, i] = s[i, i];   beta[i, j] = ((+)_{i <= k < j} beta[i, k] (x) beta[k + 1, j]) (x) s[i, j];
    total = beta[0, L - 1]      (s[i, j] = (+)_t span[i, j, t])

O(N^3) semiring operations in N steps (each width's spans at once, one dot product over split points on the
span charts of spans.py); memory O(B N^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.span_ops import CKY
from ..semirings import Semiring
from .base import Structure, check_lengths
from .fused import span_fast_path, span_totals
from .spans import SpanChart, at_length

__all__ = ["CKYTree"]


class CKYTree(Structure):
    """The CKY inside algorithm (module docstring), generic over the semiring."""

    name = "binary span tree"

    @staticmethod
    def check(span: Tensor, lengths: Tensor | None, lead: int = 0) -> tuple[int, int, Tensor]:
        """(B, N, lengths (B,) int64 on span's device), or ValueError naming the argument; ``lead``: the semiring
        value's leading dims, skipped."""
        shape = tuple(span.shape[lead:]) if isinstance(span, Tensor) else None
        if shape is None or len(shape) != 4 or shape[1] != shape[2]:
            got = shape if isinstance(span, Tensor) else type(span).__name__
            raise ValueError(f"CKYTree: span must be (B, N, N, NT), got {got}")
        B, N = shape[:2]
        return B, N, check_lengths(lengths, B, N, span.device, "CKYTree")

    def logpartition(self, span: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        _, _, lengths = self.check(span, lengths, S.lead)
        return self.inside(S.sum(span, -1), lengths, S)

    def inside(self, s: Tensor, lengths: Tensor, semiring: type[Semiring]) -> Tensor:
        """The semiring sum (*lead, B) over the trees of label-summed span scores ``s`` (*lead, B, N, N), lengths
        (B,) int64: the fused kernel when one serves the semiring (fused.py), else the program below."""
        S = semiring
        if span_fast_path(s, S):
            return span_totals(s, lengths, CKY, S, False)
        B, N = s.shape[-3], s.shape[-1]
        beta = SpanChart(S, (B,), N, s)  # beta[i, i + w]
        beta.set_width0(torch.diagonal(s, 0, -2, -1))
        for w in range(1, N):  # k = i + j: beta[i, k] (x) beta[k + 1, i + w]
            splits = S.dot(beta.by_start(w, 0, w), beta.by_end(w, 0, w).flip(-1))
            beta.write(w, S.times(splits, torch.diagonal(s, w, -2, -1)))
        return at_length(beta.start[..., 0, :], lengths - 1)  # beta[0, L - 1]
