"""The fused chain operators, registered with torch.library (contracts in csrc/ops.h):

    semiring_ops::chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores)
        -> (total (B,), scores (B, T, C) or (0,))
        one direction of the linear-chain recursion in one kernel launch; differentiable for the log
        semiring through `total`, by chain_log_backward
    semiring_ops::chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad)
        -> (g_em, g_trans, g_start, g_end): forward-backward in one reverse-scan launch that also sums
        the marginals (g_em = grad * exp(alpha + beta - log_z)) and the pair marginals into g_trans
    semiring_ops::chain_viterbi(em, trans, start, end, lengths, semiring_id) -> (score (B,), tags (B, T))
        the best path under max (or min), backtracked on the device; not differentiable.

Shapes: em (B, T, C), trans (C, C) [from, to], start and end (C,), lengths (B,) int64; float32 or float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..semirings import LogSemiring

__all__ = ["chain_log_backward", "chain_scan", "chain_viterbi"]

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
    grad = grad_total.to(em.dtype)
    g_em, g_trans, g_start, g_end = chain_log_backward(em, trans, start, end, lengths, alpha, total, grad)
    return g_em, g_trans, g_start, g_end, None, None, None, None


chain_scan.register_autograd(_scan_backward, setup_context=_scan_setup_context)


@torch.library.custom_op("semiring_ops::chain_log_backward", mutates_args=())
def chain_log_backward(
    em: Tensor,
    trans: Tensor,
    start: Tensor,
    end: Tensor,
    lengths: Tensor,
    alpha: Tensor,
    log_z: Tensor,
    grad: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of sum_b grad_b log_z_b with respect to (em, trans, start, end), by one reverse scan
    (forward-backward); a chain whose log_z is -inf gets zero gradient (contract in csrc/ops.h)."""
    return tuple(backend_for(em.device).chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad))


@chain_log_backward.register_fake
def _(em, trans, start, end, lengths, alpha, log_z, grad):
    return em.new_empty(em.shape), trans.new_empty(trans.shape), start.new_empty(start.shape), end.new_empty(end.shape)


@torch.library.custom_op("semiring_ops::chain_viterbi", mutates_args=())
def chain_viterbi(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, semiring_id: int
) -> tuple[Tensor, Tensor]:
    """Best path of each chain under max / min -> (score (B,), tags (B, T) int64, -1 past each length)."""
    return tuple(backend_for(em.device).chain_viterbi(em, trans, start, end, lengths, semiring_id))


@chain_viterbi.register_fake
def _(em, trans, start, end, lengths, semiring_id):
    return em.new_empty((em.shape[0],)), em.new_empty(em.shape[:2], dtype=torch.long)
