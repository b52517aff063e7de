"""The matrix-unit route for sums of vector terms: sum_j s_ij (a x_i + b y_j), a scalar cell s times an affine
function of an outer and an inner variable of dimension D, with a and b numbers. It is what the gradient of a
kernel product is: d/dx_i of sum_j exp(-g |x_i - y_j|^2) b_j is sum_j (-2 g exp(..) b_j gout_i) (x_i - y_j).

Summed per cell, such a reduction keeps D running sums per output row (registers spill from D ~ 128: 1.35 s for the
gradient of a 20,000^2 Gaussian kernel product at D = 784 on an H200). Here a block of rows is

    out_block = a x_block * S.sum(1) + b S Y,    S = s on (block rows) x (all inner terms),

S evaluated with torch (formula.evaluate), its squared distances and dot products of dimension >= the route's
minimum read from one GEMM (gemm_route.block_gram: the plan's precision for a sum, shift and re-summation of the
cells where a distance cancels), and S Y one more GEMM (on CUDA the float32 SGEMM but for precision="fast",
gemm_route.route_mm). A Gaussian
cell, exp(a d) of one squared distance with a the same for every cell, is made by block_gram itself on the CPU, in
the C++ pass that completes the distances (distance_blocks.py). The scalar cell must hold no other vector variable
(each would be a block x N x D tensor).
Memory: a few block x N matrices, the blocks sized as gemm_route's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from .formula import (
    Add,
    Concat,
    Const,
    Div,
    Exp,
    Formula,
    Mul,
    Neg,
    Repeat,
    Sub,
    Var,
    VecSum,
    _postorder,
    evaluate,
    replace_nodes,
)
from .gemm_route import (
    IEEE,
    MIN_DIM,
    MIN_PAIRS,
    TF32,
    block_gram,
    block_rows,
    gram_inner,
    product_mode,
    route_mm,
    route_mode,
)
from .inner_products import GramSpec, match_inner_product
from .plan import CallArgs, Plan, new_outputs

__all__ = ["LinearTerm", "match_linear", "run_linear"]

# vector terms of fewer components: the plain kernel. H200, the gradient of a 20,000^2 Gaussian kernel product: at
# D = 128 the plain kernel 22.2 ms, this route 27.4; at D = 784 1,351 ms against 44.5
MIN_LINEAR_DIM = {"cpu": 32, "cuda": 256}
# a product S @ b (no outer term: K @ b with b of E columns): on the 2-core CPU (4,000 x 2,000 Gaussian, D = 64-784)
# from E = 8 this route (GEMM, the cell in place, GEMM) is as fast as the kernel's E running sums per lane and
# faster from E = 16 (37-126 against 70-164 ms); on CUDA the kernel is faster
MIN_PRODUCT_DIM = {"cpu": 8}
_PAIR_SLOT = -3  # the placeholder variables standing for a routed inner product in S's torch evaluation


@dataclasses.dataclass(frozen=True)
class LinearTerm:
    """Components [offset, offset + dim) of the formula: s (outer_coef x + inner_coef y), with the scalar cell s,
    the coefficients (formulas of numbers; outer_coef None for no x term), the variables' slots and the cell's
    inner products to read from GEMMs."""

    cell: Formula
    outer_coef: Formula | None
    outer_slot: int
    inner_coef: Formula
    inner_slot: int
    grams: tuple[tuple[VecSum, GramSpec], ...]
    offset: int
    dim: int


def _numbers_only(f: Formula) -> bool:
    """Whether f is a scalar formula of numbers alone (a coefficient)."""
    return f.dim == 1 and not any(isinstance(n, Var) for n in _postorder(f))


def _affine(f: Formula, plan: Plan) -> dict[int, Formula] | None:
    """{slot: coefficient} of f = sum coefficient * variable (vector variables of f's dimension, coefficients
    formulas of numbers), or None when f is not of that form."""
    if isinstance(f, Var):
        return {f.slot: Const(1.0)} if f.dim > 1 and plan.role(f.slot) != "param" else None
    if isinstance(f, Neg):
        inner = _affine(f.children[0], plan)
        return None if inner is None else {k: Neg(c) for k, c in inner.items()}
    if isinstance(f, (Add, Sub)):
        a, b = (_affine(c, plan) for c in f.children)
        if a is None or b is None or f.children[0].dim != f.children[1].dim:
            return None
        out = dict(a)
        for k, c in b.items():
            c = Neg(c) if isinstance(f, Sub) else c
            out[k] = Add(out[k], c) if k in out else c
        return out
    if isinstance(f, Mul):
        for k, lin in (f.children, reversed(f.children)):
            if _numbers_only(k):
                inner = _affine(lin, plan)
                if inner is not None:
                    return {s: Mul(k, c) for s, c in inner.items()}
    return None


def _constant(f: Formula, plan: Plan) -> bool:
    """Whether f is a scalar formula of numbers and scalar parameters (the same for every cell)."""
    return f.dim == 1 and all(plan.role(n.slot) == "param" for n in _postorder(f) if isinstance(n, Var))


def _scale_of(f: Formula, slot: int, plan: Plan) -> Formula | None:
    """a with f = a * (the variable of ``slot``), a a _constant formula, or None when f is not of that form."""
    if isinstance(f, Var):
        return Const(1.0) if f.slot == slot else None
    if isinstance(f, Neg):
        a = _scale_of(f.children[0], slot, plan)
        return None if a is None else Neg(a)
    if isinstance(f, Div) and _constant(f.children[1], plan):
        a = _scale_of(f.children[0], slot, plan)
        return None if a is None else Div(a, f.children[1])
    if isinstance(f, Mul):
        for k, g in (f.children, reversed(f.children)):
            if _constant(k, plan) and (a := _scale_of(g, slot, plan)) is not None:
                return Mul(k, a)
    return None


def _parts(f: Formula) -> list[Formula]:
    """The formula's components as the parts of its (nested) concatenations."""
    return [p for c in f.children for p in _parts(c)] if isinstance(f, Concat) else [f]


def _term(f: Formula, plan: Plan, gram_min_dim: int, offset: int) -> LinearTerm | None:
    """f = [-] (product of scalar factors, repeated or not) * (one factor affine in at most one outer and one
    inner variable) as a LinearTerm."""
    if isinstance(f, Neg):
        t = _term(f.children[0], plan, gram_min_dim, offset)
        if t is None:
            return None
        outer = None if t.outer_coef is None else Neg(t.outer_coef)
        return dataclasses.replace(t, outer_coef=outer, inner_coef=Neg(t.inner_coef))
    factors = _factors(f)
    vectors = [k for k in factors if k.dim > 1 and not isinstance(k, Repeat)]
    affine = _affine(vectors[0], plan) if len(vectors) == 1 and vectors[0].dim == f.dim else None
    if affine is None:
        return None
    coefs = affine
    outer = [k for k in coefs if plan.role(k) == "outer"]
    inner = [k for k in coefs if plan.role(k) == "inner"]
    if len(outer) > 1 or len(inner) != 1:
        return None
    scalars = [k.children[0] if isinstance(k, Repeat) else k for k in factors if k is not vectors[0]]
    cell = functools.reduce(Mul, scalars) if scalars else Const(1.0)
    grams = tuple((node, spec) for node in _postorder(cell) if (spec := match_inner_product(node, plan, gram_min_dim)))
    skip = {id(node) for node, _ in grams}
    if any(n.dim != 1 for n in _postorder(cell, skip)):  # a vector left in the cell: block x N x D tensors
        return None
    o = outer[0] if outer else -1
    return LinearTerm(cell, coefs.get(o), o, coefs[inner[0]], inner[0], grams, offset, f.dim)


def _factors(f: Formula) -> list[Formula]:
    """The factors of a product (nested Mul nodes flattened)."""
    return [k for c in f.children for k in _factors(c)] if isinstance(f, Mul) else [f]


def match_linear(plan: Plan, min_dim: int, gram_min_dim: int) -> tuple[LinearTerm, ...] | None:
    """The terms of a std-sum plan whose formula (or each part of its concatenation) is a LinearTerm, with at
    least min_dim components in all, else None. Cached by plan and thresholds."""
    r, f = plan.reduction, plan.formula
    if r.kind != "semiring" or r.semiring != "std" or plan.with_arg or plan.ranged or f.dim < max(2, min_dim):
        return None
    return _match_linear(plan.key, gram_min_dim)


@functools.lru_cache(maxsize=1024)
def _match_linear(key: str, gram_min_dim: int) -> tuple[LinearTerm, ...] | None:
    plan = Plan.from_key(key)
    terms, offset = [], 0
    for part in _parts(plan.formula):
        term = _term(part, plan, gram_min_dim, offset)
        if term is None:
            return None
        terms.append(term)
        offset += part.dim
    return tuple(terms)


def run_linear(plan: Plan, call: CallArgs, device: torch.device) -> tuple[torch.Tensor, None] | None:
    """The plan's values by this route, or None when it does not apply (module docstring)."""
    if call.nbatch != 1 or call.ranges is not None or call.dtype not in (torch.float32, torch.float64):
        return None
    mode = route_mode()
    kind = device.type
    if mode == "off" or (mode == "auto" and call.n_outer * call.n_inner < MIN_PAIRS.get(kind, 1 << 62)):
        return None
    on = mode == "on"
    linear, product = MIN_LINEAR_DIM.get(kind, 1 << 30), MIN_PRODUCT_DIM.get(kind, 1 << 30)
    # on the CPU the products read a squared distance or dot product of any dimension from the GEMM (4,000 x
    # 2,000 Gaussian, D = 3 and 16, b of 16-64 columns: the plain kernel's E running sums were 3-8x the torch form)
    gram_min = 1 if on or kind in MIN_PRODUCT_DIM else MIN_DIM.get(kind, 1 << 30)
    terms = match_linear(plan, 2 if on else min(linear, product), gram_min)
    if terms is None:
        return None
    if not on and plan.formula.dim < linear and any(t.outer_coef is not None for t in terms):
        return None
    rows = block_rows(call, device, copies=8)  # S and the cell's temporaries
    if rows is None:
        return None
    vals, _ = new_outputs(plan, call, device)
    if vals.numel() == 0:
        return vals, None
    for term in terms:
        _run_term(term, plan, call, rows, vals[0])
    return vals, None


def _run_term(term: LinearTerm, plan: Plan, call: CallArgs, rows: int, vals: torch.Tensor) -> None:
    """Writes the term's components of every output row into vals (n_outer, value_dim), block by block."""
    numbers = call.numbers

    def coef(c: Formula) -> torch.Tensor:  # a formula of numbers and scalar parameters, the same for every cell
        return evaluate(c, lambda v: _param(call, v), vals, numbers).reshape(())

    # a x + b y = a (x - c) + b (y - c) + (a + b) c with c the inner terms' mean: far from the origin, x S.sum(1)
    # and S y would cancel to the digits of |x| otherwise. Without an outer term (K @ b) there is nothing to cancel
    # against: S b as it stands, as the torch form computes it
    y = call.tensors[term.inner_slot].reshape(call.n_inner, -1)
    outer_coef = coef(term.outer_coef) if term.outer_coef is not None else None
    shift = y.mean(0) if call.n_inner and outer_coef is not None else None
    if shift is not None:
        y = y - shift
    inner_coef = coef(term.inner_coef)
    both = inner_coef + (outer_coef if outer_coef is not None else 0)
    pairs = {id(node): Var("i", 1, slot=_PAIR_SLOT - n) for n, (node, _) in enumerate(term.grams)}
    owned = frozenset(v.slot for v in pairs.values())  # the blocks' matrices, made for the cell alone
    cell = replace_nodes(term.cell, pairs)
    cpu = vals.device.type == "cpu"
    exp_scale = _fused_exp(cell, term, plan, coef) if cpu else None
    inners = [gram_inner(spec, call) for _, spec in term.grams]  # the inner sides, once for every block
    # on the CPU each inner product's block matrix is one buffer for every block (the cell is evaluated in place on
    # it, then read by the product with y before the next block writes it)
    buffers = [vals.new_empty(min(rows, call.n_outer), call.n_inner) if cpu else None for _ in term.grams]
    modes = [product_mode(plan.precision, False, spec.dim) for _, spec in term.grams]
    for lo in range(0, call.n_outer, rows):
        n = min(rows, call.n_outer - lo)
        values = {
            _PAIR_SLOT - k: block_gram(spec, inner, call, lo, n, mode, buffer, exp_scale)
            for k, ((_, spec), inner, buffer, mode) in enumerate(zip(term.grams, inners, buffers, modes, strict=True))
        }

        def read(var: Var, lo: int = lo, n: int = n, values: dict = values) -> torch.Tensor:
            if var.slot <= _PAIR_SLOT:
                return values[var.slot][:, :, None]
            role = plan.role(var.slot)
            if role == "param":
                return _param(call, var)
            t = call.tensors[var.slot]
            t = t.reshape(-1, t.shape[-1])
            return t[lo : lo + n, None, :] if role == "outer" else t[None, :, :]

        if exp_scale is not None:  # the cell made by block_gram
            s = values[_PAIR_SLOT]
        else:
            s = evaluate(cell, read, vals, numbers, owned).expand(n, call.n_inner, 1)[:, :, 0]
        out = route_mm(s, y, TF32 if plan.fast else IEEE)
        if not (isinstance(term.inner_coef, Const) and term.inner_coef.value == 1.0):
            out *= inner_coef
        if shift is not None:
            total = s.sum(1, keepdim=True)
            out += total * (shift * both)
            x = call.tensors[term.outer_slot].reshape(call.n_outer, -1)[lo : lo + n]
            out += (x - shift) * (total * outer_coef)
        vals[lo : lo + n, term.offset : term.offset + term.dim] = out


def _param(call: CallArgs, var: Var) -> torch.Tensor:
    """A parameter's values as the cell's evaluation broadcasts them: (1, 1, dim)."""
    return call.tensors[var.slot].reshape(1, 1, -1)


def _fused_exp(cell: Formula, term: LinearTerm, plan: Plan, coef: Callable[[Formula], torch.Tensor]) -> float | None:
    """a where the cell is exp(a * one squared distance) with a the same for every cell (a Gaussian kernel: block_gram
    then makes it in the pass that completes the distances, on the CPU), else None. ``coef`` evaluates a."""
    if len(term.grams) != 1 or term.grams[0][1].kind == "dot" or not isinstance(cell, Exp):
        return None
    a = _scale_of(cell.children[0], _PAIR_SLOT, plan)
    return None if a is None else float(coef(a))
