"""Projective dependency trees (torch-struct's DepTree layout), by Eisner's inside algorithm.

Potentials ``arc`` (B, N, N), or (B, N, N, labels) summed over the labels first: arc[b, h, m] scores word h
heading word m (h != m), arc[b, m, m] scores the root heading m. A structure of an item of length L is a
projective tree over the root and words 0 .. L - 1: every word one head, no crossing arcs (the root counted at
the far left); ``multiroot=False`` allows one child of the root only. Its score: the semiring product of its
arcs' potentials.

Eisner's charts over positions 0 (the root) .. N, by span width w and start s (t = s + w), for complete (C)
and incomplete (I) spans headed at their left (->) or right (<-) end:

    inner   = (+)_{s <= r < t} C->[s, r] (x) C<-[r + 1, t]
    I<-[s, t] = inner (x) arc(t -> s);   I->[s, t] = inner (x) arc(s -> t)
    C<-[s, t] = (+)_{s <= r < t} C<-[s, r] (x) I<-[r, t];   C->[s, t] = (+)_{s < r <= t} I->[s, r] (x) C->[r, t]
    total   = C->[0, L]   (one root child: (+)_r C<-[1, r] (x) arc(root -> r) (x) C->[r, L])

Each chart is kept twice, by (start, width) and by (end, width) (spans.py), so every width's sums over split
points are one semiring dot product over contiguous slices: O(N) steps of O(B N^2) work, memory O(B N^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.span_ops import EISNER
from ..semirings import Semiring
from .base import Structure, check_lengths
from .fused import span_fast_path, span_totals
from .spans import SpanChart, at_length
from .tree_check import dependency_trees

__all__ = ["DependencyTree"]


class DependencyTree(Structure):
    """Eisner's algorithm (module docstring), generic over the semiring. ``multiroot``: whether the root may
    head several words (torch-struct's DependencyCRF default: True)."""

    name = "projective dependency tree"

    def __init__(self, multiroot: bool = True) -> None:
        self.multiroot = multiroot

    @staticmethod
    def check(arc: Tensor, lengths: Tensor | None, lead: int = 0) -> tuple[int, int, Tensor]:
        """(B, N, lengths (B,) int64 on arc's device), or ValueError naming the argument; ``lead``: the semiring
        value's leading dims, skipped."""
        shape = tuple(arc.shape[lead:]) if isinstance(arc, Tensor) else None
        if shape is None or len(shape) not in (3, 4) or shape[1] != shape[2]:
            got = shape if isinstance(arc, Tensor) else type(arc).__name__
            raise ValueError(f"DependencyTree: arc must be (B, N, N) or (B, N, N, labels), got {got}")
        B, N = shape[:2]
        return B, N, check_lengths(lengths, B, N, arc.device, "DependencyTree")

    @staticmethod
    def _with_root(arc: Tensor, S: type[Semiring]) -> Tensor:
        """(..., B, N + 1, N + 1): position 0 the root (its arcs from arc's diagonal), words 1 .. N; arcs into the
        root and self-arcs the semiring zero."""
        N = arc.shape[-1]
        eye = torch.eye(N, dtype=torch.bool, device=arc.device)
        words = S.mask(~eye, arc)  # (..., B, N, N)
        root = torch.diagonal(arc, dim1=-2, dim2=-1).unsqueeze(-2)  # (..., B, 1, N)
        full = S.zeros((*arc.shape[S.lead : -2], N + 1, N + 1), like=arc)
        full[..., :1, 1:] = root
        full[..., 1:, 1:] = words
        return full

    def support(self, parts: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B,) bool: whether ``parts`` (B, N, N) or (B, N, N, labels) are a projective tree (tree_check.py)."""
        _, _, lengths = self.check(parts, lengths)
        arcs = parts.sum(-1) if parts.dim() == 4 else parts
        return dependency_trees(arcs, lengths, self.multiroot, projective=True)

    def logpartition(self, arc: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        _, _, lengths = self.check(arc, lengths, S.lead)
        if arc.dim() - S.lead == 4:
            arc = S.sum(arc, -1)
        return self.inside(arc, lengths, S)

    def inside(self, arc: Tensor, lengths: Tensor, semiring: type[Semiring]) -> Tensor:
        """The semiring sum (*lead, B) over the trees of label-summed ``arc`` (*lead, B, N, N), lengths (B,) int64:
        the fused kernel when one serves the semiring (fused.py), else Eisner's program below."""
        S = semiring
        if span_fast_path(arc, S):
            return span_totals(arc, lengths, EISNER, S, self.multiroot)
        B, N = arc.shape[-3], arc.shape[-1]
        full = self._with_root(arc, S)
        cl, cr, il, ir = (SpanChart(S, (B,), N + 1, arc) for _ in range(4))
        cl.set_width0(S.ones((B, N + 1), like=arc))
        cr.set_width0(S.ones((B, N + 1), like=arc))
        for w in range(1, N + 1):
            inner = S.dot(cr.by_start(w, 0, w), cl.by_end(w, 0, w).flip(-1))  # r = s + j: C->[s, r], C<-[r + 1, t]
            il.write(w, S.times(inner, torch.diagonal(full, -w, -2, -1)))  # head t = s + w, modifier s
            ir.write(w, S.times(inner, torch.diagonal(full, w, -2, -1)))  # head s, modifier t
            cl.write(w, S.dot(cl.by_start(w, 0, w), il.by_end(w, 1, w + 1).flip(-1)))  # C<-[s, s + j], I<-[s + j, t]
            cr.write(w, S.dot(ir.by_start(w, 1, w + 1), cr.by_end(w, 0, w).flip(-1)))  # I->[s, s + j], C->[s + j, t]
        if self.multiroot:
            return at_length(cr.start[..., 0, :], lengths)  # C->[0, L]
        # one root child r in 1 .. L: C<-[1, r] (width r - 1) (x) arc(root -> r) (x) C->[r, L] (width L - r)
        left = S.times(cl.start[..., 1, :N], full[..., 0, 1:])  # (..., B, N) over r = 1 .. N
        r = torch.arange(1, N + 1, device=arc.device)
        width = (lengths[:, None] - r).clamp(min=0)  # (B, N)
        ends = cr.end[..., torch.arange(B, device=arc.device), lengths, :]  # (..., B, N + 1): C->[., L] by width
        right = ends.gather(-1, width.expand(*ends.shape[:-1], N))
        return S.sum(S.mask(r <= lengths[:, None], S.times(left, right)), -1)
