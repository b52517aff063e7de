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

import math

import torch
from torch import Tensor

from ..ops.chain_ops import sequence_lengths_eager
from ..ops.matmul import semiring_matmul
from ..semirings import LogSemiring, MaxSemiring, Semiring, resolve_semiring

__all__ = [
    "chain_entropy",
    "chain_sample",
    "chain_sum",
    "chain_topk",
    "chain_viterbi",
    "choose_strategy",
    "mask_past_length",
    "pad_edges_past_length",
    "resolve_lengths",
]


def pad_edges_past_length(edges: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
    """edges (B, T-1, C, C) with step t replaced by the identity matrix where t + 1 >= lengths."""
    if lengths is None:
        return edges
    steps = torch.arange(edges.shape[1], device=edges.device)
    live = steps[None, :] + 1 < lengths[:, None]  # (B, T-1): step t joins positions t and t+1
    eye = semiring.identity(edges.shape[-1], dtype=edges.dtype, device=edges.device)
    return torch.where(live[:, :, None, None], edges, eye)


def resolve_lengths(
    B: int,
    T: int,
    mask=None,
    lengths=None,
    device=None,
    check_range: bool = True,
    tags=None,
    num_tags: int = 1,
    raise_errors: bool = True,
) -> Tensor:
    """Each padded sequence's length (B,) int64 from a prefix mask (B, T) (bool or uint8) or lengths (B,)
    in 0..T (neither: all T), validated together with tags (B, T) if given (each in 0..num_tags-1 below its
    length), in one device round trip (the sequence_lengths kernel): a mask with holes, a shape that is not
    (B, T) / (B,), a length out of range or a bad tag raises ValueError saying which. check_range=False
    skips the data checks of lengths (the synchronisation) for callers that have made them already;
    raise_errors=False makes them without a round trip, each bad sequence's length -1 (for the fused chain
    kernels, which give it NaN results; shapes and dtypes still raise)."""
    if mask is not None:
        mask = torch.as_tensor(mask, device=device)
        if mask.dtype not in (torch.bool, torch.uint8):
            mask = mask != 0
    if lengths is not None:
        lengths = torch.as_tensor(lengths, device=device)
        if not check_range and mask is None and tags is None:
            if lengths.shape != (B,) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
                raise ValueError(
                    f"lengths must be an integer tensor of shape ({B},), got {tuple(lengths.shape)} {lengths.dtype}"
                )
            return lengths.long()
    if mask is None and lengths is None and tags is None:
        return torch.full((B,), T, dtype=torch.long, device=device)
    return sequence_lengths_eager(mask, lengths, tags, B, T, num_tags, raise_errors)


def mask_past_length(tags: Tensor, lengths: Tensor) -> Tensor:
    """tags (..., T) with -1 at positions >= lengths, which broadcasts against tags' leading dims."""
    positions = torch.arange(tags.shape[-1], device=tags.device)
    return torch.where(positions < lengths.unsqueeze(-1), tags, -1)


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
        tags = mask_past_length(tags, lengths)
        score = torch.where(lengths > 0, score, torch.zeros_like(score))
    return score, tags


def chain_topk(
    init: Tensor,
    edges: Tensor,
    final: Tensor | None = None,
    lengths: Tensor | None = None,
    k: int = 1,
) -> tuple[Tensor, Tensor]:
    """The k best paths of each chain: (scores (B, k) best first, tags (B, k, T), -1 past the length).

    A k-best max-plus recursion: each tag keeps its k best prefix scores with back-pointers to
    (previous tag, rank). Chains with fewer than k paths pad with score -inf and tags -1.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    B, C = init.shape
    steps = edges.shape[1]
    T = steps + 1
    padded = pad_edges_past_length(edges, lengths, MaxSemiring)
    # alpha (B, C, k): k best scores of prefixes ending in each tag; only rank 0 exists at the start
    alpha = torch.full((B, C, k), -math.inf, dtype=init.dtype, device=init.device)
    alpha[:, :, 0] = init
    pointers = []
    for t in range(steps):
        cand = alpha.unsqueeze(2) + padded[:, t].unsqueeze(-1)  # (B, from, to, k)
        cand = cand.permute(0, 2, 1, 3).reshape(B, C, C * k)  # (B, to, from*k)
        alpha, idx = cand.topk(k, dim=-1)  # sorted, best first
        pointers.append(idx)  # from = idx // k, rank = idx % k
    last = alpha if final is None else alpha + final.unsqueeze(-1)
    scores, idx = last.reshape(B, C * k).topk(min(k, C * k), dim=-1)
    if scores.shape[1] < k:
        fill = scores.new_full((B, k - scores.shape[1]), -math.inf)
        scores = torch.cat([scores, fill], 1)
        idx = torch.cat([idx, idx.new_zeros((B, k - idx.shape[1]))], 1)
    tag, rank = idx // k, idx % k  # (B, k)
    tags = torch.empty(B, k, T, dtype=torch.int64, device=init.device)
    tags[:, :, T - 1] = tag
    for t in range(steps - 1, -1, -1):
        back = pointers[t].gather(1, tag.unsqueeze(-1).expand(B, k, k)).gather(2, rank.unsqueeze(-1)).squeeze(-1)
        tag, rank = back // k, back % k
        tags[:, :, t] = tag
    valid = torch.isfinite(scores)
    if lengths is not None:
        tags = mask_past_length(tags, lengths.unsqueeze(-1))
        empty = lengths == 0  # the empty path: one path of score 0
        first = torch.zeros_like(scores).masked_fill(torch.arange(k, device=init.device) > 0, -math.inf)
        scores = torch.where(empty[:, None], first, scores)
        valid = torch.isfinite(scores)
    tags = torch.where(valid.unsqueeze(-1), tags, -1)
    return scores, tags


def chain_entropy(init: Tensor, edges: Tensor, final: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
    """Entropy of the Gibbs distribution over each chain's paths -> (B,), differentiable.

    H = log Z - E[score] = log Z - <grad log Z, potentials>; forbidden (-inf) potentials carry
    probability 0 and contribute nothing.
    """
    differentiable = torch.is_grad_enabled()
    leaves = [x if x.requires_grad else x.detach().requires_grad_() for x in (init, edges, final) if x is not None]
    with torch.enable_grad():
        logz = chain_sum(leaves[0], leaves[1], leaves[2] if final is not None else None, lengths, "log")
        grads = torch.autograd.grad(logz.sum(), leaves, create_graph=differentiable, allow_unused=True)
    expected = logz.new_zeros(logz.shape)
    for g, x in zip(grads, leaves, strict=True):
        if g is None:
            continue
        safe = torch.where(g == 0, torch.zeros_like(x), x)  # no 0 * -inf, in value or in gradient
        expected = expected + (g * safe).reshape(x.shape[0], -1).sum(1)
    return logz - expected


def chain_sample(
    init: Tensor,
    edges: Tensor,
    final: Tensor | None = None,
    lengths: Tensor | None = None,
    n: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """n paths per chain drawn from the Gibbs distribution -> tags (n, B, T), -1 past the length.

    Forward filtering (log semiring) then backward sampling, batched over samples and chains.
    """
    B, C = init.shape
    steps = edges.shape[1]
    T = steps + 1
    padded = pad_edges_past_length(edges, lengths, LogSemiring)
    alphas = [init]
    for t in range(steps):
        alphas.append(semiring_matmul(alphas[-1].unsqueeze(1), padded[:, t], LogSemiring).squeeze(1))
    last = alphas[-1] if final is None else alphas[-1] + final
    tags = torch.empty(n, B, T, dtype=torch.int64, device=init.device)

    def draw(logits: Tensor) -> Tensor:  # logits (n, B, C) -> (n, B)
        probs = torch.softmax(logits, dim=-1).reshape(-1, C)
        return torch.multinomial(probs, 1, generator=generator).reshape(n, B)

    tag = draw(last.expand(n, B, C))
    tags[:, :, T - 1] = tag
    for t in range(steps - 1, -1, -1):
        # p(y_t | y_{t+1}) ∝ alpha_t(y_t) * edge_t(y_t, y_{t+1})
        to = padded[:, t].transpose(1, 2).unsqueeze(0).expand(n, B, C, C)  # (n, B, to, from)
        logits = alphas[t].unsqueeze(0) + to.gather(2, tag[..., None, None].expand(n, B, 1, C)).squeeze(2)
        tag = draw(logits)
        tags[:, :, t] = tag
    if lengths is not None:
        tags = mask_past_length(tags, lengths)
    return tags
