"""The PyTorch implementation of a plan: the formula evaluated densely on chunks of output rows and reduced
with the reduction's torch code. Memory stays linear in the sizes: a chunk of r rows makes tensors of at
most nbatch * r * n_inner * W values, W the widest node of the formula (a D = 64 difference summed to
dimension 1 has W = 64, not 1), and r is chosen so that this is at most CHUNK_VALUES (~2^24), or r = 1 when
one row is wider. It serves when no kernel can be compiled, and as the tests' second opinion. A block-sparse
call (a ranged plan) runs this once per segment of rows, on the inner indices of its ranges."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from .formula import Formula, Var, _postorder, evaluate
from .plan import CallArgs, Plan

__all__ = ["rows_reader", "run_torch", "widest_node"]

CHUNK_VALUES = 1 << 24


def widest_node(formula: Formula) -> int:
    """The largest vector dimension among the formula's nodes (its intermediates and its variables)."""
    return max(1, *(node.dim for node in _postorder(formula)))


def rows_reader(
    plan: Plan, call: CallArgs, start: int, stop: int, terms: torch.Tensor | None = None
) -> Callable[[Var], torch.Tensor]:
    """formula.evaluate's ``read`` for output rows [start, stop): each variable as (B, rows, terms, D) broadcasting
    (a parameter (B, 1, 1, D), an outer one (B, rows, 1, D)); the inner terms all of them (B, 1, n_inner, D), or with
    ``terms`` (rows, C) the C inner terms of each row, gathered (B, rows, C, D)."""

    def read(var: Var) -> torch.Tensor:
        t = call.batched(var.slot)  # (B_k, n, D) or (B_k, D)
        role = plan.role(var.slot)
        if role == "param":
            return t[:, None, None, :]
        if role == "outer":
            return t[:, start:stop, None, :]
        return t[:, None, :, :] if terms is None else t[:, terms]

    return read


def run_torch(plan: Plan, call: CallArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (nbatch, n_outer, value_dim), indices (nbatch, n_outer, index_dim) or None)."""
    if call.ranges is not None:
        return _run_segments(plan, call)
    like = call.tensors[0] if call.tensors else torch.empty(0)
    per_row = max(1, call.n_inner * widest_node(plan.formula) * call.nbatch)
    chunk = max(1, CHUNK_VALUES // per_row)
    vals_parts, idx_parts = [], []
    for start in range(0, max(call.n_outer, 1), chunk):
        stop = min(call.n_outer, start + chunk)
        f = evaluate(plan.formula, rows_reader(plan, call, start, stop), like, call.numbers)
        f = f.expand(call.nbatch, stop - start, call.n_inner, plan.formula.dim)
        v, i = plan.reduction.torch_reduce(f, plan.with_arg)
        vals_parts.append(v)
        idx_parts.append(i)
        if call.n_outer == 0:
            break
    vals = torch.cat(vals_parts, 1) if vals_parts else None
    idx = torch.cat(idx_parts, 1) if plan.index_dim else None
    return vals, idx


def _run_segments(plan: Plan, call: CallArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A ranged call (no batch): each segment of rows reduced densely over the inner indices of its ranges
    (gathered), the selected indices mapped back to global ones."""
    starts, offsets, inner = (t.tolist() for t in call.ranges[0:3])
    if len(starts) == 1:  # no rows
        return run_torch(plan, replace(call, ranges=None))
    device = call.tensors[0].device if call.tensors else torch.device("cpu")
    vals_parts, idx_parts = [], []
    for s in range(len(starts) - 1):
        rows = slice(starts[s], starts[s + 1])
        spans = inner[offsets[s] : offsets[s + 1]]
        select = torch.cat([torch.arange(lo, hi) for lo, hi in spans]) if spans else torch.zeros(0, dtype=torch.int64)
        select = select.to(device)

        def piece(slot: int, t: torch.Tensor, rows: slice = rows, select: torch.Tensor = select) -> torch.Tensor:
            role = plan.role(slot)
            return t if role == "param" else t[..., rows, :] if role == "outer" else t.index_select(-2, select)

        part = replace(
            call,
            tensors=[piece(k, t) for k, t in enumerate(call.tensors)],
            n_outer=starts[s + 1] - starts[s],
            n_inner=len(select),
            ranges=None,
        )
        v, i = run_torch(plan, part)
        vals_parts.append(v)
        idx_parts.append(select[i] if i is not None and len(select) else i)
    vals = torch.cat(vals_parts, 1)
    idx = torch.cat(idx_parts, 1) if plan.index_dim else None
    return vals, idx
