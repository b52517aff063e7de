"""Span charts for the inside algorithms over spans (Eisner's, CKY): each chart kept twice, by (start, width)
and by (end, width), so that a width's sums over split points read contiguous slices.

For a span of width w starting at s (ending at t = s + w), the split terms X[s, s + j] are ``by_start`` row s,
columns j, and the terms Y[s + j, t] are ``by_end`` row t, columns w - j (reversed by a flip): one semiring dot
product per width computes every span of that width, and the result is written to both layouts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring

__all__ = ["SpanChart", "at_length"]


class SpanChart:
    """Values (*lead, *batch, P, P) of the spans over P positions, by start [.., s, w] and by end [.., t, w]; the
    semiring's zero where nothing is written."""

    def __init__(self, semiring: type[Semiring], batch: tuple[int, ...], positions: int, like: Tensor) -> None:
        self.positions = positions
        self.start = semiring.zeros((*batch, positions, positions), like=like)
        self.end = semiring.zeros((*batch, positions, positions), like=like)

    def set_width0(self, values: Tensor) -> None:
        """Spans of width 0 (single positions): values (*lead, *batch, P)."""
        self.start[..., :, 0] = values
        self.end[..., :, 0] = values

    def write(self, width: int, values: Tensor) -> None:
        """The spans of ``width``: values (*lead, *batch, P - width) by start."""
        n = self.positions - width
        self.start[..., :n, width] = values
        self.end[..., width:, width] = values

    def by_start(self, width: int, lo: int, hi: int) -> Tensor:
        """(*lead, *batch, P - width, hi - lo): for each span of ``width`` (by start s), X[s, s + j], j in [lo, hi)."""
        return self.start[..., : self.positions - width, lo:hi]

    def by_end(self, width: int, lo: int, hi: int) -> Tensor:
        """(*lead, *batch, P - width, hi - lo): for each span of ``width`` (by start s, ending at t = s + width), the
        spans of widths lo .. hi - 1 ending at t."""
        return self.end[..., width:, lo:hi]


def at_length(values: Tensor, lengths: Tensor) -> Tensor:
    """values[..., b, lengths[b]] for values (*lead, B, M) and lengths (B,) -> (*lead, B)."""
    return values[..., torch.arange(lengths.shape[0], device=values.device), lengths]
