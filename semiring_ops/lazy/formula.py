"""Symbolic formulas over i-indexed variables, j-indexed variables and parameters.

A formula is an immutable tree (a DAG when sub-formulas are shared) of :class:`Formula` nodes. Every node
has a vector dimension ``dim``; binary operations broadcast a dimension of 1 against any other. A node
knows three things about itself:

- ``emit``: its value as C code, one scalar expression per component, for the generated kernels
  (codegen_cpu.py, codegen_cuda.py), through an :class:`Emitter` that names temporaries and reads variables;
- ``evaluate``: its value as a torch tensor of shape (..., dim), for ``.dense()``, the PyTorch fallback and
  the gradients of max / min reductions;
- ``vjp``: the cotangents of its children given its own (reverse-mode symbolic differentiation), so that the
  gradient of a reduction is a new formula reduced by the same engine (:func:`vjp`). Forward-mode derivatives
  (:func:`jvp`) are vjp transposed: no node needs a rule of its own.

Variables are :class:`Var` leaves: a category (``"i"``, ``"j"`` or ``"p"``), a dimension and either a
tensor (while a user builds a formula) or a slot (the canonical form a kernel is compiled for, see
:func:`canonicalize`). Python numbers are :class:`Const` leaves, which the canonical form turns into
:class:`Num` leaves: entries of one number vector, a call argument of the kernel, so formulas that differ
only in their numbers share a kernel. Formulas compare and hash by structure through :attr:`Formula.key`.

Every pass over a formula (key, canonicalize, emit, vjp, evaluate, parse) visits each distinct node once,
without recursion: the work is linear in the number of nodes, whatever their depth or sharing.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "Const",
    "Emitter",
    "Formula",
    "FormulaError",
    "Num",
    "Var",
    "as_number",
    "canonical_node",
    "canonical_numbers",
    "canonicalize",
    "evaluate",
    "jvp",
    "node_count",
    "number_count",
    "replace_nodes",
    "transpose_linear",
    "variables",
    "vjp",
]


class FormulaError(ValueError):
    """An ill-formed formula: incompatible dimensions, a bad index, an unsupported operation."""


# ---------------------------------------------------------------- the node base


class Formula:
    """A node of a formula: ``dim`` components, computed from ``children``."""

    op: str = ""
    __slots__ = ("_canonical", "_key", "_n_numbers", "_plans", "children", "dim")

    def __init__(self, dim: int, *children: Formula) -> None:
        self.dim = int(dim)
        self.children = children
        self._key: str | None = None
        self._n_numbers: int | None = None  # number_count, once computed
        self._canonical: _Canonical | None = None  # canonicalize's result, once computed
        self._plans: dict | None = None  # the reduction plans of this formula (autograd.reduce_formula)

    # the structure, as a string: equal keys compute the same function of the same variable slots
    def params(self) -> str:
        return ""

    @classmethod
    def from_params(cls, params: str, children: list[Formula]) -> Formula:
        """The node whose key is ``{op}{params}({children' keys})`` (formula_key.parse_formula)."""
        return cls(*children)

    @property
    def key(self) -> str:
        """The structure as a string, ``{op}{params}({children' keys})``, e.g. ``Exp(Neg(Sum(Square(Sub(Vi0:3(),
        Vj1:3())))))``. A sub-formula equal to one written before (same structure, shared or not) is written
        ``@n``, n its rank among the sub-formulas completed so far (``Mul(Sub(Vi0:1(),Vj1:1()),@2)``): the key
        of a DAG is linear in its number of distinct nodes, and equal structures have equal keys. Remembered
        on the node (formulas are immutable)."""
        if self._key is None:
            self._key = _structural_key(self)
        return self._key

    def __repr__(self) -> str:
        return self.key

    def rebuild(self, children: Sequence[Formula]) -> Formula:
        """The same operation on other children (used to substitute variables)."""
        raise NotImplementedError

    # per component C expressions, given those of the children
    def emit(self, em: Emitter, args: list[list[str]]) -> list[str]:
        raise NotImplementedError

    def evaluate_node(self, values: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def vjp(self, g: Formula) -> list[Formula | None]:
        """Cotangents of the children, given the cotangent ``g`` (dim = self.dim) of this node; None where
        a child gets no gradient (it is constant, or the derivative is zero almost everywhere)."""
        raise NotImplementedError


def _broadcast_dim(op: str, a: Formula, b: Formula) -> int:
    if a.dim == b.dim or b.dim == 1:
        return a.dim
    if a.dim == 1:
        return b.dim
    raise FormulaError(
        f"{op}: operands of vector dimensions {a.dim} and {b.dim} do not broadcast (one must be 1 or both "
        f"equal): {a!r} and {b!r}"
    )


def _comp(c: list[str], d: int) -> str:
    """Component d of a child's expressions, broadcasting a dimension of 1."""
    return c[0] if len(c) == 1 else c[d]


def reduce_to_dim(g: Formula, dim: int) -> Formula:
    """The cotangent of a child of dimension ``dim`` that was broadcast to g.dim."""
    if g.dim == dim:
        return g
    if dim == 1:
        return VecSum(g)
    return Repeat(g, dim)


# ---------------------------------------------------------------- leaves


class Var(Formula):
    """A variable: category "i" (indexed by the output rows i), "j" (by the reduced index j) or "p"
    (a parameter, the same for every i and j). ``tensor`` holds the data while a user builds a formula;
    canonical formulas (the ones compiled) have a ``slot`` instead, the index of their argument."""

    op = "V"
    __slots__ = ("cat", "slot", "tensor")

    def __init__(self, cat: str, dim: int, *, tensor: torch.Tensor | None = None, slot: int = -1) -> None:
        if cat not in ("i", "j", "p"):
            raise FormulaError(f"variable category must be 'i', 'j' or 'p', got {cat!r}")
        super().__init__(dim)
        self.cat = cat
        self.tensor = tensor
        self.slot = slot

    def params(self) -> str:
        # a tensor variable's key only describes it (repr, errors): which variables are the same one is
        # decided by _VarIndex, on the tensor objects themselves
        ident = self.slot if self.tensor is None else f"#{id(self):x}"
        return f"{self.cat}{ident}:{self.dim}"

    @classmethod
    def from_params(cls, params, children):
        slot, dim = params[1:].split(":")
        return cls(params[0], int(dim), slot=int(slot))  # a slot variable: keys of tensor variables do not parse

    def rebuild(self, children: Sequence[Formula]) -> Formula:
        return self

    def emit(self, em: Emitter, args: list[list[str]]) -> list[str]:
        return [em.read(self, d) for d in range(self.dim)]

    def evaluate_node(self, values: list[torch.Tensor]) -> torch.Tensor:
        raise AssertionError("variables are evaluated by evaluate() itself")

    def vjp(self, g: Formula) -> list[Formula | None]:
        return []


def as_number(x: Any) -> float:
    """A Python number (int, float, bool) as the float a formula computes with, as torch takes a number into a
    float tensor's operation: an int beyond int64 is a float too (``10**30`` is 1e30); one beyond the float
    range (``10**400``) raises OverflowError naming it."""
    try:
        return float(x)
    except OverflowError:
        digits = str(x)
        shown = digits if len(digits) <= 24 else f"{digits[:12]}...{digits[-6:]} ({len(digits)} digits)"
        raise OverflowError(f"the number {shown} is too large for a float (at most ~1.8e308)") from None


class Const(Formula):
    """A number of the user's formula (or of a derivative): its exact value (a Python float). Canonical
    formulas hold :class:`Num` leaves instead, so the value is a call argument and not part of the kernel
    (:func:`canonicalize`); a Const left in a formula (the kernels' own rewrites) is written as a literal."""

    op = "C"
    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        super().__init__(1)
        self.value = as_number(value)

    def params(self) -> str:
        return repr(self.value)  # repr round-trips a float exactly

    @classmethod
    def from_params(cls, params, children):
        return cls(float(params))

    def rebuild(self, children: Sequence[Formula]) -> Formula:
        return self

    def emit(self, em: Emitter, args: list[list[str]]) -> list[str]:
        return [em.literal(self.value)]

    def evaluate_node(self, values: list[torch.Tensor]) -> torch.Tensor:
        raise AssertionError("constants are evaluated by evaluate() itself")

    def vjp(self, g: Formula) -> list[Formula | None]:
        return []


class Num(Formula):
    """Entry ``index`` of the number vector, a (n,) tensor passed to the kernel with the variables: what
    :func:`canonicalize` makes of each :class:`Const`. The kernel reads the value at run time (the
    Emitter's ``number``), so a new value of a number needs no new kernel."""

    op = "Num"
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        if index < 0:
            raise FormulaError(f"a number's index must be >= 0, got {index}")
        super().__init__(1)
        self.index = int(index)

    def params(self) -> str:
        return str(self.index)

    @classmethod
    def from_params(cls, params, children):
        return cls(int(params))

    def rebuild(self, children: Sequence[Formula]) -> Formula:
        return self

    def emit(self, em: Emitter, args: list[list[str]]) -> list[str]:
        return [em.number(self.index, em.hoisting)]

    def evaluate_node(self, values: list[torch.Tensor]) -> torch.Tensor:
        raise AssertionError("numbers are evaluated by evaluate() itself")

    def vjp(self, g: Formula) -> list[Formula | None]:
        return []


# ---------------------------------------------------------------- elementwise operations


class Unary(Formula):
    """An elementwise function of one formula: ``cfun`` in C (csrc/lazy/math.h), ``tfun`` in torch."""

    __slots__ = ()
    cfun: str = ""

    def __init__(self, x: Formula) -> None:
        super().__init__(x.dim, x)

    def rebuild(self, children: Sequence[Formula]) -> Formula:
        return type(self)(*children)

    def emit(self, em: Emitter, args: list[list[str]]) -> list[str]:
        return [f"{self.cfun}({a})" for a in args[0]]

    @staticmethod
    def tfun(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def evaluate_node(self, values: list[torch.Tensor]) -> torch.Tensor:
        return self.tfun(values[0])


class Neg(Unary):
    op = "Neg"
    __slots__ = ()

    def emit(self, em, args):
        return [f"(-{a})" for a in args[0]]

    tfun = staticmethod(torch.neg)

    def vjp(self, g):
        return [Neg(g)]


class Exp(Unary):
    op, cfun = "Exp", "lz_exp"
    __slots__ = ()
    tfun = staticmethod(torch.exp)

    def vjp(self, g):
        return [Mul(g, self)]


class Log(Unary):
    op, cfun = "Log", "lz_log"
    __slots__ = ()
    tfun = staticmethod(torch.log)

    def vjp(self, g):
        return [Div(g, self.children[0])]


class Sqrt(Unary):
    op, cfun = "Sqrt", "lz_sqrt"
    __slots__ = ()
    tfun = staticmethod(torch.sqrt)

    def vjp(self, g):  # g / (2 sqrt x)
        return [Div(g, Mul(Const(2.0), self))]


class Rsqrt(Unary):
    op, cfun = "Rsqrt", "lz_rsqrt"
    __slots__ = ()
    tfun = staticmethod(torch.rsqrt)

    def vjp(self, g):  # -1/2 x^(-3/2) g = -1/2 rsqrt(x) / x g
        return [Mul(g, Div(Mul(Const(-0.5), self), self.children[0]))]


class Abs(Unary):
    op, cfun = "Abs", "lz_abs"
    __slots__ = ()
    tfun = staticmethod(torch.abs)

    def vjp(self, g):
        return [Mul(g, Sign(self.children[0]))]


class Sign(Unary):
    op, cfun = "Sign", "lz_sign"
    __slots__ = ()
    tfun = staticmethod(torch.sign)

    def vjp(self, g):
        return [None]


class Step(Unary):
    """0 for x < 0, 1 otherwise (KeOps' Step)."""

    op, cfun = "Step", "lz_step"
    __slots__ = ()

    @staticmethod
    def tfun(x):
        return torch.where(x < 0, torch.zeros_like(x), torch.where(torch.isnan(x), x, torch.ones_like(x)))

    def vjp(self, g):
        return [None]


class Relu(Unary):
    op, cfun = "Relu", "lz_relu"
    __slots__ = ()
    tfun = staticmethod(torch.relu)

    def vjp(self, g):
        return [Mul(g, Step(self.children[0]))]


class Sin(Unary):
    op, cfun = "Sin", "lz_sin"
    __slots__ = ()
    tfun = staticmethod(torch.sin)

    def vjp(self, g):
        return [Mul(g, Cos(self.children[0]))]


class Cos(Unary):
    op, cfun = "Cos", "lz_cos"
    __slots__ = ()
    tfun = staticmethod(torch.cos)

    def vjp(self, g):
        return [Neg(Mul(g, Sin(self.children[0])))]


class Square(Unary):
    op = "Square"
    __slots__ = ()

    def emit(self, em, args):
        return [em.temp_expr(f"{a} * {a}") for a in args[0]]

    tfun = staticmethod(torch.square)

    def vjp(self, g):
        return [Mul(g, Mul(Const(2.0), self.children[0]))]


class Recip(Unary):
    """1 / x (the kernels' rewrite of a division by a value that is the same for every j)."""

    op = "Recip"
    __slots__ = ()

    def emit(self, em, args):
        return [em.temp_expr(f"{em.literal(1.0)} / {a}") for a in args[0]]

    tfun = staticmethod(torch.reciprocal)

    def vjp(self, g):
        return [Neg(Mul(g, Square(self)))]


class Exp2(Unary):
    """2^x (the kernels' rewrite of exp(x * v) as 2^(x * v log2 e))."""

    op, cfun = "Exp2", "fast_exp2"
    __slots__ = ()
    tfun = staticmethod(torch.exp2)

    def vjp(self, g):
        return [Mul(g, Mul(self, Const(math.log(2.0))))]


class IntPow(Formula):
    """x ** n for an integer n, by repeated squaring (lz_ipow takes a C int: |n| <= MAX; larger exponents are
    powers through :class:`Pow`, whose result is the same: 0, 1 or +-inf but for |x| = 1)."""

    op = "IntPow"
    __slots__ = ("n",)
    MAX = 2**31 - 2  # |n| for which n and the derivative's n - 1 are C ints

    def __init__(self, x: Formula, n: int) -> None:
        if not -self.MAX - 1 <= n <= self.MAX:
            raise FormulaError(f"IntPow: the exponent {n} is not in [{-self.MAX - 1}, {self.MAX}]; use Pow")
        super().__init__(x.dim, x)
        self.n = int(n)

    def params(self):
        return str(self.n)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], int(params))

    def rebuild(self, children):
        return IntPow(children[0], self.n)

    def emit(self, em, args):
        return [f"lz_ipow({a}, {self.n})" for a in args[0]]

    def evaluate_node(self, values):
        return values[0] ** self.n

    def vjp(self, g):
        if self.n == 0:
            return [None]
        x = self.children[0]
        return [Mul(g, Mul(Const(self.n), IntPow(x, self.n - 1)))]


class Pow(Formula):
    """x ** p for a formula p (of dimension 1 or x's), through the library pow."""

    op = "Pow"
    __slots__ = ()

    def __init__(self, x: Formula, p: Formula) -> None:
        super().__init__(_broadcast_dim("**", x, p), x, p)

    def rebuild(self, children):
        return Pow(*children)

    def emit(self, em, args):
        return [f"lz_pow({_comp(args[0], d)}, {_comp(args[1], d)})" for d in range(self.dim)]

    def evaluate_node(self, values):
        return torch.pow(values[0], values[1])

    def vjp(self, g):
        x, p = self.children
        gx = Mul(g, Mul(p, Pow(x, Sub(p, Const(1.0)))))
        gp = Mul(g, Mul(self, Log(x)))
        return [reduce_to_dim(gx, x.dim), reduce_to_dim(gp, p.dim)]


class Binary(Formula):
    """An elementwise operation of two formulas, broadcasting a dimension of 1."""

    __slots__ = ()
    symbol = ""

    def __init__(self, a: Formula, b: Formula) -> None:
        super().__init__(_broadcast_dim(self.symbol or self.op, a, b), a, b)

    def rebuild(self, children):
        return type(self)(*children)

    def emit(self, em, args):
        return [em.temp_expr(f"{_comp(args[0], d)} {self.symbol} {_comp(args[1], d)}") for d in range(self.dim)]


class Add(Binary):
    op, symbol = "Add", "+"
    __slots__ = ()

    def evaluate_node(self, values):
        return values[0] + values[1]

    def vjp(self, g):
        a, b = self.children
        return [reduce_to_dim(g, a.dim), reduce_to_dim(g, b.dim)]


class Sub(Binary):
    op, symbol = "Sub", "-"
    __slots__ = ()

    def evaluate_node(self, values):
        return values[0] - values[1]

    def vjp(self, g):
        a, b = self.children
        return [reduce_to_dim(g, a.dim), reduce_to_dim(Neg(g), b.dim)]


class Mul(Binary):
    op, symbol = "Mul", "*"
    __slots__ = ()

    def evaluate_node(self, values):
        return values[0] * values[1]

    def vjp(self, g):
        a, b = self.children
        return [reduce_to_dim(Mul(g, b), a.dim), reduce_to_dim(Mul(g, a), b.dim)]


class Div(Binary):
    op, symbol = "Div", "/"
    __slots__ = ()

    def evaluate_node(self, values):
        return values[0] / values[1]

    def vjp(self, g):
        a, b = self.children
        return [reduce_to_dim(Div(g, b), a.dim), reduce_to_dim(Neg(Div(Mul(g, self), b)), b.dim)]


class Clamp(Formula):
    """min(max(x, lo), hi), elementwise; lo and hi broadcast."""

    op = "Clamp"
    __slots__ = ()

    def __init__(self, x: Formula, lo: Formula, hi: Formula) -> None:
        dim = _broadcast_dim("clamp", x, lo)
        dim = _broadcast_dim("clamp", _Dim(dim), hi)
        super().__init__(dim, x, lo, hi)

    def rebuild(self, children):
        return Clamp(*children)

    def emit(self, em, args):
        return [f"lz_clamp({_comp(args[0], d)}, {_comp(args[1], d)}, {_comp(args[2], d)})" for d in range(self.dim)]

    def evaluate_node(self, values):
        x, lo, hi = torch.broadcast_tensors(*values)
        return torch.minimum(torch.maximum(x, lo), hi)

    def vjp(self, g):
        x, lo, hi = self.children
        inside = Inside(x, lo, hi)
        return [
            reduce_to_dim(Mul(g, inside), x.dim),
            reduce_to_dim(Mul(g, Mul(Step(Sub(lo, x)), Sub(Const(1.0), inside))), lo.dim),
            reduce_to_dim(Mul(g, Mul(Step(Sub(x, hi)), Sub(Const(1.0), inside))), hi.dim),
        ]


class _Dim(Formula):
    """A stand-in of a given dimension, for dimension checks only."""

    op = "_Dim"
    __slots__ = ()

    def __init__(self, dim: int) -> None:
        super().__init__(dim)


class Inside(Formula):
    """1 where lo <= x <= hi, else 0: clamp's derivative with respect to x."""

    op = "Inside"
    __slots__ = ()

    def __init__(self, x: Formula, lo: Formula, hi: Formula) -> None:
        super().__init__(max(x.dim, lo.dim, hi.dim), x, lo, hi)

    def rebuild(self, children):
        return Inside(*children)

    def emit(self, em, args):
        return [f"lz_inside({_comp(args[0], d)}, {_comp(args[1], d)}, {_comp(args[2], d)})" for d in range(self.dim)]

    def evaluate_node(self, values):
        x, lo, hi = values
        return ((x >= lo) & (x <= hi)).to(x.dtype)

    def vjp(self, g):
        return [None, None, None]


class IfElse(Formula):
    """a where c >= 0, else b (KeOps' IfElse), elementwise with broadcasting."""

    op = "IfElse"
    __slots__ = ()

    def __init__(self, c: Formula, a: Formula, b: Formula) -> None:
        dim = _broadcast_dim("ifelse", a, b)
        dim = _broadcast_dim("ifelse", c, _Dim(dim))
        super().__init__(dim, c, a, b)

    def rebuild(self, children):
        return IfElse(*children)

    def emit(self, em, args):
        return [f"lz_ifelse({_comp(args[0], d)}, {_comp(args[1], d)}, {_comp(args[2], d)})" for d in range(self.dim)]

    def evaluate_node(self, values):
        c, a, b = values
        return torch.where(c >= 0, a, b)

    def vjp(self, g):
        c, a, b = self.children
        s = Step(c)
        return [None, reduce_to_dim(Mul(g, s), a.dim), reduce_to_dim(Mul(g, Sub(Const(1.0), s)), b.dim)]


class SoftmaxWeight(Formula):
    """exp(f - o), exactly 0 where f = -inf: a logsumexp's weight of the term f against its result o."""

    op = "SoftW"
    __slots__ = ()

    def __init__(self, f: Formula, o: Formula) -> None:
        super().__init__(_broadcast_dim("softmax weight", f, o), f, o)

    def rebuild(self, children):
        return SoftmaxWeight(*children)

    def emit(self, em, args):
        return [em.temp_expr(f"lz_softmax_weight({_comp(args[0], d)}, {_comp(args[1], d)})") for d in range(self.dim)]

    def evaluate_node(self, values):
        f, o = torch.broadcast_tensors(*values)
        w = torch.exp(f - o)
        return torch.where(f == -math.inf, torch.zeros_like(w), w)

    def vjp(self, g):  # d/df = w, d/do = -w
        f, o = self.children
        gw = Mul(g, self)
        return [reduce_to_dim(gw, f.dim), reduce_to_dim(Neg(gw), o.dim)]


# ---------------------------------------------------------------- reductions over the vector dimension


class VecSum(Formula):
    op = "Sum"
    __slots__ = ()

    def __init__(self, x: Formula) -> None:
        super().__init__(1, x)

    def rebuild(self, children):
        return VecSum(children[0])

    def emit(self, em, args):
        terms = args[0]
        if not terms:
            return [em.literal(0.0)]
        if len(terms) <= WIDE_COMPONENTS:
            return [em.temp_expr(" + ".join(terms))]
        # wide: a chain of partial sums (the same left-to-right order as one expression), so that with the
        # Emitter's reordering each term is consumed as soon as it is made (docstring of Emitter.emit)
        total = terms[0]
        for term in terms[1:]:
            total = em.temp_expr(f"{total} + {term}")
        return [total]

    def evaluate_node(self, values):
        return values[0].sum(-1, keepdim=True)

    def vjp(self, g):
        return [reduce_to_dim(g, self.children[0].dim)]


class InnerProduct(Formula):
    """The sum of the components of its child, as :class:`VecSum`, that a kernel reads from a precomputed
    (output row, reduced index) matrix instead of summing it per cell (lazy/inner_products.py, the matrix-unit
    route): ``kind`` "sqdist" (the child is (x - y)^2 of an outer and an inner variable: |x|^2 + |y|^2 - 2 x.y,
    re-summed per cell where that cancels) or "dot" (x * y: x.y); ``index`` numbers the matrices of a formula.
    Only the route's own plans hold it; its value, gradient and torch evaluation are VecSum's."""

    op = "Gram"
    __slots__ = ("index", "kind")
    KINDS = ("sqdist", "dot")

    def __init__(self, x: Formula, kind: str, index: int) -> None:
        if kind not in self.KINDS:
            raise FormulaError(f"Gram: kind must be one of {self.KINDS}, got {kind!r}")
        super().__init__(1, x)
        self.kind = kind
        self.index = int(index)

    def params(self):
        return f"{self.kind}{self.index}"

    @classmethod
    def from_params(cls, params, children):
        kind = params.rstrip("0123456789")
        return cls(children[0], kind, int(params[len(kind) :]))

    def rebuild(self, children):
        return InnerProduct(children[0], self.kind, self.index)

    def emit(self, em, args):
        raise AssertionError("an inner product is read by the kernel skeleton (codegen._cell), not emitted")

    def evaluate_node(self, values):
        return values[0].sum(-1, keepdim=True)

    def vjp(self, g):
        return [reduce_to_dim(g, self.children[0].dim)]


class VecMax(Formula):
    """The largest component (NaN propagates)."""

    op = "Max"
    __slots__ = ()

    def __init__(self, x: Formula) -> None:
        super().__init__(1, x)

    def rebuild(self, children):
        return VecMax(children[0])

    def emit(self, em, args):
        acc = args[0][0]
        for a in args[0][1:]:
            acc = em.temp_expr(f"lz_max({acc}, {a})")
        return [acc]

    def evaluate_node(self, values):
        return values[0].amax(-1, keepdim=True)

    def vjp(self, g):
        x = self.children[0]
        return [Mul(reduce_to_dim(g, x.dim), ArgMaxMask(x))]


class ArgMaxMask(Formula):
    """One-hot of the first largest component: VecMax's derivative."""

    op = "ArgMaxMask"
    __slots__ = ()

    def __init__(self, x: Formula) -> None:
        super().__init__(x.dim, x)

    def rebuild(self, children):
        return ArgMaxMask(children[0])

    def emit(self, em, args):
        xs = args[0]
        best, idx = xs[0], "0"
        for d, a in enumerate(xs[1:], start=1):
            up = em.temp_expr(f"{a} > {best}", ctype="bool")
            best = em.temp_expr(f"{up} ? {a} : {best}")
            idx = em.temp_expr(f"{up} ? {d} : {idx}", ctype="int")
        return [em.temp_expr(f"{idx} == {d} ? {em.literal(1.0)} : {em.literal(0.0)}") for d in range(len(xs))]

    def evaluate_node(self, values):
        x = values[0]
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)

    def vjp(self, g):
        return [None]


class VecLogSumExp(Formula):
    op = "LSE"
    __slots__ = ()

    def __init__(self, x: Formula) -> None:
        super().__init__(1, x)

    def rebuild(self, children):
        return VecLogSumExp(children[0])

    def emit(self, em, args):
        xs = args[0]
        m = xs[0]
        for a in xs[1:]:
            m = em.temp_expr(f"lz_max({m}, {a})")
        m = em.temp_expr(f"({m} == -pos_inf<T>() || {m} == pos_inf<T>()) ? {em.literal(0.0)} : {m}")
        s = " + ".join(f"lz_exp({a} - {m})" for a in xs)
        return [em.temp_expr(f"{m} + lz_log({s})")]

    def evaluate_node(self, values):
        return torch.logsumexp(values[0], -1, keepdim=True)

    def vjp(self, g):
        x = self.children[0]
        return [Mul(reduce_to_dim(g, x.dim), SoftmaxWeight(x, self))]


# ---------------------------------------------------------------- shape operations


class Concat(Formula):
    op = "Concat"
    __slots__ = ()

    def __init__(self, a: Formula, b: Formula) -> None:
        super().__init__(a.dim + b.dim, a, b)

    def rebuild(self, children):
        return Concat(*children)

    def emit(self, em, args):
        return args[0] + args[1]

    def evaluate_node(self, values):
        a, b = values
        shape = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        return torch.cat([a.expand(*shape, a.shape[-1]), b.expand(*shape, b.shape[-1])], -1)

    def vjp(self, g):
        a, b = self.children
        return [Extract(g, 0, a.dim), Extract(g, a.dim, b.dim)]


class Extract(Formula):
    """Components start .. start + n - 1."""

    op = "Extract"
    __slots__ = ("n", "start")

    def __init__(self, x: Formula, start: int, n: int) -> None:
        if not (start >= 0 and n >= 1 and start + n <= x.dim):
            raise FormulaError(
                f"extract: components {start} .. {start + n - 1} are out of range for a formula of dimension "
                f"{x.dim}: {x!r}"
            )
        super().__init__(n, x)
        self.start, self.n = int(start), int(n)

    def params(self):
        return f"{self.start}:{self.n}"

    @classmethod
    def from_params(cls, params, children):
        start, n = params.split(":")
        return cls(children[0], int(start), int(n))

    def rebuild(self, children):
        return Extract(children[0], self.start, self.n)

    def emit(self, em, args):
        return args[0][self.start : self.start + self.n]

    def evaluate_node(self, values):
        return values[0][..., self.start : self.start + self.n]

    def vjp(self, g):
        return [Embed(g, self.start, self.children[0].dim)]


class Embed(Formula):
    """x placed at components start .. start + x.dim - 1 of a zero vector of dimension ``dim``."""

    op = "Embed"
    __slots__ = ("start",)

    def __init__(self, x: Formula, start: int, dim: int) -> None:
        super().__init__(dim, x)
        self.start = int(start)

    def params(self):
        return f"{self.start}:{self.dim}"

    @classmethod
    def from_params(cls, params, children):
        start, dim = params.split(":")
        return cls(children[0], int(start), int(dim))

    def rebuild(self, children):
        return Embed(children[0], self.start, self.dim)

    def emit(self, em, args):
        zero = em.literal(0.0)
        out = [zero] * self.dim
        out[self.start : self.start + len(args[0])] = args[0]
        return out

    def evaluate_node(self, values):
        x = values[0]
        return torch.nn.functional.pad(x, (self.start, self.dim - self.start - x.shape[-1]))

    def vjp(self, g):
        return [Extract(g, self.start, self.children[0].dim)]


class Repeat(Formula):
    """A formula of dimension 1 repeated to ``dim`` components."""

    op = "Repeat"
    __slots__ = ()

    def __init__(self, x: Formula, dim: int) -> None:
        if x.dim != 1:
            raise FormulaError(f"repeat needs a formula of dimension 1, got {x.dim}")
        super().__init__(dim, x)

    def params(self):
        return str(self.dim)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], int(params))

    def rebuild(self, children):
        return Repeat(children[0], self.dim)

    def emit(self, em, args):
        return args[0] * self.dim

    def evaluate_node(self, values):
        x = values[0]
        return x.expand(*x.shape[:-1], self.dim)

    def vjp(self, g):
        return [VecSum(g)]


# ---------------------------------------------------------------- walking formulas


def _postorder(root: Formula, done: set[int] | None = None) -> list[Formula]:
    """Nodes in post-order, each once (formulas are DAGs when sub-formulas are shared); the subtrees of the
    nodes whose ids are in ``done`` are left out. An explicit stack: formulas may be thousands deep."""
    seen: set[int] = set(done) if done else set()
    order: list[Formula] = []
    stack: list[tuple[Formula, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for child in reversed(node.children):
            if id(child) not in seen:
                stack.append((child, False))
    return order


class _VarIndex:
    """The distinct variables met so far, numbered in order: two Var nodes are one variable when they have the
    same category and dimension and either the same slot (canonical formulas) or the same tensor object
    (``Vi(x)`` twice). Eager, a dict on (id(tensor) or slot, category, dimension) finds a variable in O(1);
    under torch.compile, which (2.11) cannot take the id() of a tensor made inside the compiled function, a
    linear scan comparing with ``is`` (traced formulas have a handful of variables)."""

    __slots__ = ("_ids", "vars")

    def __init__(self) -> None:
        self.vars: list[Var] = []
        self._ids: dict[tuple, int] | None = None if torch.compiler.is_compiling() else {}

    @staticmethod
    def _ident(v: Var) -> tuple:
        return (id(v.tensor) if v.tensor is not None else ("slot", v.slot), v.cat, v.dim)

    def find(self, v: Var) -> int | None:
        if self._ids is not None:
            return self._ids.get(self._ident(v))  # the tensors stay alive in self.vars: their ids stay theirs
        for k, u in enumerate(self.vars):
            if u is v:
                return k
            same = (u.tensor is v.tensor) if v.tensor is not None else (u.tensor is None and u.slot == v.slot)
            if same and u.cat == v.cat and u.dim == v.dim:
                return k
        return None

    def add(self, v: Var) -> int:
        """v's number, numbering it if it is new."""
        k = self.find(v)
        if k is None:
            k = len(self.vars)
            self.vars.append(v)
            if self._ids is not None:
                self._ids[self._ident(v)] = k
        return k


def variables(root: Formula) -> list[Var]:
    """The distinct variables of a formula in order of first appearance (depth first, left to right)."""
    index = _VarIndex()
    for node in _postorder(root):
        if isinstance(node, Var):
            index.add(node)
    return index.vars


def substitute(root: Formula, mapping: Callable[[Var], Formula]) -> Formula:
    """The formula with every variable v replaced by mapping(v), sharing preserved."""
    memo: dict[int, Formula] = {}
    for node in _postorder(root):
        if isinstance(node, Var):
            memo[id(node)] = mapping(node)
        elif not node.children:
            memo[id(node)] = node
        else:
            kids = [memo[id(c)] for c in node.children]
            same = all(k is c for k, c in zip(kids, node.children, strict=True))
            memo[id(node)] = node if same else node.rebuild(kids)
    return memo[id(root)]


def replace_nodes(root: Formula, replaced: dict[int, Formula]) -> Formula:
    """root with the nodes of ``replaced`` (keyed by id) swapped for their values, sharing preserved."""
    memo: dict[int, Formula] = {}
    for node in _postorder(root):
        if id(node) in replaced:
            memo[id(node)] = replaced[id(node)]
        elif node.children:
            kids = [memo[id(c)] for c in node.children]
            same = all(k is c for k, c in zip(kids, node.children, strict=True))
            memo[id(node)] = node if same else node.rebuild(kids)
        else:
            memo[id(node)] = node
    return memo[id(root)]


def _structural_key(root: Formula) -> str:
    """Formula.key: one post-order pass numbers the distinct structures ((op, params, children's numbers)
    -> number), one depth-first pass writes each structure once and ``@n`` for its later occurrences, n the
    rank of its completion (formula_key.parse_formula numbers the nodes it completes the same way)."""
    heads: list[str] = []  # per structure: "{op}{params}"
    kids: list[tuple[int, ...]] = []  # per structure: its children's structures
    number: dict[tuple, int] = {}
    of: dict[int, int] = {}  # id(node) -> its structure
    for node in _postorder(root):
        head = f"{node.op}{node.params()}"
        sig = (head, tuple(of[id(c)] for c in node.children))
        s = number.get(sig)
        if s is None:
            s = number[sig] = len(heads)
            heads.append(head)
            kids.append(sig[1])
        of[id(node)] = s
    out: list[str] = []
    rank: dict[int, int] = {}  # structure -> its rank among the completed ones
    comma, close = -1, -2
    stack: list[tuple[int, int]] = [(of[id(root)], 0)]  # (structure, what): 0 write it, else close it
    while stack:
        s, what = stack.pop()
        if s == comma:
            out.append(",")
        elif what:
            out.append(")")
            rank[s] = len(rank)
        elif s in rank:
            out.append(f"@{rank[s]}")
        else:
            out.append(f"{heads[s]}(")
            stack.append((s, close))
            for k, c in enumerate(reversed(kids[s])):
                if k:
                    stack.append((comma, 0))
                stack.append((c, 0))
    return "".join(out)


def node_count(root: Formula) -> int:
    """The number of distinct nodes (objects) of a formula: the size of its emitted cell, for a canonical one."""
    return len(_postorder(root))


def number_count(root: Formula) -> int:
    """The length of the number vector a canonical formula reads: 1 + its largest Num index (0 without one).
    Remembered on the root."""
    if root._n_numbers is None:
        count = 0
        for node in _postorder(root):  # a loop: Dynamo traces no max(generator, default=)
            if isinstance(node, Num) and node.index >= count:
                count = node.index + 1
        root._n_numbers = count
    return root._n_numbers


class _Canonical:
    """canonicalize's result, remembered on the root: the canonical formula, the tensor variables by slot, the
    numbers' values (entry k is Num(numbered + k)) and which Const node has which index (by id)."""

    __slots__ = ("const_index", "formula", "numbered", "numbers", "tvars")

    def __init__(self, formula, tvars, numbers, const_index, numbered) -> None:
        self.formula: Formula = formula
        self.tvars: list[Var] = tvars
        self.numbers: tuple[float, ...] = numbers
        self.const_index: dict[int, int] = const_index
        self.numbered: int = numbered


_INTERNED: dict[tuple, Formula] = {}  # (op, params, ids of the canonical children) -> the canonical node
MAX_INTERNED = 1 << 16  # nodes kept; past that the table starts again (formulas stay valid, only unshared)


def _signature(node: Formula, kids: Sequence[Formula]) -> tuple:
    """A canonical node's key in the intern table: its operation, parameters and canonical children (by id:
    the table keeps them alive). A Var is a slot variable, a Num an index."""
    if isinstance(node, Var):
        return ("V", node.cat, node.slot, node.dim)
    if isinstance(node, Num):
        return ("Num", node.index)
    return (node.op, node.params(), *(id(k) for k in kids))


def _remember(table: dict[tuple, Formula], sig: tuple, node: Formula) -> Formula:
    """``node``, now the node of ``table`` under ``sig``."""
    if len(table) >= MAX_INTERNED:
        table.clear()
    table[sig] = node
    return node


def _intern_table() -> dict[tuple, Formula]:
    return {} if torch.compiler.is_compiling() else _INTERNED  # a traced graph keeps no formula objects


def canonical_node(node: Formula) -> Formula:
    """The shared canonical node equal to ``node``, a node whose children are canonical nodes (a kernel's own
    wrapper of a canonical formula, as ``K @ v``'s ``K * v_j``): made once, it keeps its key and number count
    across calls instead of computing them again."""
    table, sig = _intern_table(), _signature(node, node.children)
    return table.get(sig) or _remember(table, sig, node)


def canonicalize(root: Formula, reuse_first: bool = True, numbered: int = 0) -> tuple[Formula, list[Var]]:
    """(the canonical formula, the tensor variables by slot). In the canonical formula the variables are slot
    variables 0, 1, ... in order of first appearance, every Const is ``Num(k)`` (k = numbered, numbered + 1,
    ... in order of first appearance, one per Const node: see :func:`canonical_numbers` for the values),
    and equal structures are one node (hash-consing, so the kernel computes a repeated sub-formula once).
    Two formulas with equal canonical keys compile to the same kernel, whatever their tensors and numbers.

    ``numbered``: Num nodes already in the formula index the first ``numbered`` entries of the number vector
    (a derivative of a canonical formula reads the forward's numbers); new numbers come after them.

    One pass over the nodes, each looked up in a table of the canonical nodes made so far (shared by all
    formulas, so a formula rebuilt each call makes no new node). The result is remembered on the root
    (formulas are immutable), and the first child's is taken over as the prefix (its variables and numbers
    come first), so ``(K * w).sum(1)`` with a new w each call walks only the new nodes."""
    c = _canonical(root, reuse_first, numbered)
    return c.formula, list(c.tvars)


def canonical_numbers(root: Formula, numbered: int = 0) -> tuple[float, ...]:
    """The values of the numbers of canonicalize(root, numbered=numbered): entry k is Num(numbered + k)'s."""
    return _canonical(root, True, numbered).numbers


def _canonical(root: Formula, reuse_first: bool, numbered: int) -> _Canonical:
    done = root._canonical
    if done is not None and done.numbered == numbered:
        return done
    table = _intern_table()
    slots = _VarIndex()  # the tensor variables, numbered by slot
    numbers: list[float] = []
    const_index: dict[int, int] = {}  # id(Const node) -> its number's index
    canon: dict[int, Formula] = {}  # id(node) -> its canonical node
    skip: set[int] = set()
    first = root.children[0] if root.children else None
    if reuse_first and first is not None and first.children:
        prefix = _canonical(first, False, numbered)  # one level: no deep recursion
        for v in prefix.tvars:  # distinct already
            slots.add(v)
        numbers.extend(prefix.numbers)
        const_index.update(prefix.const_index)
        canon[id(first)] = prefix.formula
        skip.add(id(first))
    for node in _postorder(root, skip):
        if isinstance(node, Var):
            slot = slots.add(node)
            sig: tuple = ("V", node.cat, slot, node.dim)
            made = table.get(sig) or _remember(table, sig, Var(node.cat, node.dim, slot=slot))
        elif isinstance(node, (Const, Num)):
            if isinstance(node, Num):
                if node.index >= numbered:
                    raise FormulaError(f"Num({node.index}) has no value: the formula's numbers are {numbered}")
                index = node.index
            else:
                index = const_index.get(id(node))
                if index is None:
                    index = const_index[id(node)] = numbered + len(numbers)
                    numbers.append(node.value)
            sig = ("Num", index)
            made = table.get(sig) or _remember(table, sig, Num(index))
        else:
            kids = [canon[id(c)] for c in node.children]
            sig = _signature(node, kids)
            made = table.get(sig)
            if made is None:
                same = all(k is c for k, c in zip(kids, node.children, strict=True))
                made = _remember(table, sig, node if same else node.rebuild(kids))
        canon[id(node)] = made
    done = _Canonical(canon[id(root)], slots.vars, tuple(numbers), const_index, numbered)
    root._canonical = done
    return done


# ---------------------------------------------------------------- emission (C code)


class Emitter:
    """Collects the statements of one evaluation of a formula.

    ``read(var, d)`` returns the C expression of component d of a variable (the kernel skeleton decides where
    variables live: registers, shared memory, a staged chunk); ``number(k, hoisted)`` the expression of entry
    k of the number vector (:class:`Num`) in a statement of ``hoisted`` (True) or of ``lines``: numbers are
    read where they are used, not named, so thousands of them make no thousands of live values;
    ``ctype`` is the scalar type (``T``).
    With ``invariant(var)`` (true for variables that do not change along the reduction: parameters and the
    row's own variables), sub-formulas of invariant variables only go to ``hoisted``, statements the skeleton
    places once per row, before its loop over j; the rest goes to ``lines``. Each distinct node is emitted
    once (canonical formulas share equal sub-formulas), as one temporary per component.
    """

    def __init__(
        self,
        read: Callable[[Var, int], str],
        prefix: str = "t",
        ctype: str = "T",
        invariant: Callable[[Var], bool] | None = None,
        number: Callable[[int, bool], str] | None = None,
    ) -> None:
        self.read = read
        self.number = number or (lambda k, hoisted: f"nums[{k}]")
        self.prefix = prefix
        self.ctype = ctype
        self.invariant = invariant
        self.lines: list[str] = []
        self.hoisted: list[str] = []
        self._target = self.lines
        self._count = 0

    @property
    def hoisting(self) -> bool:
        """Whether the node being emitted goes to ``hoisted``."""
        return self._target is self.hoisted

    def temp_expr(self, expr: str, ctype: str | None = None) -> str:
        name = f"{self.prefix}{self._count}"
        self._count += 1
        self._target.append(f"const {ctype or self.ctype} {name} = {expr};")
        return name

    def literal(self, value: float) -> str:
        if math.isnan(value):
            return f"{self.ctype}(0.0 / 0.0)"
        if math.isinf(value):
            return f"({'-' if value < 0 else ''}pos_inf<{self.ctype}>())"
        return f"{self.ctype}({value!r})"

    def is_invariant(self, node: Formula, kids: list[bool]) -> bool:
        if self.invariant is None:
            return False
        if isinstance(node, Var):
            return self.invariant(node)
        return all(kids)

    def emit(self, root: Formula) -> list[str]:
        """Statements appended to self.lines (and self.hoisted); returns the root's component expressions.

        Nodes are emitted whole, one temporary per component, in post-order: a D = 784 squared distance is 784
        differences, then 784 squares, then their sum, so 1,568 values are live at once, and g++'s register
        allocation took 27 s over them. When a pass emits more than WIDE_STATEMENTS statements to ``lines``,
        they are put in depth-first order from the root instead (each statement right after the ones it
        reads, in the order it reads them): the same values, computed in another order, with a few live."""
        values: dict[int, list[str]] = {}
        inv: dict[int, bool] = {}
        start = len(self.lines)
        for node in _postorder(root):
            inv[id(node)] = self.is_invariant(node, [inv[id(c)] for c in node.children])
            self._target = self.hoisted if inv[id(node)] else self.lines
            here = self.hoisting
            args = [[self.number(c.index, here)] if isinstance(c, Num) else values[id(c)] for c in node.children]
            out = node.emit(self, args)
            # name every multi-use or compound result once, so shared sub-formulas are computed once
            if not isinstance(node, (Var, Const, Num)) and (node is not root or inv[id(node)]):
                out = [o if o.isidentifier() else self.temp_expr(o) for o in out]
            values[id(node)] = out
        self._target = self.lines
        if len(self.lines) - start > WIDE_STATEMENTS:
            self.lines[start:] = _depth_first(self.lines[start:], values[id(root)], self.prefix)
        return values[id(root)]


WIDE_COMPONENTS = 64  # a vector sum of more components is emitted as a chain of partial sums
WIDE_STATEMENTS = 256  # an emission of more statements is put in depth-first order (Emitter.emit)


def _depth_first(lines: list[str], roots: list[str], prefix: str) -> list[str]:
    """``lines`` (``const T {prefix}{n} = expr;`` statements, each reading earlier ones) reordered depth-first
    from the temporaries that ``roots`` read: a statement comes right after the statements it reads, in the
    order it reads them. Statements nothing reads stay first, in their order."""
    name_of = re.compile(rf"\b{re.escape(prefix)}\d+\b")
    index = {}
    for k, line in enumerate(lines):
        found = name_of.search(line)
        if found is not None:
            index.setdefault(found.group(0), k)
    reads = [[index[m] for m in name_of.findall(line.split("=", 1)[1]) if m in index] for line in lines]
    order: list[int] = []
    done = [False] * len(lines)
    for root in (index[m] for expr in roots for m in name_of.findall(expr) if m in index):
        stack = [(root, 0)]
        while stack:  # iterative post-order: a chain of thousands of partial sums is deeper than Python's stack
            k, at = stack.pop()
            if done[k]:
                continue
            if at < len(reads[k]):
                stack.append((k, at + 1))
                if not done[reads[k][at]]:
                    stack.append((reads[k][at], 0))
                continue
            done[k] = True
            order.append(k)
    unread = [k for k in range(len(lines)) if not done[k]]
    return [lines[k] for k in unread + order]


def strength_reduce(root: Formula, invariant: Callable[[Var], bool]) -> Formula:
    """The kernels' rewrite of a formula, with ``invariant`` as in Emitter: x / v becomes x * (1 / v) and
    exp(x * v) becomes 2^(x * (v log2 e)) when v is invariant, so a division and a multiply per term turn into
    one multiply by a value computed once per row (the results may differ in the last bit)."""
    inv: dict[int, bool] = {}
    memo: dict[int, Formula] = {}
    for node in _postorder(root):
        kids = [memo[id(c)] for c in node.children]
        is_inv = invariant(node) if isinstance(node, Var) else all(inv[id(c)] for c in node.children)
        new = (
            node if (not kids or all(k is c for k, c in zip(kids, node.children, strict=True))) else node.rebuild(kids)
        )
        if not is_inv and isinstance(new, Div) and inv[id(node.children[1])]:
            new = Mul(kids[0], Recip(kids[1]))
        if not is_inv and isinstance(new, Exp) and isinstance(kids[0], Mul):
            a, b = kids[0].children
            a_inv, b_inv = _invariant_of(a, inv, invariant), _invariant_of(b, inv, invariant)
            if a_inv != b_inv and a.dim == b.dim == kids[0].dim:
                x, v = (b, a) if a_inv else (a, b)
                new = Exp2(Mul(x, Mul(v, Const(1.4426950408889634))))
        inv[id(node)] = is_inv
        memo[id(node)] = new
        inv[id(new)] = is_inv
    return memo[id(root)]


def _invariant_of(node: Formula, inv: dict[int, bool], invariant: Callable[[Var], bool]) -> bool:
    if id(node) in inv:
        return inv[id(node)]
    if isinstance(node, Var):
        return invariant(node)
    return isinstance(node, Const) or all(_invariant_of(c, inv, invariant) for c in node.children)


# ---------------------------------------------------------------- evaluation (torch)


def evaluate(
    root: Formula,
    read: Callable[[Var], torch.Tensor],
    like: torch.Tensor,
    numbers: torch.Tensor | None = None,
    owned_slots: frozenset[int] = frozenset(),
) -> torch.Tensor:
    """The formula's value with torch: ``read(var)`` gives each variable as a tensor whose last dimension is
    the variable's and whose leading dimensions broadcast; constants take ``like``'s dtype and device, and
    ``Num(k)`` is ``numbers[k]`` (the number vector of a canonical formula, shape (n,)).

    ``owned_slots``: variables whose tensors the caller hands over (a block's matrix made for this call): with
    them, an elementwise node whose first operand is a temporary used by it alone (such a variable, or an earlier
    node's fresh result) and none of whose operands requires grad writes its result into that operand's memory
    rather than a new tensor: one pass over a large block instead of an allocation and a pass."""
    order = _postorder(root)
    reuse = bool(owned_slots)
    uses: dict[int, int] = {}
    if reuse:  # readers of each node's value; an owned variable's by slot (two nodes may read one slot)
        for node in order:
            for c in node.children:
                key = ("slot", c.slot) if isinstance(c, Var) else id(c)
                uses[key] = uses.get(key, 0) + 1
    # a negation whose one reader multiplies or divides it by a number is not made: the reader takes the number's
    # negative instead (exact in floating point), one pass over a block fewer (-D / d: neg, div -> div)
    folded = {id(n.children[0]) for n in order if reuse and _folds_negation(n, uses)}
    values: dict[int, torch.Tensor] = {}
    spare: set[int] = set()  # ids of the nodes whose value is a temporary that only its one reader sees
    for node in order:
        if id(node) in folded:  # its value stands un-negated; its reader negates the number
            inner = node.children[0]
            values[id(node)] = values[id(inner)]
            if id(inner) in spare:
                spare.add(id(node))
            continue
        if isinstance(node, Var):
            values[id(node)] = read(node)
            if reuse and node.slot in owned_slots and uses.get(("slot", node.slot), 0) == 1:
                spare.add(id(node))
        elif isinstance(node, Const):
            values[id(node)] = torch.full((1,), node.value, dtype=like.dtype, device=like.device)
        elif isinstance(node, Num):
            if numbers is None or node.index >= numbers.shape[0]:
                raise FormulaError(f"Num({node.index}): no such entry in the number vector")
            values[id(node)] = numbers[node.index : node.index + 1]
        else:
            args = [values[id(c)] for c in node.children]
            if node.children and id(node.children[0]) in folded:
                args[1] = -args[1]
            first = node.children[0] if node.children else None
            out = _in_place(node, args) if first is not None and id(first) in spare else None
            value = values[id(node)] = out if out is not None else node.evaluate_node(args)
            # a fresh tensor, or an operand handed through that was itself spare (never a caller's tensor)
            fresh = value._base is None and not any(value is a for a in args)
            handed = any(value is a and id(c) in spare for a, c in zip(args, node.children, strict=True))
            if reuse and uses.get(id(node), 0) == 1 and (fresh or handed):
                spare.add(id(node))
    return values[id(root)]


def _folds_negation(node: Formula, uses: dict) -> bool:
    """Whether ``node`` is a product or quotient of a negation, read by it alone, and a number (evaluate)."""
    if node.op not in ("Mul", "Div") or len(node.children) != 2:
        return False
    neg, number = node.children
    return isinstance(neg, Neg) and isinstance(number, (Const, Num)) and uses.get(id(neg), 0) == 1


_IN_PLACE_UNARY = frozenset(
    (
        torch.neg,
        torch.exp,
        torch.log,
        torch.sqrt,
        torch.rsqrt,
        torch.abs,
        torch.reciprocal,
        torch.exp2,
        torch.sin,
        torch.cos,
    )
)
_IN_PLACE_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}


def _in_place(node: Formula, args: list[torch.Tensor]) -> torch.Tensor | None:
    """The node's value written over its first operand (a spare temporary, evaluate), or None when the node is not
    an elementwise one of the same shape and dtype as that operand."""
    target = args[0]
    if not target.is_contiguous() or any(a.requires_grad for a in args):  # autograd records no out= op
        return None
    if isinstance(node, Unary):
        fn = node.tfun
        return fn(target, out=target) if fn in _IN_PLACE_UNARY else None
    op = _IN_PLACE_BINARY.get(node.op)
    if op is None or len(args) != 2:
        return None
    other = args[1]
    if torch.broadcast_shapes(target.shape, other.shape) != target.shape or other.dtype != target.dtype:
        return None
    return op(target, other, out=target)


# ---------------------------------------------------------------- differentiation


def vjp(root: Formula, wrt: Sequence[Var], g: Formula) -> list[Formula | None]:
    """Symbolic vector-Jacobian products: for each variable v of ``wrt`` (the same variable as one of root's,
    see _VarIndex), the formula sum_d g_d * d root_d / d v (dimension v.dim), or None when root does not
    depend on v. Cotangents flow only into sub-formulas that depend on a variable of ``wrt`` (numbers and
    other variables get none), each node visited once."""
    if g.dim != root.dim:
        raise FormulaError(f"vjp: cotangent of dimension {g.dim} for a formula of dimension {root.dim}")
    order = _postorder(root)
    wanted = _VarIndex()
    for v in wrt:
        wanted.add(v)
    needed: set[int] = set()  # ids of the nodes that depend on a variable of wrt
    for node in order:
        if (wanted.find(node) is not None) if isinstance(node, Var) else any(id(c) in needed for c in node.children):
            needed.add(id(node))
    cot: dict[int, Formula] = {id(root): g}
    by_var: list[Formula | None] = [None] * len(wanted.vars)  # the cotangent of each of wanted's variables
    for node in reversed(order):
        gn = cot.get(id(node))
        if gn is None or id(node) not in needed:
            continue
        if isinstance(node, Var):
            k = wanted.find(node)
            prev = by_var[k]
            by_var[k] = gn if prev is None else Add(prev, gn)
            continue
        for child, gc in zip(node.children, node.vjp(gn), strict=True):
            if gc is None or id(child) not in needed:
                continue
            if gc.dim != child.dim:
                gc = reduce_to_dim(gc, child.dim)
            prev = cot.get(id(child))
            cot[id(child)] = gc if prev is None else Add(prev, gc)
    return [by_var[wanted.find(v)] for v in wrt]


def to_formula(x: Any) -> Formula:
    """A Python number as a constant formula (used by the operators)."""
    if isinstance(x, Formula):
        return x
    if isinstance(x, (int, float)):
        return Const(x)
    raise FormulaError(f"cannot use {type(x).__name__} in a formula")


_PLACEHOLDER_SLOT = -2  # the slot of the placeholder of _derivative_in (canonical slots are >= 0, tensor variables -1)


def _derivative_in(dim: int, scalar: Callable[[Formula], Formula | None]) -> Formula | None:
    """d scalar(e) / de for a placeholder variable e of dimension ``dim`` and ``scalar(e)`` a formula of
    dimension 1 linear in e (None: zero). A vjp is linear in its cotangent, so the result never reads e."""
    e = Var("p", dim, slot=_PLACEHOLDER_SLOT)
    s = scalar(e)
    if s is None:
        return None
    (out,) = vjp(s, [e], Const(1.0))
    if out is not None and any(v.tensor is None and v.slot == _PLACEHOLDER_SLOT for v in variables(out)):
        raise FormulaError("the transposed map is not linear in its argument")
    return out


def _dot(a: Formula, b: Formula) -> Formula:
    return Mul(a, b) if a.dim == b.dim == 1 else VecSum(Mul(a, b))


def transpose_linear(linear: Callable[[Formula], Formula], dim: int, y: Formula) -> Formula | None:
    """The transpose of a linear map applied to y: for ``linear(e)`` a formula linear in the formula e of
    dimension ``dim`` (e ↦ A e, of dimension y.dim), the formula A^T y (dimension ``dim``) = d<A e, y>/de, or
    None when linear(e) does not depend on e."""

    def scalar(e: Formula) -> Formula:
        image = linear(e)
        if image.dim != y.dim:
            raise FormulaError(f"transpose_linear: the map gives dimension {image.dim}, y has {y.dim}")
        return _dot(image, y)

    return _derivative_in(dim, scalar)


def jvp(root: Formula, wrt: Sequence[Var], tangents: Sequence[Formula]) -> Formula | None:
    """Symbolic Jacobian-vector product: sum over v of wrt of d root / d v · t_v (dimension root.dim), with
    t_v the formula of ``tangents`` of v's dimension, or None when root depends on none of wrt. It is the
    transpose of e ↦ (vjp(root, v, e))_v applied to the tangents, d(sum_v <J_v^T e, t_v>)/de = J t, so every
    operation that has a vjp has a jvp, differentiable again as far as vjp is."""
    for v, t in zip(wrt, tangents, strict=True):
        if t.dim != v.dim:
            raise FormulaError(f"jvp: tangent of dimension {t.dim} for a variable of dimension {v.dim}")

    def scalar(e: Formula) -> Formula | None:
        parts = [_dot(g, t) for g, t in zip(vjp(root, wrt, e), tangents, strict=True) if g is not None]
        return functools.reduce(Add, parts) if parts else None

    return _derivative_in(root.dim, scalar)
