"""Pure-PyTorch implementations of the kernel entry points (csrc/ops.h), in bounded-memory blocks.

They serve as the fallback backend when the compiled kernels cannot be built, for devices without
kernels, and for user-defined semirings (any Semiring subclass) that have no C++ twin. Each block
materialises at most ``block_elements()`` cells of the (B, n, k, m) product, never the whole of it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from ..semirings import SEMIRINGS, Semiring

__all__ = [
    "accumulation_dtype",
    "block_elements",
    "bmm_forward",
    "chain_log_backward",
    "chain_scan",
    "chain_viterbi",
    "crf_log_likelihood",
    "generic_bmm",
    "gold_path_score",
    "log_bmm_grads",
    "log_contract",
    "sequence_lengths",
]


def block_elements() -> int:
    """Cells materialised per block (env SEMIRING_OPS_REFERENCE_BLOCK, default 2**24 = 64 MiB of fp32)."""
    return max(1, int(os.environ.get("SEMIRING_OPS_REFERENCE_BLOCK", 1 << 24)))


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit floats, else the dtype itself (as at::opmath_type)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _block_sizes(B: int, n: int, k: int, m: int) -> tuple[int, int, int]:
    """Batch, row and k block sizes whose (b, r, k, m) products hold at most block_elements() cells."""
    budget = block_elements()
    m1 = max(m, 1)
    kb = max(1, min(k, budget // m1))
    rb = max(1, min(n, budget // (m1 * kb)))
    bb = max(1, min(B, budget // (m1 * kb * rb)))
    return bb, rb, kb


def _blocks(B: int, n: int, k: int, m: int) -> Iterator[tuple[slice, slice, slice]]:
    bb, rb, kb = _block_sizes(B, n, k, m)
    for b0 in range(0, B, bb):
        for r0 in range(0, n, rb):
            for k0 in range(0, k, kb):
                yield slice(b0, b0 + bb), slice(r0, r0 + rb), slice(k0, k0 + kb)


def _semiring_by_id(semiring_id: int) -> type[Semiring]:
    for s in SEMIRINGS.values():
        if s.kernel_id == semiring_id:
            return s
    raise ValueError(f"no semiring has kernel_id {semiring_id}")


def bmm_forward(a: Tensor, b: Tensor, semiring_id: int, with_arg: bool) -> tuple[Tensor, Tensor]:
    """Same contract as the compiled ``bmm_forward`` (csrc/ops.h) for the built-in semirings."""
    semiring = _semiring_by_id(semiring_id)
    acc = accumulation_dtype(a.dtype)
    B, n, k = a.shape
    m = b.shape[-1]
    out = a.new_full((B, n, m), semiring.zero, dtype=acc)
    want_arg = with_arg and semiring.selects
    arg = a.new_zeros((B, n, m) if want_arg else (0,), dtype=torch.int64)
    if k == 0 or out.numel() == 0:
        return out, arg
    if semiring.name == "std":
        return torch.bmm(a.to(acc), b.to(acc)), arg
    for bs, rs, ks in _blocks(B, n, k, m):
        cells = a[bs, rs, ks].to(acc).unsqueeze(-1) + b[bs, ks].to(acc).unsqueeze(-3)  # (b, r, kb, m)
        o = out[bs, rs]
        if semiring.name == "log":
            o.copy_(torch.logaddexp(o, torch.logsumexp(cells, dim=-2)))
            continue
        # max / min: first extremum wins ties, and the first NaN wins over everything
        if semiring.name == "max":
            val, idx = cells.max(dim=-2)
            better = val > o
        else:
            val, idx = cells.min(dim=-2)
            better = val < o
        better |= torch.isnan(val) & ~torch.isnan(o)
        o.copy_(torch.where(better, val, o))
        if want_arg:
            arg[bs, rs].copy_(torch.where(better, idx + ks.start, arg[bs, rs]))
    return out, arg


def log_contract(l0: Tensor, l1: Tensor | None, r0: Tensor, r1: Tensor | None, o0: Tensor) -> Tensor:
    """out[p,r,s] = sum_t L1[p,r,t] R1[p,t,s] exp(L0[p,r,t] + R0[p,t,s] + O0[p,r,s]), in blocks over t."""
    B, R, T = l0.shape
    S = r0.shape[-1]
    out = l0.new_zeros((B, R, S))
    for bs, rs, ts in _blocks(B, R, T, S):
        x = l0[bs, rs, ts].unsqueeze(-1) + r0[bs, ts].unsqueeze(-3) + o0[bs, rs].unsqueeze(-2)
        w = torch.exp(x)  # (b, r, tb, S)
        if l1 is not None:
            w = w * l1[bs, rs, ts].unsqueeze(-1)
        if r1 is not None:
            w = w * r1[bs, ts].unsqueeze(-3)
        out[bs, rs] += w.sum(dim=-2)
    return out


def log_bmm_grads(a: Tensor, b: Tensor, c: Tensor, g: Tensor, need_a: bool, need_b: bool) -> tuple[Tensor, Tensor]:
    """Same contract as the compiled ``log_bmm_grads`` (csrc/ops.h): one log_contract per gradient."""
    negc = torch.where(c == -math.inf, c, -c)  # a fully -inf output weighs every term by exp(-inf) = 0
    # grad_a[i,k] = sum_j g_ij exp(-c_ij + b_kj + a_ik): rows i, reduction j, columns k
    ga = log_contract(negc, g, b.transpose(1, 2), None, a) if need_a else c.new_empty((0,))
    # grad_b[k,j] = sum_i exp(a_ik - c_ij + b_kj) g_ij: rows k, reduction i, columns j
    gb = log_contract(a.transpose(1, 2), None, negc, g, b) if need_b else c.new_empty((0,))
    return ga, gb


def generic_bmm(a: Tensor, b: Tensor, semiring: type[Semiring]) -> Tensor:
    """Any Semiring subclass, differentiable by autograd through its own plus / times / sum.

    a (B, n, k), b (B, k, m) -> (B, n, m), computed out-of-place in blocks so that autograd keeps
    only block-sized intermediates.
    """
    B, n, k = a.shape
    m = b.shape[-1]
    bb, rb, kb = _block_sizes(B, n, k, m)
    batches = []
    for b0 in range(0, B, bb):
        rows = []
        for r0 in range(0, n, rb):
            bs, rs = slice(b0, b0 + bb), slice(r0, r0 + rb)
            acc = a.new_full((a[bs, rs].shape[0], a[bs, rs].shape[1], m), semiring.zero)
            for k0 in range(0, k, kb):
                ks = slice(k0, k0 + kb)
                cells = semiring.times(a[bs, rs, ks].unsqueeze(-1), b[bs, ks].unsqueeze(-3))
                acc = semiring.plus(acc, semiring.sum(cells, dim=-2))
            rows.append(acc)
        batches.append(torch.cat(rows, dim=1) if rows else a.new_full((min(bb, B - b0), 0, m), semiring.zero))
    return torch.cat(batches, dim=0) if batches else a.new_full((0, n, m), semiring.zero)


# ---------------------------------------------------------------- chains (contracts in csrc/ops.h)


INVALID_LENGTH = -1  # csrc/ops.h kInvalidLength: how sequence_lengths marks a bad sequence it does not raise for


def _usable_lengths(lengths: Tensor, T: int) -> tuple[Tensor, Tensor]:
    """(L, bad): a length outside 0..T (INVALID_LENGTH: a bad sequence sequence_lengths did not raise for) is 0
    in L and flagged in bad, and that chain's results are NaN, as in the kernels (csrc/ops.h)."""
    bad = (lengths < 0) | (lengths > T)
    return lengths.masked_fill(bad, 0), bad


def _chain_walk(em, trans, start, end, lengths, S, reverse, keep_args):
    """The recursion of chain_scan, one (B, C, C) semiring reduction per step; chains past their length
    carry their last vector unchanged. Returns (last (B, C), scores (B, T, C), pointers (B, T, C), L, bad)."""
    B, T, C = em.shape
    L, bad = _usable_lengths(lengths, T)
    zero = torch.full((), S.zero, dtype=em.dtype, device=em.device)
    scores = zero.expand(B, T, C).clone()
    mat = trans if not reverse else trans.t()  # mat[k, o]: from input k to output o
    pointers = torch.zeros(B, T, C, dtype=torch.long, device=em.device)
    first = (L - 1).clamp_min(0) if reverse else torch.zeros_like(L)
    rows = torch.arange(B, device=em.device)
    u = (end if reverse else start).expand(B, C)
    vec = zero.expand(B, C)
    for s in range(T):
        t = first - s if reverse else first + s  # (B,) position of step s of each chain
        live = s < L
        tc = t.clamp(0, max(T - 1, 0))
        if s > 0:
            terms = S.times(vec.unsqueeze(2), mat)  # (B, k, o)
            if keep_args:
                best, arg = terms.max(1) if S.name == "max" else terms.min(1)
                pointers[rows, tc] = torch.where(live[:, None], arg, pointers[rows, tc])
                u = best
            else:
                u = S.sum(terms, dim=1)
        through = S.times(u, em[rows, tc])
        stored = u if reverse else through
        scores[rows, tc] = torch.where(live[:, None], stored, scores[rows, tc])
        vec = torch.where(live[:, None], through, vec)
    last = S.times(vec, start if reverse else end)
    return last, scores, pointers, L, bad


def chain_scan(em, trans, start, end, lengths, semiring_id: int, reverse: bool, save_scores: bool):
    """The PyTorch twin of the chain_scan kernel (csrc/ops.h)."""
    S = _semiring_by_id(semiring_id)
    last, scores, _, L, bad = _chain_walk(em, trans, start, end, lengths, S, reverse, False)
    total = torch.where(L > 0, S.sum(last, dim=-1), torch.full_like(L, S.one, dtype=em.dtype))
    total = total.masked_fill(bad, math.nan)
    return total, scores if save_scores else em.new_empty((0,))


def chain_viterbi(em, trans, start, end, lengths, semiring_id: int):
    """The PyTorch twin of the chain_viterbi kernel (csrc/ops.h)."""
    S = _semiring_by_id(semiring_id)
    if S.name not in ("max", "min"):
        raise ValueError(f"chain_viterbi needs a selecting semiring, got {S.name}")
    B, T, _ = em.shape
    last, _, pointers, L, bad = _chain_walk(em, trans, start, end, lengths, S, False, True)
    total, tag = last.max(-1) if S.name == "max" else last.min(-1)
    total = torch.where(L > 0, total, torch.zeros_like(total)).masked_fill(bad, math.nan)
    tags = torch.full((B, T), -1, dtype=torch.long, device=em.device)
    rows = torch.arange(B, device=em.device)
    for t in range(T - 1, -1, -1):
        live = t < L
        tags[:, t] = torch.where(live, tag, -1)
        step = pointers[rows, t].gather(1, tag.clamp_min(0).unsqueeze(1)).squeeze(1)
        tag = torch.where(live & (t > 0), step, tag)
    return total, tags


def gold_path_score(em, trans, start, end, lengths, tags) -> Tensor:
    """The log-semiring score of each chain's tag path (B,) (contract of crf_log_likelihood in csrc/ops.h);
    tags past each length are ignored."""
    B, T, C = em.shape
    if T == 0:
        return em.new_zeros(B)
    L, _ = _usable_lengths(lengths, T)
    live = torch.arange(T, device=em.device)[None, :] < L[:, None]
    dead = ~live
    y = tags.masked_fill(dead, 0).long()
    unvalidated = ((y < 0) | (y >= C)).any(1)  # out-of-range tags: NaN, as the kernels
    y = y.clamp(0, C - 1)
    unary = em.gather(2, y.unsqueeze(-1)).squeeze(-1)
    # index_select, not advanced indexing: its gradient is an index_add, not a sorting index_put
    pair = trans.reshape(-1).index_select(0, (y[:, :-1] * C + y[:, 1:]).reshape(-1)).view(B, T - 1)
    last = y.gather(1, (L - 1).clamp_min(0).unsqueeze(1)).squeeze(1)
    # masked_fill, not multiply: a forbidden (-inf) transition in the padding must not become NaN
    total = unary.masked_fill(dead, 0.0).sum(1) + pair.masked_fill(dead[:, 1:], 0.0).sum(1)
    total = total + start.index_select(0, y[:, 0]) + end.index_select(0, last)
    return total.masked_fill(L == 0, 0.0).masked_fill(unvalidated, math.nan)


def crf_log_likelihood(em, trans, start, end, lengths, tags):
    """The PyTorch twin of the crf_log_likelihood kernel (csrc/ops.h) -> (llh, alpha, log_z)."""
    log_z, alpha = chain_scan(em, trans, start, end, lengths, SEMIRINGS["log"].kernel_id, False, True)
    gold = gold_path_score(em, trans, start, end, lengths, tags)
    return torch.where(gold == -math.inf, gold, gold - log_z), alpha, log_z


def chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags=None):
    """The PyTorch twin of the chain_log_backward kernel (csrc/ops.h): beta from the reverse scan, then
    the marginals and one log_contract for the pair marginals, minus the gold path's indicators."""
    B, T, C = em.shape
    _, beta = chain_scan(em, trans, start, end, lengths, SEMIRINGS["log"].kernel_id, True, True)
    lengths, bad = _usable_lengths(lengths, T)
    log_z = log_z.masked_fill(bad, -math.inf)  # a bad chain weighs nothing in the sums; its g_em is NaN
    neg_z = torch.where(log_z == -math.inf, log_z, -log_z)[:, None, None]  # -inf: every weight exp(-inf) = 0
    if tags is not None:  # no gradient for a chain whose gold path is impossible; NaN for unvalidated tags
        gold = gold_path_score(em, trans, start, end, lengths, tags)
        # the loss is sum_b grad_b (gold_b - log_z_b): the marginals weigh -grad, the gold path +grad
        grad = torch.where(gold == -math.inf, 0.0, torch.where(gold.isnan(), gold, -grad))
    g_em = torch.exp(alpha + beta + neg_z) * grad[:, None, None]  # 0 past each length (alpha = -inf there)
    live_t = torch.arange(T, device=em.device)[None, :] < lengths[:, None]  # (B, T)
    g = torch.where(log_z == -math.inf, 0.0, grad)
    if tags is not None and T > 0:
        y = tags.masked_fill(~live_t, 0).long().clamp(0, C - 1)
        g_em = g_em.scatter_add(2, y.unsqueeze(-1), -(g[:, None] * live_t).unsqueeze(-1))
    g_start = g_em[:, 0].sum(0) if T > 0 else torch.zeros_like(start)
    rows = torch.arange(B, device=em.device)
    last = g_em[rows, (lengths - 1).clamp(0, max(T - 1, 0))] if T > 0 else em.new_zeros((B, C))
    g_end = torch.where((lengths > 0)[:, None], last, 0).sum(0)
    g_em_out = g_em.masked_fill(bad[:, None, None], math.nan)  # a bad chain adds nothing to the sums below
    if T < 2:
        return g_em_out, torch.zeros_like(trans), g_start, g_end
    live = (torch.arange(1, T, device=em.device)[None, :] < lengths[:, None])[:, :, None]
    left = (alpha[:, :-1] + neg_z).reshape(1, -1, C).transpose(1, 2)  # (1, C, N), N = B (T - 1)
    right = torch.where(live, em[:, 1:] + beta[:, 1:], -math.inf).reshape(1, -1, C)
    weight = grad[:, None, None].expand(B, T - 1, C).reshape(1, -1, C)
    g_trans = log_contract(left, None, right, weight, trans.unsqueeze(0)).squeeze(0)
    if tags is not None:
        pairs = (y[:, :-1] * C + y[:, 1:]).reshape(-1)
        counts = (g[:, None] * live[:, :, 0]).reshape(-1)
        g_trans = g_trans - torch.zeros(C * C, dtype=em.dtype, device=em.device).index_add(0, pairs, counts).view(C, C)
    return g_em_out, g_trans, g_start, g_end


def sequence_lengths(mask, lengths, tags, batch: int, steps: int, num_tags: int, raise_errors: bool = True) -> Tensor:
    """The PyTorch twin of the sequence_lengths kernel (csrc/ops.h): raises ValueError as it does, or without
    raise_errors marks each bad sequence's length INVALID_LENGTH."""
    if mask is not None and lengths is not None:
        raise ValueError("give mask or lengths, not both")
    device = next((t.device for t in (mask, lengths, tags) if t is not None), None)
    problems: list[tuple[Tensor, Callable[[], str]]] = []  # (bad (B,) bool, its error), in the kernels' order
    if mask is not None:
        if mask.shape != (batch, steps):
            raise ValueError(
                f"mask has shape {tuple(mask.shape)}; expected {(batch, steps)} (batch-major) to match the inputs"
            )
        m = mask.bool()
        holes = (m[:, 1:] & ~m[:, :-1]).any(1)
        problems.append(
            (holes, lambda: "mask has holes (a 1 after a 0): only prefix masks (right padding) are supported")
        )
        L = m.sum(1)
    elif lengths is not None:
        if lengths.shape != (batch,) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(
                f"lengths must be an integer tensor of shape ({batch},), got {tuple(lengths.shape)} {lengths.dtype}"
            )
        L = lengths.to(torch.long, copy=True)  # never the caller's tensor: an op's output may not alias its input
        out_of_range = (L < 0) | (L > steps)  # noqa: SIM300
        problems.append((out_of_range, lambda: f"lengths must lie in 0..{steps}, got {L.tolist()}"))
    else:
        L = torch.full((batch,), steps, dtype=torch.long, device=device)
    if tags is not None:
        if tags.shape != (batch, steps) or tags.dtype.is_floating_point or tags.dtype == torch.bool:
            raise ValueError(
                f"tags has shape {tuple(tags.shape)} and dtype {tags.dtype}; "
                f"expected an integer ({batch}, {steps}) tensor (batch-major)"
            )
        live = torch.arange(steps, device=tags.device)[None, :] < L[:, None]
        bad_tags = (((tags < 0) | (tags >= num_tags)) & live).any(1)
        problems.append((bad_tags, lambda: f"tags must lie in [0, {num_tags}) at unmasked positions"))
    if not raise_errors:
        bad = torch.zeros(batch, dtype=torch.bool, device=L.device)
        for flags, _ in problems:
            bad = bad | flags
        return L.masked_fill(bad, INVALID_LENGTH)
    for flags, message in problems:
        if bool(flags.any()):
            raise ValueError(message())
    return L
