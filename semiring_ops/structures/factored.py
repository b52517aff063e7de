"""Chains whose potentials factor into per-step emissions and one shared transition matrix.

    emissions   (B, T, C)  score of tag c at step t,
    transitions (C, C)     score of moving from tag i to tag j ([from, to]), shared by every step,
    start, end  (C,) or None  scores of the first / last tag (None: the semiring's one),
    lengths     (B,) int64 or None  each chain's length in 0..T (None: all T).

This is the shape of a linear-chain CRF and of an HMM (log probabilities). Here the (B, T-1, C, C)
edge tensor never has to exist: the fused chain kernels run the whole recursion in one launch with
the transition matrix kept on chip. Everything else falls back to the generic engine in chain.py,
which takes explicit edges.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import MaxSemiring, Semiring, resolve_semiring
from .chain import chain_sum, chain_viterbi

__all__ = ["chain_sum_factored", "chain_viterbi_factored", "factored_to_edges"]


def factored_to_edges(
    emissions: Tensor, transitions: Tensor, start: Tensor | None, end: Tensor | None, semiring: type[Semiring]
) -> tuple[Tensor, Tensor, Tensor | None]:
    """init (B, C), edges (B, T-1, C, C), final (B, C) or None for the generic engine (chain.py)."""
    B = emissions.shape[0]
    init = emissions[:, 0] if start is None else semiring.times(start, emissions[:, 0])
    edges = semiring.times(transitions, emissions[:, 1:, None, :])
    final = None if end is None else end.expand(B, -1)
    return init, edges, final


def chain_sum_factored(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None = None,
    end: Tensor | None = None,
    lengths: Tensor | None = None,
    semiring: str | type[Semiring] = "log",
) -> Tensor:
    """Semiring sum over all paths of each chain -> (B,); the semiring's one for length 0.

    With the log semiring: the log-partition, differentiable; its gradient with respect to the
    emissions is the posterior marginals (B, T, C), with respect to the transitions the expected
    transition counts summed over the batch (C, C).
    """
    S = resolve_semiring(semiring)
    if emissions.shape[1] == 0:
        return emissions.new_full((emissions.shape[0],), S.one)
    return chain_sum(*factored_to_edges(emissions, transitions, start, end, S), lengths, S)


def chain_viterbi_factored(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None = None,
    end: Tensor | None = None,
    lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Best path of each chain: (score (B,), tags (B, T) int64, -1 past each chain's length)."""
    B, T, _ = emissions.shape
    if T == 0:
        return emissions.new_zeros(B), emissions.new_empty((B, 0), dtype=torch.long)
    return chain_viterbi(*factored_to_edges(emissions, transitions, start, end, MaxSemiring), lengths)
