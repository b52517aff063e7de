"""The fused chain operators, registered with torch.library (contracts in csrc/ops.h):

    semiring_ops::chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores)
        -> (total (B,), scores (B, T, C) or (0,))
        one direction of the linear-chain recursion in one kernel launch; differentiable for the log
        semiring through `total` (forward-backward: the reverse scan gives beta, and then
            d total_b / d em[b, t, c]   = exp(alpha + beta - total)[b, t, c]           (marginals)
            d total / d trans[i, j]     = sum_{b, t} exp(alpha[b,t,i] + trans[i,j] + em[b,t+1,j]
                                                      + beta[b,t+1,j] - total_b)    (one log_contract)
            d total / d start, d end    = the marginals at the first / last position)
    semiring_ops::chain_viterbi(em, trans, start, end, lengths, semiring_id) -> (score (B,), tags (B, T))
        the best path under max (or min), backtracked on the device; not differentiable.

Shapes: em (B, T, C), trans (C, C) [from, to], start and end (C,), lengths (B,) int64; float32 or float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..semirings import LogSemiring
from .registry import log_contract

__all__ = ["chain_log_gradients", "chain_scan", "chain_viterbi"]

_LOG = LogSemiring.kernel_id


@torch.library.custom_op("semiring_ops::chain_scan", mutates_args=())
def chain_scan(
    em: Tensor,
    trans: Tensor,
    start: Tensor,
    end: Tensor,
    lengths: Tensor,
    semiring_id: int,
    reverse: bool,
    save_scores: bool,
) -> tuple[Tensor, Tensor]:
    """One direction of the chain recursion (see the module docstring) -> (total (B,), scores)."""
    return tuple(backend_for(em.device).chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores))


@chain_scan.register_fake
def _(em, trans, start, end, lengths, semiring_id, reverse, save_scores):
    scores = em.new_empty(em.shape) if save_scores else em.new_empty((0,))
    return em.new_empty((em.shape[0],)), scores


def _scan_setup_context(ctx, inputs, output):
    em, trans, start, end, lengths, semiring_id, reverse, save_scores = inputs
    total, scores = output
    ctx.semiring_id, ctx.reverse = semiring_id, reverse
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(em, trans, start, end, lengths, total, scores if save_scores else None)


def _scan_backward(ctx, grad_total, grad_scores):
    if grad_scores is not None:
        raise NotImplementedError("chain_scan: gradients flow through `total` only, not through `scores`")
    if grad_total is None:
        return (None,) * 8
    em, trans, start, end, lengths, total, alpha = ctx.saved_tensors
    if ctx.semiring_id != _LOG or ctx.reverse or alpha is None:
        raise NotImplementedError(
            "chain_scan: only the forward log-semiring scan run with save_scores=True is differentiable"
        )
    g_em, g_trans, g_start, g_end = chain_log_gradients(em, trans, start, end, lengths, total, alpha, grad_total)
    return g_em, g_trans, g_start, g_end, None, None, None, None


chain_scan.register_autograd(_scan_backward, setup_context=_scan_setup_context)


def chain_log_gradients(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, total: Tensor, alpha: Tensor, g: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of sum_b g_b total_b (log semiring) with respect to em, trans, start and end, by the
    reverse scan (beta) and one log_contract; a chain whose total is -inf gets zero gradient."""
    B, T, C = em.shape
    _, beta = chain_scan(em, trans, start, end, lengths, _LOG, True, True)
    neg_total = torch.where(total == -math.inf, total, -total)[:, None, None]  # -inf: every weight exp(-inf) = 0
    g = g.to(em.dtype)
    g_em = torch.exp(alpha + beta + neg_total) * g[:, None, None]  # (B, T, C) marginals, 0 past each length
    g_start = g_em[:, 0].sum(0) if T > 0 else torch.zeros_like(start)
    rows = torch.arange(B, device=em.device)
    last = g_em[rows, (lengths - 1).clamp(0, max(T - 1, 0))] if T > 0 else em.new_zeros((B, C))
    g_end = torch.where((lengths > 0)[:, None], last, 0).sum(0)
    if T > 1:
        N = B * (T - 1)
        live = (torch.arange(1, T, device=em.device)[None, :] < lengths[:, None])[:, :, None]
        left = (alpha[:, :-1] + neg_total).reshape(1, N, C).transpose(1, 2)  # (1, C, N): rows i
        right = torch.where(live, em[:, 1:] + beta[:, 1:], -math.inf).reshape(1, N, C)  # columns j
        weight = g[:, None, None].expand(B, T - 1, C).reshape(1, N, C)
        g_trans = log_contract(left, None, right, weight, trans.unsqueeze(0)).squeeze(0)
    else:
        g_trans = torch.zeros_like(trans)
    return g_em, g_trans, g_start, g_end


@torch.library.custom_op("semiring_ops::chain_viterbi", mutates_args=())
def chain_viterbi(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, semiring_id: int
) -> tuple[Tensor, Tensor]:
    """Best path of each chain under max / min -> (score (B,), tags (B, T) int64, -1 past each length)."""
    return tuple(backend_for(em.device).chain_viterbi(em, trans, start, end, lengths, semiring_id))


@chain_viterbi.register_fake
def _(em, trans, start, end, lengths, semiring_id):
    return em.new_empty((em.shape[0],)), em.new_empty(em.shape[:2], dtype=torch.long)
