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

O(N^3) semiring operations, each width's spans at once; memory O(B N^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring
from .base import Structure, check_lengths

__all__ = ["DependencyTree"]


class DependencyTree(Structure):
    """Eisner's algorithm (module docstring), generic over the semiring. ``multiroot``: whether the root may
    head several words (torch-struct's DependencyCRF default: True)."""

    name = "projective dependency tree"

    def __init__(self, multiroot: bool = True) -> None:
        self.multiroot = multiroot

    @staticmethod
    def check(arc: Tensor, lengths: Tensor | None) -> tuple[int, int, Tensor]:
        """(B, N, lengths (B,) int64 on arc's device), or ValueError naming the argument."""
        if not isinstance(arc, Tensor) or arc.dim() not in (3, 4) or arc.shape[1] != arc.shape[2]:
            got = tuple(arc.shape) if isinstance(arc, Tensor) else type(arc).__name__
            raise ValueError(f"DependencyTree: arc must be (B, N, N) or (B, N, N, labels), got {got}")
        B, N = arc.shape[:2]
        return B, N, check_lengths(lengths, B, N, arc.device, "DependencyTree")

    @staticmethod
    def _with_root(arc: Tensor, S: type[Semiring]) -> Tensor:
        """(B, N + 1, N + 1): position 0 the root (its arcs from arc's diagonal), words 1 .. N; arcs into the
        root and self-arcs the semiring zero."""
        B, N = arc.shape[:2]
        eye = torch.eye(N, dtype=torch.bool, device=arc.device)
        zero = torch.full((), S.zero, dtype=arc.dtype, device=arc.device)
        words = torch.where(eye, zero, arc)  # (B, N, N)
        root = torch.diagonal(arc, dim1=1, dim2=2).unsqueeze(1)  # (B, 1, N)
        top = torch.cat([zero.expand(B, 1, 1), root], 2)  # (B, 1, N + 1)
        rest = torch.cat([zero.expand(B, N, 1), words], 2)  # (B, N, N + 1)
        return torch.cat([top, rest], 1)

    def logpartition(self, arc: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        S = semiring
        B, N, lengths = self.check(arc, lengths)
        if arc.dim() == 4:
            arc = S.sum(arc, -1)
        full = self._with_root(arc, S)
        one = torch.full((B, N + 1), S.one, dtype=arc.dtype, device=arc.device)
        c_left, c_right, i_left, i_right = [one], [one], [None], [None]  # [width] -> (B, N + 1 - width) by start
        for w in range(1, N + 1):
            n = N + 1 - w  # spans of width w
            inner = S.sum(
                torch.stack([S.times(c_right[j][:, :n], c_left[w - 1 - j][:, j + 1 : j + 1 + n]) for j in range(w)]), 0
            )
            i_left.append(S.times(inner, torch.diagonal(full, -w, 1, 2)))  # head t = s + w, modifier s
            i_right.append(S.times(inner, torch.diagonal(full, w, 1, 2)))  # head s, modifier t
            c_left.append(
                S.sum(torch.stack([S.times(c_left[j][:, :n], i_left[w - j][:, j : j + n]) for j in range(w)]), 0)
            )
            c_right.append(
                S.sum(
                    torch.stack([S.times(i_right[j][:, :n], c_right[w - j][:, j : j + n]) for j in range(1, w + 1)]), 0
                )
            )
        if self.multiroot:
            totals = torch.stack([c_right[w][:, 0] for w in range(1, N + 1)], 1)  # (B, N): the span 0 .. L
        else:  # the root's one child r: C<-[1, r] (x) arc(root -> r) (x) C->[r, L]
            totals = torch.stack(
                [
                    S.sum(
                        torch.stack(
                            [
                                S.times(S.times(c_left[r - 1][:, 1], full[:, 0, r]), c_right[L - r][:, r])
                                for r in range(1, L + 1)
                            ]
                        ),
                        0,
                    )
                    for L in range(1, N + 1)
                ],
                1,
            )
        return totals.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
