"""More formula nodes, for KeOps' LazyTensor API: inverse trigonometric functions, sin(x) / x and its
derivatives, x log x, rounding, comparisons, one-hot vectors, B-splines and tensor contractions.

Each node is a :class:`formula.Formula` like those of formula.py (C code through the Emitter, torch
evaluation, symbolic VJP) and parses back from its key (formula_key.py registers the classes of both modules).
The C functions live in csrc/lazy/math.h.

================  =====================================  ======================================
node              value                                  derivative
================  =====================================  ======================================
Asin, Acos, Atan  the library functions                  1/sqrt(1 - x^2), -1/sqrt(1 - x^2), 1/(1 + x^2)
Atan2(y, x)       atan2(y, x)                            (x, -y) / (x^2 + y^2)
SinXDivX(x, n)    d^n/dx^n sin(x)/x (1 at 0 for n = 0)   SinXDivX(x, n + 1): finite at 0, any order
XLogX             x log x, 0 at 0                        log x + 1
Floor, Round(x,d) floor, round half away from zero       none (zero almost everywhere)
Compare(a, b)     1.0 where a < b (<=, ==, !=), else 0   none
OneHot(x, D)      e_k for k = floor(x + 1/2) in [0, D)   none
BSpline(t, x, k)  the B-splines of order k on knots t    wrt x only (the knots get none)
Contract(a, b)    an einsum of a and b as tensors        two contractions
================  =====================================  ======================================
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from .formula import (
    Add,
    Const,
    Div,
    Emitter,
    Extract,
    Formula,
    FormulaError,
    Log,
    Mul,
    Neg,
    Rsqrt,
    Square,
    Sub,
    Unary,
    VecSum,
    _broadcast_dim,
    _comp,
    reduce_to_dim,
)

__all__ = [
    "Acos",
    "Asin",
    "Atan",
    "Atan2",
    "BSpline",
    "Compare",
    "Contract",
    "Floor",
    "OneHot",
    "Round",
    "SinXDivX",
    "XLogX",
    "contract_spec",
]


# ---------------------------------------------------------------- elementwise functions


class Asin(Unary):
    op, cfun = "Asin", "lz_asin"
    __slots__ = ()
    tfun = staticmethod(torch.asin)

    def vjp(self, g):
        return [Mul(g, Rsqrt(Sub(Const(1.0), Square(self.children[0]))))]


class Acos(Unary):
    op, cfun = "Acos", "lz_acos"
    __slots__ = ()
    tfun = staticmethod(torch.acos)

    def vjp(self, g):
        return [Neg(Mul(g, Rsqrt(Sub(Const(1.0), Square(self.children[0])))))]


class Atan(Unary):
    op, cfun = "Atan", "lz_atan"
    __slots__ = ()
    tfun = staticmethod(torch.atan)

    def vjp(self, g):
        return [Div(g, Add(Const(1.0), Square(self.children[0])))]


class Atan2(Formula):
    """atan2(y, x), elementwise with broadcasting (the angle of the point (x, y))."""

    op = "Atan2"
    __slots__ = ()

    def __init__(self, y: Formula, x: Formula) -> None:
        super().__init__(_broadcast_dim("atan2", y, x), y, x)

    def rebuild(self, children):
        return Atan2(*children)

    def emit(self, em, args):
        return [em.temp_expr(f"lz_atan2({_comp(args[0], d)}, {_comp(args[1], d)})") for d in range(self.dim)]

    def evaluate_node(self, values):
        return torch.atan2(*torch.broadcast_tensors(*values))

    def vjp(self, g):
        y, x = self.children
        r2 = Add(Square(y), Square(x))
        return [reduce_to_dim(Div(Mul(g, x), r2), y.dim), reduce_to_dim(Neg(Div(Mul(g, y), r2)), x.dim)]


class XLogX(Unary):
    """x log x, 0 at x = 0 (KeOps' XLogX)."""

    op, cfun = "XLogX", "lz_xlogx"
    __slots__ = ()

    @staticmethod
    def tfun(x):
        safe = torch.where(x == 0, torch.ones_like(x), x)
        return torch.where(x == 0, torch.zeros_like(x), x * torch.log(safe))

    def vjp(self, g):
        return [Mul(g, Add(Log(self.children[0]), Const(1.0)))]


SINC_SERIES_BELOW = 0.5  # |x| below which SinXDivX sums its series (csrc/lazy/math.h lz_sinxdivx)
_SINC_TERMS = 10


class SinXDivX(Formula):
    """The n-th derivative of sin(x) / x (n = 0: the function, 1 at x = 0), finite everywhere: the gradient of
    order n is order n + 1, so every derivative is exact at 0 too (KeOps' formula, cos(x)/x - sin(x)/x^2, is
    NaN there). Computed in double (csrc/lazy/math.h lz_sinxdivx)."""

    op = "SinXDivX"
    __slots__ = ("n",)

    def __init__(self, x: Formula, n: int = 0) -> None:
        if n < 0:
            raise FormulaError(f"sinxdivx: the order of the derivative must be >= 0, got {n}")
        super().__init__(x.dim, x)
        self.n = int(n)

    def params(self):
        return str(self.n)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], int(params))

    def rebuild(self, children):
        return SinXDivX(children[0], self.n)

    def emit(self, em, args):
        return [em.temp_expr(f"lz_sinxdivx({a}, {self.n})") for a in args[0]]

    def evaluate_node(self, values):
        return sinxdivx_torch(values[0], self.n)

    def vjp(self, g):
        return [Mul(g, SinXDivX(self.children[0], self.n + 1))]


def sinxdivx_torch(x: torch.Tensor, n: int) -> torch.Tensor:
    """The n-th derivative of sin(x)/x with torch, by lz_sinxdivx's scheme (in float64, cast back)."""
    xd = x.double()
    small = xd.abs() < SINC_SERIES_BELOW
    xs = torch.where(small, xd, torch.zeros_like(xd))
    series = torch.zeros_like(xd)
    k0 = (n + 1) // 2
    for k in range(k0, k0 + _SINC_TERMS):
        p = 2 * k - n
        series = series + ((-1.0) ** k / ((2 * k + 1) * math.factorial(p))) * xs**p
    xl = torch.where(small, torch.ones_like(xd), xd)
    sn, cs = torch.sin(xl), torch.cos(xl)
    f = sn / xl
    for m in range(1, n + 1):
        dm = (sn, cs, -sn, -cs)[m % 4]
        f = (dm - m * f) / xl
    return torch.where(small, series, f).to(x.dtype)


class Floor(Unary):
    op, cfun = "Floor", "lz_floor"
    __slots__ = ()
    tfun = staticmethod(torch.floor)

    def vjp(self, g):
        return [None]


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's round (half away from zero; torch.round rounds half to even): exact, x - trunc(x) has no error."""
    t = torch.trunc(x)
    return torch.where((x - t).abs() >= 0.5, t + torch.sign(x), t)


class Round(Formula):
    """x rounded to ``d`` decimals, half away from zero (KeOps' Round): round(x 10^d) / 10^d."""

    op = "Round"
    __slots__ = ("d",)

    def __init__(self, x: Formula, d: int = 0) -> None:
        super().__init__(x.dim, x)
        self.d = int(d)

    def params(self):
        return str(self.d)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], int(params))

    def rebuild(self, children):
        return Round(children[0], self.d)

    def emit(self, em, args):
        if self.d == 0:
            return [em.temp_expr(f"lz_round({a})") for a in args[0]]
        s = em.literal(10.0**self.d)
        return [em.temp_expr(f"lz_round({a} * {s}) / {s}") for a in args[0]]

    def evaluate_node(self, values):
        x = values[0]
        if self.d == 0:
            return _round_half_away(x)
        s = 10.0**self.d
        return _round_half_away(x * s) / s

    def vjp(self, g):
        return [None]


# ---------------------------------------------------------------- comparisons


_COMPARISONS = {"lt": "<", "le": "<=", "eq": "==", "ne": "!="}


class Compare(Formula):
    """1.0 where ``a <rel> b`` holds, else 0.0, elementwise with broadcasting; rel in lt, le, eq, ne (a > b is
    Compare(b, a, "lt")). A comparison with NaN is false (so ``!=`` is 1). No gradient."""

    op = "Cmp"
    __slots__ = ("rel",)

    def __init__(self, a: Formula, b: Formula, rel: str) -> None:
        if rel not in _COMPARISONS:
            raise FormulaError(f"comparison must be one of {sorted(_COMPARISONS)}, got {rel!r}")
        super().__init__(_broadcast_dim(_COMPARISONS[rel], a, b), a, b)
        self.rel = rel

    def params(self):
        return self.rel

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], children[1], params)

    def rebuild(self, children):
        return Compare(children[0], children[1], self.rel)

    def emit(self, em, args):
        one, zero, sym = em.literal(1.0), em.literal(0.0), _COMPARISONS[self.rel]
        return [
            em.temp_expr(f"({_comp(args[0], d)} {sym} {_comp(args[1], d)}) ? {one} : {zero}") for d in range(self.dim)
        ]

    def evaluate_node(self, values):
        a, b = values
        fn = {"lt": torch.lt, "le": torch.le, "eq": torch.eq, "ne": torch.ne}[self.rel]
        return fn(a, b).to(torch.result_type(a, b))

    def vjp(self, g):
        return [None, None]


# ---------------------------------------------------------------- vectors


class OneHot(Formula):
    """The one-hot vector of dimension ``D`` of a scalar x: component k is 1 where floor(x + 1/2) = k (x rounded
    half up), else 0; all zeros when that is outside [0, D) (KeOps writes out of its array there). No gradient."""

    op = "OneHot"
    __slots__ = ()

    def __init__(self, x: Formula, dim: int) -> None:
        if x.dim != 1:
            raise FormulaError(f"one_hot needs a scalar formula, got one of dimension {x.dim}")
        if dim < 1:
            raise FormulaError(f"one_hot: the dimension must be >= 1, got {dim}")
        super().__init__(dim, x)

    def params(self):
        return str(self.dim)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], int(params))

    def rebuild(self, children):
        return OneHot(children[0], self.dim)

    def emit(self, em, args):
        k = em.temp_expr(f"lz_floor({args[0][0]} + {em.literal(0.5)})")
        one, zero = em.literal(1.0), em.literal(0.0)
        return [em.temp_expr(f"{k} == {em.literal(float(d))} ? {one} : {zero}") for d in range(self.dim)]

    def evaluate_node(self, values):
        x = values[0]
        k = torch.floor(x + 0.5)
        return (k == torch.arange(self.dim, device=x.device, dtype=x.dtype)).to(x.dtype)

    def vjp(self, g):
        return [None]


class BSpline(Formula):
    """The B-splines of order ``k`` on the knots t (a formula of dimension K >= k + 2), at a scalar x: a vector
    of dimension K - k - 1, by Cox-de Boor's recursion from the indicators t_i <= x < t_(i+1) (KeOps' BSpline;
    a ratio whose knots coincide counts 0). Its gradient reaches x (B'_(i,k) = k (B_(i,k-1) / (t_(i+k) - t_i) -
    B_(i+1,k-1) / (t_(i+k+1) - t_(i+1)))); the knots get none."""

    op = "BSpline"
    __slots__ = ("order",)

    def __init__(self, knots: Formula, x: Formula, order: int) -> None:
        if order < 0:
            raise FormulaError(f"bspline: the order must be >= 0, got {order}")
        if x.dim != 1:
            raise FormulaError(f"bspline: splines are sampled at a scalar, got a formula of dimension {x.dim}")
        if knots.dim < order + 2:
            raise FormulaError(f"bspline of order {order} needs at least {order + 2} knots, got {knots.dim}")
        super().__init__(knots.dim - order - 1, knots, x)
        self.order = int(order)

    def params(self):
        return str(self.order)

    @classmethod
    def from_params(cls, params, children):
        return cls(children[0], children[1], int(params))

    def rebuild(self, children):
        return BSpline(children[0], children[1], self.order)

    def emit(self, em, args):
        t, x = args[0], args[1][0]
        one, zero = em.literal(1.0), em.literal(0.0)
        b = [em.temp_expr(f"({t[i]} <= {x} && {x} < {t[i + 1]}) ? {one} : {zero}") for i in range(len(t) - 1)]

        def ratio(i: int, k: int) -> str:
            return em.temp_expr(f"({t[i]} < {t[i + k]}) ? ({x} - {t[i]}) / ({t[i + k]} - {t[i]}) : {zero}")

        for k in range(1, self.order + 1):
            w = [ratio(i, k) for i in range(len(b))]
            b = [em.temp_expr(f"{w[i]} * {b[i]} + ({one} - {w[i + 1]}) * {b[i + 1]}") for i in range(len(b) - 1)]
        return b

    def evaluate_node(self, values):
        t, x = values
        lead = torch.broadcast_shapes(t.shape[:-1], x.shape[:-1])
        t, x = t.expand(*lead, t.shape[-1]), x.expand(*lead, 1)
        b = ((t[..., :-1] <= x) & (x < t[..., 1:])).to(t.dtype)

        def ratio(k: int, n: int) -> torch.Tensor:
            lo, hi = t[..., :n], t[..., k : k + n]
            ok = lo < hi
            return torch.where(ok, (x - lo) / torch.where(ok, hi - lo, torch.ones_like(hi)), torch.zeros_like(lo))

        for k in range(1, self.order + 1):
            w = ratio(k, b.shape[-1])
            b = w[..., :-1] * b[..., :-1] + (1 - w[..., 1:]) * b[..., 1:]
        return b

    def vjp(self, g):
        knots, x = self.children
        k = self.order
        if k == 0:
            return [None, None]
        lower = BSpline(knots, x, k - 1)  # dimension n + 1, n = self.dim
        n = self.dim
        left = Mul(Extract(lower, 0, n), _SafeRecip(Sub(Extract(knots, k, n), Extract(knots, 0, n))))
        right = Mul(Extract(lower, 1, n), _SafeRecip(Sub(Extract(knots, k + 1, n), Extract(knots, 1, n))))
        return [None, VecSum(Mul(g, Mul(Const(float(k)), Sub(left, right))))]


class _SafeRecip(Unary):
    """1 / x, and 0 where x = 0 (B-spline derivatives over coinciding knots)."""

    op = "SafeRecip"
    __slots__ = ()

    def emit(self, em, args):
        one, zero = em.literal(1.0), em.literal(0.0)
        return [em.temp_expr(f"{a} == {zero} ? {zero} : {one} / {a}") for a in args[0]]

    @staticmethod
    def tfun(x):
        zero = x == 0
        return torch.where(zero, torch.zeros_like(x), 1 / torch.where(zero, torch.ones_like(x), x))

    def vjp(self, g):
        return [Neg(Mul(g, Square(self)))]


# ---------------------------------------------------------------- tensor contractions


_LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def contract_spec(spec: str, sizes: Sequence[int]) -> tuple[str, str, str, dict[str, int]]:
    """(labels of a, of b, of the output, size of each label) of an einsum ``spec`` ("ab,bc->ac") whose labels
    have ``sizes`` in order of first appearance; checked: no label twice in one operand, and every label in at
    least two of a, b and the output (so both gradients are contractions again)."""
    try:
        ins, out = spec.split("->")
        la, lb = ins.split(",")
    except ValueError:
        raise FormulaError(f"contraction: {spec!r} is not of the form 'ab,bc->ac'") from None
    order = list(dict.fromkeys(la + lb + out))
    if any(c not in _LABELS for c in order) or len(order) != len(sizes):
        raise FormulaError(f"contraction {spec!r}: {len(order)} labels (letters) need as many sizes, got {sizes}")
    for name, labels in (("a", la), ("b", lb), ("the output", out)):
        if len(set(labels)) != len(labels):
            raise FormulaError(f"contraction {spec!r}: a label repeats in {name}")
    for c in order:
        if (c in la) + (c in lb) + (c in out) < 2:
            raise FormulaError(f"contraction {spec!r}: label {c!r} appears in only one operand")
    size = dict(zip(order, (int(s) for s in sizes), strict=True))
    if any(s < 1 for s in size.values()):
        raise FormulaError(f"contraction {spec!r}: sizes must be >= 1, got {sizes}")
    return la, lb, out, size


def _numel(labels: str, size: dict[str, int]) -> int:
    return math.prod(size[c] for c in labels)


class Contract(Formula):
    """out = einsum(spec, a, b), the formulas a and b (and the output) read as row-major tensors whose axes are
    the labels of ``spec`` with the given sizes: tensordot, matrix-vector products, tensor and Kronecker
    products are all contractions. ``spec`` is like "ab,bc->ac" (see :func:`contract_spec`)."""

    op = "Contract"
    __slots__ = ("la", "lb", "lo", "size", "spec")

    def __init__(self, a: Formula, b: Formula, spec: str, sizes: Sequence[int]) -> None:
        la, lb, lo, size = contract_spec(spec, sizes)
        for name, f, labels in (("a", a, la), ("b", b, lb)):
            if f.dim != _numel(labels, size):
                raise FormulaError(
                    f"contraction {spec!r} with sizes {list(sizes)}: {name} must have dimension "
                    f"{_numel(labels, size)}, got {f.dim}: {f!r}"
                )
        super().__init__(_numel(lo, size), a, b)
        self.spec, self.la, self.lb, self.lo, self.size = spec, la, lb, lo, size

    def params(self):
        return f"{self.spec}:{','.join(str(s) for s in self.size.values())}"

    @classmethod
    def from_params(cls, params, children):
        spec, sizes = params.split(":")
        return cls(children[0], children[1], spec, [int(s) for s in sizes.split(",")])

    def rebuild(self, children):
        return Contract(children[0], children[1], self.spec, list(self.size.values()))

    def _flat(self, labels: str, index: dict[str, int]) -> int:
        k = 0
        for c in labels:
            k = k * self.size[c] + index[c]
        return k

    def terms(self) -> list[list[tuple[int, int]]]:
        """For each output component, the (component of a, component of b) pairs whose products it sums."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.dim)]
        labels = list(self.size)
        for values in itertools.product(*(range(self.size[c]) for c in labels)):
            index = dict(zip(labels, values, strict=True))
            out[self._flat(self.lo, index)].append((self._flat(self.la, index), self._flat(self.lb, index)))
        return out

    def emit(self, em: Emitter, args):
        a, b = args
        return [em.temp_expr(" + ".join(f"{a[i]} * {b[j]}" for i, j in pairs)) for pairs in self.terms()]

    def evaluate_node(self, values):
        a, b = values
        lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        ta = a.expand(*lead, a.shape[-1]).reshape(*lead, *(self.size[c] for c in self.la))
        tb = b.expand(*lead, b.shape[-1]).reshape(*lead, *(self.size[c] for c in self.lb))
        res = torch.einsum(f"...{self.la},...{self.lb}->...{self.lo}", ta, tb)
        return res.reshape(*lead, self.dim)

    def vjp(self, g):
        a, b = self.children

        def contract(x: Formula, y: Formula, lx: str, ly: str, lz: str) -> Formula:
            order = list(dict.fromkeys(lx + ly + lz))
            return Contract(x, y, f"{lx},{ly}->{lz}", [self.size[c] for c in order])

        return [contract(g, b, self.lo, self.lb, self.la), contract(a, g, self.la, self.lo, self.lb)]
