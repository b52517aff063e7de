"""Lazy reductions sharded over torch.distributed ranks (``group=``, semiring_ops/lazy/distributed.py): each
reduction on gloo CPU ranks, the j (or i) data split in uneven and empty shards, equals the one-process answer on
the concatenated data, with ties to the lowest global index and the gradients of sum / logsumexp / K @ v."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist

from semiring_ops.lazy import Vi, Vj
from tests.dist_util import run_ranks

K_BEST = 3


def _gauss(x, y):
    return (-((Vi(x) - Vj(y)) ** 2).sum(-1)).exp()


def _sqdist(x, y):
    return ((Vi(x) - Vj(y)) ** 2).sum(-1)


def _reductions(x, y, b, group):
    """Every reduction over j of the test's formulas, by name."""
    g, d = _gauss(x, y), _sqdist(x, y)
    out = {
        "sum": g.sum(1, group=group),
        "sum_keepdim": g.sum(1, group=group, keepdim=True),
        "logsumexp": (-d).logsumexp(1, group=group),
        "logsumexp_weight": (-d).logsumexp(1, weight=Vj(b.abs() + 0.1), group=group),
        "matmul": g.__matmul__(b, group=group),
        "sumsoftmaxweight": (-d).sumsoftmaxweight(Vj(b), 1, group=group),
        "min": d.min(1, group=group),
        "argmin": d.argmin(1, group=group),
        "max_argmax": d.max_argmax(1, group=group),
        "min_argmin": d.min_argmin(1, group=group),
        "Kmin": d.Kmin(K_BEST, 1, group=group),
        "argKmin": d.argKmin(K_BEST, 1, group=group),
        "Kmin_argKmin": d.Kmin_argKmin(K_BEST, 1, group=group),
        "Kmax_argKmax_vec": ((Vi(x) - Vj(y)) ** 2).Kmax_argKmax(K_BEST, 1, group=group),  # D = 2 components
    }
    return out


def _batched(x, y, group):
    """A batch dimension (2, ., .): the shard is along each batch's j."""
    xb = torch.stack([x, 2 * x])
    yb = torch.stack([y, 0.5 * y])
    d = ((Vi(xb) - Vj(yb)) ** 2).sum(-1)
    return {
        "b_sum": d.sum(2, group=group),
        "b_min_argmin": d.min_argmin(2, group=group),
        "b_Kmin_argKmin": d.Kmin_argKmin(2, 2, group=group),
    }


def _over_i(x, y, group):
    """Reductions over i (dim=0): the i data is the sharded one."""
    g, d = _gauss(x, y), _sqdist(x, y)
    return {
        "sum0": g.sum(0, group=group),
        "logsumexp0": (-d).logsumexp(0, group=group),
        "min_argmin0": d.min_argmin(0, group=group),
        "argKmin0": d.argKmin(K_BEST, 0, group=group),
    }


def _grads(x, y, b, group):
    """d/dx of sum, logsumexp and K @ v (this rank's contribution, then all-reduced), and d/db of K @ v."""
    out = {}
    b = b.detach().requires_grad_(True)
    for name in ("sum", "logsumexp", "matmul", "min", "Kmin"):
        xg = x.detach().requires_grad_(True)
        if name == "sum":
            r = _gauss(xg, y).sum(1, group=group)
        elif name == "logsumexp":
            r = (-_sqdist(xg, y)).logsumexp(1, group=group)
        elif name == "min":
            r = _sqdist(xg, y).min(1, group=group)
        elif name == "Kmin":
            r = _sqdist(xg, y).Kmin(K_BEST, 1, group=group)
        else:
            r = _gauss(xg, y).__matmul__(b, group=group)
        w = torch.linspace(-1, 2, r.numel(), dtype=r.dtype, device=r.device).reshape(r.shape)
        loss = (r * w).sum() + (r**2).sum()
        wrt = [xg, b] if name == "matmul" else [xg]
        got = torch.autograd.grad(loss, wrt)
        out[f"dx_{name}_local"] = got[0].clone()
        if group is not None:
            full = got[0].clone()
            dist.all_reduce(full, group=group)
        else:
            full = got[0]
        out[f"dx_{name}"] = full
        if name == "matmul":
            out["db_matmul"] = got[1]
    return out


def _pack(value):
    """A rank's result as bytes: a tensor put on run_ranks' queue travels as a shared-memory handle, which
    dies with the rank's process when that exits before the parent reads it (a flaky EOFError)"""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _run(fn, world, *args):
    return [torch.load(io.BytesIO(r), weights_only=False) for r in run_ranks(fn, world, *args, timeout=120)]


def _shard(t, sizes, rank):
    lo = sum(sizes[:rank])
    return t[lo : lo + sizes[rank]]


def _rank_fn(rank, world, x, y, b, sizes_j, sizes_i):
    group = dist.group.WORLD
    ys, bs = _shard(y, sizes_j, rank), _shard(b, sizes_j, rank)
    out = _reductions(x, ys, bs, group)
    out.update(_grads(x, ys, bs, group))
    out.update(_over_i(_shard(x, sizes_i, rank), y, group))
    out.update(_batched(x, ys, group))
    return _pack(out)


def _reference(x, y, b):
    out = _reductions(x, y, b, None)
    out.update(_grads(x, y, b, None))
    out.update(_over_i(x, y, None))
    out.update(_batched(x, y, None))
    return out


def _data(m, n, seed, dup=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2, generator=gen, dtype=torch.float64)
    if dup:  # the second half repeats the first: equal values at indices j and j + n / 2
        half = torch.randn(n // 2, 2, generator=gen, dtype=torch.float64)
        y = torch.cat([half, half])
        x[:3] = half[:3]  # exact zeros, tied between two ranks
    else:
        y = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    b = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    return x, y, b


def _flat(v):
    return list(v) if isinstance(v, tuple) else [v]


def _check(results, ref, sizes_j):
    for rank, got in enumerate(results):
        for name, want in ref.items():
            if name.endswith("_local"):
                continue
            if name == "db_matmul":
                want = _shard(want, sizes_j, rank)
            for g, w in zip(_flat(got[name]), _flat(want), strict=True):
                assert g.shape == w.shape, (rank, name)
                if w.dtype == torch.int64:
                    assert torch.equal(g, w), (rank, name, g, w)
                else:
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"rank {rank}: {name}")


@pytest.mark.parametrize(
    ("world", "sizes_j", "sizes_i", "dup"),
    [
        (2, [13, 22], [11, 19], False),  # uneven shards
        (3, [9, 0, 16], [0, 18, 12], False),  # an empty shard, over j and over i
        (3, [7, 6, 7], [10, 10, 10], True),  # duplicated points across ranks: ties to the lowest global index
    ],
)
def test_sharded_equals_one_process(world, sizes_j, sizes_i, dup):
    x, y, b = _data(sum(sizes_i), sum(sizes_j), seed=world + 10 * dup, dup=dup)
    ref = _reference(x, y, b)  # (compiles the kernels once, before the ranks do)
    results = _run(_rank_fn, world, x, y, b, sizes_j, sizes_i)
    _check(results, ref, sizes_j)
    # the gradient for x on a rank is its shard's contribution: their sum is the one-process gradient
    for name in ("sum", "logsumexp", "matmul", "min", "Kmin"):
        total = sum(r[f"dx_{name}_local"] for r in results)
        torch.testing.assert_close(total, ref[f"dx_{name}"], rtol=1e-10, atol=1e-12)
    if dup:  # the ties are real: the first half's indices win
        assert (ref["argmin"][:3, 0] < sum(sizes_j) // 2).all()
        assert torch.equal(ref["min"][:3], torch.zeros(3, 1, dtype=torch.float64))


def _all_empty_fn(rank, world, x):
    y = torch.empty(0, 2, dtype=torch.float64)
    group = dist.group.WORLD
    d = _sqdist(x, y)
    xg = x.detach().requires_grad_(True)
    lse = (-_sqdist(xg, y)).logsumexp(1, group=group)
    (grad,) = torch.autograd.grad(lse.clamp(min=-1.0).sum(), [xg])
    return _pack(
        {
            "sum": _gauss(x, y).sum(1, group=group),
            "logsumexp": lse.detach(),
            "grad": grad,
            "min_argmin": d.min_argmin(1, group=group),
            "max_argmax": d.max_argmax(1, group=group),
        }
    )


def test_all_shards_empty():
    """Every shard empty: the semiring zeros, index 0, -inf rows without NaN (value or gradient)."""
    x = torch.randn(5, 2, dtype=torch.float64)
    for got in _run(_all_empty_fn, 2, x):
        assert torch.equal(got["sum"], torch.zeros(5, 1, dtype=torch.float64))
        assert torch.equal(got["logsumexp"], torch.full((5, 1), -torch.inf, dtype=torch.float64))
        assert not got["grad"].isnan().any()
        assert torch.equal(got["min_argmin"][0], torch.full((5, 1), torch.inf, dtype=torch.float64))
        assert torch.equal(got["min_argmin"][1], torch.zeros(5, 1, dtype=torch.int64))
        assert torch.equal(got["max_argmax"][0], torch.full((5, 1), -torch.inf, dtype=torch.float64))


def test_group_none_unchanged_and_errors():
    x, y, b = _data(6, 5, seed=3)
    g = _gauss(x, y)
    assert torch.equal(g.sum(1, group=None), g.sum(1))
    assert torch.equal(g.__matmul__(b, group=None), g @ b)
    assert torch.equal(_sqdist(x, y).argKmin(2, 1, group=None), _sqdist(x, y).argKmin(2, 1))
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="group="):
            g.sum(1, group=object())
    with pytest.raises(NotImplementedError, match="solve"):
        _gauss(x, x).solve(b[:6], group=object())


def _too_many_fn(rank, world, x, y):
    try:
        _sqdist(x, y[rank * 2 : rank * 2 + 2]).argKmin(5, 1, group=dist.group.WORLD)
    except ValueError as exc:
        return str(exc)
    return None


def test_kbest_larger_than_all_shards():
    x, y, _ = _data(4, 4, seed=5)
    for msg in run_ranks(_too_many_fn, 2, x, y, timeout=120):
        assert msg is not None and "over all ranks" in msg


def _rank_fn_nccl(rank, world, x, y, b, sizes_j, sizes_i):
    """_rank_fn on cuda:rank (NCCL), its tensors brought back to the CPU."""
    dev = torch.device("cuda", rank)
    packed = _rank_fn(rank, world, x.to(dev), y.to(dev), b.to(dev), sizes_j, sizes_i)
    out = torch.load(io.BytesIO(packed), weights_only=False)
    return _pack({k: tuple(t.cpu() for t in v) if isinstance(v, tuple) else v.cpu() for k, v in out.items()})


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_sharded_equals_one_process_over_nccl():
    sizes_j, sizes_i = [13, 22], [11, 19]
    x, y, b = _data(sum(sizes_i), sum(sizes_j), seed=5)
    ref = _reference(x, y, b)
    results = [
        torch.load(io.BytesIO(r), weights_only=False)
        for r in run_ranks(_rank_fn_nccl, 2, x, y, b, sizes_j, sizes_i, timeout=180, backend="nccl")
    ]
    _check(results, ref, sizes_j)
