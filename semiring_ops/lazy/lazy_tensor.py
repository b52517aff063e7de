"""LazyTensor: KeOps' symbolic matrices, reduced by the semirings of the core.

    from semiring_ops.lazy import LazyTensor
    x_i = LazyTensor(x[:, None, :])        # (M, 1, D): an i-variable
    y_j = LazyTensor(y[None, :, :])        # (1, N, D): a j-variable
    K_ij = (-((x_i - y_j) ** 2).sum(-1) / 2).exp()   # (M, N) symbolic: nothing is computed yet
    a = K_ij @ b                           # (M, E): sum_j K_ij b_j, one kernel, memory linear in M + N

A LazyTensor has shape (*batch, M, N, D): M is the number of i, N of j (1 when the formula has no such
variable), D the formula's vector dimension. Operations build a formula; reductions over i (axis -3, or 0
without batch) or j (axis -2, or 1) compile it to a kernel (C++ on the CPU, CUDA on GPUs), cached on disk.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from . import formula as F
from .autograd import Extent, evaluate_dense, matmul_formula, reduce_formula
from .formula import Formula, FormulaError, Var, substitute, variables
from .reductions import Reduction, kbest, semiring_reduction, weighted_logsumexp

__all__ = ["LazyTensor", "Pm", "Vi", "Vj"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """torch's broadcasting of two shapes, or None when they do not broadcast."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


NUMBER_CACHE_SIZE = 1024  # distinct (value, dtype, device) number tensors kept by _number_tensor
_DEFAULT_DEVICE = torch.device("cpu")
_DEFAULT_DTYPE = torch.float32


def _number_tensor(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (1,) tensor holding the Python number ``value`` in ``dtype`` on ``device``, cached.

    Numbers become parameters (so a new value needs no new kernel), and ``torch.tensor`` on a GPU is a
    synchronous host-to-device copy: the last NUMBER_CACHE_SIZE tensors are kept, so repeating a constant
    copies nothing. The tensors are shared and only ever read (by kernels, as parameters). The key is the
    value's exact bits (float.hex: -0.0 and 0.0 differ, NaN matches NaN), so a float64 tensor is exact."""
    if torch.compiler.is_compiling():  # a graph makes its constants once, and cannot trace the cache
        return torch.tensor([value], dtype=dtype, device=device)
    return _cached_number(float(value).hex(), dtype, torch.device(device))


@functools.lru_cache(maxsize=NUMBER_CACHE_SIZE)
def _cached_number(value_hex: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # a normal tensor even when first asked for under inference_mode: an inference tensor could not be
    # saved for backward by a later reduction that records a graph
    with torch.inference_mode(False), torch.no_grad():
        return torch.tensor([float.fromhex(value_hex)], dtype=dtype, device=device)


class _Number(Var):
    """A parameter made from a Python number (``Pm(2.0)``) whose dtype and device are not decided yet: it
    holds a float32 CPU tensor, and the first operation with a formula that has a dtype and a device
    replaces it by a tensor of that dtype on that device (:meth:`LazyTensor._nary`)."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        super().__init__("p", 1, tensor=_number_tensor(value, _DEFAULT_DTYPE, _DEFAULT_DEVICE))
        self.value = float(value)


def _materialise(formula: Formula, dtype: torch.dtype, device: torch.device) -> Formula:
    """The formula with its deferred numbers (:class:`_Number`) made parameters of dtype on device."""

    def fix(v: Var) -> Formula:
        if isinstance(v, _Number):
            return Var("p", 1, tensor=_number_tensor(v.value, dtype, device))
        return v

    return substitute(formula, fix)


def _check_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _FLOATS:
        raise TypeError(
            f"{what}: LazyTensor variables must be float16, bfloat16, float32 or float64 tensors, got {t.dtype} "
            f"(shape {tuple(t.shape)})"
        )


def _torch_operators() -> dict[Any, tuple[str, bool]]:
    """torch's spellings of the arithmetic operators -> (the operator's dunder name, reflected)."""
    table: dict[Any, tuple[str, bool]] = {}
    for name, aliases in (
        ("add", ("add",)),
        ("sub", ("sub", "subtract")),
        ("mul", ("mul", "multiply")),
        ("truediv", ("div", "divide", "true_divide")),
        ("matmul", ("matmul",)),
        ("pow", ("pow",)),
    ):
        for alias in aliases:
            for owner in (torch, torch.Tensor):
                if hasattr(owner, alias):
                    table[getattr(owner, alias)] = (name, False)
        for dunder, reflected in ((f"__{name}__", False), (f"__r{name}__", True)):
            if hasattr(torch.Tensor, dunder):
                table[getattr(torch.Tensor, dunder)] = (name, reflected)
    if hasattr(torch.Tensor, "__rdiv__"):
        table[torch.Tensor.__rdiv__] = ("truediv", True)
    return table


_TORCH_OPERATORS = _torch_operators()


class LazyTensor:
    """A symbolic (*batch, M, N, D) tensor: a formula over i-variables, j-variables and parameters.

    ``LazyTensor(x)`` infers the variable kind from the shape as KeOps does: (..., M, 1, D) is an i-variable,
    (..., 1, N, D) a j-variable, (..., 1, 1, D), a tensor of shape (D,) or a 0-d tensor a parameter; a 2-D
    (n, D) tensor needs ``axis=0`` (i) or ``axis=1`` (j). Python numbers make constants.

    ``Pm(number)`` makes a *deferred* parameter: it takes the dtype and device of the first formula it is
    combined with (so ``Vi(x64) * Pm(0.5)`` is float64, on x64's device); a LazyTensor made of such
    numbers only is float32 on the CPU (``deferred`` is True until then).
    """

    __array_priority__ = 1000
    __slots__ = ("batch", "deferred", "device", "dtype", "formula", "n_i", "n_j")

    def __init__(self, x: Any, axis: int | None = None) -> None:
        if isinstance(x, LazyTensor):
            self._set(x.formula, x.batch, x.n_i, x.n_j, x.device, x.dtype, x.deferred)
            return
        if isinstance(x, (int, float)):
            self._set(F.Const(x), (), None, None, None, None)
            return
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"LazyTensor(x): x must be a tensor or a number, got {type(x).__name__}")
        _check_dtype(x, "LazyTensor(x)")
        shape = tuple(x.shape)
        if x.dim() <= 1:
            self._variable(x.reshape(max(1, x.numel())) if x.dim() == 0 else x, "p")
        elif x.dim() == 2:
            if axis not in (0, 1):
                raise ValueError(
                    f"LazyTensor(x) of shape {shape}: a 2-D tensor (n, D) needs axis=0 (i-variable) or axis=1 "
                    f"(j-variable); or pass x[:, None, :] / x[None, :, :]"
                )
            self._variable(x, "i" if axis == 0 else "j")
        else:
            m, n = shape[-3], shape[-2]
            if m != 1 and n != 1:
                raise ValueError(
                    f"LazyTensor(x) of shape {shape}: one of the dimensions -3 (i) and -2 (j) must be 1; a dense "
                    f"(M, N, D) array is not a variable (use x[:, None, :] for an i-variable, x[None, :, :] for j)"
                )
            if m == 1 and n == 1:
                self._variable(x.squeeze(-2).squeeze(-2), "p")
            elif n == 1:
                self._variable(x.squeeze(-2), "i")
            else:
                self._variable(x.squeeze(-3), "j")

    # ------------------------------------------------------------ construction

    def _set(self, formula, batch, n_i, n_j, device, dtype, deferred: bool = False) -> None:
        self.formula: Formula = formula
        self.batch: tuple[int, ...] = tuple(batch)
        self.n_i: int | None = n_i
        self.n_j: int | None = n_j
        self.device: torch.device | None = device
        self.dtype: torch.dtype | None = dtype
        # only deferred numbers (Pm(2.0)): device and dtype are the defaults (cpu, float32) and give way
        self.deferred: bool = deferred

    def _variable(self, data: torch.Tensor, cat: str) -> None:
        """data: (*batch, n, D) for i / j, (*batch, D) for parameters."""
        trailing = 1 if cat == "p" else 2
        if data.dim() < trailing:
            raise ValueError(f"a {cat}-variable needs at least {trailing} dimensions, got shape {tuple(data.shape)}")
        batch = tuple(data.shape[:-trailing])
        n = data.shape[-2] if cat != "p" else None
        self._set(
            Var(cat, data.shape[-1], tensor=data),
            batch,
            n if cat == "i" else None,
            n if cat == "j" else None,
            data.device,
            data.dtype,
        )

    @classmethod
    def _make(cls, formula, batch, n_i, n_j, device, dtype, deferred: bool = False) -> LazyTensor:
        out = cls.__new__(cls)
        out._set(formula, batch, n_i, n_j, device, dtype, deferred)
        return out

    @classmethod
    def _number(cls, value: float) -> LazyTensor:
        """A deferred number parameter (see the class docstring)."""
        return cls._make(_Number(value), (), None, None, _DEFAULT_DEVICE, _DEFAULT_DTYPE, True)

    # ------------------------------------------------------------ description

    @property
    def ndim(self) -> int:
        return len(self.batch) + 3

    @property
    def shape(self) -> tuple[int, ...]:
        """(*batch, M, N, D)."""
        return (*self.batch, self._extent().n_i, self._extent().n_j, self.formula.dim)

    def _extent(self) -> Extent:
        """Batch shape and the numbers of i and j (1 for a category without variables)."""
        return Extent(self.batch, 1 if self.n_i is None else self.n_i, 1 if self.n_j is None else self.n_j)

    def describe(self) -> str:
        kinds = sorted({v.cat for v in variables(self.formula)})
        names = {"i": "i-variables", "j": "j-variables", "p": "parameters"}
        what = ", ".join(names[k] for k in kinds) or "constants"
        return f"LazyTensor of shape {self.shape} (vector dimension {self.formula.dim}; {what})"

    def __repr__(self) -> str:
        return f"{self.describe()}: {self.formula!r}"

    # ------------------------------------------------------------ combining

    def _join(self, others: Sequence[LazyTensor], op: str) -> tuple:
        """The batch, n_i, n_j, device, dtype and deferred flag of an operation of self with others, checked.
        Deferred numbers take the device and dtype of the other operands; only deferred numbers: the defaults."""
        operands = (self, *others)
        fixed = [o for o in operands if not o.deferred and o.device is not None]
        ref = fixed[0] if fixed else self
        device, dtype = (ref.device, ref.dtype) if fixed else (None, None)
        for o in fixed[1:]:
            if o.device != device:
                raise ValueError(
                    f"{op}: operands on different devices ({device} and {o.device}): {ref.describe()} and "
                    f"{o.describe()}"
                )
            if o.dtype != dtype:
                raise TypeError(
                    f"{op}: operands of different dtypes ({dtype} and {o.dtype}): {ref.describe()} and "
                    f"{o.describe()}; convert one with .to()"
                )
        deferred = not fixed and any(o.deferred for o in operands)
        if deferred:
            device, dtype = _DEFAULT_DEVICE, _DEFAULT_DTYPE
        batch, n_i, n_j = self.batch, self.n_i, self.n_j
        for o in others:
            for name, a, b in (("i", n_i, o.n_i), ("j", n_j, o.n_j)):
                if a is not None and b is not None and a != b:
                    raise ValueError(
                        f"{op}: the operands have {a} and {b} {name}-indices: {self.describe()} and {o.describe()}"
                    )
            if o.batch != batch:
                joined = _broadcast(batch, o.batch)
                if joined is None:
                    raise ValueError(
                        f"{op}: batch shapes {batch} and {o.batch} do not broadcast: {self.describe()} and "
                        f"{o.describe()}"
                    )
                batch = joined
            n_i = n_i if n_i is not None else o.n_i
            n_j = n_j if n_j is not None else o.n_j
        return batch, n_i, n_j, device, dtype, deferred

    def _lift(self, other: Any) -> LazyTensor:
        if isinstance(other, LazyTensor):
            return other
        if isinstance(other, float) and self.device is not None and not float(other).is_integer():
            # a float becomes a parameter, so a new value needs no new kernel (deferred beside deferred numbers)
            if self.deferred:
                return self._number(other)
            return LazyTensor(_number_tensor(other, self.dtype, self.device))
        if isinstance(other, (int, float)):
            return LazyTensor(other)
        if isinstance(other, torch.Tensor):
            return LazyTensor(other)
        raise TypeError(f"cannot combine a LazyTensor with {type(other).__name__}")

    def _unary(self, node: type, *args: Any) -> LazyTensor:
        formula = node(self.formula, *args)
        return self._make(formula, self.batch, self.n_i, self.n_j, self.device, self.dtype, self.deferred)

    def _nary(self, op: str, build, *others: Any) -> LazyTensor:
        lifted = [self._lift(o) for o in others]
        meta = self._join(lifted, op)
        try:
            formula = build(self.formula, *[o.formula for o in lifted])
        except FormulaError as exc:
            operands = " and ".join(x.describe() for x in (self, *lifted))
            raise ValueError(f"{op}: {operands} cannot be combined: {exc}") from None
        *_, device, dtype, deferred = meta
        if not deferred and device is not None and any(o.deferred for o in (self, *lifted)):
            formula = _materialise(formula, dtype, device)
        return self._make(formula, *meta)

    def _binary(self, node: type, other: Any, op: str, reflected: bool = False) -> LazyTensor:
        if reflected:
            return self._lift(other)._nary(op, node, self)
        return self._nary(op, node, other)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """A torch operator with a LazyTensor operand: ``tensor * lazy`` in eager (Tensor.__mul__ asks here),
        and under torch.compile also ``lazy @ tensor`` (Dynamo hands an operator with a tensor operand to
        torch, as Tensor.matmul(lazy, tensor)). Only the arithmetic operators; torch functions such as
        torch.exp(lazy) do not take LazyTensors."""
        op = _TORCH_OPERATORS.get(func)
        if op is None or kwargs or len(args) != 2:
            return NotImplemented
        name, reflected = op
        x, y = (args[1], args[0]) if reflected else (args[0], args[1])  # the operation is x <name> y
        if name == "matmul" and not isinstance(x, LazyTensor) and torch.compiler.is_compiling():
            x, y = y, x  # Dynamo swaps the operands of `lazy @ tensor` (matmul has no reflected torch function)
        if isinstance(x, LazyTensor):
            return getattr(x, f"__{name}__")(y)
        method = getattr(y, f"__r{name}__", None)
        return NotImplemented if method is None else method(x)

    def __add__(self, o):
        return self._binary(F.Add, o, "+")

    def __radd__(self, o):
        return self._binary(F.Add, o, "+", True)

    def __sub__(self, o):
        return self._binary(F.Sub, o, "-")

    def __rsub__(self, o):
        return self._binary(F.Sub, o, "-", True)

    def __mul__(self, o):
        return self._binary(F.Mul, o, "*")

    def __rmul__(self, o):
        return self._binary(F.Mul, o, "*", True)

    def __truediv__(self, o):
        return self._binary(F.Div, o, "/")

    def __rtruediv__(self, o):
        return self._binary(F.Div, o, "/", True)

    def __neg__(self):
        return self._unary(F.Neg)

    def __abs__(self):
        return self.abs()

    def __pow__(self, p):
        if isinstance(p, bool) or not isinstance(p, (int, float, LazyTensor, torch.Tensor)):
            raise TypeError(f"**: the exponent must be a number or a LazyTensor, got {type(p).__name__}")
        if isinstance(p, (int, float)) and float(p).is_integer():
            return self.square() if p == 2 else self._unary(F.IntPow, int(p))
        if isinstance(p, float) and p == 0.5:
            return self.sqrt()
        if isinstance(p, float) and p == -0.5:
            return self.rsqrt()
        if isinstance(p, float):
            return self._nary("**", F.Pow, LazyTensor(p))
        return self._nary("**", F.Pow, p)

    def __or__(self, o):  # KeOps' dot product over the vector dimension
        return self._binary(lambda a, b: F.VecSum(F.Mul(a, b)), o, "|")

    def __ror__(self, o):
        return self._binary(lambda a, b: F.VecSum(F.Mul(a, b)), o, "|", True)

    # ------------------------------------------------------------ elementwise functions

    def exp(self):
        return self._unary(F.Exp)

    def log(self):
        return self._unary(F.Log)

    def sqrt(self):
        return self._unary(F.Sqrt)

    def rsqrt(self):
        return self._unary(F.Rsqrt)

    def abs(self):
        return self._unary(F.Abs)

    def sign(self):
        return self._unary(F.Sign)

    def relu(self):
        return self._unary(F.Relu)

    def step(self):
        return self._unary(F.Step)

    def sin(self):
        return self._unary(F.Sin)

    def cos(self):
        return self._unary(F.Cos)

    def square(self):
        return self._unary(F.Square)

    def clamp(self, lo: Any, hi: Any) -> LazyTensor:
        """min(max(self, lo), hi); the bounds are numbers or LazyTensors."""
        lo = LazyTensor(float(lo)) if isinstance(lo, (int, float)) else lo
        hi = LazyTensor(float(hi)) if isinstance(hi, (int, float)) else hi
        return self._nary("clamp", F.Clamp, lo, hi)

    def ifelse(self, a: Any, b: Any) -> LazyTensor:
        """a where self >= 0, else b."""
        return self._nary("ifelse", F.IfElse, a, b)

    # ------------------------------------------------------------ the vector dimension

    def sqnorm2(self):
        return self._unary(lambda x: F.VecSum(F.Square(x)))

    def norm2(self):
        return self.sqnorm2().sqrt()

    def normalize(self):
        return self / self.norm2()

    def sqdist(self, other: Any) -> LazyTensor:
        return (self - other).sqnorm2()

    def concat(self, other: Any) -> LazyTensor:
        return self._nary("concat", F.Concat, other)

    def elem(self, m: int) -> LazyTensor:
        return self.extract(m, 1)

    def extract(self, m: int, d: int) -> LazyTensor:
        try:
            return self._unary(F.Extract, m, d)
        except FormulaError as exc:
            raise ValueError(f"extract({m}, {d}) of {self.describe()}: {exc}") from None

    @property
    def T(self) -> LazyTensor:
        """The transpose: i-variables become j-variables and the other way round."""
        swap = {"i": "j", "j": "i"}
        formula = substitute(self.formula, lambda v: v if v.cat == "p" else Var(swap[v.cat], v.dim, tensor=v.tensor))
        return self._make(formula, self.batch, self.n_j, self.n_i, self.device, self.dtype, self.deferred)

    # ------------------------------------------------------------ reductions

    def _axis(self, dim: int | None, axis: int | None, what: str) -> str:
        """ "i", "j" (the category reduced over) or "vector"."""
        if dim is not None and axis is not None and dim != axis:
            raise ValueError(f"{what}: dim={dim} and axis={axis} disagree; give one of them")
        d = axis if dim is None else dim
        if d is None:
            raise ValueError(f"{what}: give the axis to reduce over (dim=0 / -3 for i, 1 / -2 for j)")
        nb = len(self.batch)
        if d in (nb, -3):
            return "i"
        if d in (nb + 1, -2):
            return "j"
        if d in (nb + 2, -1):
            return "vector"
        raise ValueError(
            f"{what}: axis {d} is not a reduction axis of a {self.describe()}: use {nb} or -3 (over i), "
            f"{nb + 1} or -2 (over j), {nb + 2} or -1 (the vector dimension)"
        )

    def _reduce(self, reduction: Reduction, over: str, what: str, with_arg: bool = False):
        if over == "vector":
            raise ValueError(f"{what} over the vector dimension is not available; reduce over i or j")
        if self.device is None:
            raise ValueError(f"{what}: a formula of constants only has nothing to reduce over")
        outer = "j" if over == "i" else "i"
        extent = self._extent()
        n_inner = extent.rows(over)
        # max / min over an empty axis give the semiring zero (-inf / +inf) and index 0, as sum (0) and
        # logsumexp (-inf) give theirs; K best of nothing have no value at all
        if reduction.kind == "kbest" and not 1 <= reduction.k <= n_inner:
            empty = "; the reduced axis is empty" if n_inner == 0 else ""
            raise ValueError(
                f"{what}: K={reduction.k} must be between 1 and the reduced size {n_inner} (over {over}){empty}"
            )
        vals, idx = reduce_formula(self.formula, reduction, outer, extent, with_arg)
        if reduction.kind == "kbest":
            d = self.formula.dim
            shape = (*vals.shape[:-1], reduction.k) + ((d,) if d > 1 else ())
            vals, idx = vals.reshape(shape), idx.reshape(shape)
        return vals, idx

    def sum(self, dim: int | None = None, axis: int | None = None) -> Any:
        """Sum over i or j: (*batch, rows, D); over the vector dimension (-1): a LazyTensor."""
        over = self._axis(dim, axis, "sum")
        if over == "vector":
            return self._unary(F.VecSum)
        return self._reduce(semiring_reduction("std"), over, "sum")[0]

    sum_reduction = sum

    def logsumexp(self, dim: int | None = None, axis: int | None = None, weight: Any = None) -> Any:
        """log sum exp over i or j, per component; with ``weight`` (a LazyTensor w of dimension E, the formula
        scalar): log sum_j exp(F_ij) w_ij, of dimension E. Over the vector dimension: a LazyTensor."""
        over = self._axis(dim, axis, "logsumexp")
        if over == "vector":
            if weight is not None:
                raise ValueError("logsumexp over the vector dimension takes no weight; reduce over i or j")
            return self._unary(F.VecLogSumExp)
        if weight is None:
            return self._reduce(semiring_reduction("log"), over, "logsumexp")[0]
        if self.formula.dim != 1:
            raise ValueError(f"logsumexp with a weight needs a scalar formula, got {self.describe()}")
        joined = self._nary("logsumexp(weight=)", F.Concat, weight)
        return joined._reduce(weighted_logsumexp(), over, "logsumexp")[0]

    logsumexp_reduction = logsumexp

    def _extremum(self, dim, axis, largest: bool, values: bool, indices: bool, what: str):
        over = self._axis(dim, axis, what)
        if over == "vector":
            if indices:
                raise ValueError(f"{what} over the vector dimension is not available")
            return self._unary(F.VecMax) if largest else -(-self)._unary(F.VecMax)
        vals, idx = self._reduce(semiring_reduction("max" if largest else "min"), over, what, True)
        if values and indices:
            return vals, idx
        return vals if values else idx

    def max(self, dim=None, axis=None):
        """The largest term per component over i or j (min, argmax, ... alike). Over an empty axis the
        values are the semiring zero (-inf for max, +inf for min) and the indices 0, on every backend."""
        return self._extremum(dim, axis, True, True, False, "max")

    def min(self, dim=None, axis=None):
        return self._extremum(dim, axis, False, True, False, "min")

    def argmax(self, dim=None, axis=None):
        return self._extremum(dim, axis, True, False, True, "argmax")

    def argmin(self, dim=None, axis=None):
        return self._extremum(dim, axis, False, False, True, "argmin")

    def max_argmax(self, dim=None, axis=None):
        return self._extremum(dim, axis, True, True, True, "max_argmax")

    def min_argmin(self, dim=None, axis=None):
        return self._extremum(dim, axis, False, True, True, "min_argmin")

    def _kbest(self, K: int, dim, axis, largest: bool, what: str):
        if isinstance(K, bool) or not isinstance(K, int):
            raise TypeError(f"{what}: K must be an int, got {type(K).__name__}")
        over = self._axis(dim, axis, what)
        return self._reduce(kbest(K, largest), over, what)

    def Kmin(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, False, "Kmin")[0]

    def argKmin(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, False, "argKmin")[1]

    def Kmin_argKmin(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, False, "Kmin_argKmin")

    def Kmax(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, True, "Kmax")[0]

    def argKmax(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, True, "argKmax")[1]

    def Kmax_argKmax(self, K: int, dim=None, axis=None):
        return self._kbest(K, dim, axis, True, "Kmax_argKmax")

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        """sum_j K_ij v_j for a scalar formula K and v of shape (..., N, E): (..., M, E)."""
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"@: the right operand must be a tensor (..., N, E), got {type(v).__name__}")
        if self.formula.dim != 1:
            raise ValueError(f"@ needs a scalar formula (vector dimension 1), got {self.describe()}")
        if v.dim() < 2:
            raise ValueError(f"@: the right operand must have shape (..., N, E), got {tuple(v.shape)}")
        extent = self._extent()  # an axis without variables counts 1, as v_j's would then broadcast against
        if (
            v.dim() == 2
            and not self.batch
            and extent.n_j == v.shape[0]
            and not self.deferred
            and v.dtype == self.dtype
            and v.device == self.device
        ):  # the common case, without building K * v_j each call
            return matmul_formula(self.formula, v, extent)
        return (self * Vj(v)).sum(dim=-2)

    # ------------------------------------------------------------ dense

    def dense(self) -> torch.Tensor:
        """The formula evaluated at every (i, j) with torch: a (*batch, M, N, D) tensor (for small sizes)."""
        if self.device is None:
            raise ValueError("dense(): a formula of constants only")
        like = torch.empty(0, dtype=self.dtype, device=self.device)
        return evaluate_dense(self.formula, self._extent(), like)

    @property
    def variables(self) -> list[torch.Tensor]:
        return [v.tensor for v in variables(self.formula)]


def _as_tensor(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(x).__name__}")
    _check_dtype(x, what)
    return x


def Vi(x: torch.Tensor) -> LazyTensor:
    """An i-variable from x of shape (..., M, D) (M = 1: a parameter, as LazyTensor(x[..., None, :]) is)."""
    return _indexed(x, "i")


def Vj(x: torch.Tensor) -> LazyTensor:
    """A j-variable from x of shape (..., N, D) (N = 1: a parameter, as LazyTensor(x[..., None, :, :]) is)."""
    return _indexed(x, "j")


def _indexed(x: torch.Tensor, cat: str) -> LazyTensor:
    """Vi / Vj: x itself is the variable's tensor (no view of it), so Vi(x) twice is one kernel argument."""
    what = f"V{cat}(x)"
    x = _as_tensor(x, what)
    if x.dim() < 2:
        raise ValueError(f"{what}: x must have shape (..., {'M' if cat == 'i' else 'N'}, D), got {tuple(x.shape)}")
    if x.shape[-2] == 1:
        return LazyTensor(x.unsqueeze(-2 if cat == "i" else -3))
    out = LazyTensor.__new__(LazyTensor)
    out._variable(x, cat)
    return out


def Pm(x: Any) -> LazyTensor:
    """A parameter from a number, a 0-d tensor or a vector of shape (D,). A number takes the dtype and device
    of the formula it is combined with (float32 on the CPU while it has none)."""
    if isinstance(x, (int, float)):
        return LazyTensor._number(x)
    x = _as_tensor(x, "Pm(x)")
    if x.dim() > 1:
        raise ValueError(f"Pm(x): x must be a number or have shape (D,), got {tuple(x.shape)}")
    return LazyTensor(x)
