"""Chains whose potentials factor into per-step emissions and one shared transition matrix.

    emissions   (B, T, C)         score of tag c at step t,
    transitions (C, C)            score of moving from tag i to tag j ([from, to]), shared by every step,
    start, end  (C,) or None      scores of the first / last tag (None: the semiring's one),
    lengths     (B,) int or None  each chain's length in 0..T (None: all T).

This is the shape of a linear-chain CRF and of an HMM (log probabilities). The fused chain kernels
(semiring_ops::chain_scan / chain_viterbi, csrc/cpu/chain_cpu.cpp and csrc/cuda/chain_kernels.cuh) run the
whole recursion in one launch with the transition matrix on chip, and the (B, T-1, C, C) edge tensor
never exists; the log-partition's gradient is forward-backward (a reverse scan). A semiring with no
C++ twin, or a gradient the fused kernels do not provide (through max / min sums), takes the generic
engine of chain.py on explicit edges instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..build.reference import accumulation_dtype, gold_path_score
from ..ops import chain_ops
from ..ops.chain_ops import chain_scan, chain_viterbi_eager, crf_log_likelihood_eager
from ..semirings import LogSemiring, MaxSemiring, Semiring, resolve_semiring
from .chain import chain_sum, resolve_lengths

__all__ = ["chain_log_likelihood_factored", "chain_sum_factored", "chain_viterbi_factored", "factored_to_edges"]


def factored_to_edges(
    emissions: Tensor, transitions: Tensor, start: Tensor | None, end: Tensor | None, semiring: type[Semiring]
) -> tuple[Tensor, Tensor, Tensor | None]:
    """init (B, C), edges (B, T-1, C, C), final (B, C) or None for the generic engine (chain.py)."""
    B = emissions.shape[0]
    init = emissions[:, 0] if start is None else semiring.times(start, emissions[:, 0])
    edges = semiring.times(transitions, emissions[:, 1:, None, :])
    final = None if end is None else end.expand(B, -1)
    return init, edges, final


def _check(emissions: Tensor, transitions: Tensor, start: Tensor | None, end: Tensor | None) -> None:
    if emissions.dim() != 3:
        raise ValueError(f"emissions must be (B, T, C), got shape {tuple(emissions.shape)}")
    C = emissions.shape[2]
    named = {"transitions": (transitions, (C, C)), "start": (start, (C,)), "end": (end, (C,))}
    for name, (x, shape) in named.items():
        if x is None:
            continue
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} for emissions of shape {tuple(emissions.shape)}, got {tuple(x.shape)}"
            )
        if x.device != emissions.device:
            raise ValueError(f"{name} is on {x.device}, emissions on {emissions.device}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if not emissions.is_floating_point():
        raise TypeError(f"emissions must be floating point, got {emissions.dtype}")


def _kernel_inputs(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None,
    end: Tensor | None,
    lengths: Tensor | None,
    one: float,
    check_lengths: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused kernels' arguments: one accumulation dtype, start / end filled with the semiring's
    one when absent, lengths int64 on the emissions' device."""
    B, T, C = emissions.shape
    dtype = torch.promote_types(accumulation_dtype(emissions.dtype), accumulation_dtype(transitions.dtype))
    device = emissions.device
    start = emissions.new_full((C,), one, dtype=dtype) if start is None else _as_dtype(start, dtype)
    end = emissions.new_full((C,), one, dtype=dtype) if end is None else _as_dtype(end, dtype)
    check_range = check_lengths and not torch.compiler.is_compiling()
    lengths = resolve_lengths(B, T, None, lengths, device, check_range)
    return _as_dtype(emissions, dtype), _as_dtype(transitions, dtype), start, end, lengths


def _as_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x in dtype, without the call when it is already (x.to costs ~1.2 us of host time even as a no-op)."""
    return x if x.dtype == dtype else x.to(dtype)


def chain_sum_factored(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None = None,
    end: Tensor | None = None,
    lengths: Tensor | None = None,
    semiring: str | type[Semiring] = "log",
    check_lengths: bool = True,
) -> Tensor:
    """Semiring sum over all paths of each chain -> (B,); the semiring's one for length 0.

    With the log semiring: the log-partition, differentiable; its gradient with respect to the
    emissions is the posterior marginals (B, T, C), with respect to the transitions the expected
    transition counts summed over the batch (C, C), with respect to start / end the marginals of the
    first / last tag summed over the batch. check_lengths=False skips the range check of lengths (one
    device synchronisation) for callers that have validated them.
    """
    _check(emissions, transitions, start, end)
    S = resolve_semiring(semiring)
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (emissions, transitions, start, end)
    )
    if S.kernel_id is None or (needs_grad and S is not LogSemiring):
        if emissions.shape[1] == 0:
            return emissions.new_full((emissions.shape[0],), S.one)
        return chain_sum(*factored_to_edges(emissions, transitions, start, end, S), lengths, S)
    args = _kernel_inputs(emissions, transitions, start, end, lengths, S.one, check_lengths)
    total, _ = chain_scan(*args, S.kernel_id, False, needs_grad)
    return total


def chain_log_likelihood_factored(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None,
    end: Tensor | None,
    lengths: Tensor,
    tags: Tensor,
) -> Tensor:
    """Log-likelihood (B,) of the tag paths `tags` (B, T) under the log-semiring chain: the path's score
    minus the log-partition (a CRF's training objective), by one fused forward scan; differentiable, its
    gradient one fused reverse scan. lengths (B,) int64 and tags must be validated already (in range below
    each length): the CRF does it with resolve_lengths(..., tags=).
    """
    _check(emissions, transitions, start, end)
    args = _kernel_inputs(emissions, transitions, start, end, lengths, LogSemiring.one, False)
    return crf_log_likelihood_eager(*args, tags.long())[0]


def chain_viterbi_factored(
    emissions: Tensor,
    transitions: Tensor,
    start: Tensor | None = None,
    end: Tensor | None = None,
    lengths: Tensor | None = None,
    check_lengths: bool = True,
) -> tuple[Tensor, Tensor]:
    """Best path of each chain: (score (B,), tags (B, T) int64, -1 past each chain's length).

    One launch of the fused Viterbi kernel (back-pointers and backtrack on the device); the score is
    not differentiable.
    """
    _check(emissions, transitions, start, end)
    args = _kernel_inputs(
        emissions.detach(), transitions.detach(), _detach(start), _detach(end), lengths, 0.0, check_lengths
    )
    return chain_viterbi_eager(*args, MaxSemiring.kernel_id)


def _detach(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.detach()


@chain_ops.generic_chain_objective.install
def generic_chain_objective(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, tags: Tensor | None
) -> Tensor:
    """Each chain's log-partition (B,), or with tags (B, T) its log-likelihood gold - log_z, by the generic engine
    on explicit edges (autograd to any order): what the fused kernels' second derivatives differentiate. The
    kernels' inputs (start and end given, lengths (B,) int64); a chain whose log_z or gold score is -inf gives 0
    (its gradient is 0 in the kernels too)."""
    if em.shape[1] == 0:
        log_z = em.sum((1, 2)) * 0  # empty chains: log_z = 0, still in the graph of em
    else:
        log_z = chain_sum(*factored_to_edges(em, trans, start, end, LogSemiring), lengths, LogSemiring)
    objective = log_z if tags is None else gold_path_score(em, trans, start, end, lengths, tags) - log_z
    finite = torch.isfinite(log_z.detach()) & torch.isfinite(objective.detach())
    return torch.where(finite, objective, objective.new_zeros(()))
