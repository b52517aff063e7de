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
import math
import operator
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import torch

from ..hooks import Hook
from . import formula as F
from . import formula_math as FM
from .autograd import Extent, evaluate_dense, matmul_formula, reduce_formula
from .block_sparse import oriented_ranges
from .formula import Formula, FormulaError, Var, substitute, variables
from .multi_device import reduce_on_devices
from .multi_device import resolve as resolve_devices
from .options import DEFAULT as _DEFAULT_OPTIONS
from .options import ReduceOptions, auto_gpu, parse_options
from .reductions import Reduction, kbest, semiring_reduction, weighted_logsumexp
from .solve import LinearSystem, solve_system
from .symbolic import deferrable, is_placeholder, symbolic_var, symbolic_variables

# A formula's values into a host tensor, block by block (blocks/api.py installs it): (K, out, devices, max_device_bytes,
# progress) -> out, devices None meaning the formula's GPU or the CPU workers.
blocks_dense = Hook("LazyTensor.dense(out=..., devices=...)", "semiring_ops.blocks")

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
        super().__init__("p", 1, tensor=_number_tensor(F.as_number(value), _DEFAULT_DTYPE, _DEFAULT_DEVICE))
        self.value = F.as_number(value)


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


class _ComplexHooks:
    """What complex.py registers here (it imports this module; this one does not import it): its class, the
    test for a complex operand, the real-with-complex operation, and real2complex / imag2complex / exp1j."""

    cls: ClassVar[Any] = None
    is_operand: ClassVar[Any] = staticmethod(lambda x: False)
    binary: ClassVar[Any] = None
    methods: ClassVar[dict[str, Any]] = {}


def register_complex(cls: type, is_operand, binary, methods: dict[str, Any]) -> None:
    _ComplexHooks.cls, _ComplexHooks.binary, _ComplexHooks.methods = cls, binary, methods
    _ComplexHooks.is_operand = staticmethod(is_operand)


def _is_complex(x: Any) -> bool:
    return isinstance(x, complex) or (isinstance(x, torch.Tensor) and x.is_complex())


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
    __slots__ = ("batch", "deferred", "device", "dtype", "formula", "n_i", "n_j", "ranges", "symbolic")
    is_complex = False

    def __new__(cls, x: Any = None, axis: int | None = None):
        if _is_complex(x):  # a complex tensor or number: KeOps' ComplexLazyTensor (complex.py)
            return _ComplexHooks.cls(x, axis)
        return super().__new__(cls)

    def __init__(self, x: Any, axis: int | None = None) -> None:
        if isinstance(x, LazyTensor):
            self._set(x.formula, x.batch, x.n_i, x.n_j, x.device, x.dtype, x.deferred, x.symbolic)
            return
        if isinstance(x, tuple):  # KeOps' symbolic variable (index, dim, cat): its tensor is given at the call
            if axis is not None:
                raise ValueError(f"LazyTensor({x!r}): a symbolic variable (index, dim, cat) takes no axis")
            if len(x) != 3:
                raise ValueError(f"LazyTensor(x): a tuple x is a symbolic variable (index, dim, cat), got {x!r}")
            self._set(symbolic_var(*x, what=f"LazyTensor({x!r})"), (), None, None, None, None, symbolic=True)
            return
        if isinstance(x, (int, float)):
            self._set(F.Const(x), (), None, None, None, None)
            return
        if isinstance(x, list):  # numbers: a parameter vector in the formula's dtype (KeOps' lists)
            if not x or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x):
                raise TypeError(f"LazyTensor(x): a list makes a parameter vector of numbers, got {x!r:.200}")
            vec = LazyTensor.concatenate([Pm(float(v)) for v in x]) if len(x) > 1 else Pm(float(x[0]))
            self._set(vec.formula, (), None, None, vec.device, vec.dtype, vec.deferred)
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

    def _set(self, formula, batch, n_i, n_j, device, dtype, deferred: bool = False, symbolic: bool = False) -> None:
        self.formula: Formula = formula
        self.batch: tuple[int, ...] = tuple(batch)
        self.n_i: int | None = n_i
        self.n_j: int | None = n_j
        self.device: torch.device | None = device
        self.dtype: torch.dtype | None = dtype
        # only deferred numbers (Pm(2.0)): device and dtype are the defaults (cpu, float32) and give way
        self.deferred: bool = deferred
        # it holds a symbolic variable (Vi(0, 3)): its reductions are callables (symbolic.py)
        self.symbolic: bool = symbolic
        # KeOps' block-sparsity pattern, set by the user (``K.ranges = ranges_ij``) and used by this LazyTensor's
        # reductions without a ranges= of their own; operations carry it over (KeOps' rule: the operand's that is
        # set, two different ones refused), the transpose swaps it
        self.ranges: tuple | None = None

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
    def _make(
        cls, formula, batch, n_i, n_j, device, dtype, deferred: bool = False, symbolic: bool = False
    ) -> LazyTensor:
        out = cls.__new__(cls)
        out._set(formula, batch, n_i, n_j, device, dtype, deferred, symbolic)
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

    @property
    def _shape(self) -> tuple[int, ...]:
        """(*batch, M, N, D): KeOps' internal shape (its ``shape`` drops D = 1; here ``shape`` is this too)."""
        return self.shape

    @property
    def symbolic_variables(self) -> tuple[tuple[int, int, int], ...]:
        """KeOps' (index, dim, cat) of the symbolic variables (``Vi(0, 3)`` is (0, 3, 0)), by index."""
        return symbolic_variables(self.formula) if self.symbolic else ()

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
        if isinstance(other, (int, float)):
            # a number is a Const: an entry of the kernel's number vector (formula.canonicalize), so a new
            # value needs no new kernel; exact (a Python float) until the call makes it a compute-dtype tensor
            return LazyTensor(other)
        if isinstance(other, torch.Tensor):
            return LazyTensor(other)
        raise TypeError(f"cannot combine a LazyTensor with {type(other).__name__}")

    def _unary(self, node: type, *args: Any) -> LazyTensor:
        formula = node(self.formula, *args)
        out = self._make(formula, self.batch, self.n_i, self.n_j, self.device, self.dtype, self.deferred, self.symbolic)
        out.ranges = self.ranges
        return out

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
        out = self._make(formula, *meta, self.symbolic or any(o.symbolic for o in lifted))
        out.ranges = _joined_ranges((self, *lifted), op)
        return out

    def _binary(self, node: type, other: Any, op: str, reflected: bool = False) -> LazyTensor:
        if _ComplexHooks.is_operand(other):  # a complex number, tensor or LazyTensor: a complex result
            return _ComplexHooks.binary(self, other, op, reflected)
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
        if isinstance(p, (int, float)) and abs(p) <= F.IntPow.MAX and float(p).is_integer():
            return self.square() if p == 2 else self._unary(F.IntPow, int(p))
        if isinstance(p, float) and p == 0.5:
            return self.sqrt()
        if isinstance(p, float) and p == -0.5:
            return self.rsqrt()
        if isinstance(p, (int, float)):  # any other number (a huge int too): the library pow
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
        lo = LazyTensor(lo) if isinstance(lo, (int, float)) else lo
        hi = LazyTensor(hi) if isinstance(hi, (int, float)) else hi
        return self._nary("clamp", F.Clamp, lo, hi)

    def ifelse(self, a: Any, b: Any) -> LazyTensor:
        """a where self >= 0, else b."""
        return self._nary("ifelse", F.IfElse, a, b)

    # ------------------------------------------------------------ the vector dimension

    def real2complex(self):
        """This real LazyTensor as a complex one, self + 0i (a ComplexLazyTensor)."""
        return _ComplexHooks.methods["real2complex"](self)

    def imag2complex(self):
        """0 + i self (a ComplexLazyTensor)."""
        return _ComplexHooks.methods["imag2complex"](self)

    def exp1j(self):
        """exp(i self) = cos(self) + i sin(self) (a ComplexLazyTensor)."""
        return _ComplexHooks.methods["exp1j"](self)

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
        out = self._make(formula, self.batch, self.n_j, self.n_i, self.device, self.dtype, self.deferred, self.symbolic)
        if self.ranges is not None:
            out.ranges = (*self.ranges[3:6], *self.ranges[0:3])
        return out

    # ------------------------------------------------------------ more of KeOps' API

    def power(self, p: Any) -> LazyTensor:
        """``self ** p``."""
        return self**p

    def floor(self) -> LazyTensor:
        return self._unary(FM.Floor)

    def round(self, d: int = 0) -> LazyTensor:
        """Rounded to ``d`` decimals, half away from zero (C's round, as KeOps; torch.round rounds half to even).
        No gradient."""
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"round(d): d must be an int, got {d!r}")
        return self._unary(FM.Round, d)

    __round__ = round

    def mod(self, modulus: Any, offset: Any = 0) -> LazyTensor:
        """``self - modulus * floor((self - offset) / modulus)``, in [offset, offset + modulus) (KeOps' Mod);
        its gradient is that of this formula."""
        return self - modulus * ((self - offset) / modulus).floor()

    def xlogx(self) -> LazyTensor:
        """x log x, 0 at x = 0."""
        return self._unary(FM.XLogX)

    def sinxdivx(self) -> LazyTensor:
        """sin(x) / x, 1 at x = 0; its derivatives are exact at 0 too."""
        return self._unary(FM.SinXDivX)

    def sinc(self) -> LazyTensor:
        """sin(pi x) / (pi x), 1 at x = 0 (torch.sinc)."""
        return (math.pi * self).sinxdivx()

    def asin(self) -> LazyTensor:
        return self._unary(FM.Asin)

    def acos(self) -> LazyTensor:
        return self._unary(FM.Acos)

    def atan(self) -> LazyTensor:
        return self._unary(FM.Atan)

    def atan2(self, x: Any) -> LazyTensor:
        """atan2(self, x): the angle of the point (x, self), as torch.atan2(self, x)."""
        return self._nary("atan2", FM.Atan2, x)

    # comparisons: 1.0 where true, else 0.0 (no gradient); a LazyTensor stays hashable by identity
    def _compare(self, other: Any, rel: str, op: str, swap: bool = False) -> LazyTensor:
        if swap:
            return self._lift(other)._nary(op, lambda a, b: FM.Compare(a, b, rel), self)
        return self._nary(op, lambda a, b: FM.Compare(a, b, rel), other)

    def __eq__(self, other):  # type: ignore[override]
        return self._compare(other, "eq", "==")

    def __ne__(self, other):  # type: ignore[override]
        return self._compare(other, "ne", "!=")

    def __lt__(self, other):
        return self._compare(other, "lt", "<")

    def __le__(self, other):
        return self._compare(other, "le", "<=")

    def __gt__(self, other):
        return self._compare(other, "lt", ">", swap=True)

    def __ge__(self, other):
        return self._compare(other, "le", ">=", swap=True)

    __hash__ = object.__hash__

    def norm(self, dim: int) -> LazyTensor:
        """The Euclidean norm over the vector dimension (``dim`` = -1, the only one), as norm2()."""
        if dim not in (-1, self.ndim - 1):
            raise ValueError(f"norm(dim={dim}): only the vector dimension (-1) of a {self.describe()}")
        return self.norm2()

    def weightedsqnorm(self, s: Any) -> LazyTensor:
        """sum_d s x_d^2 (s of dimension 1), sum_d s_d x_d^2 (dimension D) or sum_de s_de x_d x_e (D^2, s a
        row-major matrix), x = self of dimension D."""
        s = self._lift(s)
        d = self.formula.dim
        if s.formula.dim == 1:
            return s * self.sqnorm2()
        if s.formula.dim == d:
            return (s * self.square()).sum(-1)
        if s.formula.dim == d * d:
            return (s * self.tensorprod(self)).sum(-1)
        raise ValueError(
            f"weightedsqnorm: weights of dimension 1, {d} or {d * d} for a {self.describe()}, got {s.describe()}"
        )

    def weightedsqdist(self, y: Any, s: Any) -> LazyTensor:
        """``(self - y).weightedsqnorm(s)``."""
        return (self - y).weightedsqnorm(s)

    def one_hot(self, D: int) -> LazyTensor:
        """The one-hot vector of dimension D of a scalar formula: 1 at floor(x + 1/2), all 0 outside [0, D)."""
        if isinstance(D, bool) or not isinstance(D, int):
            raise TypeError(f"one_hot(D): D must be an int, got {D!r}")
        try:
            return self._unary(FM.OneHot, D)
        except FormulaError as exc:
            raise ValueError(f"one_hot({D}) of {self.describe()}: {exc}") from None

    def bspline(self, x: Any, k: int = 0) -> LazyTensor:
        """The B-splines of order k on the knots ``self`` (dimension K) at the scalar x: dimension K - k - 1
        (KeOps' BSpline). Differentiable with respect to x, not to the knots: knots that require a gradient
        while gradients are recorded are refused (detach them)."""
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"bspline: the order k must be an int, got {k!r}")
        if torch.is_grad_enabled() and any(v.tensor.requires_grad for v in variables(self.formula)):
            raise ValueError(f"bspline: no gradient with respect to the knots ({self.describe()}); detach them")
        return self._nary("bspline", lambda t, xx: FM.BSpline(t, xx, k), x)

    def softdtw_sqdist(self, y: Any, gamma: Any) -> LazyTensor:
        """The soft-DTW discrepancy between the vectors self (dimension n) and y (dimension m), on the squared
        differences of their components, with smoothing gamma (a scalar): KeOps' SoftDTW_SqDist. Built from
        the n m cells of the recursion (a formula unrolled into the kernel, so n m is limited to
        SOFTDTW_MAX_CELLS); differentiable with respect to all three, twice."""
        return self._nary("softdtw_sqdist", _softdtw_formula, y, gamma)

    @staticmethod
    def concatenate(lazies: Sequence[LazyTensor], axis: int = -1) -> LazyTensor:
        """The LazyTensors joined along the vector dimension (the only axis: -1)."""
        if not isinstance(lazies, (tuple, list)) or not lazies:
            raise ValueError("concatenate: give a non-empty tuple of LazyTensors")
        if axis not in (-1, lazies[0].ndim - 1):
            raise ValueError(f"concatenate: LazyTensors join along their vector dimension (-1) only, got {axis}")
        return functools.reduce(LazyTensor.concat, lazies)

    @staticmethod
    def cat(lazies: Sequence[LazyTensor], dim: int) -> LazyTensor:
        return LazyTensor.concatenate(lazies, dim)

    def __getitem__(self, key: Any) -> LazyTensor:
        """Components of the vector dimension: ``x[k]`` (elem; k < 0 counts from the end), ``x[a:b]`` (extract),
        also written ``x[:, :, k]`` or ``x[..., k]`` with all other axes whole."""
        if isinstance(key, tuple):
            whole = (slice(None),) * (self.ndim - 1)
            if key[:1] == (Ellipsis,):
                key = (*whole[: self.ndim - len(key) + 1], *key[1:])
            if len(key) != self.ndim or key[:-1] != whole:
                raise ValueError(f"a LazyTensor is indexed along its vector dimension only, got {key!r}")
            key = key[-1]
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError(f"a LazyTensor's components are sliced with step 1, got {key!r}")
            start, stop, _ = key.indices(self.formula.dim)
            return self.extract(start, stop - start)
        if isinstance(key, int) and not isinstance(key, bool):
            return self.elem(key + self.formula.dim if -self.formula.dim <= key < 0 else key)
        raise TypeError(f"a LazyTensor is indexed by an int or a slice of its vector dimension, got {key!r}")

    def _contract(self, other: Any, op: str, spec_of) -> LazyTensor:
        def build(a: Formula, b: Formula) -> Formula:
            spec, sizes = spec_of(a.dim, b.dim)
            return FM.Contract(a, b, spec, sizes)

        return self._nary(op, build, other)

    def matvecmult(self, v: Any) -> LazyTensor:
        """A @ v for A = self of dimension n p (a row-major n x p matrix) and v of dimension p: dimension n."""
        return self._contract(v, "matvecmult", lambda da, db: ("ij,j->i", [_quotient(da, db, "matvecmult"), db]))

    def vecmatmult(self, A: Any) -> LazyTensor:
        """v @ A for v = self of dimension n and A of dimension n p (row-major n x p): dimension p."""
        return self._contract(A, "vecmatmult", lambda da, db: ("i,ij->j", [da, _quotient(db, da, "vecmatmult")]))

    def difference_matrix(self, other: Any) -> LazyTensor:
        """The differences of every component of self with every component of other, self's index major:
        component k D2 + l is self_k - other_l (dimension D1 D2). KeOps 2.3 declares it, but its engine has no
        such operation."""
        other = self._lift(other)
        return LazyTensor.concatenate([self.elem(k) - other for k in range(self.formula.dim)])

    def tensorprod(self, other: Any) -> LazyTensor:
        """The outer product of the vectors, row-major: dimension D1 D2."""
        return self._contract(other, "tensorprod", lambda da, db: ("i,j->ij", [da, db]))

    def keops_tensordot(self, other: Any, dimfa, dimfb, contfa, contfb, *args) -> LazyTensor:
        """torch.tensordot of self and other read as row-major tensors of shapes dimfa and dimfb, contracting
        the axes contfa of the first with contfb of the second; the optional permutation sends the result's
        axis p (the first's free axes, then the second's) to position perm[p]. Flattened row-major."""
        spec, sizes = _tensordot_spec(dimfa, dimfb, contfa, contfb, args[0] if args else None)
        return self._nary("keops_tensordot", lambda a, b: FM.Contract(a, b, spec, sizes), other)

    def keops_kron(self, other: Any, dimfself, dimfother) -> LazyTensor:
        """The Kronecker product (np.kron) of self and other read as row-major tensors of shapes dimfself and
        dimfother (of equal length), flattened."""
        da, db = _int_tuple(dimfself, "keops_kron"), _int_tuple(dimfother, "keops_kron")
        if len(da) != len(db):
            raise ValueError(f"keops_kron: shapes {da} and {db} must have as many axes")
        n = len(da)
        return self.keops_tensordot(other, da, db, (), (), [*range(0, 2 * n, 2), *range(1, 2 * n, 2)])

    def factorize(self, other: Any = None) -> LazyTensor:
        """self: KeOps' hint to compute a shared sub-formula once, which the kernels here always do."""
        return self

    def auto_factorize(self) -> LazyTensor:
        return self

    # symbolic differentiation: formulas of the formula's derivatives (formula.vjp), reduced like any other

    def _variable_node(self, v: Any, what: str) -> Var:
        if not isinstance(v, LazyTensor) or type(v.formula) is not Var:
            raise TypeError(
                f"{what}: the variable must be a LazyTensor of one tensor (LazyTensor(x), Vi(x), Vj(x), Pm(x)), "
                f"got {v.describe() if isinstance(v, LazyTensor) else type(v).__name__}"
            )
        return v.formula

    def grad(self, v: Any, gradin: Any) -> LazyTensor:
        """The gradient of self with respect to the variable v, applied to gradin (of self's dimension):
        sum_d gradin_d d self_d / d v, of v's dimension."""
        var = self._variable_node(v, "grad")

        def build(f: Formula, g: Formula) -> Formula:
            if g.dim != f.dim:
                raise FormulaError(f"gradin has dimension {g.dim}, the formula {f.dim}")
            return _vjp_or_zero(f, var, g)

        return self._nary("grad", build, gradin)

    def diff(self, v: Any, diffin: Any) -> LazyTensor:
        """The differential of self with respect to the variable v applied to diffin (of v's dimension):
        sum_e d self / d v_e diffin_e, of self's dimension (forward differentiation)."""
        var = self._variable_node(v, "diff")

        def build(f: Formula, u: Formula) -> Formula:
            if u.dim != var.dim:
                raise FormulaError(f"diffin has dimension {u.dim}, the variable {var.dim}")
            stand_in = Var("p", f.dim, tensor=torch.empty(0))  # a cotangent never read: the vjp is linear in it
            h = F.vjp(f, [var], stand_in)[0]
            if h is None:
                return _zero(f.dim)
            out = _vjp_or_zero(h, stand_in, u)
            if any(w.tensor is stand_in.tensor for w in variables(out)):
                raise FormulaError("diff: the derivative is not linear in its cotangent")  # a bug if ever seen
            return out

        return self._nary("diff", build, diffin)

    def grad_matrix(self, v: Any) -> LazyTensor:
        """The gradient matrix (the transposed Jacobian) of self with respect to v, flattened: the gradients of
        self's components one after the other, dimension D_self D_v."""
        var = self._variable_node(v, "grad_matrix")
        return self._unary(lambda f: _concat_all([_vjp_or_zero(f, var, _unit(k, f.dim)) for k in range(f.dim)]))

    def divergence(self, v: Any) -> LazyTensor:
        """sum_k d self_k / d v_k (self and v of one dimension)."""
        var = self._variable_node(v, "divergence")
        if self.formula.dim != var.dim:
            raise ValueError(f"divergence: the formula has dimension {self.formula.dim}, the variable {var.dim}")
        return self._unary(lambda f: _divergence(f, var))

    def laplacian(self, v: Any) -> LazyTensor:
        """sum_k d^2 self / d v_k^2 of a scalar formula."""
        var = self._variable_node(v, "laplacian")
        if self.formula.dim != 1:
            raise ValueError(f"laplacian needs a scalar formula, got {self.describe()}")
        return self._unary(lambda f: _divergence(_vjp_or_zero(f, var, F.Const(1.0)), var))

    def trace_operator(self, v: Any) -> LazyTensor:
        """The trace of self as a linear function of v (of v's dimension: the trace of its matrix; scalar: the
        sum of its row), i.e. the divergence, or the sum of the gradient."""
        var = self._variable_node(v, "trace_operator")
        d = self.formula.dim
        if d == var.dim:
            return self.divergence(v)
        if d != 1:
            raise ValueError(f"trace_operator: the formula must have dimension 1 or {var.dim}, got {d}")
        return self._unary(lambda f: F.VecSum(_vjp_or_zero(f, var, F.Const(1.0))))

    def t(self) -> LazyTensor:
        """The transpose (``.T``)."""
        return self.T

    def dim(self) -> int:
        """The number of axes, (*batch, M, N, D): KeOps' and torch's dim()."""
        return self.ndim

    @property
    def nbatchdims(self) -> int:
        return len(self.batch)

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

    def _reduce(
        self,
        reduction: Reduction,
        over: str,
        what: str,
        with_arg: bool = False,
        opts: ReduceOptions | None = None,
        group: Any = None,
        devices: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values, indices or None) of a reduction over i or j, with KeOps' options ``opts`` applied: values
        (*batch, rows, D) (k-best: (*batch, rows, K[, D])), keepdim inserting the reduced axis. (None, not an
        options object, is the default: torch 2.11's dynamo cannot wrap an object held in a default.)
        ``group``: a torch.distributed process group over whose ranks the reduced axis is sharded
        (distributed.py). ``devices``: devices of this process over which the output axis is cut
        (multi_device.py)."""
        if opts is None:
            opts = _DEFAULT_OPTIONS
        if devices is not None:
            if group is not None:
                raise ValueError(f"{what}: give group= (ranks) or devices= (this process's devices), not both")
            devices = resolve_devices(devices, what)
        if group is not None:
            from .distributed import reduce_sharded

            return reduce_sharded(self, reduction, over, what, with_arg, opts, group)
        if over == "vector":
            raise ValueError(f"{what} over the vector dimension is not available; reduce over i or j")
        if self.device is None:
            raise ValueError(f"{what}: a formula of constants only has nothing to reduce over")
        formula, device, dtype = self.formula, self.device, self.dtype
        extent = self._extent()
        if opts is not _DEFAULT_OPTIONS:  # (the common call pays for none of this)
            opts.check_sum_type(not reduction.selects, what)
            if opts.keepdim and reduction.kind == "kbest":
                raise ValueError(f"{what}: keepdim is for reductions to one value per row, not for the K best")
            device, dtype = opts.compute_device(self.device, what), opts.compute_dtype(self.dtype, what)
        if device.type == "cpu" and opts.automatic_device and auto_gpu(extent.pairs):
            device = torch.device("cuda", torch.cuda.current_device())  # KeOps' "auto": a GPU when there is one
        moved = device != self.device or dtype != self.dtype
        if moved:
            formula = _retargeted(formula, device, dtype)
        outer = "j" if over == "i" else "i"
        n_inner = extent.rows(over)
        # max / min over an empty axis give the semiring zero (-inf / +inf) and index 0, as sum (0) and
        # logsumexp (-inf) give theirs; K best of nothing have no value at all
        if reduction.kind == "kbest" and not 1 <= reduction.k <= n_inner:
            empty = "; the reduced axis is empty" if n_inner == 0 else ""
            raise ValueError(
                f"{what}: K={reduction.k} must be between 1 and the reduced size {n_inner} (over {over}){empty}"
            )
        ranges = opts.ranges if opts.ranges is not None else self.ranges
        if ranges is not None:
            ranges = parse_options(what, {"ranges": ranges}).ranges  # checked here too when set as an attribute
            if devices is not None:
                raise NotImplementedError(f"{what}: devices= with ranges= (block-sparse reductions) is not supported")
            k = reduction.k if reduction.kind == "kbest" else 0
            oriented = self._ranges_for(outer, extent, what, ranges, k)
            vals, idx = reduce_formula(formula, reduction, outer, extent, with_arg, ranges=oriented)
        elif devices is not None:
            vals, idx = reduce_on_devices(formula, reduction, outer, extent, with_arg, devices)
        else:
            vals, idx = reduce_formula(formula, reduction, outer, extent, with_arg, precision=opts.precision)
        if moved:
            vals = vals.to(device=self.device, dtype=self.dtype)
            idx = None if idx is None else idx.to(self.device)
        if reduction.kind == "kbest":
            d = self.formula.dim
            shape = (*vals.shape[:-1], reduction.k) + ((d,) if d > 1 else ())
            vals, idx = vals.reshape(shape), idx.reshape(shape)
        if opts.keepdim:
            at = -2 if over == "j" else -3
            vals, idx = vals.unsqueeze(at), (None if idx is None else idx.unsqueeze(at))
        return vals, idx

    def _ranges_for(
        self, outer: str, extent: Extent, what: str, ranges: tuple | None = None, k: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """The six range tensors of a block-sparse reduction with ``outer`` rows (block_sparse.py) of KeOps'
        ``ranges`` (this LazyTensor's attribute unless given), checked: in the reduction, the output rows of
        block k, ranges_o[k] = [a, b), reduce over the inner indices of redranges[l] for l in
        [slices[k - 1], slices[k]) only, and rows in no block over nothing (the semiring zero, index 0).
        ``k``: a k-best's K, which every row needs as many terms as."""
        ranges = self.ranges if ranges is None else ranges
        if self.batch:
            raise ValueError(f"{what}: ranges= with batch dimensions {self.batch} is not supported")
        oriented, min_terms = oriented_ranges(ranges, outer, extent.n_i, extent.n_j, what)
        if min_terms < k:
            raise ValueError(
                f"{what}: K={k}, but some rows reduce over {min_terms} terms (ranges=); every row needs at least K"
            )
        return oriented

    def _own_ranges(self, opts: ReduceOptions) -> ReduceOptions:
        """opts without out=, for a reduction of a LazyTensor made from this one (K * v_j for K @ v): with this
        one's ranges attribute unless opts has ranges of its own."""
        if opts.ranges is None and self.ranges is not None:
            return replace(opts, out=None, ranges=self.ranges)
        return replace(opts, out=None) if opts.out is not None else opts

    @staticmethod
    def _output(result: Any, opts: ReduceOptions, what: str) -> Any:
        """The result of a reduction, or ``out`` holding it (KeOps' in-place form)."""
        out = opts.out
        if out is None:
            return result
        if isinstance(result, tuple):
            raise TypeError(f"{what}: out= takes one tensor, and {what} returns two")
        view = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)  # a NumPy array, written in place
        if view.shape != result.shape or view.dtype != result.dtype or view.device != result.device:
            raise ValueError(
                f"{what}: out has shape {tuple(view.shape)}, {view.dtype} on {view.device}; the result has shape "
                f"{tuple(result.shape)}, {result.dtype} on {result.device}"
            )
        if torch.is_grad_enabled() and (result.requires_grad or view.requires_grad):
            raise RuntimeError(
                f"{what}: out= does not support automatic differentiation (torch's rule for out= arguments); "
                f"leave it out, or reduce under torch.no_grad()"
            )
        view.copy_(result)
        return out

    def _vector(self, node, opts: ReduceOptions, what: str) -> LazyTensor:
        """A reduction over the vector dimension: a LazyTensor of dimension 1 (keepdim is implied, as in KeOps,
        which ignores its options there; out= and ranges= are refused)."""
        if opts.out is not None or opts.ranges is not None:
            raise ValueError(f"{what} over the vector dimension is a LazyTensor: out= and ranges= do not apply")
        return self._unary(node)

    @deferrable(vector_default=True)
    def sum(self, dim: int | None = None, axis: int | None = None, **kwargs: Any) -> Any:
        """Sum over i or j: (*batch, rows, D); over the vector dimension (-1, the default as in KeOps): a LazyTensor.
        ``kwargs``: KeOps' reduction options (options.py), e.g. ``keepdim=True``, ``dtype_acc="float64"``,
        ``out=``; ``call=False`` (or a symbolic variable) returns a callable (symbolic.ReducedLazyTensor)."""
        over = self._axis(dim, axis, "sum")
        group, devices = _pop_spread(kwargs)
        opts = parse_options("sum", kwargs) if kwargs else _DEFAULT_OPTIONS
        if over == "vector":
            return self._vector(F.VecSum, opts, "sum")
        vals = self._reduce(semiring_reduction("std"), over, "sum", opts=opts, group=group, devices=devices)[0]
        return self._output(vals, opts, "sum")

    sum_reduction = deferrable()(sum.__wrapped__)  # KeOps' sum_reduction: no default axis

    @deferrable()
    def logsumexp(self, dim: int | None = None, axis: int | None = None, weight: Any = None, **kwargs: Any) -> Any:
        """log sum exp over i or j, per component; with ``weight`` (a LazyTensor w of dimension E, the formula
        scalar; ``other=`` is KeOps' other name for it): log sum_j exp(F_ij) w_ij, of dimension E. Over the
        vector dimension: a LazyTensor."""
        if "other" in kwargs:
            if weight is not None:
                raise ValueError("logsumexp: weight= and other= are the same argument; give one")
            weight = kwargs.pop("other")
        over = self._axis(dim, axis, "logsumexp")
        group, devices = _pop_spread(kwargs)
        opts = parse_options("logsumexp", kwargs) if kwargs else _DEFAULT_OPTIONS
        if over == "vector":
            if weight is not None:
                raise ValueError("logsumexp over the vector dimension takes no weight; reduce over i or j")
            return self._vector(F.VecLogSumExp, opts, "logsumexp")
        if weight is None:
            vals = self._reduce(semiring_reduction("log"), over, "logsumexp", opts=opts, group=group, devices=devices)[
                0
            ]
            return self._output(vals, opts, "logsumexp")
        if self.formula.dim != 1:
            raise ValueError(f"logsumexp with a weight needs a scalar formula, got {self.describe()}")
        joined = self._nary("logsumexp(weight=)", F.Concat, weight)
        vals = joined._reduce(
            weighted_logsumexp(), over, "logsumexp", opts=self._own_ranges(opts), group=group, devices=devices
        )[0]
        return self._output(vals, opts, "logsumexp")

    logsumexp_reduction = logsumexp

    @deferrable()
    def sumsoftmaxweight(self, weight: Any, dim: int | None = None, axis: int | None = None, **kwargs: Any):
        """sum_j softmax_j(F_ij) w_ij for a scalar formula F and weights w (a LazyTensor or tensor of dimension E):
        (*batch, rows, E). Two reductions: s = logsumexp of F, then the sum of exp(F_ij - s_i) w_ij (exactly 0
        for F = -inf; a row of -inf only gives 0); differentiable, twice, through both."""
        over = self._axis(dim, axis, "sumsoftmaxweight")
        group, devices = _pop_spread(kwargs)
        opts = parse_options("sumsoftmaxweight", kwargs) if kwargs else _DEFAULT_OPTIONS
        if over == "vector":
            raise ValueError("sumsoftmaxweight over the vector dimension is not available; reduce over i or j")
        if self.formula.dim != 1:
            raise ValueError(f"sumsoftmaxweight needs a scalar formula, got {self.describe()}")
        inner = replace(opts, out=None)
        s = self._reduce(
            semiring_reduction("log"),
            over,
            "sumsoftmaxweight",
            opts=replace(inner, keepdim=False),
            group=group,
            devices=devices,
        )[0]
        s_lazy = LazyTensor(s.unsqueeze(-2) if over == "j" else s.unsqueeze(-3))  # the rows' own variable
        terms = self._nary("sumsoftmaxweight", F.SoftmaxWeight, s_lazy)._nary("sumsoftmaxweight", F.Mul, weight)
        own = self._own_ranges(inner)
        vals = terms._reduce(
            semiring_reduction("std"), over, "sumsoftmaxweight", opts=own, group=group, devices=devices
        )[0]
        return self._output(vals, opts, "sumsoftmaxweight")

    sumsoftmaxweight_reduction = sumsoftmaxweight

    def solve(self, other: Any, var: Any = None, call: bool = True, alpha: float = 1e-10, eps: float = 1e-6, **kwargs):
        """The solution a of (alpha Id + A) a = b by conjugate gradients (KeOps' LazyTensor.solve; A should be
        symmetric positive definite, which is not checked), solve.py:

        - without ``var``: A(a) = K @ a for the square scalar formula K = self. ``other`` is b: an i-variable (a
          tensor (..., M, E) or (M,), or a LazyTensor Vi(b)), then (K a)_i = sum_j K_ij a_j; or a j-variable
          (Vj(b)), then (K a)_j = sum_i K_ij a_i;
        - with ``var`` (a symbolic variable of self, ``Vj(k, E)`` for an i-variable b): self is a formula F
          linear in var, and A(a) = sum over var's axis of F[var := a] (``(K * Vj(0, 1)).solve(b, var=Vj(0, 1))``
          is ``K.solve(b)``). Every other variable of F holds its tensor.

        Stops when |r|^2 < numel(b) eps^2 (KeOps' rule), or after 10 n + 10 iterations with a RuntimeWarning.
        Differentiable with respect to b and to F's tensors (implicit differentiation: one more solve, with A's
        transpose), once. ``kwargs``: reduction options for the products (``out=`` receives a); ``call=False``
        (or a symbolic b, as ``Vi(0, E)``) returns a callable (symbolic.ReducedLazyTensor)."""
        if var is None:
            return self._solve_kernel(other, call=call, alpha=alpha, eps=eps, **kwargs)
        if call is not True:
            raise NotImplementedError("solve(var=..., call=False) is not supported: call it with call=True")
        if not (isinstance(var, LazyTensor) and var.symbolic and type(var.formula) is Var):
            raise TypeError(f"solve: var must be a symbolic variable of the formula, Vj(k, E) / Vi(k, E); got {var!r}")
        (index, dim, cat), v = var.symbolic_variables[0], var.formula
        mine = self.symbolic_variables
        if (index, dim, cat) not in mine:
            raise ValueError(f"solve: var {var.describe()} is not a variable of {self.describe()}")
        if len(mine) > 1 or (isinstance(other, LazyTensor) and other.symbolic):
            raise NotImplementedError(
                f"solve(var=...): the formula's only symbolic variable must be var; it has {mine}"
            )
        return self._solve(self, v, index, other, alpha, eps, kwargs)

    @deferrable()
    def _solve_kernel(self, other: Any, alpha: float = 1e-10, eps: float = 1e-6, **kwargs):
        """solve without var: the system of the formula self * x over the axis b is not indexed by."""
        if self.formula.dim != 1 or self.device is None:
            raise ValueError(f"solve needs a scalar formula of tensors, got {self.describe()}")
        over = "i" if isinstance(other, LazyTensor) and type(other.formula) is Var and other.formula.cat == "j" else "j"
        unknown = symbolic_var(0, _rhs_dim(other), "ij".index(over), "solve")  # self has no symbolic variables
        template = self._nary("solve", F.Mul, LazyTensor._make(unknown, (), None, None, None, None, symbolic=True))
        return self._solve(template, unknown, 0, other, alpha, eps, kwargs)

    def _solve(self, template, unknown: Var, index: int, other: Any, alpha: float, eps: float, kwargs) -> Any:
        """a of the system of ``template`` (a LazyTensor holding the placeholder ``unknown``, symbolic ``index``)
        for b = other; self is the LazyTensor solve was called on (its options and ranges)."""
        if "group" in kwargs:
            raise NotImplementedError("solve: group= (sharded reductions) is not supported; see docs/lazy.md")
        opts = parse_options("solve", kwargs) if kwargs else _DEFAULT_OPTIONS
        if self.device is None:
            raise ValueError(f"solve needs a formula of tensors, got {self.describe()}")
        if self.n_i is not None and self.n_j is not None and self.n_i != self.n_j:
            raise ValueError(f"solve needs a square formula (M = N), got {self.describe()}")
        if isinstance(other, LazyTensor):
            if type(other.formula) is not Var or other.formula.cat == "p":
                raise TypeError(f"solve: b must be a tensor or a LazyTensor Vi(b) / Vj(b), got {other.describe()}")
            b, rows = other.formula.tensor, other.formula.cat
        elif isinstance(other, torch.Tensor):
            b, rows = (other.unsqueeze(-1) if other.dim() == 1 else other), "i"  # (M,): a column, as K @ v
        else:
            raise TypeError(f"solve: b must be a tensor or a LazyTensor, got {type(other).__name__}")
        over = "j" if rows == "i" else "i"
        if unknown.cat != over or unknown.dim != b.shape[-1] or template.formula.dim != b.shape[-1]:
            raise ValueError(
                f"solve: b is a {rows}-variable of dimension {b.shape[-1]}, so the unknown must be a "
                f"{over}-variable of that dimension and the formula of that dimension; got "
                f"V{unknown.cat}(.., {unknown.dim}) in a formula of dimension {template.formula.dim}"
            )
        n_rows = self.n_i if self.n_i is not None else self.n_j
        if (n_rows is not None and b.shape[-2] != n_rows) or b.dtype != self.dtype or b.device != self.device:
            raise ValueError(
                f"solve: b of shape {tuple(b.shape)}, {b.dtype} on {b.device} does not fit {self.describe()} "
                f"({self.dtype} on {self.device})"
            )
        inner = self._own_ranges(replace(opts, out=None, keepdim=False))
        system = LinearSystem(template, unknown, index, over, float(alpha), inner)
        a = solve_system(system, b, float(eps))
        column = isinstance(other, torch.Tensor) and other.dim() == 1
        return self._output(a.squeeze(-1) if column else a, opts, "solve")

    def _extremum(self, dim, axis, largest: bool, values: bool, indices: bool, what: str, kwargs: dict[str, Any]):
        over = self._axis(dim, axis, what)
        group, devices = _pop_spread(kwargs)
        opts = parse_options(what, kwargs) if kwargs else _DEFAULT_OPTIONS
        if over == "vector":
            if values and indices:
                raise ValueError(f"{what} over the vector dimension is not available; reduce over i or j")
            if indices:  # KeOps' ArgMax / ArgMin operations: the index of the first extremum, a number
                return self._vector(_vector_argmax if largest else _vector_argmin, opts, what)
            return self._vector(F.VecMax, opts, what) if largest else -(-self)._vector(F.VecMax, opts, what)
        vals, idx = self._reduce(
            semiring_reduction("max" if largest else "min"), over, what, True, opts, group, devices
        )
        if values and indices:
            return self._output((vals, idx), opts, what)
        return self._output(vals if values else idx, opts, what)

    @deferrable(vector_default=True)
    def max(self, dim=None, axis=None, **kwargs):
        """The largest term per component over i or j (min, argmax, ... alike). Over an empty axis the
        values are the semiring zero (-inf for max, +inf for min) and the indices 0, on every backend. Without an
        axis, over the vector dimension (KeOps' default): a LazyTensor (argmin / argmax: the index, as a float)."""
        return self._extremum(dim, axis, True, True, False, "max", kwargs)

    @deferrable(vector_default=True)
    def min(self, dim=None, axis=None, **kwargs):
        return self._extremum(dim, axis, False, True, False, "min", kwargs)

    @deferrable(vector_default=True)
    def argmax(self, dim=None, axis=None, **kwargs):
        return self._extremum(dim, axis, True, False, True, "argmax", kwargs)

    @deferrable(vector_default=True)
    def argmin(self, dim=None, axis=None, **kwargs):
        return self._extremum(dim, axis, False, False, True, "argmin", kwargs)

    @deferrable()
    def max_argmax(self, dim=None, axis=None, **kwargs):
        return self._extremum(dim, axis, True, True, True, "max_argmax", kwargs)

    @deferrable()
    def min_argmin(self, dim=None, axis=None, **kwargs):
        return self._extremum(dim, axis, False, True, True, "min_argmin", kwargs)

    __max__, __min__ = max, min
    # KeOps' *_reduction forms have no default axis
    max_reduction, min_reduction = deferrable()(max.__wrapped__), deferrable()(min.__wrapped__)
    argmax_reduction, argmin_reduction = deferrable()(argmax.__wrapped__), deferrable()(argmin.__wrapped__)
    max_argmax_reduction = max_argmax
    min_argmin_reduction = min_argmin

    def _kbest(self, K: int, dim, axis, largest: bool, what: str, kwargs: dict[str, Any], pick: slice):
        if isinstance(K, bool) or not isinstance(K, int):
            raise TypeError(f"{what}: K must be an int, got {type(K).__name__}")
        over = self._axis(dim, axis, what)
        group, devices = _pop_spread(kwargs)
        opts = parse_options(what, kwargs) if kwargs else _DEFAULT_OPTIONS
        vals, idx = self._reduce(kbest(K, largest), over, what, opts=opts, group=group, devices=devices)
        result = (vals, idx)[pick]
        return self._output(result[0] if len(result) == 1 else result, opts, what)

    @deferrable()
    def Kmin(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, False, "Kmin", kwargs, slice(0, 1))

    @deferrable()
    def argKmin(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, False, "argKmin", kwargs, slice(1, 2))

    @deferrable()
    def Kmin_argKmin(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, False, "Kmin_argKmin", kwargs, slice(0, 2))

    @deferrable()
    def Kmax(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, True, "Kmax", kwargs, slice(0, 1))

    @deferrable()
    def argKmax(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, True, "argKmax", kwargs, slice(1, 2))

    @deferrable()
    def Kmax_argKmax(self, K: int, dim=None, axis=None, **kwargs):
        return self._kbest(K, dim, axis, True, "Kmax_argKmax", kwargs, slice(0, 2))

    Kmin_reduction, argKmin_reduction, Kmin_argKmin_reduction = Kmin, argKmin, Kmin_argKmin
    Kmax_reduction, argKmax_reduction, Kmax_argKmax_reduction = Kmax, argKmax, Kmax_argKmax

    @deferrable()
    def __matmul__(self, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """sum_j K_ij v_j for a scalar formula K and v of shape (..., N, E): (..., M, E); v of shape (N,) gives
        (..., M). ``kwargs``: KeOps' reduction options, as for sum (``K.__matmul__(v, backend="CPU")``), and
        ``group=`` (v and K's j data sharded over the group's ranks, distributed.py)."""
        group, devices = _pop_spread(kwargs)
        opts = parse_options("@", kwargs) if kwargs else _DEFAULT_OPTIONS
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"@: the right operand must be a tensor (..., N, E) or (N,), got {type(v).__name__}")
        if v.is_complex():  # a complex product (complex.py)
            return _ComplexHooks.cls.lift(self).__matmul__(v, **kwargs)
        if self.formula.dim != 1:
            raise ValueError(f"@ needs a scalar formula (vector dimension 1), got {self.describe()}")
        if v.dim() == 0:
            raise ValueError(f"@: the right operand must have shape (..., N, E) or (N,), got {tuple(v.shape)}")
        column = v.dim() == 1
        if column:
            v = v.unsqueeze(-1)
        extent = self._extent()  # an axis without variables counts 1, as v_j's would then broadcast against
        if (
            v.dim() == 2
            and group is None
            and devices is None
            and (opts is _DEFAULT_OPTIONS or opts.is_plain)
            and not self.batch
            and extent.n_j == v.shape[0]
            and not self.deferred
            and v.dtype == self.dtype
            and v.device == self.device
        ):  # the common case, without building K * v_j each call (K.ranges: block-sparse, in the same kernel)
            ranges = None if self.ranges is None else self._ranges_for("i", extent, "@")
            result = matmul_formula(self.formula, v, extent, ranges)
        else:
            own = self._own_ranges(opts)
            result = (self * Vj(v))._reduce(
                semiring_reduction("std"), "j", "@", opts=own, group=group, devices=devices
            )[0]
        return self._output(result.squeeze(-1) if column else result, opts, "@")

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``self @ v`` (scipy.sparse.linalg's LinearOperator protocol, as KeOps)."""
        return self @ v

    def rmatvec(self, v: torch.Tensor) -> torch.Tensor:
        """``self.T @ v``."""
        return self.T @ v

    # ------------------------------------------------------------ dense

    def dense(
        self,
        out: torch.Tensor | None = None,
        *,
        devices: Any = None,
        max_device_bytes: int | None = None,
        progress: bool | None = None,
    ) -> torch.Tensor:
        """The formula evaluated at every (i, j): a (*batch, M, N, D) tensor.

        Evaluated with torch on the formula's device, unless ``out`` (a host tensor (M, N, D), or (M, N) when
        D = 1), ``devices``, ``max_device_bytes`` or ``progress`` is given, or the result (with torch's
        temporaries, ~3x its size) would not fit the GPU's free memory: then semiring_ops.blocks.dense writes
        it block by block into a host tensor (``out``, or a new one), on ``devices`` (default: the formula's
        GPU, or CPU workers). The block path takes formulas without batch dimensions."""
        if self.symbolic:
            raise ValueError(f"dense(): {self.describe()} holds symbolic variables {self.symbolic_variables}")
        if self.device is None:
            raise ValueError("dense(): a formula of constants only")
        extent = self._extent()
        routed = out is not None or devices is not None or max_device_bytes is not None or progress is not None
        if not routed and self.device.type == "cuda" and not extent.batch:
            cells = extent.n_i * extent.n_j * self.formula.dim
            routed = 3 * cells * self.dtype.itemsize > torch.cuda.mem_get_info(self.device)[0]
        if routed:
            d = self.formula.dim
            target = out[..., 0] if out is not None and d == 1 and out.dim() == 3 else out
            got = blocks_dense(self, target, devices, max_device_bytes, progress)
            return out if out is not None else (got[..., None] if d == 1 else got)
        like = torch.empty(0, dtype=self.dtype, device=self.device)
        return evaluate_dense(self.formula, extent, like)

    @property
    def variables(self) -> list[torch.Tensor]:
        """The tensors of the formula, each once, in order of appearance (not the symbolic variables')."""
        return [v.tensor for v in variables(self.formula) if not (self.symbolic and is_placeholder(v.tensor))]


def _rhs_dim(b: Any) -> int:
    """The dimension E of solve's right-hand side b ((..., n, E) or (n,) tensor, or Vi(b) / Vj(b)); 1 for what
    solve then refuses."""
    if isinstance(b, LazyTensor):
        return b.formula.dim
    return b.shape[-1] if isinstance(b, torch.Tensor) and b.dim() > 1 else 1


def _as_tensor(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(x).__name__}")
    _check_dtype(x, what)
    return x


def Vi(x_or_ind: torch.Tensor | int, dim: int | None = None) -> LazyTensor:
    """An i-variable from x of shape (..., M, D) (M = 1: a parameter, as LazyTensor(x[..., None, :]) is);
    ``Vi(ind, dim)``: KeOps' symbolic i-variable number ``ind`` of dimension ``dim``, whose tensor is given
    when the reduction is called (symbolic.py)."""
    return _indexed(x_or_ind, dim, "i")


def Vj(x_or_ind: torch.Tensor | int, dim: int | None = None) -> LazyTensor:
    """A j-variable from x of shape (..., N, D) (N = 1: a parameter, as LazyTensor(x[..., None, :, :]) is);
    ``Vj(ind, dim)``: a symbolic j-variable (see Vi)."""
    return _indexed(x_or_ind, dim, "j")


def _symbolic(ind: Any, dim: Any, cat: str, what: str) -> LazyTensor:
    """KeOps' ``LazyTensor((ind, dim, cat))`` for Vi / Vj / Pm(ind, dim)."""
    if isinstance(ind, torch.Tensor):
        raise TypeError(f"{what}: dim= is for a symbolic variable {what[:2]}(ind, dim) with ind an int, not a tensor")
    return LazyTensor((ind, dim, "ijp".index(cat)))


def _indexed(x: torch.Tensor | int, dim: int | None, cat: str) -> LazyTensor:
    """Vi / Vj: x itself is the variable's tensor (no view of it), so Vi(x) twice is one kernel argument."""
    what = f"V{cat}(x)"
    if dim is not None:
        return _symbolic(x, dim, cat, f"V{cat}(ind, dim)")
    if isinstance(x, int) and not isinstance(x, bool):
        raise TypeError(f"{what}: x is a tensor (..., n, D), or an index with its dimension: V{cat}(ind, dim)")
    x = x if _is_complex(x) else _as_tensor(x, what)
    if x.dim() < 2:
        raise ValueError(f"{what}: x must have shape (..., {'M' if cat == 'i' else 'N'}, D), got {tuple(x.shape)}")
    if x.shape[-2] == 1 or x.is_complex():  # (a complex x: a ComplexLazyTensor)
        return LazyTensor(x.unsqueeze(-2 if cat == "i" else -3))
    out = LazyTensor.__new__(LazyTensor)
    out._variable(x, cat)
    return out


def Pm(x: Any, dim: int | None = None) -> LazyTensor:
    """A parameter from a number, a 0-d tensor or a vector of shape (D,). A number takes the dtype and device
    of the formula it is combined with (float32 on the CPU while it has none). ``Pm(ind, dim)``: a symbolic
    parameter (see Vi)."""
    if dim is not None:
        return _symbolic(x, dim, "p", "Pm(ind, dim)")
    if isinstance(x, (int, float)):
        return LazyTensor._number(x)
    if isinstance(x, list):
        return LazyTensor(x)
    if _is_complex(x):
        return LazyTensor(x)
    x = _as_tensor(x, "Pm(x)")
    if x.dim() > 1:
        raise ValueError(f"Pm(x): x must be a number or have shape (D,), got {tuple(x.shape)}")
    return LazyTensor(x)


# ---------------------------------------------------------------- helpers of KeOps' API


def _pop_spread(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(group, devices): a reduction's keywords that spread it over ranks (distributed.py) or over this
    process's devices (multi_device.py), taken out of its KeOps options."""
    if not kwargs:
        return None, None
    return kwargs.pop("group", None), kwargs.pop("devices", None)


def _joined_ranges(operands: Sequence[LazyTensor], op: str) -> tuple | None:
    """The ranges attribute of a LazyTensor made from ``operands`` (KeOps' rule): the one that is set; two that
    differ are refused."""
    found: LazyTensor | None = None
    for x in operands:
        if x.ranges is None:
            continue
        if found is not None and not _same_ranges(found.ranges, x.ranges):
            raise ValueError(
                f"{op}: the operands have different ranges (block-sparsity patterns): {found.describe()} and "
                f"{x.describe()}; set one, or equal ones"
            )
        found = found or x
    return None if found is None else found.ranges


def _same_ranges(a: tuple, b: tuple) -> bool:
    if a is b:
        return True
    return len(a) == len(b) and all(
        torch.as_tensor(x).shape == torch.as_tensor(y).shape
        and bool(torch.equal(torch.as_tensor(x).cpu(), torch.as_tensor(y).cpu()))
        for x, y in zip(a, b, strict=True)
    )


def _retargeted(formula: Formula, device: torch.device, dtype: torch.dtype) -> Formula:
    """The formula with its tensors on ``device`` in ``dtype`` (copies, differentiable), each tensor copied once so
    that a variable used twice stays one kernel argument (identity by ``is``, as formula._VarIndex)."""
    done: list[tuple[torch.Tensor, torch.Tensor]] = []

    def move(v: Var) -> Formula:
        for old, new in done:
            if old is v.tensor:
                return Var(v.cat, v.dim, tensor=new)
        new = v.tensor.to(device=device, dtype=dtype)
        done.append((v.tensor, new))
        return Var(v.cat, v.dim, tensor=new)

    return substitute(formula, move)


def _vector_argmax(x: Formula) -> Formula:
    """The index of the first largest component of x, as a number (no gradient): KeOps' ArgMax operation."""
    if x.dim == 1:
        return F.Mul(F.ArgMaxMask(x), F.Const(0.0))
    return F.VecSum(F.Mul(F.ArgMaxMask(x), _concat_all([F.Const(float(d)) for d in range(x.dim)])))


def _vector_argmin(x: Formula) -> Formula:
    """The index of the first smallest component of x, as a number: KeOps' ArgMin operation."""
    return _vector_argmax(F.Neg(x))


def _zero(dim: int) -> Formula:
    return F.Const(0.0) if dim == 1 else F.Repeat(F.Const(0.0), dim)


def _unit(k: int, dim: int) -> Formula:
    """The k-th basis vector of dimension dim, as constants."""
    return F.Const(1.0) if dim == 1 else F.Embed(F.Const(1.0), k, dim)


def _vjp_or_zero(f: Formula, var: Var, g: Formula) -> Formula:
    """sum_d g_d d f_d / d var (var's dimension); zeros when f does not depend on var."""
    out = F.vjp(f, [var], g)[0]
    return _zero(var.dim) if out is None else out


def _concat_all(parts: Sequence[Formula]) -> Formula:
    return functools.reduce(F.Concat, parts)


def _divergence(f: Formula, var: Var) -> Formula:
    """sum_k d f_k / d var_k."""
    terms = [F.Extract(_vjp_or_zero(f, var, _unit(k, f.dim)), k, 1) for k in range(f.dim)]
    return functools.reduce(F.Add, terms)


def _quotient(total: int, part: int, what: str) -> int:
    if part < 1 or total % part:
        raise FormulaError(f"{what}: a dimension of {total} is not a multiple of {part}")
    return total // part


def _int_tuple(values: Any, what: str) -> tuple[int, ...]:
    """A shape or axis list (ints, numpy ints, a torch.Size, or one int) as a tuple of ints."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    try:
        return (operator.index(values),)
    except TypeError:
        pass
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{what}: expected ints, got {values!r}") from None


def _tensordot_spec(dimfa, dimfb, contfa, contfb, perm) -> tuple[str, list[int]]:
    """The einsum spec (formula_math.Contract) and label sizes of keops_tensordot's arguments."""
    what = "keops_tensordot"
    da, db = _int_tuple(dimfa, what), _int_tuple(dimfb, what)
    ca, cb = _int_tuple(contfa, what), _int_tuple(contfb, what)
    if len(ca) != len(cb):
        raise ValueError(f"{what}: contfa {ca} and contfb {cb} must have as many axes")
    for shape, axes, name in ((da, ca, "contfa"), (db, cb, "contfb")):
        if len(set(axes)) != len(axes) or any(not 0 <= a < len(shape) for a in axes):
            raise ValueError(f"{what}: {name} {axes} must be distinct axes of the shape {shape}")
    if any(da[a] != db[b] for a, b in zip(ca, cb, strict=True)):
        raise ValueError(f"{what}: contracted axes of sizes {[da[a] for a in ca]} and {[db[b] for b in cb]} differ")
    labels = iter(FM._LABELS)
    la = [next(labels) for _ in da]
    lb = [""] * len(db)
    for a, b in zip(ca, cb, strict=True):
        lb[b] = la[a]
    lb = [c or next(labels) for c in lb]
    free = [la[k] for k in range(len(da)) if k not in ca] + [lb[k] for k in range(len(db)) if k not in cb]
    order = list(range(len(free))) if perm is None else list(_int_tuple(perm, what))
    if sorted(order) != list(range(len(free))):
        raise ValueError(f"{what}: the permutation {tuple(order)} is not one of the {len(free)} free axes")
    out = [""] * len(free)
    for p, position in enumerate(order):
        out[position] = free[p]
    spec = f"{''.join(la)},{''.join(lb)}->{''.join(out)}"
    size = dict(zip(la, da, strict=True)) | dict(zip(lb, db, strict=True))
    return spec, [size[c] for c in dict.fromkeys(la + lb + out)]


SOFTDTW_MAX_CELLS = 4096  # n m cells of softdtw_sqdist, each a handful of statements unrolled into the kernel


def _softdtw_formula(x: Formula, y: Formula, gamma: Formula) -> Formula:
    """Soft-DTW of the components of x (n) and y (m) with the squared difference as the cost: r_(i,j) =
    (x_i - y_j)^2 + softmin_gamma(r_(i-1,j-1), r_(i-1,j), r_(i,j-1)), softmin_g(a, b, c) = -g log(e^(-a/g) +
    e^(-b/g) + e^(-c/g)); the first row and column sum the costs. The value is r_(n-1,m-1)."""
    n, m = x.dim, y.dim
    if gamma.dim != 1:
        raise FormulaError(f"softdtw_sqdist: gamma must be a scalar, got dimension {gamma.dim}")
    if n * m > SOFTDTW_MAX_CELLS:
        raise FormulaError(f"softdtw_sqdist: {n} x {m} cells, more than SOFTDTW_MAX_CELLS = {SOFTDTW_MAX_CELLS}")
    xs = [F.Extract(x, i, 1) for i in range(n)] if n > 1 else [x]
    ys = [F.Extract(y, j, 1) for j in range(m)] if m > 1 else [y]

    def softmin(*terms: Formula) -> Formula:
        scaled = _concat_all([F.Neg(F.Div(t, gamma)) for t in terms])
        return F.Neg(F.Mul(gamma, F.VecLogSumExp(scaled)))

    r: dict[tuple[int, int], Formula] = {}
    for j in range(m):
        for i in range(n):
            cost = F.Square(F.Sub(xs[i], ys[j]))
            if i == 0 and j == 0:
                r[i, j] = cost
            elif j == 0:
                r[i, j] = F.Add(cost, r[i - 1, 0])
            elif i == 0:
                r[i, j] = F.Add(cost, r[0, j - 1])
            else:
                r[i, j] = F.Add(cost, softmin(r[i - 1, j - 1], r[i - 1, j], r[i, j - 1]))
    return r[n - 1, m - 1]
