"""The PyTorch implementation of a plan: the formula evaluated densely on chunks of output rows and reduced
with the reduction's torch code. Memory stays linear in the sizes: a chunk of r rows makes tensors of at
most nbatch * r * n_inner * W values, W the widest node of the formula (a D = 64 difference summed to
dimension 1 has W = 64, not 1), and r is chosen so that this is at most CHUNK_VALUES (~2^24), or r = 1 when
one row is wider. It serves when no kernel can be compiled, and as the tests' second opinion."""

from __future__ import annotations

import torch

from .formula import Formula, Var, _postorder, evaluate
from .plan import CallArgs, Plan

__all__ = ["run_torch", "widest_node"]

CHUNK_VALUES = 1 << 24


def widest_node(formula: Formula) -> int:
    """The largest vector dimension among the formula's nodes (its intermediates and its variables)."""
    return max(1, *(node.dim for node in _postorder(formula)))


def run_torch(plan: Plan, call: CallArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (nbatch, n_outer, value_dim), indices (nbatch, n_outer, index_dim) or None)."""
    like = call.tensors[0] if call.tensors else torch.empty(0)
    per_row = max(1, call.n_inner * widest_node(plan.formula) * call.nbatch)
    chunk = max(1, CHUNK_VALUES // per_row)
    vals_parts, idx_parts = [], []
    for start in range(0, max(call.n_outer, 1), chunk):
        stop = min(call.n_outer, start + chunk)

        def read(var: Var, start: int = start, stop: int = stop) -> torch.Tensor:
            t = call.batched(var.slot)  # (B_k, n, D) or (B_k, D)
            role = plan.role(var.slot)
            if role == "param":
                return t[:, None, None, :]
            if role == "outer":
                return t[:, start:stop, None, :]
            return t[:, None, :, :]

        f = evaluate(plan.formula, read, like, call.numbers)
        f = f.expand(call.nbatch, stop - start, call.n_inner, plan.formula.dim)
        v, i = plan.reduction.torch_reduce(f, plan.with_arg)
        vals_parts.append(v)
        idx_parts.append(i)
        if call.n_outer == 0:
            break
    vals = torch.cat(vals_parts, 1) if vals_parts else None
    idx = torch.cat(idx_parts, 1) if plan.index_dim else None
    return vals, idx
