"""The winners of a selecting reduction (k-best, max, min) on the matrix-unit route, evaluated again as written.

The route's matrices carry the error of their GEMM: on CUDA float32 the tensor cores' 3xTF32 accumulation
(gemm_route.py), ~1e-8 x 3 D relative to |x||y|, which a squared distance |x|^2 + |y|^2 - 2 x.y between near
neighbours magnifies by (|x|^2 + |y|^2) / |x - y|^2 (H200, unit-norm embeddings of D = 768 at cosine 0.96: 2.2e-4
relative error against float64, the plain kernel's 2.8e-7). A selection needs those values only to pick a few
terms. So the route's kernel picks K + MARGIN candidates a row, each candidate's formula is evaluated again in
torch from the variables as the user wrote it (no GEMM, nothing that cancels beyond the formula's own arithmetic),
and the K best of those are kept, in torch.topk's order (reductions.candidates_order: by value, ties by the lower
index). The values are then the formula's as written (3e-8 median relative error on those embeddings: torch's
sum over D is pairwise); the indices differ from an exact selection only where the K-th and the (K + MARGIN + 1)-th
best differ by less than the GEMM's error.

MARGIN = 0 by measurement (H200, 50,000^2 k-NN, K = 10; clustered unit-norm points at cosine 0.96 for the rows
whose 10 indices are float64's): a margin lengthens every list of the kernel, which the insertions pay for.

| D | route alone | margin 0 | margin 2 | margin 4 | rows with float64's indices, margin 0 / >= 2 |
|---|---|---|---|---|---|
| 128 | 10.88 ms | 12.22 | 14.54 | 15.44 | 99.95% / 100% |
| 784 | 39.29 | 42.69 | 44.39 | 45.14 | 100% / 100% |
| 2048 (20,000^2) | 15.82 | 19.74 | 20.21 | 21.38 | 99.61% / 100% |

(the torch form: 99.8% at D = 768; the plain kernel 100%.)

A max or min (K = 1, with or without its index) keeps its semiring's own candidate, the kernel's (a k-best list
would order NaN differently from the semiring's max and min, which propagate it): its value is evaluated again,
its index is the route's.

Cost: the candidates' variables gathered, (rows, K + MARGIN, D) values at most CHUNK_VALUES at a time.
"""

from __future__ import annotations

import dataclasses

import torch

from .formula import evaluate
from .plan import CallArgs, Plan
from .reductions import candidates_order, kbest
from .torch_backend import rows_reader, widest_node

__all__ = ["MARGIN", "candidate_plan", "evaluate_winners"]

MARGIN = 0  # candidates beyond K a row (a k-best reduction): module docstring
CHUNK_VALUES = 1 << 25  # gathered values evaluated at a time


def candidate_plan(plan: Plan) -> Plan:
    """The plan the route runs for ``plan`` (selecting): K + MARGIN best of a k-best, with the indices of a max or
    min that had none."""
    r = plan.reduction
    if r.kind == "kbest":  # (its kernels give indices whatever with_arg: the plan itself when there is no margin)
        return plan if MARGIN == 0 else dataclasses.replace(plan, reduction=kbest(r.k + MARGIN, r.semiring == "max"))
    return plan if plan.with_arg else dataclasses.replace(plan, with_arg=True)


def evaluate_winners(
    plan: Plan, call: CallArgs, vals: torch.Tensor, idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values, indices) of ``plan`` (selecting, unbatched) over ``call`` from the candidate plan's output
    ``vals``/``idx`` (1, n_outer, candidates x Dv): the candidates' formula evaluated as written, their K best kept
    (module docstring). Indices None where ``plan`` tracks none."""
    dv, n = plan.formula.dim, call.n_outer
    per_row = idx.shape[-1] // dv  # candidates a row and component
    largest = plan.reduction.semiring == "max"
    cand = idx.reshape(n, per_row, dv)
    values = _evaluate_pairs(plan, call, cand).to(vals.dtype)
    empty = None  # a list's slots not filled: only where there are fewer terms than candidates
    if per_row > call.n_inner:
        empty = cand < 0
        values = values.masked_fill(empty, -torch.inf if largest else torch.inf)
    k = plan.reduction.k if plan.reduction.kind == "kbest" else 1
    if plan.reduction.kind == "kbest":
        order = candidates_order(values, cand, largest, empty)[:, :k]
        values, cand = values.gather(1, order), cand.gather(1, order)
    values = values.reshape(1, n, k * dv)
    return values, cand.reshape(1, n, k * dv) if plan.index_dim else None


def _evaluate_pairs(plan: Plan, call: CallArgs, cand: torch.Tensor) -> torch.Tensor:
    """(n, C, Dv): component c of the formula at output row r and inner term cand[r, m, c] (-1: any term)."""
    n, per_row, dv = cand.shape
    like = call.tensors[0]
    out = torch.empty(n, per_row, dv, dtype=like.dtype, device=like.device)
    rows = max(1, CHUNK_VALUES // max(1, per_row * dv * widest_node(plan.formula)))
    owned = frozenset(k for k in range(len(plan.arg_cats)) if plan.role(k) == "inner")  # gathered: fresh tensors
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        terms = cand[lo:hi].reshape(hi - lo, per_row * dv).clamp(min=0)
        read = rows_reader(plan, call, lo, hi, terms)  # the inner variables gathered (1, rows, C Dv, D)
        f = evaluate(plan.formula, read, like, call.numbers, owned)  # (1, rows, C Dv, Dv)
        f = f.expand(1, hi - lo, per_row * dv, dv).reshape(hi - lo, per_row, dv, dv)
        out[lo:hi] = f.diagonal(dim1=-2, dim2=-1)  # candidate (m, c)'s component c
    return out
