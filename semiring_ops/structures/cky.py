"""Binary span trees (torch-struct's CKY_CRF / TreeCRF layout), by the CKY inside algorithm.

Potentials ``span`` (B, N, N, NT): span[b, i, j, t] scores the span of words i .. j (inclusive, i <= j)
labelled t; the labels are summed by the semiring first. A structure of an item of length L is a full binary
bracketing of words 0 .. L - 1 (every word a leaf span, the whole item the top span) with a label per span;
its score is the semiring product of its labelled spans' potentials.

    beta[i, i] = s[i, i];   beta[i, j] = ((+)_{i <= k < j} beta[i, k] (x) beta[k + 1, j]) (x) s[i, j];
    total = beta[0, L - 1]      (s[i, j] = (+)_t span[i, j, t])

O(N^3) semiring operations, each width's spans at once; memory O(B N^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring
from .base import Structure, check_lengths

__all__ = ["CKYTree"]


class CKYTree(Structure):
    """The CKY inside algorithm (module docstring), generic over the semiring."""

    name = "binary span tree"

    @staticmethod
    def check(span: Tensor, lengths: Tensor | None) -> tuple[int, int, Tensor]:
        """(B, N, lengths (B,) int64 on span's device), or ValueError naming the argument."""
        if not isinstance(span, Tensor) or span.dim() != 4 or span.shape[1] != span.shape[2]:
            got = tuple(span.shape) if isinstance(span, Tensor) else type(span).__name__
            raise ValueError(f"CKYTree: span must be (B, N, N, NT), got {got}")
        B, N = span.shape[:2]
        return B, N, check_lengths(lengths, B, N, span.device, "CKYTree")

    def logpartition(self, span: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        _, N, lengths = self.check(span, lengths)
        s = S.sum(span, -1)  # (B, N, N)
        beta = [torch.diagonal(s, 0, 1, 2)]  # [width] -> (B, N - width): spans i .. i + width
        for w in range(1, N):
            n = N - w
            splits = torch.stack([S.times(beta[k][:, :n], beta[w - 1 - k][:, k + 1 : k + 1 + n]) for k in range(w)])
            beta.append(S.times(S.sum(splits, 0), torch.diagonal(s, w, 1, 2)))
        tops = torch.stack([beta[w][:, 0] for w in range(N)], 1)  # (B, N): the span 0 .. L - 1
        return tops.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
