"""The matrix-unit route's plans: the vector sums of a formula that are inner products of an outer and an inner
variable, and the plan that reads them from precomputed matrices (gemm_route.py runs it).

A squared distance ``((x_i - y_j) ** 2).sum(-1)`` or a dot product ``(x_i | y_j)`` of D-vectors costs a generated
kernel D terms per cell on the SIMT pipe; the same values for a block of rows are one GEMM, |x|^2 + |y|^2 - 2 x.y
(or x.y), on the tensor cores or BLAS. :func:`gram_plan` finds such sums (:func:`match_inner_product`: Square,
IntPow 2 or a product of a difference with itself for "sqdist", the same times a parameter w of dimension D for a
weighted one, sum_d w_d (x_d - y_d)^2 = |x|_w^2 + |y|_w^2 - 2 x.(w y), a product for "dot", of one outer and one
inner variable of the same dimension D >= ``min_dim``) and replaces each by a formula.InnerProduct node: the kernel
skeletons (codegen._cell) read its value from the route's matrices and keep the child for the exact re-summation
of cells where the squared distance cancels. Everything else of the formula (i-only, j-only and parameter terms,
the reduction) is the original plan's, in the same generated kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from .formula import Formula, InnerProduct, IntPow, Mul, Square, Sub, Var, VecSum, _postorder, replace_nodes
from .plan import Plan

__all__ = ["GramSpec", "gram_plan", "match_inner_product"]


@dataclass(frozen=True)
class GramSpec:
    """One inner product of a routed plan: its kind, the outer and inner variables' slots, their dimension."""

    kind: str  # "sqdist" or "dot" (formula.InnerProduct)
    outer_slot: int
    inner_slot: int
    dim: int
    weight_slot: int = -1  # sqdist: a parameter w of dimension D, sum_d w_d (x_d - y_d)^2 (-1: none)


def _squared_difference(x: Formula) -> Formula | None:
    """The difference d of x = d ** 2 (Square, IntPow 2 or d * d), else None."""
    squared = isinstance(x, Square) or (isinstance(x, IntPow) and x.n == 2)
    squared = squared or (isinstance(x, Mul) and x.children[0] is x.children[1])
    return x.children[0] if squared and isinstance(x.children[0], Sub) else None


def match_inner_product(node: Formula, plan: Plan, min_dim: int) -> GramSpec | None:
    """The GramSpec of a VecSum node of ``plan.formula`` that is a squared distance or a dot product of one
    outer and one inner variable of dimension >= min_dim (no broadcasting), else None."""
    if not isinstance(node, VecSum) or node.children[0].dim < max(1, min_dim):
        return None
    x = node.children[0]
    weight = -1
    if isinstance(x, Mul) and x.children[0] is not x.children[1]:  # w * (x - y)^2, w a parameter of dimension D
        for w, rest in (x.children, tuple(reversed(x.children))):
            if isinstance(w, Var) and w.dim == x.dim and plan.role(w.slot) == "param" and _squared_difference(rest):
                weight, x = w.slot, rest
                break
    diff = _squared_difference(x)
    kind, pair = ("sqdist", diff.children) if diff is not None else ("dot", x.children if isinstance(x, Mul) else ())
    if len(pair) != 2 or not all(isinstance(v, Var) and v.dim == x.dim for v in pair):
        return None
    roles = {plan.role(v.slot): v.slot for v in pair}
    if set(roles) != {"outer", "inner"}:
        return None
    return GramSpec(kind, roles["outer"], roles["inner"], x.dim, weight)


def gram_plan(plan: Plan, min_dim: int) -> tuple[Plan, tuple[GramSpec, ...]] | None:
    """The routed plan of ``plan`` (its inner products of dimension >= min_dim as InnerProduct nodes, numbered
    in post-order) and their specs, or None when it has none or is block-sparse. Cached by plan and min_dim."""
    if plan.ranged or "Sum(" not in plan.key:
        return None
    return _gram_plan(plan.key, min_dim)


@functools.lru_cache(maxsize=1024)
def _gram_plan(key: str, min_dim: int) -> tuple[Plan, tuple[GramSpec, ...]] | None:
    plan = Plan.from_key(key)
    specs: list[GramSpec] = []
    replaced: dict[int, Formula] = {}
    for node in _postorder(plan.formula):
        spec = match_inner_product(node, plan, min_dim)
        if spec is not None:
            replaced[id(node)] = InnerProduct(node.children[0], spec.kind, len(specs))
            specs.append(spec)
    if not specs:
        return None
    formula = replace_nodes(plan.formula, replaced)
    routed = dataclasses.replace(plan, formula=formula)
    return routed, tuple(specs)
