"""The linear-chain engine, written once and generic over the semiring.

A batch of chains is given as
    init   (B, C)          score of the first tag (start transition + first emission),
    edges  (B, T-1, C, C)  score of moving from tag i at step t to tag j at step t+1 ([from, to]),
    final  (B, C) or None  score of ending in each tag,
    lengths (B,) or None   each chain's length in 0..T (None: all T).
The semiring sum over all tag paths is

    ⊕_{y_0..y_{L-1}}  init[y_0] ⊗ edges[0, y_0, y_1] ⊗ ... ⊗ edges[L-2, y_{L-2}, y_{L-1}] ⊗ final[y_{L-1}]

(the log semiring gives the log-partition, whose gradient gives marginals; the max semiring gives the
Viterbi score). A chain of length 0 sums to the semiring's one.

Steps past a chain's length get the semiring's identity matrix as their edge, so every chain runs the
same number of steps with no per-sequence control flow; the backpointers of an identity step map each
tag to itself, so Viterbi backtracking passes through the padding unchanged.

Two strategies, chosen automatically or by name:
    "sequential": T-1 batched vector-matrix products, O(T C^2) work, T steps deep.
    "parallel":   a log-depth tree of matrix-matrix products, O(T C^3) work, log T steps deep.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.matmul import semiring_matmul
from ..semirings import MaxSemiring, Semiring, resolve_semiring

__all__ = ["chain_sum", "chain_viterbi", "choose_strategy", "pad_edges_past_length"]


def pad_edges_past_length(edges: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
    """edges (B, T-1, C, C) with step t replaced by the identity matrix where t + 1 >= lengths."""
    if lengths is None:
        return edges
    steps = torch.arange(edges.shape[1], device=edges.device)
    live = steps[None, :] + 1 < lengths[:, None]  # (B, T-1): step t joins positions t and t+1
    eye = semiring.identity(edges.shape[-1], dtype=edges.dtype, device=edges.device)
    return torch.where(live[:, :, None, None], edges, eye)


def choose_strategy(T: int, C: int) -> str:
    """The parallel scan's C^3 work pays only for long chains over few tags."""
    return "parallel" if T >= 64 and C <= 16 else "sequential"


def _finish(alpha: Tensor, final: Tensor | None, lengths: Tensor | None, S: type[Semiring]) -> Tensor:
    """⊕_c alpha[:, c] ⊗ final[:, c]; the semiring's one for chains of length 0."""
    total = S.sum(alpha if final is None else S.times(alpha, final), dim=-1)
    if lengths is None:
        return total
    return torch.where(lengths > 0, total, torch.full_like(total, S.one))


def chain_sum(
    init: Tensor,
    edges: Tensor,
    final: Tensor | None = None,
    lengths: Tensor | None = None,
    semiring: str | type[Semiring] = "log",
    strategy: str = "auto",
) -> Tensor:
    """Semiring sum over all paths of each chain (see the module docstring for shapes) -> (B,)."""
    S = resolve_semiring(semiring)
    B, C = init.shape
    steps = edges.shape[1]
    if strategy == "auto":
        strategy = choose_strategy(steps + 1, C)
    if init.shape[0] == 0 or steps == 0:
        return _finish(init, final, lengths, S)
    edges = pad_edges_past_length(edges, lengths, S)
    if strategy == "sequential":
        alpha = init.unsqueeze(1)  # (B, 1, C)
        for t in range(steps):
            alpha = semiring_matmul(alpha, edges[:, t], S)
        return _finish(alpha.squeeze(1), final, lengths, S)
    if strategy != "parallel":
        raise ValueError(f"strategy must be 'auto', 'sequential' or 'parallel', got {strategy!r}")
    product = edges
    while product.shape[1] > 1:
        if product.shape[1] % 2:
            eye = S.identity(C, dtype=edges.dtype, device=edges.device).expand(B, 1, C, C)
            product = torch.cat([product, eye], dim=1)
        product = semiring_matmul(product[:, 0::2], product[:, 1::2], S)
    alpha = semiring_matmul(init.unsqueeze(1), product[:, 0], S).squeeze(1)
    return _finish(alpha, final, lengths, S)


def chain_viterbi(
    init: Tensor,
    edges: Tensor,
    final: Tensor | None = None,
    lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Best path of each chain: (score (B,), tags (B, T) int64, -1 past each chain's length).

    The forward pass keeps the max semiring's argmax as back-pointers; the backtrack runs on the
    device, one batched gather per step for the whole batch.
    """
    S = MaxSemiring
    B = init.shape[0]
    steps = edges.shape[1]
    T = steps + 1
    padded = pad_edges_past_length(edges, lengths, S)
    alpha = init.unsqueeze(1)
    pointers = []
    for t in range(steps):
        alpha, back = semiring_matmul(alpha, padded[:, t], S, return_argmax=True)
        pointers.append(back.squeeze(1))  # (B, C): best previous tag for each tag at step t+1
    last = alpha.squeeze(1) if final is None else alpha.squeeze(1) + final
    score, tag = last.max(dim=-1)
    tags = torch.empty(B, T, dtype=torch.int64, device=init.device)
    tags[:, T - 1] = tag
    for t in range(steps - 1, -1, -1):
        tag = pointers[t].gather(1, tag.unsqueeze(1)).squeeze(1)
        tags[:, t] = tag
    if lengths is not None:
        positions = torch.arange(T, device=init.device)
        tags = torch.where(positions[None, :] < lengths[:, None], tags, -1)
        score = torch.where(lengths > 0, score, torch.zeros_like(score))
    return score, tags
