"""The contraction order of an einsum: which two operands to contract at each step.

Each step contracts two operands into one whose labels are those still needed (by the output or by an operand not
yet contracted). Its cost is the cells it computes, the product of the sizes of every label the two operands hold
(the batched (n x k) (x) (k x m) product it lowers to: B n k m); its intermediate holds the product of its own
labels' sizes. A plan is chosen by
  - up to OPTIMAL_LIMIT operands: dynamic programming over subsets (every order of pairwise contractions is
    considered: the optimum of the cost model);
  - beyond: greedily, the pair whose step computes the fewest cells (ties: the smaller intermediate), preferring
    pairs that share a label (an outer product of unrelated operands only when nothing else is left).
With a memory budget (bytes), an order whose intermediates all fit comes first; among those, the fewest cells.
Intermediates that do not fit under any order are allowed, the least over budget chosen.

When even the best order has an intermediate over the budget, plan_cut picks a label to cut the whole contraction
into chunks along (execute.py runs the plan once per chunk): the label and chunk length giving the fewest chunks
whose plans fit, a label of the output before a summed one (whose chunks' results are then added in the semiring).

Labels that only one operand holds and the output does not are summed inside that operand before any step
(a reduction: execute.py), so the planner never sees them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OPTIMAL_LIMIT", "Plan", "plan_contractions", "plan_cut"]

OPTIMAL_LIMIT = 7  # operands up to which every order is searched (3^7 subset splits)


@dataclass(frozen=True)
class Plan:
    """``steps[s] = (i, j)``: contract the operands at positions i < j of the current list (both removed, the result
    appended last). ``cells``: the cells computed; ``peak``: the largest intermediate (a step's result other than
    the last one's, which is the output), in elements."""

    steps: tuple[tuple[int, int], ...]
    cells: int
    peak: int


def _numel(labels, sizes) -> int:
    return math.prod(sizes[label] for label in labels)


def _kept(labels: frozenset[str], outside: frozenset[str], output: frozenset[str]) -> frozenset[str]:
    """The labels of a contracted group still needed afterwards."""
    return frozenset(label for label in labels if label in output or label in outside)


def plan_contractions(
    inputs: Sequence[Sequence[str]],
    output: Sequence[str],
    sizes: dict[str, int],
    budget_elements: int | None = None,
) -> Plan:
    """The order of pairwise contractions for operands labelled ``inputs`` (each label once per operand) into
    ``output``, under the model of the module docstring. ``budget_elements``: the largest intermediate allowed."""
    n = len(inputs)
    if n <= 1:
        return Plan((), 0, 0)
    if n <= OPTIMAL_LIMIT:
        return _optimal(inputs, output, sizes, budget_elements)
    return _greedy(inputs, output, sizes, budget_elements)


def _over(elements: int, budget: int | None) -> int:
    return 0 if budget is None else max(0, elements - budget)


def _optimal(inputs, output, sizes, budget) -> Plan:
    n = len(inputs)
    out = frozenset(output)
    label_sets = [frozenset(labels) for labels in inputs]
    full = (1 << n) - 1
    holds: dict[int, frozenset[str]] = {}  # subset -> every label its operands hold
    for mask in range(1, full + 1):
        holds[mask] = frozenset().union(*(label_sets[i] for i in range(n) if mask >> i & 1))

    def kept(mask: int) -> frozenset[str]:
        return _kept(holds[mask], holds.get(full & ~mask, frozenset()), out)

    # best[mask] = (over budget, cells, peak, tree): tree is an operand index or (left tree, right tree)
    best: dict[int, tuple[int, int, int, object]] = {1 << i: (0, 0, 0, i) for i in range(n)}
    for mask in sorted(range(1, full + 1), key=lambda m: bin(m).count("1")):
        if mask in best:
            continue
        result = kept(mask) if mask != full else out
        size = _numel(result, sizes)
        choice = None
        sub = (mask - 1) & mask
        while sub:
            other = mask & ~sub
            if sub < other:  # each split once
                a, b = best[sub], best[other]
                cells = _numel(kept(sub) | kept(other), sizes)
                over = a[0] + b[0] + (_over(size, budget) if mask != full else 0)
                key = (over, a[1] + b[1] + cells, max(a[2], b[2], size if mask != full else 0))
                if choice is None or key < choice[:3]:
                    choice = (*key, (a[3], b[3]))
            sub = (sub - 1) & mask
        best[mask] = choice
    over, cells, peak, tree = best[full]
    return Plan(_steps(tree, n), cells, peak)


def _steps(tree, n: int) -> tuple[tuple[int, int], ...]:
    """The contraction tree as steps on a list of operands (both removed, the result appended)."""
    order = list(range(n))  # which original operand (or internal node) each list position holds
    steps: list[tuple[int, int]] = []

    def walk(node) -> object:
        if isinstance(node, int):
            return node
        left, right = walk(node[0]), walk(node[1])
        i, j = sorted((order.index(left), order.index(right)))
        steps.append((i, j))
        del order[j], order[i]
        order.append(node)
        return node

    walk(tree)
    return tuple(steps)


def _greedy(inputs, output, sizes, budget) -> Plan:
    out = frozenset(output)
    current = [frozenset(labels) for labels in inputs]
    steps: list[tuple[int, int]] = []
    total = peak = 0
    while len(current) > 1:
        best = None
        for i in range(len(current)):
            for j in range(i + 1, len(current)):
                outside = frozenset().union(*(current[k] for k in range(len(current)) if k not in (i, j)))
                last = len(current) == 2
                result = out if last else _kept(current[i] | current[j], outside, out)
                size = _numel(result, sizes)
                key = (
                    0 if last else _over(size, budget),
                    not (current[i] & current[j]),  # pairs that share a label first
                    _numel(current[i] | current[j], sizes),
                    size,
                )
                if best is None or key < best[0]:
                    best = (key, i, j, result, size)
        (_, _, cells, _), i, j, result, size = best
        steps.append((i, j))
        total += cells
        peak = max(peak, 0 if len(current) == 2 else size)
        del current[j], current[i]
        current.append(result)
    return Plan(tuple(steps), total, peak)


def plan_cut(
    inputs: Sequence[Sequence[str]],
    output: Sequence[str],
    sizes: dict[str, int],
    budget_elements: int | None,
    summed_ok: bool = True,
) -> tuple[str, int] | None:
    """None when the plan's intermediates fit ``budget_elements`` (or there is no budget); else (label, chunk): cut
    the contraction along ``label`` into chunks of ``chunk`` values (the last one shorter), so that each chunk's
    plan fits, with the fewest chunks (an output label first at equal counts; a summed label only with
    ``summed_ok``). When no single label makes it fit, the label whose chunks of one value come nearest; the
    chunks are then cut again."""
    if budget_elements is None or plan_contractions(inputs, output, sizes, budget_elements).peak <= budget_elements:
        return None

    def peak(label: str, chunk: int) -> int:
        return plan_contractions(inputs, output, {**sizes, label: chunk}, budget_elements).peak

    labels = sorted({lab for term in inputs for lab in term})
    best = None
    for label in labels:
        if sizes[label] <= 1 or (label not in output and not summed_ok):
            continue
        if peak(label, 1) > budget_elements:  # never fits by this label alone
            key = (1, peak(label, 1), label not in output)
            chunk = 1
        else:  # the longest chunk that fits (the peak grows with the chunk)
            low, high = 1, sizes[label] - 1
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if peak(label, mid) <= budget_elements else (low, mid - 1)
            chunk = low
            key = (0, -(-sizes[label] // chunk), label not in output)
        if best is None or key < best[0]:
            best = (key, label, chunk)
    return None if best is None else (best[1], best[2])
