"""Symbolic formulas over i-indexed variables, j-indexed variables and parameters.

A formula is an immutable tree (a DAG when sub-formulas are shared) of :class:`Formula` nodes. Every node
has a vector dimension ``dim``; binary operations broadcast a dimension of 1 against any other. A node
knows three things about itself:

- ``emit``: its value as C code, one scalar expression per component, for the generated kernels
  (codegen_cpu.py, codegen_cuda.py), through an :class:`Emitter` that names temporaries and reads variables;
- ``evaluate``: its value as a torch tensor of shape (..., dim), for ``.dense()``, the PyTorch fallback and
  the gradients of max / min reductions;
- ``vjp``: the cotangents of its children given its own (reverse-mode symbolic differentiation), so that the
  gradient of a reduction is a new formula reduced by the same engine (:func:`vjp`).

Variables are :class:`Var` leaves: a category (``"i"``, ``"j"`` or ``"p"``), a dimension and either a
tensor (while a user builds a formula) or a slot (the canonical form a kernel is compiled for, see
:func:`canonicalize`). Formulas compare and hash by structure through :attr:`Formula.key`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "Const",
    "Emitter",
    "Formula",
    "FormulaError",
    "Var",
    "canonicalize",
    "evaluate",
    "variables",
    "vjp",
]


class FormulaError(ValueError):
    """An ill-formed formula: incompatible dimensions, a bad index, an unsupported operation."""


# ---------------------------------------------------------------- the node base


class Formula:
    """A node of a formula: ``dim`` components, computed from ``children``."""

    op: str = ""
    __slots__ = ("_canonical", "_key", "_plans", "children", "dim")

    def __init__(self, dim: int, *children: Formula) -> None:
        self.dim = int(dim)
        self.children = children
        self._key: str | None = None
        self._canonical: tuple[Formula, list[Var]] | None = None  # canonicalize's result, once computed
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
        if self._key is None:  # children first, without recursion (formulas may be thousands deep)
            for c in self.children:
                if c._key is None and not c.children:
                    c._key = f"{c.op}{c.params()}()"
            if all(c._key is not None for c in self.children):  # a leaf, or children already keyed
                inner = ",".join(c._key for c in self.children)
                self._key = f"{self.op}{self.params()}({inner})"
                return self._key
            for node in _postorder(self):
                if node._key is None:
                    inner = ",".join(c._key for c in node.children)
                    node._key = f"{node.op}{node.params()}({inner})"
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


class Const(Formula):
    """A number written into the kernel (integers of the user's formula, exponents, clamp bounds)."""

    op = "C"
    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        super().__init__(1)
        self.value = float(value)

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
    """x ** n for an integer n."""

    op = "IntPow"
    __slots__ = ("n",)

    def __init__(self, x: Formula, n: int) -> None:
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
        return [em.temp_expr(" + ".join(args[0]) if args[0] else em.literal(0.0))]

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
    (``Vi(x)`` twice). Compared with ``is``, not by id(): torch.compile (2.11) cannot take the id() of a tensor
    made inside the compiled function. A linear scan: formulas have a handful of variables."""

    __slots__ = ("vars",)

    def __init__(self) -> None:
        self.vars: list[Var] = []

    def find(self, v: Var) -> int | None:
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


_CANONICAL: dict[str, Formula] = {}  # canonical key -> the canonical formula, shared by equal structures
MAX_CANONICAL = 4096


def canonicalize(root: Formula, reuse_first: bool = True) -> tuple[Formula, list[Var]]:
    """(the formula with slot variables 0, 1, ... in order of first appearance, the tensor variables in that
    order). Two formulas with equal canonical keys compile to the same kernel.

    One pass over the nodes computes the canonical key (the key the canonical formula would have); the
    canonical formula itself is built once per key and shared. The result is remembered on the root
    (formulas are immutable), and the first child's is taken over as the prefix (its variables come
    first), so ``K @ v`` or ``(K * w).sum(1)`` with a new v or w each call walk only the new nodes."""
    if root._canonical is not None:
        return root._canonical[0], list(root._canonical[1])
    keys: dict[int, str] = {}
    slots = _VarIndex()  # the tensor variables, numbered by slot
    slot_of: dict[int, int] = {}  # id(Var node) -> its slot
    done: set[int] = set()
    first = root.children[0] if root.children else None
    canon_first = None
    if reuse_first and first is not None and first.children:
        canon_first, first_vars = canonicalize(first, reuse_first=False)  # one level: no deep recursion
        slots.vars.extend(first_vars)  # distinct already
        keys[id(first)] = canon_first.key
        done.add(id(first))
    order = _postorder(root, done)
    for node in order:
        if isinstance(node, Var):
            slot = slot_of[id(node)] = slots.add(node)
            keys[id(node)] = f"V{node.cat}{slot}:{node.dim}()"  # = Var(cat, dim, slot=slot).key
        elif not node.children:
            keys[id(node)] = node.key
        else:
            keys[id(node)] = f"{node.op}{node.params()}({','.join(keys[id(c)] for c in node.children)})"
    key = keys[id(root)]
    canon = _CANONICAL.get(key)
    if canon is None:
        canon = _build_canonical(order, slot_of, first if canon_first is not None else None, canon_first)
        if len(_CANONICAL) >= MAX_CANONICAL:
            _CANONICAL.clear()
        _CANONICAL[key] = canon
    root._canonical = (canon, slots.vars)
    return canon, list(slots.vars)


def _build_canonical(
    order: list[Formula], slot_of: dict[int, int], first: Formula | None, canon_first: Formula | None
) -> Formula:
    """The canonical formula of the nodes ``order`` (post-order, the root last): variables become slot
    variables (slot_of: id(Var node) -> slot), the subtree ``first`` (left out of ``order``) is ``canon_first``."""
    memo: dict[int, Formula] = {}
    if first is not None:
        memo[id(first)] = canon_first
    made: dict[int, Var] = {}
    for node in order:
        if isinstance(node, Var):
            slot = slot_of[id(node)]
            if slot not in made:
                made[slot] = Var(node.cat, node.dim, slot=slot)
            memo[id(node)] = made[slot]
        elif not node.children:
            memo[id(node)] = node
        else:
            memo[id(node)] = node.rebuild([memo[id(c)] for c in node.children])
    return memo[id(order[-1])]


# ---------------------------------------------------------------- emission (C code)


class Emitter:
    """Collects the statements of one evaluation of a formula.

    ``read(var, d)`` returns the C expression of component d of a variable (the kernel skeleton decides where
    variables live: registers, shared memory, a staged chunk); ``ctype`` is the scalar type (``T``).
    With ``invariant(var)`` (true for variables that do not change along the reduction: parameters and the
    row's own variables), sub-formulas of invariant variables only go to ``hoisted``, statements the skeleton
    places once per row, before its loop over j; the rest goes to ``lines``.
    """

    def __init__(
        self,
        read: Callable[[Var, int], str],
        prefix: str = "t",
        ctype: str = "T",
        invariant: Callable[[Var], bool] | None = None,
    ) -> None:
        self.read = read
        self.prefix = prefix
        self.ctype = ctype
        self.invariant = invariant
        self.lines: list[str] = []
        self.hoisted: list[str] = []
        self._target = self.lines
        self._count = 0

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
        """Statements appended to self.lines (and self.hoisted); returns the root's component expressions."""
        values: dict[int, list[str]] = {}
        inv: dict[int, bool] = {}
        for node in _postorder(root):
            args = [values[id(c)] for c in node.children]
            inv[id(node)] = self.is_invariant(node, [inv[id(c)] for c in node.children])
            self._target = self.hoisted if inv[id(node)] else self.lines
            out = node.emit(self, args)
            # name every multi-use or compound result once, so shared sub-formulas are computed once
            if not isinstance(node, (Var, Const)) and (node is not root or inv[id(node)]):
                out = [o if o.isidentifier() else self.temp_expr(o) for o in out]
            values[id(node)] = out
        self._target = self.lines
        return values[id(root)]


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


def evaluate(root: Formula, read: Callable[[Var], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The formula's value with torch: ``read(var)`` gives each variable as a tensor whose last dimension is
    the variable's and whose leading dimensions broadcast; constants take ``like``'s dtype and device."""
    values: dict[int, torch.Tensor] = {}
    for node in _postorder(root):
        if isinstance(node, Var):
            values[id(node)] = read(node)
        elif isinstance(node, Const):
            values[id(node)] = torch.full((1,), node.value, dtype=like.dtype, device=like.device)
        else:
            values[id(node)] = node.evaluate_node([values[id(c)] for c in node.children])
    return values[id(root)]


# ---------------------------------------------------------------- differentiation


def vjp(root: Formula, wrt: Sequence[Var], g: Formula) -> list[Formula | None]:
    """Symbolic vector-Jacobian products: for each variable v of ``wrt`` (the same variable as one of root's,
    see _VarIndex), the formula sum_d g_d * d root_d / d v (dimension v.dim), or None when root does not
    depend on v."""
    if g.dim != root.dim:
        raise FormulaError(f"vjp: cotangent of dimension {g.dim} for a formula of dimension {root.dim}")
    order = _postorder(root)
    cot: dict[int, Formula] = {id(root): g}
    seen = _VarIndex()
    by_var: list[Formula] = []  # the cotangent of each of seen's variables
    for node in reversed(order):
        gn = cot.get(id(node))
        if gn is None:
            continue
        if isinstance(node, Var):
            k = seen.add(node)
            if k == len(by_var):
                by_var.append(gn)
            else:
                by_var[k] = Add(by_var[k], gn)
            continue
        for child, gc in zip(node.children, node.vjp(gn), strict=True):
            if gc is None:
                continue
            if gc.dim != child.dim:
                gc = reduce_to_dim(gc, child.dim)
            prev = cot.get(id(child))
            cot[id(child)] = gc if prev is None else Add(prev, gc)
    found = [seen.find(v) for v in wrt]
    return [None if k is None else by_var[k] for k in found]


def to_formula(x: Any) -> Formula:
    """A Python number as a constant formula (used by the operators)."""
    if isinstance(x, Formula):
        return x
    if isinstance(x, (int, float)):
        return Const(float(x))
    raise FormulaError(f"cannot use {type(x).__name__} in a formula")
