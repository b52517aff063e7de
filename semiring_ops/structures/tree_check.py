"""Whether given 0 / 1 arcs are a dependency tree of an item: the support of DependencyTree (projective) and
NonProjectiveDependencyTree, so that ``log_prob`` of anything else is -inf rather than a finite number.

Arcs (B, N, N) [head, modifier] (labels, if any, already summed), the root's arc into m on the diagonal. An item
of length L holds a tree when: every word m < L has exactly one head among the root and the words < L; no arc
touches a word >= L; following heads from any word reaches the root (no cycle); with ``multiroot=False`` the
root has exactly one child; with ``projective=True`` no two arcs cross, the root at position 0 left of every
word (Eisner's trees). Vectorised over the batch: pointer doubling for the cycles, all pairs of arcs for the
crossings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["dependency_trees"]


def dependency_trees(arcs: Tensor, lengths: Tensor, multiroot: bool, projective: bool) -> Tensor:
    """(B,) bool: whether each item's ``arcs`` (B, N, N) are a tree (module docstring); ``lengths`` (B,)."""
    B, N, _ = arcs.shape
    device = arcs.device
    on = arcs != 0
    words = torch.arange(N, device=device)
    inside = words < lengths[:, None]  # (B, N)
    ok = ~(on & ~(inside[:, :, None] & inside[:, None, :])).flatten(1).any(1)  # nothing touches padding
    heads_in = arcs.sum(1)  # (B, N): incoming arcs of each modifier (two labels on one arc count twice)
    ok &= torch.where(inside, heads_in == 1, heads_in == 0).all(1)
    root = torch.diagonal(on, dim1=1, dim2=2)  # (B, N): the root heads m
    children = (root & inside).sum(1)
    ok &= children >= 1 if multiroot else children == 1
    # head of each word as a node index: words 0 .. N - 1, the root N (padding and the root point at the root)
    head = on.float().argmax(1)  # (B, N): the (single, where ok) head row
    head = torch.where(root | ~inside, torch.full_like(head, N), head)
    node = torch.cat([head, torch.full((B, 1), N, dtype=head.dtype, device=device)], 1)  # (B, N + 1)
    for _ in range(math.ceil(math.log2(N + 1)) + 1):  # pointer doubling: 2^steps > N hops
        node = node.gather(1, node)
    ok &= (node[:, :N] == N).all(1)
    if projective and N > 1:  # arcs as intervals over positions (the root 0, word m at m + 1)
        h_pos = torch.where(head == N, torch.zeros_like(head), head + 1)
        m_pos = words + 1
        lo, hi = torch.minimum(h_pos, m_pos), torch.maximum(h_pos, m_pos)  # (B, N)
        a_lo, a_hi, b_lo, b_hi = lo[:, :, None], hi[:, :, None], lo[:, None, :], hi[:, None, :]
        cross = (a_lo < b_lo) & (b_lo < a_hi) & (a_hi < b_hi)
        both = inside[:, :, None] & inside[:, None, :]
        ok &= ~(cross & both).flatten(1).any(1)
    return ok
