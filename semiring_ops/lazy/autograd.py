"""Running a reduction with autograd.

:func:`reduce_formula` canonicalises a formula (its tensors become slot arguments, so equal structures share
one compiled kernel), then runs its plan (:func:`run_plan`) one of two ways:

- plain eager tensors: straight to the kernel, through :class:`LazyReduction` when a graph is recorded
  (no dispatcher on the way: it is most of a small reduction's host time);
- anything else (torch.compile, FakeTensor, dispatch modes, tensor subclasses): the registered operator
  ``semiring_ops::lazy_reduce(plan_key, [n_i, n_j, *batch], tensors) -> (values, indices)``, with a fake
  implementation (shapes from the plan) and the same gradient. Its plan travels as its key, a string that
  describes it completely (formula_key.py parses it back), so a traced graph holds only strings and tensors.

The backward pass of both is

- for sum and logsumexp: new sum reductions of the formula's symbolic derivative (formula.vjp) with the
  reduction's cotangent (reductions.Reduction.cotangent), one over j for the i-variables and parameters and one
  over i for the j-variables. These are reductions themselves, so second derivatives come the same way; a
  block-sparse one's read the same ranges, the reduction over the other axis their other half;
- for max, min and k-best: the subgradient at the selected pairs, evaluated with torch on those pairs only
  (O(rows * selected) work and memory), differentiable again through torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as _FORWARD_AD

from ..ops.registry import plain_eager
from .block_sparse import check_transposed, swapped
from .dispatch import execute
from .formula import (
    Concat,
    Formula,
    Mul,
    Var,
    canonical_node,
    canonical_numbers,
    canonicalize,
    evaluate,
    jvp,
    substitute,
    transpose_linear,
    vjp,
)
from .plan import RANGE_TENSORS, Plan, numbers_tensor, prepare_call
from .reductions import Reduction, semiring_reduction

__all__ = ["Extent", "matmul_formula", "reduce_formula", "run_plan"]

MAX_INNER = 2**31 - 1  # the reducers keep int32 indices


@dataclass(frozen=True)
class Extent:
    """The sizes of a lazy tensor: broadcast batch shape, number of i and of j."""

    batch: tuple[int, ...]
    n_i: int
    n_j: int

    def rows(self, cat: str) -> int:
        return self.n_i if cat == "i" else self.n_j

    @property
    def pairs(self) -> int:
        """The (i, j) pairs of a reduction, batch included."""
        return math.prod(self.batch) * self.n_i * self.n_j


def _remembered_plan(
    formula: Formula, key: tuple, make, numbers: torch.Tensor | None = None
) -> tuple[Plan, list[Var], torch.Tensor | None]:
    """(plan, tensor variables, number vector or None) kept on the formula under ``key``; make(canon, tvars)
    builds the plan once. ``numbers``: the number vector that Num nodes already in the formula index (those
    of a derivative of a canonical formula); the call's vector starts with it."""
    if formula._plans is None:
        formula._plans = {}
    entry = formula._plans.get(key)
    if entry is None:
        numbered = 0 if numbers is None else numbers.shape[0]
        canon, tvars = canonicalize(formula, numbered=numbered)
        plan = make(canon, tvars)
        vector = None
        if plan.n_numbers:
            like = numbers if numbers is not None else (tvars[0].tensor if tvars else None)
            vector = _number_vector(numbers, canonical_numbers(formula, numbered), like)
        entry = formula._plans[key] = (plan, tvars, vector)
    return entry


def _number_vector(prefix: torch.Tensor | None, values: Sequence[float], like: torch.Tensor | None) -> torch.Tensor:
    """The number vector of a plan derived from another: the numbers its Num nodes share with that plan's
    (``prefix``, or None), then its own ``values`` (numbers_tensor in the compute dtype of ``like``)."""
    own = numbers_tensor(values, like) if values or prefix is None else None
    if prefix is None:
        return own
    return prefix if own is None else torch.cat([prefix, own.to(prefix.dtype)])


def _with_numbers(tensors: list[torch.Tensor], vector: torch.Tensor | None) -> list[torch.Tensor]:
    return tensors if vector is None else [*tensors, vector]


def reduce_formula(
    formula: Formula,
    reduction: Reduction,
    outer: str,
    extent: Extent,
    with_arg: bool = False,
    numbers: torch.Tensor | None = None,
    ranges: tuple[torch.Tensor, ...] | None = None,
    precision: str = "exact",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reduces ``formula`` over the category that is not ``outer``: (values (*batch, rows, value_dim),
    indices (*batch, rows, index_dim) or None). The plan is remembered on the formula, so reducing one
    LazyTensor again goes straight to the kernel. ``numbers``: see _remembered_plan. ``ranges``: a block-sparse
    reduction's six range tensors (block_sparse.oriented_ranges for ``outer``). ``precision``: the route's
    products (Plan.precision)."""
    ranged = ranges is not None

    def make(canon: Formula, tvars: list[Var]) -> Plan:
        cats, dims = tuple(v.cat for v in tvars), tuple(v.dim for v in tvars)
        return Plan(canon, cats, dims, reduction, outer, with_arg, ranged, precision)

    plan, tvars, vector = _remembered_plan(formula, (reduction, outer, with_arg, ranged, precision), make, numbers)
    tensors = _with_numbers([v.tensor for v in tvars], vector)
    return run_plan(plan, extent, [*tensors, *ranges] if ranged else tensors)


def matmul_formula(
    formula: Formula, v: torch.Tensor, extent: Extent, ranges: tuple[torch.Tensor, ...] | None = None
) -> torch.Tensor:
    """sum_j F_ij v_j for a scalar formula F and v (N, E): (M, E); the plan of ``F * v_j`` summed over j
    is remembered on F, so ``K @ v`` with a new v each call (conjugate gradients) builds no formula.
    ``ranges``: a block-sparse product's six range tensors (block_sparse.oriented_ranges for rows i)."""
    e, ranged = v.shape[-1], ranges is not None

    def make(canon: Formula, tvars: list[Var]) -> Plan:
        cats, dims = (*(t.cat for t in tvars), "j"), (*(t.dim for t in tvars), e)
        v_j = canonical_node(Var("j", e, slot=len(tvars)))
        return Plan(canonical_node(Mul(canon, v_j)), cats, dims, semiring_reduction("std"), "i", False, ranged)

    plan, tvars, vector = _remembered_plan(formula, ("@", e, "ranged") if ranged else ("@", e), make)
    tensors = _with_numbers([*(t.tensor for t in tvars), v], vector)
    return run_plan(plan, extent, [*tensors, *ranges] if ranged else tensors)[0]


def run_plan(plan: Plan, extent: Extent, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs ``plan`` on its argument tensors (one per slot, then the number vector when the plan has numbers):
    directly or through LazyReduction on plain eager tensors, through the registered operator otherwise (see
    the module docstring)."""
    plan.check_call(tensors)
    n_inner = extent.rows(plan.inner)
    if n_inner > MAX_INNER:
        raise ValueError(f"reductions over more than 2^31 - 1 terms are not supported (got {n_inner})")
    # the range tensors are the RangeMaps' own (block_sparse.py), plain CPU tensors never wrapped or needing grad
    variables = tensors[: len(tensors) - RANGE_TENSORS] if plan.ranged else tensors
    if not plain_eager(*variables):
        if not torch.compiler.is_compiling():
            if _functorch_level(tensors):  # under a torch.func transform: the Function and its rules
                out = LazyReduction.apply(plan, extent, *tensors)
                return (out[0], out[1]) if plan.index_dim else (out, None)
            if any(torch._C._functorch.is_legacy_batchedtensor(t) for t in tensors):
                raise NotImplementedError(
                    "lazy reductions do not run under the legacy vmap of torch.autograd.functional's "
                    "vectorize=True and gradcheck's check_batched_grad: use torch.func (jacrev, jacfwd, hessian, "
                    "vmap), or vectorize=False"
                )
        vals, idx = lazy_reduce(plan.key, [extent.n_i, extent.n_j, *extent.batch], list(tensors))
        return vals, (idx if plan.index_dim else None)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in variables)) and _FORWARD_AD._current_level < 0:
        return _run(plan, extent, tensors)  # no graph to record, no dual tensors: skip the Function's overhead
    out = LazyReduction.apply(plan, extent, *tensors)
    if plan.index_dim:
        return out[0], out[1]
    return out, None


def _functorch_level(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a tensor is a torch.func wrapper (vmap's batched tensors, grad's and jvp's tracking tensors)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(wrapped(t) for t in tensors)


def _run(plan: Plan, extent: Extent, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reduction itself: (values (*batch, rows, value_dim) in the inputs' dtype, indices or None)."""
    device = tensors[0].device if tensors else torch.device("cpu")
    n_outer, n_inner = extent.rows(plan.outer), extent.rows(plan.inner)
    call = prepare_call(plan, extent.batch, n_outer, n_inner, list(tensors))
    vals, idx = execute(plan, call, device)
    if tensors and vals.dtype != tensors[0].dtype:
        vals = vals.to(tensors[0].dtype)
    vals = vals.reshape(*extent.batch, n_outer, plan.value_dim)
    if idx is not None:
        idx = idx.reshape(*extent.batch, n_outer, plan.index_dim)
    return vals, idx


def _backward(
    plan: Plan, extent: Extent, saved: Sequence[torch.Tensor | None], grad_vals: torch.Tensor, needs: Sequence[bool]
) -> list[torch.Tensor | None]:
    """The gradients of the argument tensors; saved = (*tensors, values, indices or None)."""
    *tensors, vals, idx = saved
    if plan.reduction.selects:
        return _selected_pairs_backward(plan, extent, tensors, vals, idx, grad_vals, needs)
    return _reduction_backward(plan, extent, tensors, vals, grad_vals, needs)


class LazyReduction(torch.autograd.Function):
    """The reduction with its derivatives: ``backward`` (reverse mode), ``jvp`` (forward mode) and ``vmap`` (a
    batching rule), so torch.func's transforms (grad, vjp, jvp, vmap, jacrev, jacfwd, hessian) compose with it.
    torch.func calls ``forward`` on plain tensors and the rules below on those of the level it removes."""

    @staticmethod
    def forward(plan: Plan, extent: Extent, *tensors: torch.Tensor):
        vals, idx = _run(plan, extent, tensors)
        return (vals, idx) if idx is not None else vals

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        plan, extent, *tensors = inputs
        vals, idx = output if plan.index_dim else (output, None)
        ctx.plan, ctx.extent = plan, extent
        ctx.set_materialize_grads(False)  # the jvp then gets None, not zeros, for inputs without a tangent
        ctx.save_for_backward(*tensors, vals, idx)
        ctx.save_for_forward(*tensors, vals, idx)
        if idx is not None:
            ctx.mark_non_differentiable(idx)

    @staticmethod
    def backward(ctx, grad_vals: torch.Tensor | None, grad_idx: torch.Tensor | None = None):
        if grad_vals is None:
            return (None,) * len(ctx.saved_tensors)  # (plan, extent, *tensors): saved are (*tensors, vals, idx)
        grads = _backward(ctx.plan, ctx.extent, ctx.saved_tensors, grad_vals, ctx.needs_input_grad[2:])
        return (None, None, *grads)

    @staticmethod
    def jvp(ctx, _plan, _extent, *tangents: torch.Tensor | None):
        t = _forward_derivative(ctx.plan, ctx.extent, ctx.saved_tensors, tangents)
        return (t, None) if ctx.plan.index_dim else t

    @staticmethod
    def vmap(info, in_dims, plan: Plan, extent: Extent, *tensors: torch.Tensor):
        vals, idx = _batched_run(plan, extent, list(tensors), in_dims[2:], info.batch_size)
        return ((vals, idx), (0, 0)) if idx is not None else (vals, 0)


def _batched_run(
    plan: Plan, extent: Extent, tensors: list[torch.Tensor], in_dims: Sequence[int | None], size: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The batching rule: the reduction of ``size`` calls at once, tensors[k] batched along in_dims[k] (None:
    shared), with values (size, *batch, rows, value_dim). The vmapped dimension becomes the first batch
    dimension of one call (a variable not vmapped gets a batch of one, which broadcasts). A block-sparse plan
    (no batch dimensions) or a batched number vector runs one call per batch entry."""
    slots = len(plan.arg_cats)
    if plan.ranged or any(d is not None for d in in_dims[slots:]):
        outs = [
            run_plan(plan, extent, [t if d is None else t.select(d, b) for t, d in zip(tensors, in_dims, strict=True)])
            for b in range(size)
        ]
        idx = torch.stack([o[1] for o in outs]) if plan.index_dim else None
        return torch.stack([o[0] for o in outs]), idx
    nbatch = len(extent.batch)
    args = list(tensors)
    for k in range(slots):
        t = args[k].unsqueeze(0) if in_dims[k] is None else args[k].movedim(in_dims[k], 0)
        missing = nbatch + (1 if plan.arg_cats[k] == "p" else 2) - (t.dim() - 1)
        args[k] = t.reshape(t.shape[0], *(1,) * missing, *t.shape[1:]) if missing > 0 else t
    return run_plan(plan, Extent((size, *extent.batch), extent.n_i, extent.n_j), args)


# ---------------------------------------------------------------- the registered operator


def _extent(sizes: list[int]) -> Extent:
    return Extent(tuple(sizes[2:]), sizes[0], sizes[1])


@torch.library.custom_op("semiring_ops::lazy_reduce", mutates_args=())
def lazy_reduce(plan_key: str, sizes: list[int], tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduction of plan ``plan_key`` over the argument tensors (the plan's slots in order, then its number
    vector when it has numbers) for the sizes
    [n_i, n_j, *batch] (never an empty list: the autograd wrapper of a custom op tells an empty list from an
    int list): values (*batch, rows, value_dim) in the arguments' dtype and indices (*batch, rows, index_dim)
    int64, or an empty (0,) int64 tensor when the plan tracks none."""
    vals, idx = _run(Plan.from_key(plan_key), _extent(sizes), tensors)
    return vals, (idx if idx is not None else vals.new_empty((0,), dtype=torch.int64))


@lazy_reduce.register_fake
def _(plan_key, sizes, tensors):
    plan = Plan.from_key(plan_key)
    extent = _extent(sizes)
    rows = (*extent.batch, extent.rows(plan.outer))
    like = tensors[0]
    idx_shape = (*rows, plan.index_dim) if plan.index_dim else (0,)
    return like.new_empty((*rows, plan.value_dim)), like.new_empty(idx_shape, dtype=torch.int64)


def _lazy_reduce_setup_context(ctx, inputs, output):
    plan_key, sizes, tensors = inputs
    vals, idx = output
    ctx.plan, ctx.extent = Plan.from_key(plan_key), _extent(sizes)
    ctx.save_for_backward(*tensors, vals, idx if ctx.plan.index_dim else None)


def _lazy_reduce_backward(ctx, grad_vals, _grad_idx):
    grads = _backward(ctx.plan, ctx.extent, ctx.saved_tensors, grad_vals, ctx.needs_input_grad[2])
    return None, None, grads


lazy_reduce.register_autograd(_lazy_reduce_backward, setup_context=_lazy_reduce_setup_context)


def _concat(parts: list[Formula]) -> Formula:
    return functools.reduce(Concat, parts)


def _reduction_backward(plan, extent, tensors, vals, grad_vals, needs) -> list[torch.Tensor | None]:
    """Sum and logsumexp: sum reductions of vjp(F, v, cotangent) for every variable v that needs a gradient
    (the derivatives read the forward's number vector, after the variables in ``tensors``, and add theirs)."""
    slots = len(plan.arg_cats)
    numbers = tensors[slots] if plan.n_numbers else None
    ranges = tuple(tensors[-RANGE_TENSORS:]) if plan.ranged else None
    f = substitute(plan.formula, lambda v: Var(v.cat, v.dim, tensor=tensors[v.slot]))
    out = Var(plan.outer, plan.value_dim, tensor=vals)
    grad = Var(plan.outer, plan.value_dim, tensor=grad_vals)
    cot = plan.reduction.cotangent(f, out, grad)
    wanted = [k for k in range(slots) if needs[k]]
    wrt = [Var(plan.arg_cats[k], plan.arg_dims[k], tensor=tensors[k]) for k in wanted]
    forms = dict(zip(wanted, vjp(f, wrt, cot), strict=True))
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    for rows_cat, roles in ((plan.outer, ("outer", "param")), (plan.inner, ("inner",))):
        group = [k for k in wanted if plan.role(k) in roles and forms[k] is not None]
        if not group:
            continue
        parts = _concat([forms[k] for k in group])
        rows_ranges = ranges
        if ranges is not None and rows_cat != plan.outer:  # the inner variables' gradient: the other half
            check_transposed(ranges)
            rows_ranges = swapped(ranges)
        res, _ = reduce_formula(parts, semiring_reduction("std"), rows_cat, extent, numbers=numbers, ranges=rows_ranges)
        start = 0
        for k in group:
            g = res[..., start : start + plan.arg_dims[k]]
            start += plan.arg_dims[k]
            if plan.role(k) == "param":
                g = g.sum(-2)
            grads[k] = g.sum_to_size(tensors[k].shape)
    for k in wanted:
        if grads[k] is None:
            grads[k] = torch.zeros_like(tensors[k])
    return grads


def _selected_pairs_backward(plan, extent, tensors, vals, idx, grad_vals, needs) -> list[torch.Tensor | None]:
    """Max, min, k-best: sum over the selected pairs (i, idx[i, p]) of grad[i, p] * dF_c(p)(i, idx[i, p]),
    with c(p) the component of slot p; outputs that are not finite pass no gradient. The formula's vjp is
    evaluated with torch at those pairs only (O(rows * selected) work and memory), then summed over the
    pairs of each row, or added into the reduced variables' rows: torch operations, so differentiable again
    and batched by torch.func."""
    wanted = [k for k in range(len(plan.arg_cats)) if needs[k]]
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    if extent.rows(plan.inner) == 0:  # nothing was selected (the values are the semiring zero): no gradient
        for k in wanted:
            grads[k] = torch.zeros_like(tensors[k])
        return grads
    like = _compute(vals)
    fdim, pairs = plan.formula.dim, idx.shape[-1]
    g = torch.where(torch.isfinite(vals), grad_vals, torch.zeros_like(grad_vals)).to(like.dtype)
    one_hot = torch.arange(fdim, device=idx.device) == (torch.arange(pairs, device=idx.device) % fdim)[:, None]
    cot = Var(plan.outer, fdim, tensor=g[..., None] * one_hot.to(like.dtype))  # (*batch, n_outer, pairs, D)
    wrt = [Var(plan.arg_cats[k], plan.arg_dims[k], slot=k) for k in wanted]
    flat = _flat_pairs(extent, plan, idx)
    at_pairs = _pair_reader(plan, extent, flat, pairs)
    numbers = tensors[len(plan.arg_cats)].to(like.dtype) if plan.n_numbers else None
    read = lambda v: cot.tensor if v is cot else at_pairs(tensors[v.slot], v.cat)  # noqa: E731
    nbatch, n_inner = math.prod(extent.batch), extent.rows(plan.inner)
    for k, form in zip(wanted, vjp(plan.formula, wrt, cot), strict=True):
        t = tensors[k]
        if form is None:
            grads[k] = torch.zeros_like(t)
            continue
        d = evaluate(form, read, like, numbers).expand(*extent.batch, extent.rows(plan.outer), pairs, t.shape[-1])
        role = plan.role(k)
        if role == "outer":
            d = d.sum(-2)
        elif role == "param":
            d = d.sum((-3, -2))
        else:
            rows = d.new_zeros(nbatch * n_inner, t.shape[-1]).index_add(0, flat, d.reshape(-1, t.shape[-1]))
            d = rows.reshape(*extent.batch, n_inner, t.shape[-1])
        grads[k] = d.sum_to_size(t.shape).to(t.dtype)
    return grads


def _compute(t: torch.Tensor) -> torch.Tensor:
    """t in the dtype formulas are evaluated in (float32 for 16-bit tensors)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _flat_pairs(extent: Extent, plan: Plan, idx: torch.Tensor) -> torch.Tensor:
    """The selected pairs' rows in the reduced variables flattened over the batch: (nbatch * n_outer * pairs,)."""
    nbatch, n_outer, pairs = math.prod(extent.batch), extent.rows(plan.outer), idx.shape[-1]
    first_row = torch.arange(nbatch, device=idx.device).view(nbatch, 1, 1) * extent.rows(plan.inner)
    return (first_row + idx.reshape(nbatch, n_outer, pairs)).reshape(-1)


def _pair_reader(plan: Plan, extent: Extent, flat: torch.Tensor, pairs: int):
    """read(t, cat): a variable's tensor t of category ``cat`` at the selected pairs (``flat``: _flat_pairs, ``pairs``
    per row), shaped to broadcast as (*batch, n_outer, pairs, D) (parameters (..., 1, 1, D), outer variables
    (..., n_outer, 1, D))."""
    batch, n_outer, n_inner = extent.batch, extent.rows(plan.outer), extent.rows(plan.inner)
    nbatch = math.prod(batch)

    def read(t: torch.Tensor, cat: str) -> torch.Tensor:
        t = _compute(t)
        if cat == "p":
            return t[..., None, None, :]
        if cat == plan.outer:
            return t[..., :, None, :]
        rows = t.expand(*batch, n_inner, t.shape[-1]).reshape(nbatch * n_inner, t.shape[-1])
        return rows.index_select(0, flat).reshape(*batch, n_outer, pairs, t.shape[-1])

    return read


def _picked(plan: Plan, f: torch.Tensor) -> torch.Tensor:
    """From f (..., n_outer, pairs, D) at the selected pairs, the component each slot p selected (p mod D):
    (*batch, n_outer, pairs), the layout of the values."""
    fdim, pairs = plan.formula.dim, f.shape[-2]
    comp = torch.arange(pairs, device=f.device) % fdim
    return f.gather(-1, comp.expand(*f.shape[:-1]).unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class _Tangent:
    """A reduction's forward-mode rule for one set of moving inputs, derived once per (plan, moving slots):
    ``formula``, dF over sentinel variables (selecting reductions evaluate it at the selected pairs), or for
    sum-type reductions ``plan``, the sum reduction of the integrand T dF, whose slots read ``sources``
    (indices into (*tensors, *tangents of the moving slots, values)) and whose number vector is the forward's
    followed by ``numbers``. None: the tangent is zero."""

    formula: Formula | None
    plan: Plan | None = None
    sources: tuple[int, ...] = ()
    numbers: tuple[float, ...] = ()


_SENTINELS: list[torch.Tensor] = []  # stand-ins for a derived formula's tensors: sentinel k is source k


def _sentinel(k: int) -> torch.Tensor:
    while len(_SENTINELS) <= k:
        _SENTINELS.append(torch.empty(0))
    return _SENTINELS[k]


@functools.lru_cache(maxsize=1024)
def _tangent_rule(plan_key: str, moved: tuple[int, ...]) -> _Tangent:
    """The _Tangent of plan ``plan_key`` for tangents of the slots ``moved``: formula.jvp of the formula, and for
    a sum or logsumexp the transpose of its cotangent map (a sum: 1; logsumexp: the softmax weights)."""
    plan = Plan.from_key(plan_key)
    slots = len(plan.arg_cats)
    cat, dim = plan.arg_cats, plan.arg_dims
    f = substitute(plan.formula, lambda v: Var(v.cat, v.dim, tensor=_sentinel(v.slot)))
    wrt = [Var(cat[k], dim[k], tensor=_sentinel(k)) for k in moved]
    dirs = [Var(cat[k], dim[k], tensor=_sentinel(slots + n)) for n, k in enumerate(moved)]
    df = jvp(f, wrt, dirs)
    if df is None or plan.reduction.selects:
        return _Tangent(df)
    out = Var(plan.outer, plan.value_dim, tensor=_sentinel(slots + len(moved)))
    integrand = transpose_linear(lambda g: plan.reduction.cotangent(f, out, g), plan.value_dim, df)
    if integrand is None:
        return _Tangent(None)
    canon, tvars = canonicalize(integrand, numbered=plan.n_numbers)
    index = {id(_sentinel(k)): k for k in range(slots + len(moved) + 1)}
    sources = tuple(index[id(v.tensor)] for v in tvars)
    tplan = Plan(
        canon,
        tuple(v.cat for v in tvars),
        tuple(v.dim for v in tvars),
        semiring_reduction("std"),
        plan.outer,
        False,
        plan.ranged,
    )
    return _Tangent(df, tplan, sources, canonical_numbers(integrand, plan.n_numbers))


def _forward_derivative(plan: Plan, extent: Extent, saved, tangents) -> torch.Tensor:
    """The tangent of the values for the tangents of the argument tensors (None: zero), by the plan's
    _tangent_rule: a sum reduction of T dF for sum and logsumexp; dF at the selected pairs for max, min and
    k-best."""
    *tensors, vals, idx = saved
    slots = len(plan.arg_cats)
    moved = tuple(k for k in range(slots) if tangents[k] is not None)
    rule = _tangent_rule(plan.key, moved) if moved else _Tangent(None)
    if rule.formula is None or extent.rows(plan.inner) == 0:
        return torch.zeros_like(vals)
    numbers = tensors[slots] if plan.n_numbers else None
    sources = [*tensors[:slots], *(tangents[k] for k in moved), vals]
    if plan.reduction.selects:
        at_pairs = _pair_reader(plan, extent, _flat_pairs(extent, plan, idx), idx.shape[-1])
        like = _compute(vals)
        by_sentinel = {id(_sentinel(k)): t for k, t in enumerate(sources)}
        picked = _picked(
            plan, evaluate(rule.formula, lambda v: at_pairs(by_sentinel[id(v.tensor)], v.cat), like, numbers)
        )
        picked = picked.expand(vals.shape).to(vals.dtype)
        return torch.where(torch.isfinite(vals), picked, torch.zeros_like(picked))
    if rule.plan is None:
        return torch.zeros_like(vals)
    args = [sources[k] for k in rule.sources]
    if rule.plan.n_numbers:  # the rule numbers its own after the plan's n_numbers: the forward's vector may be longer
        prefix = None if numbers is None else numbers[: plan.n_numbers]
        args.append(_number_vector(prefix, rule.numbers, vals))
    if plan.ranged:
        args += tensors[-RANGE_TENSORS:]
    return run_plan(rule.plan, extent, args)[0]


def evaluate_dense(formula: Formula, extent: Extent, like: torch.Tensor) -> torch.Tensor:
    """The formula at every (i, j): (*batch, n_i, n_j, D), with torch (for ``LazyTensor.dense()``)."""

    def read(var: Var) -> torch.Tensor:
        t = var.tensor
        if var.cat == "p":
            return t[..., None, None, :]
        return t[..., :, None, :] if var.cat == "i" else t[..., None, :, :]

    f = evaluate(formula, read, like)
    return f.expand(*extent.batch, extent.n_i, extent.n_j, formula.dim)
