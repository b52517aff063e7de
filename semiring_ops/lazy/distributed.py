"""Lazy reductions sharded over torch.distributed ranks: ``K.sum(1, group=g)`` and the other reductions.

Reducing over j (dim=1) with ``group=g``: each rank of the process group ``g`` holds a slice of the j data (its
shard, possibly empty) and the same i data; each rank reduces its own shard (the one-process kernels), and the
partial results are combined with torch.distributed collectives of the group's backend (gloo, NCCL):

===============  ===================================================================================
reduction        combine
===============  ===================================================================================
sum, K @ v       all_reduce SUM
logsumexp        all_reduce MAX of the rows' partial maxima m, all_reduce SUM of exp(partial - m),
                 log + m (rows of -inf on every rank stay -inf, without NaN)
max / min, arg   all_gather of (value, global index): the best value, ties to the lowest global index
                 (the lower rank); an empty shard's partial never wins
K best           all_gather of each rank's min(K, shard size) best (value, global index), padded to K, then
                 merged by a sort: by value, ties to the lowest global index; 1 <= K <= total size
===============  ===================================================================================

A global index is the local one plus the rank's offset: the sum of the lower ranks' shard sizes (an all_gather
of the sizes). Every rank gets the whole result. Reducing over i (dim=0) with ``group=`` shards the i data
instead, with the same rules.

Gradients: the combine's backward is the identity on each rank's partial result (sum), exp(partial - total)
(logsumexp), the winning rank's partial (max / min / K best values): on each rank, the gradient reaches its
own shard's terms only. So the gradient of a sharded variable (y, b) is complete on its rank, while that of a
replicated one (x) is this rank's contribution: all_reduce(x.grad) (SUM) is the one-process gradient (as
DistributedDataParallel does for parameters). Not with ranges= (block-sparse patterns name global indices).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .reductions import Reduction, candidates_order, kbest, semiring_reduction

if TYPE_CHECKING:
    from .lazy_tensor import LazyTensor
    from .options import ReduceOptions

__all__ = ["all_reduce_sum", "reduce_sharded"]


class _AllReduceSum(torch.autograd.Function):
    """all_reduce(SUM) of x over the group; backward: the identity (each rank's partial result contributes
    to the total with weight 1, and every rank holds the same total, so the cotangent of its partial is the
    total's own)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        y = x.detach().clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g, None


def all_reduce_sum(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The sum over the group's ranks of x, differentiable (identity backward, see _AllReduceSum)."""
    return _AllReduceSum.apply(x, group)


def _check_group(group: Any, what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{what}: group= needs an initialised torch.distributed process group")


def _sizes(n_local: int, device: torch.device, group: Any) -> list[int]:
    """Every rank's shard size, in rank order."""
    world = dist.get_world_size(group)
    mine = torch.tensor([n_local], dtype=torch.int64, device=device)
    got = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(got, mine, group=group)
    return [int(t.item()) for t in got]


def _all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """(world, *x.shape): every rank's x (same shapes everywhere), not differentiable."""
    x = x.detach().contiguous()
    got = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, x, group=group)
    return torch.stack(got)


def _logsumexp_combine(p: torch.Tensor, group: Any) -> torch.Tensor:
    """log sum_ranks exp(p), max-shifted; differentiable: d/dp = exp(p - total), 0 where the total is -inf."""
    m = p.detach().clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = all_reduce_sum(torch.exp(p - m), group)
    positive = s > 0
    safe = torch.where(positive, s, torch.ones_like(s))
    return torch.where(positive, torch.log(safe) + m, torch.full_like(s, -math.inf))


def _pick(local: torch.Tensor, winner: torch.Tensor, rank: int, group: Any) -> torch.Tensor:
    """The winning rank's entries of ``local`` on every rank, differentiable (the gradient goes to the winner)."""
    mine = winner == rank
    return all_reduce_sum(torch.where(mine, local, torch.zeros_like(local)), group)


def _extremum_combine(vals, idx, reduction: Reduction, offset: int, empty: bool, n_total: int, group: Any):
    """(values, global indices) of max / min: the best over ranks, ties to the lowest global index."""
    rank = dist.get_rank(group)
    gidx = torch.full_like(idx, n_total) if empty else idx + offset  # an empty shard's index never wins
    all_v, all_i = _all_gather(vals, group), _all_gather(gidx, group)
    best = all_v.amax(0) if reduction.semiring == "max" else all_v.amin(0)
    hit = (all_v == best) | (torch.isnan(all_v) & torch.isnan(best))
    hit &= all_i < n_total  # not an empty shard
    chosen = torch.where(hit, all_i, torch.full_like(all_i, n_total)).amin(0)
    # all shards empty: the semiring zero (every rank's value) and index 0
    chosen_rank = torch.argmax((all_i == chosen).to(torch.uint8), 0)
    chosen_rank = torch.where(chosen < n_total, chosen_rank, torch.zeros_like(chosen_rank))
    out_v = _pick(vals, chosen_rank, rank, group)
    out_i = torch.where(chosen < n_total, chosen, torch.zeros_like(chosen))
    return out_v, out_i


def _kbest_combine(vals, idx, k: int, largest: bool, offset: int, n_total: int, group: Any):
    """vals, idx (..., k_local, D) local best -> (..., K, D) global best, ties to the lowest global index."""
    rank = dist.get_rank(group)
    pad = k - vals.shape[-2]
    gidx = idx + offset
    if pad:
        fill = -math.inf if largest else math.inf
        shape = (*vals.shape[:-2], pad, vals.shape[-1])
        vals = torch.cat([vals, torch.full(shape, fill, dtype=vals.dtype, device=vals.device)], -2)
        gidx = torch.cat([gidx, torch.full(shape, n_total, dtype=gidx.dtype, device=gidx.device)], -2)
    all_v, all_i = _all_gather(vals, group), _all_gather(gidx, group)  # (world, ..., K, D)
    cand_v = torch.cat(list(all_v.unbind(0)), -2)  # (..., world K, D), rank-major
    cand_i = torch.cat(list(all_i.unbind(0)), -2)
    order = candidates_order(cand_v, cand_i, largest, cand_i >= n_total)[..., :k, :]  # the padding last, after NaN
    out_i = cand_i.gather(-2, order)
    src_rank, slot = order // k, order % k
    out_v = _pick(vals.gather(-2, slot), src_rank, rank, group)
    return out_v, out_i


def reduce_sharded(
    lazy: LazyTensor,
    reduction: Reduction,
    over: str,
    what: str,
    with_arg: bool,
    opts: ReduceOptions,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LazyTensor._reduce with ``group=``: this rank's shard of the reduced axis reduced, the partial results
    combined over the group (module docstring). Same (values, indices) layout as _reduce."""
    _check_group(group, what)
    if over == "vector":
        raise ValueError(f"{what} over the vector dimension with group=: reduce over i (dim=0) or j (dim=1)")
    if lazy.device is None:
        raise ValueError(f"{what}: a formula of constants only has nothing to reduce over")
    if opts.ranges is not None or lazy.ranges is not None:
        raise NotImplementedError(f"{what}: group= with ranges= (block-sparse reductions) is not supported")
    n_local = lazy._extent().rows(over)
    sizes = _sizes(n_local, lazy.device, group)
    rank = dist.get_rank(group)
    offset, n_total = sum(sizes[:rank]), sum(sizes)
    local_opts = replace(opts, keepdim=False, out=None)
    d = lazy.formula.dim
    if reduction.kind == "kbest":
        k = reduction.k
        if not 1 <= k <= n_total:
            raise ValueError(
                f"{what}: K={k} must be between 1 and the reduced size {n_total} over all ranks (over {over})"
            )
        k_local = min(k, n_local)
        if k_local:
            vals, idx = lazy._reduce(kbest(k_local, reduction.semiring == "max"), over, what, opts=local_opts)
            if d == 1:
                vals, idx = vals.unsqueeze(-1), idx.unsqueeze(-1)
        else:  # an empty shard: no candidates (padded by the combine), still on the autograd graph (zero gradients)
            vals, idx = lazy._reduce(semiring_reduction(reduction.semiring), over, what, True, local_opts)
            vals, idx = vals.unsqueeze(-2)[..., :0, :], idx.unsqueeze(-2)[..., :0, :]
        vals, idx = _kbest_combine(vals, idx, k, reduction.semiring == "max", offset, n_total, group)
        if d == 1:
            vals, idx = vals.squeeze(-1), idx.squeeze(-1)
    else:
        selects = reduction.selects
        vals, idx = lazy._reduce(reduction, over, what, with_arg or selects, local_opts)
        if selects:
            vals, idx = _extremum_combine(vals, idx, reduction, offset, n_local == 0, n_total, group)
            idx = idx if with_arg else None
        elif reduction.semiring == "log":  # logsumexp, with or without a weight
            vals = _logsumexp_combine(vals, group)
        elif reduction.semiring == "std":
            vals = all_reduce_sum(vals, group)
        else:
            raise NotImplementedError(f"{what}: group= with the {reduction.semiring!r} semiring is not supported")
    if opts.keepdim:
        at = -2 if over == "j" else -3
        vals, idx = vals.unsqueeze(at), (None if idx is None else idx.unsqueeze(at))
    return vals, idx
