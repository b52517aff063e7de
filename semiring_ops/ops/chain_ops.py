"""The fused chain operators, registered with torch.library (contracts in csrc/ops.h):

    semiring_ops::chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores)
        -> (total (B,), scores (B, T, C) or (0,))
        one direction of the linear-chain recursion in one kernel launch; differentiable for the log
        semiring through `total`, by chain_log_backward
    semiring_ops::chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags=None)
        -> (g_em, g_trans, g_start, g_end): forward-backward in one reverse-scan launch that also sums
        the marginals (g_em = grad * exp(alpha + beta - log_z)) and the pair marginals into g_trans; with
        tags, the gradient of grad * (gold - log_z) (a CRF's log-likelihood): the tag paths' indicators minus
        the marginals
    semiring_ops::crf_log_likelihood(em, trans, start, end, lengths, tags) -> (llh (B,), alpha, log_z)
        a CRF's log-likelihood of the tag paths (B, T) in one forward-scan launch; differentiable through
        llh, by chain_log_backward with the tags
    semiring_ops::sequence_lengths(mask, lengths, tags, batch, steps, num_tags, raise_errors) -> lengths (B,)
        a prefix mask or lengths turned into int64 lengths and validated with the tags: in one device round
        trip (raise_errors), or with none, each bad sequence's length -1 (its chain results NaN)
    semiring_ops::chain_viterbi(em, trans, start, end, lengths, semiring_id) -> (score (B,), tags (B, T))
        the best path under max (or min), backtracked on the device; not differentiable.
    semiring_ops::pair_marginal_sum(em, trans, lengths, alpha, log_z, weight, beta) -> (C, C)
        the weighted pair marginals' sum that chain_log_backward leaves to its caller when they do not fit on chip
        (large C on a GPU); an operator so that the C++ autograd node (csrc/autograd) calls it too.

Eager calls on plain tensors skip the custom ops' Python dispatch; a CRF's log-likelihood that needs a gradient is
recorded by the chain family's C++ autograd node (crf_log_likelihood_eager).

Shapes: em (B, T, C), trans (C, C) [from, to], start and end (C,), lengths (B,) int64; float32 or float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..hooks import Hook
from ..semirings import LogSemiring
from .registry import eager_function, plain_eager

__all__ = [
    "chain_log_backward",
    "chain_log_backward_eager",
    "chain_scan",
    "chain_viterbi",
    "chain_viterbi_eager",
    "crf_log_likelihood",
    "crf_log_likelihood_eager",
    "sequence_lengths",
    "sequence_lengths_eager",
]

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
    ctx.mark_non_differentiable(scores)  # gradients flow through `total` only
    ctx.save_for_backward(em, trans, start, end, lengths, total, scores if save_scores else None)


def _scan_backward(ctx, grad_total, _grad_scores):
    if grad_total is None:
        return (None,) * 8
    em, trans, start, end, lengths, total, alpha = ctx.saved_tensors
    if ctx.semiring_id != _LOG or ctx.reverse or alpha is None:
        raise NotImplementedError(
            "chain_scan: only the forward log-semiring scan run with save_scores=True is differentiable"
        )
    grad = grad_total.to(em.dtype)
    g_em, g_trans, g_start, g_end = chain_log_backward_eager(em, trans, start, end, lengths, alpha, total, grad)
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
    tags: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients with respect to (em, trans, start, end) of sum_b grad_b log_z_b, or with tags (B, T) of
    sum_b grad_b (gold_b - log_z_b) (gold: the tag path's score; a CRF's log-likelihood), by one reverse scan
    (forward-backward); a chain whose log_z or gold score is -inf gets zero gradient (csrc/ops.h)."""
    return _chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags)


@chain_log_backward.register_fake
def _(em, trans, start, end, lengths, alpha, log_z, grad, tags=None):
    return em.new_empty(em.shape), trans.new_empty(trans.shape), start.new_empty(start.shape), end.new_empty(end.shape)


# Each chain's objective by the PyTorch chain program, differentiable to any order: (em, trans, start, end, lengths,
# tags or None) -> (B,) log_z, or gold - log_z with tags (0 for a chain whose log_z or gold score is -inf, as the
# kernels' gradient); structures/factored.py installs it.
generic_chain_objective = Hook("chain_log_backward's own backward (second derivatives)", "semiring_ops.structures")


def _log_backward_setup_context(ctx, inputs, output):
    em, trans, start, end, lengths, _alpha, _log_z, grad, tags = inputs
    ctx.has_tags = tags is not None
    ctx.save_for_backward(em, trans, start, end, lengths, grad, tags)


def _log_backward_backward(ctx, v_em, v_trans, v_start, v_end):
    """Second derivatives: the outputs are g = d (sum_b grad_b F_b) / d params, so the gradient of <v, g> is the
    Hessian of sum_b grad_b F_b times v for the parameters, and <v, dF_b / d params> for grad_b, both by autograd
    through generic_chain_objective (alpha and log_z are the forward's caches of the parameters: no gradient)."""
    em, trans, start, end, lengths, grad, tags = ctx.saved_tensors
    with torch.enable_grad():
        params = [x.detach().requires_grad_() for x in (em, trans, start, end)]
        weight = grad.detach().requires_grad_()
        objective = generic_chain_objective(*params, lengths, tags if ctx.has_tags else None)
        first = torch.autograd.grad((weight * objective).sum(), params, create_graph=True)
        pairs = [(f, v) for f, v in zip(first, (v_em, v_trans, v_start, v_end), strict=True) if v is not None]
        dot = sum((f * v).sum() for f, v in pairs)
        found = torch.autograd.grad(dot, [*params, weight], allow_unused=True) if pairs else [None] * 5
    g_em, g_trans, g_start, g_end, g_grad = (
        torch.zeros_like(x) if g is None else g for g, x in zip(found, (*params, weight), strict=True)
    )
    return g_em, g_trans, g_start, g_end, None, None, None, g_grad, None


chain_log_backward.register_autograd(_log_backward_backward, setup_context=_log_backward_setup_context)


# ---------------------------------------------------------------- the CRF's loss


@torch.library.custom_op("semiring_ops::crf_log_likelihood", mutates_args=())
def crf_log_likelihood(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, tags: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """llh (B,) = gold path score - log_z, with the forward scores alpha (B, T, C) and log_z (B,)."""
    return tuple(backend_for(em.device).crf_log_likelihood(em, trans, start, end, lengths, tags))


@crf_log_likelihood.register_fake
def _(em, trans, start, end, lengths, tags):
    B = em.shape[0]
    return em.new_empty((B,)), em.new_empty(em.shape), em.new_empty((B,))


def _crf_setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1], output[2])  # gradients flow through llh only
    ctx.save_for_backward(*inputs, output[1], output[2])


def _crf_backward(ctx, grad_llh, _grad_alpha=None, _grad_log_z=None):
    if grad_llh is None:
        return (None,) * 6
    em, trans, start, end, lengths, tags, alpha, log_z = ctx.saved_tensors
    # chain_log_backward with tags: the gradient of sum_b grad_b (gold_b - log_z_b) = sum_b grad_b llh_b
    grads = chain_log_backward_eager(em, trans, start, end, lengths, alpha, log_z, grad_llh.to(em.dtype), tags)
    return (*grads, None, None)


crf_log_likelihood.register_autograd(_crf_backward, setup_context=_crf_setup_context)


_CrfLogLikelihoodEager = eager_function(
    "_CrfLogLikelihoodEager",
    lambda *inputs: tuple(backend_for(inputs[0].device).crf_log_likelihood(*inputs)),
    _crf_setup_context,
    _crf_backward,
)


def crf_log_likelihood_eager(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, tags: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """crf_log_likelihood, through the registered op under torch.compile and dispatch modes, else recorded by the
    chain family's C++ autograd node (csrc/autograd), or by _CrfLogLikelihoodEager where there is none, or run
    directly."""
    args = (em, trans, start, end, lengths, tags)
    if not plain_eager(*args):
        return crf_log_likelihood(*args)
    backend = backend_for(em.device)
    if torch.is_grad_enabled() and (
        em.requires_grad or trans.requires_grad or start.requires_grad or end.requires_grad
    ):
        node = backend.autograd_node("chain", "crf_log_likelihood_autograd")
        return _CrfLogLikelihoodEager.apply(*args) if node is None else tuple(node(*args))
    return tuple(backend.crf_log_likelihood(*args))


def chain_log_backward_eager(em, trans, start, end, lengths, alpha, log_z, grad, tags=None):
    """chain_log_backward, skipping the op's dispatch when no graph is recorded (a backward without
    create_graph=True runs in no-grad mode); with create_graph=True the op, for its second derivatives."""
    args = (em, trans, start, end, lengths, alpha, log_z, grad, tags)
    records = torch.is_grad_enabled() and any(x.requires_grad for x in (em, trans, start, end, grad))
    if records or not plain_eager(*args):
        return chain_log_backward(*args)
    return _chain_log_backward(*args)


def _chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags):
    """The backend's chain_log_backward, with the pair marginals' sum added when its kernel left them off chip
    (large C on a GPU: it then returns beta and the chains' weights, csrc/ops.h)."""
    g_em, g_trans, g_start, g_end, *off_chip = backend_for(em.device).chain_log_backward(
        em, trans, start, end, lengths, alpha, log_z, grad, tags
    )
    if off_chip and off_chip[0].numel():
        beta, weight = off_chip
        g_trans = pair_marginal_sum(em, trans, lengths, alpha, log_z, weight, beta).add_(g_trans)
    return g_em, g_trans, g_start, g_end


@torch.library.custom_op("semiring_ops::pair_marginal_sum", mutates_args=())
def pair_marginal_sum(
    em: Tensor, trans: Tensor, lengths: Tensor, alpha: Tensor, log_z: Tensor, weight: Tensor, beta: Tensor
) -> Tensor:
    """sum_n weight_n exp(left[n, i] + right[n, j] + trans[i, j]) over n = (b, t), with left = alpha[b, t] - log_z_b
    and right = em[b, t + 1] + beta[b, t + 1] (-inf past the length): the weighted pair marginals' sum, (C, C).
    One log_contract (the bmm family) over chunks of n run as a batch, so that even a single (C, C) output fills
    the GPU. em, alpha, beta (B, T, C); trans (C, C); lengths, log_z, weight (B,)."""
    B, T, C = em.shape
    neg_z = torch.where(log_z == -math.inf, log_z, -log_z).view(B, 1, 1)
    live = (torch.arange(1, T, device=em.device).view(1, -1) < lengths.view(-1, 1)).unsqueeze(-1)
    left = (alpha[:, :-1] + neg_z).reshape(-1, C)
    right = torch.where(live, em[:, 1:] + beta[:, 1:], -math.inf).reshape(-1, C)
    w = weight.reshape(B, 1, 1).expand(B, T - 1, C).reshape(-1, C)
    n = left.shape[0]
    tiles = ((C + 63) // 64) ** 2  # log_contract's 64 x 64 output tiles per chunk
    chunks = max(1, min((n + 63) // 64, (264 + tiles - 1) // tiles))  # about 264 blocks (2 per H100 SM) in all
    size = (n + chunks - 1) // chunks
    pad = chunks * size - n
    if pad:
        left = torch.cat([left, left.new_full((pad, C), -math.inf)])
        right = torch.cat([right, right.new_full((pad, C), -math.inf)])
        w = torch.cat([w, w.new_zeros((pad, C))])
    left, right, w = (x.view(chunks, size, C) for x in (left, right, w))
    parts = backend_for(em.device).log_contract(
        left.transpose(1, 2), None, right, w, trans.unsqueeze(0).expand(chunks, C, C)
    )
    return parts.sum(0)


@pair_marginal_sum.register_fake
def _(em, trans, lengths, alpha, log_z, weight, beta):
    return trans.new_empty(trans.shape)


def chain_viterbi_eager(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, semiring_id: int
) -> tuple[Tensor, Tensor]:
    """chain_viterbi without the op's dispatch outside torch.compile and dispatch modes (it has no gradient)."""
    if not plain_eager(em, trans, start, end, lengths):
        return chain_viterbi(em, trans, start, end, lengths, semiring_id)
    return tuple(backend_for(em.device).chain_viterbi(em, trans, start, end, lengths, semiring_id))


# ---------------------------------------------------------------- sequence lengths


@torch.library.custom_op("semiring_ops::sequence_lengths", mutates_args=())
def sequence_lengths(
    mask: Tensor | None,
    lengths: Tensor | None,
    tags: Tensor | None,
    batch: int,
    steps: int,
    num_tags: int,
    raise_errors: bool = True,
) -> Tensor:
    """Lengths (B,) int64 from a prefix mask (B, T) or lengths (B,), validated with the tags (B, T) (each in
    0..num_tags-1 below its length): with raise_errors in one device round trip, ValueError naming what is
    wrong; without, no round trip, each bad sequence's length -1 (its chain results are then NaN)."""
    return _sequence_lengths(mask, lengths, tags, batch, steps, num_tags, raise_errors)


@sequence_lengths.register_fake
def _(mask, lengths, tags, batch, steps, num_tags, raise_errors=True):
    like = next(t for t in (mask, lengths, tags) if t is not None)
    return like.new_empty((batch,), dtype=torch.long)


def _sequence_lengths(mask, lengths, tags, *sizes_and_flag) -> Tensor:
    """The backend's sequence_lengths, on the device of the first tensor given (the op's body)."""
    device = next(t.device for t in (mask, lengths, tags) if t is not None)
    return backend_for(device).sequence_lengths(mask, lengths, tags, *sizes_and_flag)


def sequence_lengths_eager(mask, lengths, tags, batch: int, steps: int, num_tags: int, raise_errors: bool = True):
    """sequence_lengths without the op's dispatch outside torch.compile and dispatch modes."""
    args = (mask, lengths, tags, batch, steps, num_tags, raise_errors)
    if not plain_eager(mask, lengths, tags):
        return sequence_lengths(*args)
    return _sequence_lengths(*args)


@torch.library.custom_op("semiring_ops::chain_viterbi", mutates_args=())
def chain_viterbi(
    em: Tensor, trans: Tensor, start: Tensor, end: Tensor, lengths: Tensor, semiring_id: int
) -> tuple[Tensor, Tensor]:
    """Best path of each chain under max / min -> (score (B,), tags (B, T) int64, -1 past each length)."""
    return tuple(backend_for(em.device).chain_viterbi(em, trans, start, end, lengths, semiring_id))


@chain_viterbi.register_fake
def _(em, trans, start, end, lengths, semiring_id):
    return em.new_empty((em.shape[0],)), em.new_empty(em.shape[:2], dtype=torch.long)
