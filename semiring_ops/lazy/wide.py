"""Wide vector sums as loops over their components, for the kernels (codegen.cpu_source, codegen.cuda_source).

The Emitter writes one statement per component, so KeOps' k-NN formula on MNIST, ``((x_i - y_j) ** 2).sum(-1)``
with D = 784, is 1,568 statements per copy of the cell: g++ took 19-28 s over it on the 2-core machine. A sum over
more than ``formula.WIDE_COMPONENTS`` components of an elementwise formula of variables (and numbers and scalar
constants) is instead computed by a loop over the components d, before the cell, and the cell reads its value:

- over a group of lanes: ``T w0[kLanes] = 0; for d: for l: w0[l] += term(d, j0 + l)``, the loop over the lanes
  innermost (contiguous j: it vectorises), then ``w0_v = w0[l]`` in the lane's cell;
- for one j (tails and the scalar loops): ``T w0_v = 0; for d: w0_v += term(d, j)``;
- the CUDA kernel computes them for a tile of j at a time, in chunks of components staged through shared memory
  (wide_chunks.py), and the CPU kernel for a tile of rows and all j before the rows' cells
  (codegen._cpu_wide_pass); the cell reads its sum (``read_sum``).

The components are added in increasing d, as the unrolled sum does (starting from 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .formula import (
    WIDE_COMPONENTS,
    Add,
    Const,
    Div,
    Emitter,
    Formula,
    Mul,
    Num,
    Sub,
    Unary,
    Var,
    VecSum,
    _postorder,
    replace_nodes,
)

__all__ = ["WIDE_SLOT", "WideSums", "component_term", "find_wide_sums", "wide_sums"]

WIDE_SLOT = 1 << 20  # placeholder variables of slot WIDE_SLOT + n stand for wide sum n in the rewritten formula
_BINARY = (Add, Sub, Mul, Div)


@dataclass
class WideSums:
    """The formula with its wide sums replaced by placeholders, and the statements that compute them: before
    a group of lanes (``group``), first in a lane's cell (``lane``), first in a scalar cell (``scalar``);
    ``terms``: the summed formula of wide sum n (its components are the terms)."""

    formula: Formula
    group: list[str] = field(default_factory=list)
    lane: list[str] = field(default_factory=list)
    scalar: list[str] = field(default_factory=list)
    terms: list[Formula] = field(default_factory=list)

    @staticmethod
    def placeholder(var: Var) -> str | None:
        """The C name a placeholder reads (None for a real variable)."""
        return f"w{var.slot - WIDE_SLOT}_v" if var.slot >= WIDE_SLOT else None


def _loopable(x: Formula, is_inner: Callable[[Var], bool]) -> bool:
    """Whether the components of x are one elementwise formula of component d of its variables, one of which
    changes with j."""
    inner = False
    for node in _postorder(x):
        if isinstance(node, Var):
            inner = inner or is_inner(node)
        elif isinstance(node, Const):
            if node.dim != 1:
                return False
        elif not isinstance(node, (Num, Unary, *_BINARY)):
            return False
        if node.dim not in (1, x.dim):
            return False
    return inner


def component_term(x: Formula, read_at: Callable[[Var, str], str], number: Callable[[int], str], prefix: str):
    """(statements, expression) of component d of x (``d`` and ``j`` in scope)."""
    em = Emitter(lambda var, c: "", prefix=prefix)
    values: dict[int, str] = {}
    for node in _postorder(x):
        if isinstance(node, Var):
            out = read_at(node, "d" if node.dim > 1 else "0")
        elif isinstance(node, Num):
            out = number(node.index)
        elif isinstance(node, Const):
            out = em.literal(node.value)
        elif isinstance(node, _BINARY):
            a, b = (values[id(c)] for c in node.children)
            out = em.temp_expr(f"{a} {node.symbol} {b}")
        else:
            out = node.emit(em, [[values[id(node.children[0])]]])[0]
            out = out if out.isidentifier() else em.temp_expr(out)
        values[id(node)] = out
    return em.lines, values[id(x)]


def find_wide_sums(formula: Formula, is_inner: Callable[[Var], bool]) -> list[Formula]:
    """The VecSum nodes of ``formula`` computed as loops (wide sum n is the n-th), in postorder."""
    return [
        node
        for node in _postorder(formula)
        if isinstance(node, VecSum) and node.children[0].dim > WIDE_COMPONENTS and _loopable(node.children[0], is_inner)
    ]


def wide_sums(
    formula: Formula,
    is_inner: Callable[[Var], bool],
    read_at: Callable[[Var, str], str],
    number: Callable[[int], str],
    read_sum: Callable[[int], str] | None = None,
) -> WideSums:
    """The wide sums of ``formula`` as loops (module docstring): read_at(var, d) is the C expression of
    component d (a C expression) of a variable at the current j; number(k) that of number k. With
    ``read_sum``, a cell (lane or scalar) reads wide sum n from read_sum(n), computed elsewhere (the CUDA
    kernel's chunks, wide_chunks.py; the CPU's pass over a tile of rows, codegen._cpu_wide_pass)."""
    found = find_wide_sums(formula, is_inner)
    if not found:
        return WideSums(formula)
    out = WideSums(formula)
    replaced: dict[int, Formula] = {}
    for n, node in enumerate(found):
        x = node.children[0]
        out.terms.append(x)
        replaced[id(node)] = Var("j", 1, slot=WIDE_SLOT + n)
        if read_sum is not None:  # computed elsewhere, read in every cell
            out.lane.append(f"const T w{n}_v = {read_sum(n)};")
            out.scalar.append(f"const T w{n}_v = {read_sum(n)};")
            continue
        lines, term = component_term(x, read_at, number, f"w{n}_")
        out.group += [
            f"T w{n}[kLanes];",
            f"for (int l = 0; l < kLanes; ++l) w{n}[l] = T(0);",
            f"for (int64_t d = 0; d < {x.dim}; ++d) {{",
            "  for (int l = 0; l < kLanes; ++l) {",
            "    const int64_t j = j0 + l;",
            *("    " + line for line in lines),
            f"    w{n}[l] += {term};",
            "  }",
            "}",
        ]
        out.lane.append(f"const T w{n}_v = w{n}[l];")
        out.scalar += [
            f"T w{n}_v = T(0);",
            f"for (int64_t d = 0; d < {x.dim}; ++d) {{",
            *("  " + line for line in lines),
            f"  w{n}_v += {term};",
            "}",
        ]
    out.formula = replace_nodes(formula, replaced)
    return out
