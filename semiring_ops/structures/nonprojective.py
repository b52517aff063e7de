"""Non-projective dependency trees (torch-struct's NonProjectiveDependencyCRF layout): the matrix-tree theorem
for the partition and marginals, Chu-Liu-Edmonds for the best tree.

Potentials ``arc`` (B, N, N): arc[b, h, m] scores word h heading word m (h != m), arc[b, m, m] the root
heading m. A structure of an item of length L is any spanning tree over the root and words 0 .. L - 1 (crossing
arcs allowed); ``multiroot=False`` (torch-struct's default here) allows one child of the root.

With A[h, m] = exp(arc[h, m] - c_m) for words h != m and r[m] = exp(arc[m, m] - c_m) (c_m: the largest
finite score of an arc into m, so that every column's largest entry is 1 and the determinant keeps its
precision at scores of any scale), the Laplacian Lap[m, m] = sum_h A[h, m], Lap[h, m] = -A[h, m] gives
(Koo et al., 2007)

    multi-root:  Z = det(Lap + diag(r));     single root:  Z = det(Lap with row 0 replaced by r)
    log Z = log |det| + sum_m c_m

Words past the length get identity rows and columns. Unlike the dynamic programs this is not a semiring
computation: ``logpartition`` takes LogSemiring only, ``max`` / ``argmax`` run Chu-Liu-Edmonds (on the host,
O(L^3) per item; one root child by a penalty on the root arcs larger than any score difference).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..semirings import LogSemiring, Semiring
from ..structure_semirings import categorical_one_hot
from .base import ENUMERATION_LIMIT, Structure
from .dependency import DependencyTree
from .tree_check import dependency_trees

__all__ = ["NonProjectiveDependencyTree"]


class NonProjectiveDependencyTree(Structure):
    """The matrix-tree theorem and Chu-Liu-Edmonds (module docstring)."""

    name = "non-projective dependency tree"

    def __init__(self, multiroot: bool = False) -> None:
        self.multiroot = multiroot

    def support(self, parts: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B,) bool: whether ``parts`` (B, N, N) or (B, N, N, labels) are a tree, crossings allowed."""
        _, _, lengths = DependencyTree.check(parts, lengths)
        arcs = parts.sum(-1) if parts.dim() == 4 else parts
        return dependency_trees(arcs, lengths, self.multiroot, projective=False)

    def logpartition(self, arc: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        if semiring is not LogSemiring:
            raise NotImplementedError(
                f"NonProjectiveDependencyTree: the matrix-tree theorem sums over trees (LogSemiring); "
                f"got {semiring.__name__} (max / argmax use Chu-Liu-Edmonds)"
            )
        if arc.dim() != 3:
            raise ValueError(f"NonProjectiveDependencyTree: arc must be (B, N, N), got {tuple(arc.shape)}")
        _, N, lengths = DependencyTree.check(arc, lengths)
        live = torch.arange(N, device=arc.device)[None, :] < lengths[:, None]  # (B, N) words within the length
        pair = live[:, :, None] & live[:, None, :]
        finite = torch.where(pair & torch.isfinite(arc), arc, torch.full_like(arc, -math.inf))
        # column m holds the arcs into word m only (its root arc on the diagonal): scaling it by exp(-c_m), c_m its
        # largest score, multiplies the determinant by exp(-c_m) and keeps every column's largest entry 1
        c = finite.amax(1)  # (B, N)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c)).detach()
        scaled = torch.where(pair, (arc - c[:, None, :]).exp(), torch.zeros_like(arc))
        eye = torch.eye(N, dtype=torch.bool, device=arc.device)
        A = scaled.masked_fill(eye, 0)
        r = torch.diagonal(scaled, 0, 1, 2)  # (B, N)
        lap = torch.diag_embed(A.sum(1)) - A + torch.diag_embed((~live).to(arc.dtype))  # identity past L
        # multi-root: the root's arcs on the diagonal; one root child: row 0 replaced by them
        lap = lap + torch.diag_embed(r) if self.multiroot else torch.cat([r.unsqueeze(1), lap[:, 1:]], 1)
        return torch.linalg.slogdet(lap)[1] + torch.where(live, c, torch.zeros_like(c)).sum(1)

    def argmax(self, arc: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The best tree's arcs, 0 / 1 (B, N, N), by Chu-Liu-Edmonds."""
        B, _, lengths = DependencyTree.check(arc, lengths)
        out = torch.zeros_like(arc)
        scores = arc.detach().double().cpu()
        for b in range(B):
            L = int(lengths[b])
            heads = _best_heads(scores[b, :L, :L], self.multiroot)
            for m, h in enumerate(heads):
                out[b, m if h < 0 else h, m] = 1
        return out

    def max(self, arc: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The best tree's score (B,)."""
        return self.score(arc, self.argmax(arc, lengths))

    def _sample_block(self, arc: Tensor, lengths: Tensor | None, generator: torch.Generator | None) -> Tensor:
        """One exact draw per item of ``arc`` (B, N, N) by conditioning (the matrix-tree theorem is no semiring
        program): each word's head in turn, drawn from its marginals given the heads drawn before it (the other
        arcs into those words set to -inf); N matrix-tree marginal computations."""
        _, N, lengths = DependencyTree.check(arc, lengths)
        x = arc.clone()
        parts = torch.zeros_like(x)
        for word in range(N):
            heads = self.marginals(x, lengths)[:, :, word].clamp(min=0)  # (B, N): zero past the length
            draw = categorical_one_hot(heads, -1, generator)
            parts[:, :, word] = draw
            fixed = draw.sum(-1, keepdim=True) > 0
            x[:, :, word] = torch.where(fixed & (draw == 0), -math.inf, x[:, :, word])
        return parts

    def kmax(self, arc: Tensor, k: int, lengths: Tensor | None = None) -> Tensor:
        """(k, B): the k best trees' scores (``_kbest``)."""
        return self._kbest(arc, k, lengths)[0]

    def _kbest(self, arc: Tensor, k: int, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        """(scores (k, B), parts (k, B, N, N)) by ranking every tree (no k-best semiring runs the matrix-tree
        theorem): items of at most ENUMERATION_LIMIT trees; ties in enumeration order."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(self).__name__}: k must be an int >= 1, got {k!r}")
        arc = arc.detach()
        B, N, lengths = DependencyTree.check(arc, lengths)
        counts = self.count(arc, lengths)
        scores = arc.new_full((k, B), -math.inf)
        parts = arc.new_zeros((k, B, N, N))
        for b, count in enumerate(counts.tolist()):
            if round(count) > ENUMERATION_LIMIT:
                raise ValueError(
                    f"{type(self).__name__}: top-k and the support enumerate every tree; item {b} has "
                    f"{round(count)}, more than ENUMERATION_LIMIT = {ENUMERATION_LIMIT}"
                )
            L = int(lengths[b])
            trees = arc.new_zeros((round(count), N, N))
            if len(trees):
                trees[:, :L, :L] = self._trees(arc[b, :L, :L], len(trees))
            total = self.score(arc[b].expand_as(trees), trees)
            best = torch.sort(total, descending=True, stable=True).indices[:k]
            scores[: len(best), b], parts[: len(best), b] = total[best], trees[best]
        return scores, parts

    def _trees(self, arc: Tensor, count: int) -> Tensor:
        """Every tree (count, L, L) of one item's arcs (L, L), by conditioning on each word's head in turn: the
        heads of nonzero probability under the uniform distribution over the allowed trees (at least 1 / count
        each) given the heads fixed so far, found by the matrix-tree marginals of every partial tree at once."""
        L = arc.shape[-1]
        partial = torch.where(torch.isneginf(arc), -math.inf, 0.0).to(torch.float64).unsqueeze(0)  # (P, L, L)
        for word in range(L):
            heads = self.marginals(partial)[:, :, word]  # (P, L)
            row, head = (heads > 0.5 / count).nonzero(as_tuple=True)
            partial = partial[row]
            column = torch.full_like(partial[:, :, word], -math.inf)
            column[torch.arange(len(row), device=arc.device), head] = 0.0
            partial[:, :, word] = column
        if partial.shape[0] != count:  # (every tree has probability >= 1 / count under the uniform distribution)
            raise RuntimeError(f"{type(self).__name__}: enumerated {partial.shape[0]} trees, count says {count}")
        return torch.isfinite(partial).to(arc.dtype)


def _best_heads(arc: Tensor, multiroot: bool) -> list[int]:
    """Chu-Liu-Edmonds on one item's (L, L) scores: the head of each word (-1: the root)."""
    L = arc.shape[0]
    # graph nodes: 0 the root, 1 .. L the words; w[h][m] the score of h -> m
    w = [[-math.inf] * (L + 1) for _ in range(L + 1)]
    finite = [float(v) for v in arc.flatten() if math.isfinite(float(v))]
    penalty = 0.0 if multiroot or not finite else 2 * (max(finite) - min(finite)) * L + 1.0
    for m in range(L):
        w[0][m + 1] = float(arc[m, m]) - penalty  # one root child: each root arc costs more than any gain
        for h in range(L):
            if h != m:
                w[h + 1][m + 1] = float(arc[h, m])
    heads = _cle(list(range(L + 1)), w)
    return [heads[m + 1] - 1 for m in range(L)]


def _cle(nodes: list[int], w: list[list[float]]) -> dict[int, int]:
    """Maximum spanning arborescence rooted at nodes[0] of the complete graph on ``nodes`` with scores w[h][m]:
    {node: head} (Chu-Liu-Edmonds, recursive contraction of cycles)."""
    root = nodes[0]
    best = {m: max((h for h in nodes if h != m), key=lambda h: (w[h][m], -h)) for m in nodes if m != root}
    cycle = _find_cycle(best, root)
    if cycle is None:
        return best
    c = max(len(w), *(n + 1 for n in nodes))  # a fresh node for the contracted cycle
    for row in w:
        row.extend([-math.inf] * (c + 1 - len(row)))
    w.extend([[-math.inf] * (c + 1) for _ in range(c + 1 - len(w))])
    in_cycle = set(cycle)
    rest = [n for n in nodes if n not in in_cycle]
    enter, leave = {}, {}
    for u in rest:  # arcs into the cycle: gain relative to the cycle arc they replace
        v = max(cycle, key=lambda v: w[u][v] - w[best[v]][v])
        w[u][c], enter[u] = w[u][v] - w[best[v]][v], v
    for v in rest:  # arcs out of the cycle: the best member
        u = max(cycle, key=lambda u: w[u][v])
        w[c][v], leave[v] = w[u][v], u
    heads = _cle([*rest, c], w)
    out = {}
    for v, h in heads.items():
        if v == c:  # the arc into the cycle breaks one cycle arc
            out[enter[h]] = h
        else:
            out[v] = leave[v] if h == c else h
    for v in cycle:
        out.setdefault(v, best[v])
    return out


def _find_cycle(heads: dict[int, int], root: int) -> list[int] | None:
    for start in heads:
        seen, v = [], start
        while v != root and v not in seen:
            seen.append(v)
            v = heads[v]
        if v != root:
            return seen[seen.index(v) :]
    return None
