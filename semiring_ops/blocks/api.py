"""semiring_ops.blocks' entry points: a lazy formula's dense values, its condensed symmetric values (pdist),
and a semiring product, each written block by block into a host output that may exceed device memory.

Common keywords: ``out`` (a host tensor to fill, of the result's shape and dtype; allocated when None);
``devices`` (None: every visible GPU, or CPU workers without one; a list of devices; "all"); ``max_device_bytes``
(the per-device budget that replaces 0.8 x free memory, scheduler.py); ``progress`` (None: a progress line on
a terminal, True / False to force).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..lazy import lazy_tensor
from ..lazy.formula import variables
from ..ops import matmul as matmul_ops
from . import host_memory
from .engine import home_devices, plan_for, resolve_devices, run_blocks
from .policies import LazyDensePolicy, MatmulPolicy
from .scheduler import condensed_size
from .writers import CondensedWriter, DenseWriter

__all__ = ["dense", "matmul", "pdist"]

Devices = Sequence[torch.device | str | int] | str | None


def _host_out(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
    """``out`` checked (a CPU tensor of the result's shape and dtype), or a new one (host_memory.empty: huge
    pages, so its first touch is cheap)."""
    if out is None:
        return host_memory.empty(shape, dtype)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.device.type != "cpu":
        raise ValueError(f"{what}: out must be a host (CPU) tensor, got one on {out.device}")
    if tuple(out.shape) != shape or out.dtype != dtype:
        raise ValueError(
            f"{what}: out has shape {tuple(out.shape)} and {out.dtype}; the result has {shape} and {dtype}"
        )
    return out


def _lazy_parts(K: Any, what: str):
    if not isinstance(K, lazy_tensor.LazyTensor):
        raise TypeError(f"{what}: K must be a semiring_ops.lazy LazyTensor, got {type(K).__name__}")
    if K.device is None:
        raise ValueError(f"{what}: K is a formula of constants only; it has no rows or columns")
    extent = K._extent()
    if extent.batch:
        raise ValueError(f"{what}: K has batch dimensions {extent.batch}; blocks take (M, N) formulas")
    return K.formula, extent.n_i, extent.n_j, K.dtype


def dense(
    K: Any,
    out: torch.Tensor | None = None,
    *,
    devices: Devices = None,
    max_device_bytes: int | None = None,
    progress: bool | None = None,
) -> torch.Tensor:
    """The values of the lazy formula ``K`` at every (i, j): a host tensor (M, N), or (M, N, D) for a formula
    of dimension D > 1 (``K.dense()``'s values, without its batch dims, written block by block)."""
    formula, m, n, dtype = _lazy_parts(K, "blocks.dense")
    policy = LazyDensePolicy(formula, m, n, dtype)
    shape = (m, n) if formula.dim == 1 else (m, n, formula.dim)
    out = _host_out(out, shape, dtype, "blocks.dense")
    devs = resolve_devices(devices)
    run_blocks(policy, DenseWriter(out), plan_for(policy, devs, max_device_bytes), devs, progress)
    return out


def pdist(
    K: Any,
    *,
    diagonal: bool = False,
    out: torch.Tensor | None = None,
    devices: Devices = None,
    max_device_bytes: int | None = None,
    progress: bool | None = None,
) -> torch.Tensor:
    """The condensed values of a symmetric lazy formula ``K`` built from ``Vi(x)`` and ``Vj(x)`` of one x:
    K[i, j] for the pairs i < j in scipy.spatial.distance.pdist's order (row-major), a host tensor
    (n (n - 1) / 2[, D]); with ``diagonal=True`` the pairs i <= j, each row's diagonal first. Only the
    blocks on one side of the diagonal are computed (scheduler.py's triangle mode), about half the work
    of :func:`dense`. Feeds scipy's squareform and scipy.cluster.hierarchy unchanged (``out.numpy()``)."""
    formula, m, n, dtype = _lazy_parts(K, "blocks.pdist")
    if m == n == 1:  # Vi / Vj of one row are parameters (KeOps' rule): no pair, or the diagonal's one
        values = K.dense().reshape(1, -1).to("cpu")
        values = values[:1] if diagonal else values[:0]
        out = _host_out(out, tuple(values.shape) if formula.dim > 1 else (values.shape[0],), dtype, "blocks.pdist")
        out.copy_(values.reshape(out.shape))
        return out

    def same_data(cat: str) -> set:  # a tensor's data, not the object: x[:500] twice is the same x
        return {
            (v.tensor.data_ptr(), tuple(v.tensor.shape), v.tensor.stride(), v.tensor.dtype, v.tensor.device)
            for v in variables(formula)
            if v.cat == cat
        }

    i_tensors, j_tensors = same_data("i"), same_data("j")
    if m != n or not i_tensors or i_tensors != j_tensors:
        raise ValueError(
            f"blocks.pdist: K must be built from Vi(x) and Vj(x) of the same x (a symmetric formula); got "
            f"{len(i_tensors)} i and {len(j_tensors)} j tensors with different data, M = {m}, N = {n}"
        )
    policy = LazyDensePolicy(formula, m, n, dtype)
    size = condensed_size(n, diagonal)
    out = _host_out(out, (size,) if formula.dim == 1 else (size, formula.dim), dtype, "blocks.pdist")
    if not out.is_contiguous():
        raise ValueError("blocks.pdist: out must be contiguous (the condensed layout is written by position)")
    devs = resolve_devices(devices)
    grid = plan_for(policy, devs, max_device_bytes, triangle="upper", diagonal=diagonal)
    run_blocks(policy, CondensedWriter(out, n, diagonal), grid, devs, progress)
    return out


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    semiring: Any = "log",
    out: torch.Tensor | None = None,
    *,
    devices: Devices = None,
    max_device_bytes: int | None = None,
    progress: bool | None = None,
) -> torch.Tensor:
    """C = A (x) B over ``semiring`` (semiring_matmul's names or classes) for a (m, k) and b (k, n), on the
    host or a device, into a host tensor (m, n) written block by block: for products whose output exceeds
    device memory."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"blocks.matmul: {name} must be a 2-D tensor, got {got}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"blocks.matmul: a {tuple(a.shape)} and b {tuple(b.shape)}: inner sizes differ")
    if a.dtype != b.dtype:
        raise ValueError(f"blocks.matmul: a is {a.dtype} and b is {b.dtype}; they must match")
    policy = MatmulPolicy(a, b, semiring)
    out = _host_out(out, (policy.m, policy.n), a.dtype, "blocks.matmul")
    devs = resolve_devices(devices)
    run_blocks(policy, DenseWriter(out), plan_for(policy, devs, max_device_bytes), devs, progress)
    return out


@lazy_tensor.blocks_dense.install
def _lazy_dense(
    K: Any, out: torch.Tensor | None, devices: Devices, max_device_bytes: int | None, progress: bool | None
) -> torch.Tensor:
    """LazyTensor.dense's route to the host: on the formula's GPU (or the CPU workers) unless devices are named."""
    devices = home_devices(K.device) if devices is None else devices
    return dense(K, out, devices=devices, max_device_bytes=max_device_bytes, progress=progress)


@matmul_ops.blocks_matmul_into.install
def _matmul_into(a: torch.Tensor, b: torch.Tensor, semiring: Any, out: torch.Tensor) -> torch.Tensor:
    """semiring_matmul(out=<a host tensor>)'s route: blocks on the operands' device."""
    return matmul(a, b, semiring, out, devices=home_devices(a.device))
