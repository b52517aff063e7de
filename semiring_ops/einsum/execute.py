"""Running an einsum: diagonals, reductions, and pairwise contractions on the semiring matmul kernels.

Every operand is carried with its labels (one per dimension). In order:
  1. a label repeated within an operand becomes its diagonal (torch.diagonal: a view);
  2. a label that only one operand holds and the output does not is summed there (the semiring's sum, a
     reduction), before and after every step;
  3. two operands at a time (plan.py's order) are contracted into one: their shared labels still needed are
     batch dimensions, their shared labels no longer needed are the contraction, the others are rows (first
     operand) and columns (second): permuted and reshaped into a batched (n x k) (x) (k x m) product on
     semiring_matmul, whose kernels never form the B n k m terms; a step with nothing to contract is the
     semiring's elementwise product, broadcast;
  4. the last operand is permuted into the output's order.
Size-1 dimensions broadcast: batch dimensions through semiring_matmul's batch broadcasting (no copy), a
contracted one by expanding it. Autograd follows from the pieces (their gradients, and the log semiring's second
derivatives, are semiring_matmul's and torch's); under max / min the gradient reaches the selected terms, the
first of tied ones within each step.

With ``track`` (max / min), every summed label also gets, for each cell of the operand it was summed into, the
index that won there, carried through the later steps by gathers: return_argmax.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..ops.matmul import semiring_matmul
from ..semirings import Semiring
from .equation import BoundEquation
from .plan import plan_contractions, plan_cut

__all__ = ["Operand", "contract"]


@dataclass
class Operand:
    """A tensor, the label of each of its dimensions, and (when tracking) the winning index of each label already
    summed into it, as int64 tensors broadcastable to the tensor."""

    value: Tensor
    labels: tuple[str, ...]
    won: dict[str, Tensor] = field(default_factory=dict)


def _diagonals(op: Operand) -> Operand:
    if len(set(op.labels)) == len(op.labels):
        return op
    value, labels = op.value, list(op.labels)
    while len(set(labels)) < len(labels):
        label = [lab for i, lab in enumerate(labels) if lab in labels[:i]][0]  # noqa: RUF015 (no generator: dynamo)
        first, second = labels.index(label), len(labels) - 1 - labels[::-1].index(label)
        value = torch.diagonal(value, dim1=first, dim2=second)  # the diagonal becomes the last dimension
        labels = [lab for d, lab in enumerate(labels) if d not in (first, second)] + [label]
    return Operand(value, tuple(labels), op.won)


def _unravel(flat: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    """Indices (flat over dims of `sizes`, row-major) -> one index tensor per dim."""
    out = []
    for size in reversed(sizes):
        out.append(flat % size if size > 1 else torch.zeros_like(flat))
        flat = flat // size if size > 1 else flat
    return out[::-1]


def _reduce(op: Operand, labels: Sequence[str], S: type[Semiring], track: bool) -> Operand:
    """The semiring sum of `op` over `labels` (dimensions it holds)."""
    if not labels:
        return op
    keep = [d for d, lab in enumerate(op.labels) if lab not in labels]
    gone = [op.labels.index(lab) for lab in labels]
    value = op.value.permute((*keep, *gone))
    rest = value.shape[: len(keep)]
    sizes = [op.value.shape[d] for d in gone]
    flat = value.reshape((*rest, math.prod(sizes)))
    out_labels = tuple(op.labels[d] for d in keep)
    if not track:
        return Operand(S.sum(flat, -1), out_labels)
    if flat.shape[-1] == 0:
        result = flat.new_full(rest, S.zero)
        index = torch.zeros(rest, dtype=torch.long, device=flat.device)
    else:  # the first of tied extrema wins (argmax / argmin), and gets the gradient (as S.sum gives it)
        index = flat.argmax(-1) if S.zero == -math.inf else flat.argmin(-1)
        result = torch.gather(flat, -1, index.unsqueeze(-1)).squeeze(-1)
        result = torch.where(result == S.zero, result.detach(), result)  # no structure: no gradient
    won = {}
    for label, tensor in op.won.items():  # earlier winners, looked up at this reduction's winner
        full = tensor.expand(op.value.shape).permute((*keep, *gone)).reshape(flat.shape)
        won[label] = torch.gather(full, -1, index.unsqueeze(-1)).squeeze(-1)
    for label, idx in zip(labels, _unravel(index, sizes), strict=True):
        won[label] = idx
    return Operand(result, out_labels, won)


def unique_labels(terms: Sequence[Sequence[str]], output: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Per operand's labels, those no other operand and not the output holds."""
    counts: dict[str, int] = {}
    for labels in terms:
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
    return tuple(tuple(lab for lab in labels if counts[lab] == 1 and lab not in output) for labels in terms)


def step_keep(terms: Sequence[Sequence[str]], i: int, j: int, output: Sequence[str]) -> frozenset[str]:
    """The labels still needed once operands i and j are contracted: the output's and the other operands'."""
    return frozenset(output).union(*[labels for d, labels in enumerate(terms) if d not in (i, j)])


def _eager_cached(fn):
    """fn remembered (lru_cache) in eager mode; under torch.compile called plainly (dynamo traces the function,
    not the cache). For the functions of labels and sizes each step looks up."""
    cached = functools.lru_cache(maxsize=4096)(fn)

    @functools.wraps(fn)
    def call(*args):
        return fn(*args) if torch.compiler.is_compiling() else cached(*args)

    return call


_unique_labels_of = _eager_cached(unique_labels)
_step_keep_of = _eager_cached(step_keep)


def _reduce_unique(ops: list[Operand], output, S: type[Semiring], track: bool) -> list[Operand]:
    """Every operand summed over the labels only it holds (reductions)."""
    terms = tuple([op.labels for op in ops])
    uniques = _unique_labels_of(terms, output)
    return [_reduce(op, unique, S, track) if unique else op for op, unique in zip(ops, uniques, strict=True)]


def _times(x: Operand, y: Operand, S: type[Semiring]) -> Operand:
    """The elementwise product of two operands with no label to contract, broadcast: labels x's then y's own."""
    y_only = [lab for lab in y.labels if lab not in x.labels]
    labels = (*x.labels, *y_only)
    xv = x.value.reshape((*x.value.shape, *([1] * len(y_only))))
    order = [y.labels.index(lab) if lab in y.labels else None for lab in labels]
    yv = y.value.permute([d for d in order if d is not None])
    shape = [y.value.shape[d] if d is not None else 1 for d in order]
    yv = yv.reshape(shape)
    value = S.times(xv, yv)
    won = {lab: t.reshape((*t.shape, *([1] * len(y_only)))) if t.dim() else t for lab, t in x.won.items()}
    for lab, t in y.won.items():
        full = t.expand(y.value.shape).permute([d for d in order if d is not None]).reshape(shape)
        won[lab] = full
    return Operand(value, labels, won)


def _broadcast(a: int, b: int) -> int:
    """The size two broadcast dimensions make (equal, or one of them 1; 1 against 0 gives 0)."""
    return b if a == 1 else a


@dataclass(frozen=True)
class PairLayout:
    """How two operands become one batched (n x k) (x) (k x m) semiring matmul: a function of their labels, shapes
    and the labels still needed (remembered in eager mode, so a repeated call only permutes, reshapes and
    multiplies)."""

    summed: tuple[str, ...]  # contracted: the shared labels no longer needed
    k_sizes: tuple[int, ...]  # their sizes, broadcast
    x_order: tuple[int, ...] | None  # x's permutation to (batch, rows, summed); None: already so
    x_expand: tuple[int, ...]  # that view with every contracted label at its broadcast size
    x_broadcasts: bool  # whether a contracted label of x has size 1 against a larger one (x_expand is needed)
    x_matrix: tuple[int, ...]  # (*x_batch, n, k)
    y_order: tuple[int, ...] | None  # y's permutation to (batch, summed, cols)
    y_expand: tuple[int, ...]
    y_broadcasts: bool
    y_matrix: tuple[int, ...]  # (*y_batch, k, m)
    out_batch: tuple[int, ...]  # the batch sizes, broadcast
    labels: tuple[str, ...]  # the result's: (batch, rows, cols)
    shape: tuple[int, ...]


def pair_layout(x_labels, x_shape, y_labels, y_shape, keep: frozenset[str]) -> PairLayout | None:
    """The layout of x (x) y summed over their shared labels not in `keep`; None when none is (a product)."""
    shared = [lab for lab in x_labels if lab in y_labels]
    summed = tuple(lab for lab in shared if lab not in keep)
    if not summed:
        return None
    batch = [lab for lab in shared if lab in keep]
    rows = [lab for lab in x_labels if lab not in y_labels]
    cols = [lab for lab in y_labels if lab not in x_labels]
    xs, ys = dict(zip(x_labels, x_shape, strict=True)), dict(zip(y_labels, y_shape, strict=True))
    k_sizes = tuple(_broadcast(xs[lab], ys[lab]) for lab in summed)
    x_order = tuple(x_labels.index(lab) for lab in (*batch, *rows, *summed))
    y_order = tuple(y_labels.index(lab) for lab in (*batch, *summed, *cols))
    x_batch, y_batch = [xs[lab] for lab in batch], [ys[lab] for lab in batch]
    x_rows, y_cols = [xs[lab] for lab in rows], [ys[lab] for lab in cols]
    n, k, m = math.prod(x_rows), math.prod(k_sizes), math.prod(y_cols)
    out_batch = tuple(_broadcast(a, b) for a, b in zip(x_batch, y_batch, strict=True))
    x_expand = (*x_batch, *x_rows, *k_sizes)
    y_expand = (*y_batch, *k_sizes, *y_cols)
    return PairLayout(
        summed=summed,
        k_sizes=k_sizes,
        x_order=None if x_order == tuple(range(len(x_order))) else x_order,
        x_expand=x_expand,
        x_broadcasts=any(xs[lab] != s for lab, s in zip(summed, k_sizes, strict=True)),
        x_matrix=(*x_batch, n, k),
        y_order=None if y_order == tuple(range(len(y_order))) else y_order,
        y_expand=y_expand,
        y_broadcasts=any(ys[lab] != s for lab, s in zip(summed, k_sizes, strict=True)),
        y_matrix=(*y_batch, k, m),
        out_batch=out_batch,
        labels=(*batch, *rows, *cols),
        shape=(*out_batch, *x_rows, *y_cols),
    )


_pair_layout_of = _eager_cached(pair_layout)


def _as_matrix(value: Tensor, order, expand, matrix) -> Tensor:
    """An operand permuted, broadcast along a contracted size-1 label (a view) and reshaped to its matrix (each
    step skipped where it would change nothing: no autograd node, no Python call)."""
    if order is not None:
        value = value.permute(order)
    if expand is not None:
        value = value.expand(expand)
    return value if value.shape == matrix else value.reshape(matrix)


def _contract_pair(x: Operand, y: Operand, keep: frozenset[str], S: type[Semiring], track: bool) -> Operand:
    """x (x) y summed over their shared labels not in `keep`, as one batched semiring matmul."""
    args = (x.labels, tuple(x.value.shape), y.labels, tuple(y.value.shape), keep)
    lay = _pair_layout_of(*args)
    if lay is None:
        return _times(x, y, S)
    xv = _as_matrix(x.value, lay.x_order, lay.x_expand if lay.x_broadcasts else None, lay.x_matrix)
    yv = _as_matrix(y.value, lay.y_order, lay.y_expand if lay.y_broadcasts else None, lay.y_matrix)
    if not track:
        value = semiring_matmul(xv, yv, S)
        return Operand(value if value.shape == lay.shape else value.reshape(lay.shape), lay.labels)
    value, arg = semiring_matmul(xv, yv, S, return_argmax=True)
    shape = lay.shape
    if math.prod(lay.k_sizes) == 0:  # nothing summed: the semiring's zero, every winner 0 (as _reduce gives)
        zero = torch.zeros(shape, dtype=torch.long, device=value.device)
        return Operand(value.reshape(shape), lay.labels, {lab: zero for lab in (*x.won, *y.won, *lay.summed)})
    won = {}
    for lab, t in x.won.items():  # x's cell (batch, row, k = arg): gathered along k
        full = _as_matrix(t.expand(x.value.shape), lay.x_order, lay.x_expand, lay.x_matrix)
        won[lab] = torch.gather(full.expand((*lay.out_batch, *lay.x_matrix[-2:])), -1, arg).reshape(shape)
    for lab, t in y.won.items():  # y's cell (batch, k = arg, col): gathered along k
        full = _as_matrix(t.expand(y.value.shape), lay.y_order, lay.y_expand, lay.y_matrix)
        won[lab] = torch.gather(full.expand((*lay.out_batch, *lay.y_matrix[-2:])), -2, arg).reshape(shape)
    for lab, idx in zip(lay.summed, _unravel(arg, lay.k_sizes), strict=True):
        won[lab] = idx.reshape(shape)
    return Operand(value.reshape(shape), lay.labels, won)


@functools.lru_cache(maxsize=1024)
def _plan_steps_cached(inputs, output, sizes, budget_elements) -> tuple[tuple[int, int], ...]:
    return plan_contractions(inputs, output, dict(sizes), budget_elements).steps


@functools.lru_cache(maxsize=1024)
def _plan_cut_cached(inputs, output, sizes, budget_elements, summed_ok) -> tuple[str, int] | None:
    return plan_cut(inputs, output, dict(sizes), budget_elements, summed_ok)


# The planner is a function of Python values alone: remembered, and under torch.compile run once while tracing,
# its result kept as a constant (assume_constant_result on plain functions: dynamo would trace into an lru_cache).
# Its arguments must be constants: torch.compile(dynamic=False), since dynamic (symbolic) sizes are not.


def assume_constant_result(fn: Callable) -> Callable:
    """torch.compiler.assume_constant_result, without importing torch._dynamo when nothing has yet (3 s, most of
    `import semiring_ops`): its mark is an attribute that dynamo reads when it traces a call. tests/test_einsum.py
    checks that it marks exactly as torch's does."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


@assume_constant_result
def _plan_steps(inputs, output, sizes, budget_elements) -> tuple[tuple[int, int], ...]:
    """plan.py's order (steps) for these labels and sizes."""
    return _plan_steps_cached(inputs, output, sizes, budget_elements)


@assume_constant_result
def _plan_cut(inputs, output, sizes, budget_elements, summed_ok) -> tuple[str, int] | None:
    """plan.py's cut (label, chunk) for a contraction whose intermediates pass the budget, or None."""
    return _plan_cut_cached(inputs, output, sizes, budget_elements, summed_ok)


def contract(
    bound: BoundEquation,
    operands: Sequence[Tensor],
    S: type[Semiring],
    track: bool = False,
    budget_elements: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The einsum of `operands` under `bound` in the semiring S -> (result in the output's label order, and with
    `track` the winning index of every summed label: out_shape + (len(bound.summed),), int64; else None).
    ``budget_elements`` bounds the intermediates: the order is chosen for it, and where no order fits, the
    contraction runs in chunks along one label (plan_cut)."""
    ops = [_diagonals(Operand(t, labels)) for t, labels in zip(operands, bound.inputs, strict=True)]
    ops = [_empty_broadcasts(op, bound.sizes) for op in ops]
    output = bound.output
    ops = _reduce_unique(ops, output, S, track)
    return _contract_chunks(ops, output, dict(bound.sizes), bound.summed, S, track, budget_elements)


def _empty_broadcasts(op: Operand, sizes: dict[str, int]) -> Operand:
    """A size-1 dimension that broadcasts against an empty one, made empty too (its terms are none), so every
    operand's sizes are the planner's: 1 against 0 would otherwise keep intermediates it counts as empty."""
    value = op.value
    for dim, label in enumerate(op.labels):
        if sizes[label] == 0 and value.shape[dim] == 1:
            value = value.narrow(dim, 0, 0)
    return op if value is op.value else Operand(value, op.labels, op.won)


def _contract_chunks(ops, output, sizes, summed, S, track, budget) -> tuple[Tensor, Tensor | None]:
    """The contraction of the operands, whole, or chunk by chunk along the label plan_cut names."""
    key = (tuple([op.labels for op in ops]), output, tuple([(lab, sizes[lab]) for lab in sorted(sizes)]), budget)
    cut = _plan_cut(*key, True) if budget is not None else None
    if cut is None:
        return _finish(_steps(ops, output, key[2], S, track, budget), output, sizes, summed, track)
    label, chunk = cut
    if label in output:
        return _output_chunks(ops, output, sizes, summed, S, track, budget, label, chunk)
    value = arg = None
    for start in range(0, sizes[label], chunk):  # the semiring's sum of the chunks, the earlier of tied ones winning
        length = min(chunk, sizes[label] - start)
        sub = [_narrow(op, label, start, length) for op in ops]
        v, a = _contract_chunks(sub, output, {**sizes, label: length}, summed, S, track, budget)
        if a is not None:  # the chunk's winning values of `label` count from `start`
            column = summed.index(label)
            a = torch.cat([a[..., :column], a[..., column : column + 1] + start, a[..., column + 1 :]], -1)
        if value is None:
            value, arg = v, a
            continue
        both = torch.stack([value, v], -1)
        if track:
            pick = (both.argmax(-1) if S.zero == -math.inf else both.argmin(-1)).unsqueeze(-1)
            arg = torch.where(pick.bool(), a, arg)
        value = S.sum(both, -1)
    return value, arg


def _output_chunks(ops, output, sizes, summed, S, track, budget, label, chunk) -> tuple[Tensor, Tensor | None]:
    """The contraction cut along the output label `label`: each chunk's result written into its slice of the
    output as it comes (or concatenated, when autograd needs them)."""
    dim = output.index(label)
    shape = tuple(sizes[lab] for lab in output)
    values, args = [], []
    value = arg = None
    for start in range(0, sizes[label], chunk):
        length = min(chunk, sizes[label] - start)
        sub = [_narrow(op, label, start, length) for op in ops]
        v, a = _contract_chunks(sub, output, {**sizes, label: length}, summed, S, track, budget)
        if v.requires_grad:
            values.append(v)
            args.append(a)
            continue
        if value is None:
            value = v.new_empty(shape)
            arg = None if a is None else a.new_empty((*shape, a.shape[-1]))
        value.narrow(dim, start, length).copy_(v)
        if a is not None:
            arg.narrow(dim, start, length).copy_(a)
    if values:
        return torch.cat(values, dim), torch.cat(args, dim) if track else None
    return value, arg


def _narrow(op: Operand, label: str, start: int, length: int) -> Operand:
    """The operand's values (and winners) where `label` lies in [start, start + length); unchanged without it or
    where it broadcasts (size 1)."""
    if label not in op.labels:
        return op
    dim = op.labels.index(label)
    if op.value.shape[dim] == 1:
        return op
    won = {}
    for lab, t in op.won.items():
        won[lab] = t.narrow(dim, start, length) if t.dim() == op.value.dim() and t.shape[dim] != 1 else t
    return Operand(op.value.narrow(dim, start, length), op.labels, won)


def _steps(ops, output, sizes_key, S, track, budget) -> Operand:
    """The pairwise contractions of the plan, with the reductions each one makes possible -> the last operand."""
    steps = _plan_steps(tuple([op.labels for op in ops]), output, sizes_key, budget)
    for i, j in steps:
        keep = _step_keep_of(tuple([op.labels for op in ops]), i, j, output)
        result = _contract_pair(ops[i], ops[j], keep, S, track)
        ops = [*ops[:i], *ops[i + 1 : j], *ops[j + 1 :], result]
        ops = _reduce_unique(ops, output, S, track)
    (last,) = ops
    return last


def _finish(last: Operand, output, sizes, summed, track) -> tuple[Tensor, Tensor | None]:
    """The last operand in the output's label order and shape, and with `track` the winners stacked."""
    order = [last.labels.index(lab) for lab in output]
    value = last.value if order == list(range(len(order))) else last.value.permute(order)
    shape = tuple(sizes[lab] for lab in output)
    if tuple(value.shape) != shape:  # an output label of size 1 everywhere it was seen, or a broadcast one
        value = value.expand(shape)
    if not track:
        return value, None
    won = [last.won[lab].expand(last.value.shape).permute(order).expand(shape) for lab in summed]
    arg = torch.stack(won, -1) if won else torch.zeros((*shape, 0), dtype=torch.long, device=value.device)
    return value, arg
