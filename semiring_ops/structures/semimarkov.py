"""Semi-Markov CRF (torch-struct's SemiMarkov layout): segmentations of a sequence into labelled segments.

Potentials ``edge`` (B, N - 1, K, C, C): edge[b, n, k, c, c'] scores a segment boundary at position n with
label c' followed by the next boundary at n + k with label c (1 <= k < K; k = 0 is never used). A structure is
a chain of boundaries 0 = p_0 < p_1 < ... < p_m = L - 1 (L: the item's length, default N) with gaps below K and
a label z_i at each; its score is the semiring product of edge[b, p_{i-1}, p_i - p_{i-1}, z_i, z_{i-1}].

    beta[0, c] = one;  beta[n, c] = (+)_{1 <= k < K, k <= n} (+)_{c'} beta[n - k, c'] (x) edge[n - k, k, c, c']
    total = (+)_c beta[L - 1, c]

One semiring matrix-vector product per position (all K durations at once), on the semiring kernels; under log,
max and min a fused kernel runs the whole recursion and its adjoint in one launch each (structures/fused.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.span_ops import SEMIMARKOV
from ..semirings import Semiring
from .base import Structure, check_lengths
from .fused import span_fast_path, span_gradient, span_totals

__all__ = ["SemiMarkov"]


class SemiMarkov(Structure):
    """The semi-Markov dynamic program (module docstring), generic over the semiring."""

    name = "semi-Markov"

    @staticmethod
    def check(edge: Tensor, lengths: Tensor | None, lead: int = 0) -> tuple[int, int, int, int, Tensor]:
        """(B, N, K, C, lengths (B,) int64 on edge's device), or ValueError naming the argument; ``lead``: the
        semiring value's leading dims, skipped."""
        shape = tuple(edge.shape[lead:]) if isinstance(edge, Tensor) else None
        if shape is None or len(shape) != 5 or shape[3] != shape[4]:
            got = shape if isinstance(edge, Tensor) else type(edge).__name__
            raise ValueError(f"SemiMarkov: edge must be (B, N - 1, K, C, C), got {got}")
        B, N1, K, C, _ = shape
        N = N1 + 1
        if K < 2:
            raise ValueError(f"SemiMarkov: edge's K = {K}: segments need K >= 2 (lengths 1 .. K - 1)")
        return B, N, K, C, check_lengths(lengths, B, N, edge.device, "SemiMarkov")

    def _fused_gradient(self, edge: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor | None:
        lengths = self.check(edge, lengths, semiring.lead)[-1]
        return span_gradient(edge, lengths, SEMIMARKOV, semiring, False) if span_fast_path(edge, semiring) else None

    def logpartition(self, edge: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        B, N, K, C, lengths = self.check(edge, lengths, S.lead)
        if span_fast_path(edge, S):
            return span_totals(edge, lengths, SEMIMARKOV, S, False)
        beta = [S.ones((B, C), like=edge)]
        for n in range(1, N):
            ks = torch.arange(1, min(K - 1, n) + 1, device=edge.device)  # durations ending at n
            prev = torch.stack([beta[n - int(k)] for k in ks], -2)  # (..., B, k, C')
            e = edge[..., n - ks, ks, :, :]  # (..., B, k, C, C'): [c, c']
            beta.append(S.sum(S.matmul(e, prev.unsqueeze(-1)).squeeze(-1), -2))  # (..., B, C)
        chart = torch.stack(beta, -2)  # (..., B, N, C)
        return S.sum(chart[..., torch.arange(B, device=edge.device), lengths - 1, :], -1)
