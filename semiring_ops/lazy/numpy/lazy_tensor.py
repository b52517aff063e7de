"""The NumPy LazyTensor: semiring_ops.lazy's torch LazyTensor behind KeOps's ``pykeops.numpy`` interface.

A :class:`LazyTensor` here holds a torch LazyTensor (``_lazy``) whose tensors share the arrays' memory
(``torch.from_numpy``) and forwards every operation to it, turning NumPy arrays, NumPy numbers and NumPy
LazyTensors among the arguments into their torch counterparts, and tensors, torch LazyTensors and tuples of
them among the results back (tensors as arrays: a reduction's values in the inputs' dtype, its indices int64).
What differs from the torch LazyTensor is what ``pykeops.numpy`` shows of a LazyTensor:

- ``dtype``: a NumPy dtype (``np.dtype("float32")``, equal to KeOps's ``"float32"`` and to ``np.float32``), or
  None for a LazyTensor of numbers only; ``shape``: ``(*batch, M, N)`` when the vector dimension D is 1, else
  ``(*batch, M, N, D)``; ``_shape``: always ``(*batch, M, N, D)``; ``ndim``: D (KeOps's meaning); ``dim()``:
  ``len(_shape)``. So ``scipy.sparse.linalg.aslinearoperator(K)`` takes a scalar formula K: its ``matvec``,
  ``rmatvec`` and ``@`` take and return arrays.
- ``backend``: an attribute (None, "CPU", "GPU", ...) that reductions of this LazyTensor, and of those made
  from it, use when not given ``backend=``.
- ``ranges``: KeOps's block-sparsity 6-tuple, set as integer arrays (returned as arrays).
- ``solve`` and ``@`` take arrays (an (N, E) array ``b`` in ``solve`` is ``Vi(b)``, as in KeOps); symbolic
  variables (``Vi(0, 3)``) and ``call=False`` give callables of arrays. The rest is the torch LazyTensor's:
  ``sum``, ``min``, ``max``, ``argmin``, ``argmax`` without an axis reduce the vector dimension (KeOps's
  default), and so on.
"""

from __future__ import annotations

import functools
import inspect
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import lazy_tensor as _lt
from ..complex import ComplexLazyTensor as _TorchComplex
from ..options import BACKENDS

__all__ = ["ComplexLazyTensor", "LazyTensor", "Pm", "Vi", "Vj"]

_NUMPY_DTYPES = {
    t: np.dtype(str(t).removeprefix("torch."))
    for t in (torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128)
}
_FORWARDED_DUNDERS = (
    "__abs__",
    "__add__",
    "__eq__",
    "__ge__",
    "__getitem__",
    "__gt__",
    "__le__",
    "__lt__",
    "__max__",
    "__min__",
    "__mul__",
    "__ne__",
    "__neg__",
    "__or__",
    "__pow__",
    "__radd__",
    "__rmul__",
    "__ror__",
    "__round__",
    "__rsub__",
    "__rtruediv__",
    "__sub__",
    "__truediv__",
)


def _tensor(x: np.ndarray) -> torch.Tensor:
    """A NumPy array as a tensor sharing its memory (a copy only for negative strides, which torch refuses).

    A read-only array (np.broadcast_to, a memory map) is shared too: the kernels only read their inputs, so
    torch's warning about writing to it does not apply."""
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    if x.flags.writeable:
        return torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x)


def _to_torch(x: Any, what: str) -> Any:
    """An argument of a NumPy LazyTensor's operation as the torch LazyTensor's: arrays as tensors (memory
    shared), NumPy numbers as Python numbers, NumPy LazyTensors as their torch LazyTensors, inside tuples and
    lists too; torch objects are refused (a NumPy LazyTensor computes on arrays only)."""
    if isinstance(x, LazyTensor):
        return x._lazy
    if isinstance(x, np.ndarray):
        return _tensor(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (tuple, list)):
        return type(x)(_to_torch(v, what) for v in x)
    if isinstance(x, (torch.Tensor, _lt.LazyTensor, _TorchComplex)):
        raise TypeError(
            f"{what}: a NumPy LazyTensor is made of NumPy arrays, got a torch {type(x).__name__}; use "
            f"semiring_ops.lazy.LazyTensor for tensors"
        )
    return x


def _to_numpy(x: Any, backend: str | None) -> Any:
    """A result of the torch LazyTensor as the NumPy front end's: tensors as arrays, torch LazyTensors as NumPy
    LazyTensors (with ``backend``), inside tuples and lists too; a callable (a reduction made with
    ``call=False``) as a callable of arrays."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, (_lt.LazyTensor, _TorchComplex)):
        return LazyTensor._wrap(x, backend)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_numpy(v, backend) for v in x)
    if callable(x) and not isinstance(x, (type, types.FunctionType, types.MethodType)):
        return _ArrayCallable(x, backend)
    return x


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], what: str, backend: str | None) -> Any:
    """fn(*args, **kwargs) with the arguments turned into torch objects and the result back into NumPy ones.
    ``out=`` stays an array: the torch LazyTensor writes into a NumPy ``out`` in place and returns it."""
    targs = _to_torch(args, what)
    tkwargs = {k: v if k == "out" else _to_torch(v, what) for k, v in kwargs.items()}
    return _to_numpy(fn(*targs, **tkwargs), backend)


class _ArrayCallable:
    """A callable of the torch front end (a reduction made with ``call=False``) called with arrays: its arguments
    turned into tensors, its result into arrays."""

    __slots__ = ("_backend", "_fn")

    def __init__(self, fn: Callable[..., Any], backend: str | None) -> None:
        self._fn, self._backend = fn, backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._backend is not None and "backend" not in kwargs:
            kwargs = {**kwargs, "backend": self._backend}
        return _call(self._fn, args, kwargs, "call", self._backend)

    def __getattr__(self, name: str) -> Any:
        """The callable's other attributes (``symbolic_variables``, ``nargs``, ``variables``, ``callfun``), as NumPy
        objects."""
        if name.startswith("__"):
            raise AttributeError(name)
        return _to_numpy(getattr(self._fn, name), self._backend)

    def __repr__(self) -> str:
        return f"NumPy callable of {self._fn!r}"


class LazyTensor:
    """A symbolic (*batch, M, N, D) array: KeOps's ``pykeops.numpy.LazyTensor`` (see the module docstring).

    ``LazyTensor(x)`` with x a NumPy array infers the kind of variable from its shape, as KeOps: (..., M, 1, D)
    an i-variable, (..., 1, N, D) a j-variable, (..., 1, 1, D), (D,) or 0-d a parameter; a 2-D (n, D) array
    needs ``axis=0`` (i) or ``axis=1`` (j), ``axis=2`` makes a (D,) array a parameter. A number, a NumPy number
    or a list of numbers is a parameter whose dtype is the formula's. The array is not copied: changing it
    changes the LazyTensor's later reductions.
    """

    __slots__ = ("_backend", "_lazy")
    __array_ufunc__ = None  # ``array * lazy``: NumPy defers to LazyTensor.__rmul__ (as KeOps's)
    __array_priority__ = 1000
    __hash__ = object.__hash__  # ``==`` builds a formula; a LazyTensor is hashed by identity

    def __new__(cls, x: Any = None, axis: int | None = None, is_complex: bool = False):
        complex_data = np.iscomplexobj(x) if isinstance(x, (np.ndarray, np.generic, complex)) else False
        wanted = is_complex or complex_data or (isinstance(x, LazyTensor) and x.is_complex)
        return object.__new__(ComplexLazyTensor if wanted else cls)

    def __init__(self, x: Any = None, axis: int | None = None, is_complex: bool = False) -> None:
        self._backend: str | None = x._backend if isinstance(x, LazyTensor) else None
        self._lazy: _lt.LazyTensor | _TorchComplex = _variable(x, axis, "LazyTensor(x)")
        if is_complex and not self._lazy.is_complex:
            self._lazy = _TorchComplex.lift(self._lazy)

    @classmethod
    def _wrap(cls, lazy: _lt.LazyTensor | _TorchComplex, backend: str | None = None) -> LazyTensor:
        out = object.__new__(ComplexLazyTensor if lazy.is_complex else LazyTensor)
        out._lazy, out._backend = lazy, backend
        return out

    @property
    def is_complex(self) -> bool:
        """Whether the formula is complex (a ComplexLazyTensor)."""
        return self._lazy.is_complex

    # ------------------------------------------------------------ what KeOps shows of a LazyTensor

    @property
    def dtype(self) -> np.dtype | None:
        """The NumPy dtype of the formula's arrays; None while it has none (numbers only)."""
        dtype = self._lazy.dtype if self._lazy.is_complex else (None if self._lazy.deferred else self._lazy.dtype)
        return None if dtype is None else _NUMPY_DTYPES[dtype]

    @property
    def _shape(self) -> tuple[int, ...]:
        """(*batch, M, N, D), D included even when 1."""
        return tuple(self._lazy.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """(*batch, M, N) when the vector dimension D is 1 (a matrix: scipy's LinearOperator shape), else
        (*batch, M, N, D)."""
        s = self._shape
        return s[:-1] if s[-1] == 1 else s

    @property
    def ndim(self) -> int:
        """The vector dimension D (KeOps's ``ndim``; the number of axes is ``dim()``)."""
        return self._shape[-1]

    def dim(self) -> int:
        """The number of axes of ``_shape``: (*batch, M, N, D)."""
        return len(self._shape)

    @property
    def nbatchdims(self) -> int:
        return self._lazy.nbatchdims

    @property
    def backend(self) -> str | None:
        """The backend of this LazyTensor's reductions when they are not given ``backend=`` (None: automatic)."""
        return self._backend

    @backend.setter
    def backend(self, value: str | None) -> None:
        if value is not None and value not in BACKENDS:
            raise ValueError(f"LazyTensor.backend = {value!r}: expected None or one of {list(BACKENDS)}")
        self._backend = value

    @property
    def ranges(self) -> tuple[np.ndarray, ...] | None:
        """KeOps's block-sparsity pattern (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i), integer
        arrays, used by this LazyTensor's reductions without ``ranges=``; None: dense."""
        ranges = self._lazy.ranges
        return None if ranges is None else _to_numpy(tuple(ranges), None)

    @ranges.setter
    def ranges(self, value: Any) -> None:
        if value is not None and not (isinstance(value, (tuple, list)) and len(value) == 6):
            raise TypeError(f"LazyTensor.ranges: expected None or KeOps's 6-tuple of integer arrays, got {value!r}")
        self._lazy.ranges = None if value is None else tuple(_to_torch(tuple(value), "LazyTensor.ranges"))

    @property
    def variables(self) -> list[np.ndarray]:
        """The arrays of the formula's variables (views of the arrays it was made of)."""
        return [_to_numpy(t, None) for t in self._lazy.variables if t is not None]

    @property
    def T(self) -> LazyTensor:
        """The transpose: i-variables become j-variables and the other way round."""
        return self._wrap(self._lazy.T, self._backend)

    def __repr__(self) -> str:
        dtype = "no dtype yet" if self.dtype is None else f"dtype {self.dtype}"
        return f"NumPy LazyTensor of shape {self.shape}, {dtype}: {self._lazy.formula!r}"

    # ------------------------------------------------------------ linear operator (scipy.sparse.linalg)

    def __matmul__(self, v: np.ndarray, **kwargs: Any) -> np.ndarray:
        """sum_j K_ij v_j for a scalar formula K = self and an array v of shape (..., N, E): (..., M, E); v of
        shape (N,) gives (..., M). ``kwargs``: KeOps's reduction options (``out=`` an array, written in place)."""
        if not isinstance(v, np.ndarray):
            raise TypeError(f"@: the right operand must be a NumPy array (..., N, E) or (N,), got {type(v).__name__}")
        dtype = self.dtype
        if dtype is not None and v.dtype != dtype:
            raise TypeError(
                f"@: v of shape {v.shape} is {v.dtype}, the LazyTensor of shape {self.shape} is {dtype}; convert v "
                f"with v.astype({str(dtype)!r})"
            )
        return self._forward("__matmul__", (v,), kwargs)

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """``self @ v``: scipy.sparse.linalg's LinearOperator protocol (v of shape (N,) or (N, 1))."""
        return self @ v

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        """``self.T @ v`` (v of shape (M,) or (M, 1))."""
        return self.T @ v

    # ------------------------------------------------------------ everything else: forwarded

    def _forward(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The torch LazyTensor's method ``name`` called with these arguments as torch objects, its result as NumPy
        objects; this LazyTensor's backend given to methods that take reduction options, unless they have one.
        A LazyTensor result keeps its operands' backend and ranges (KeOps's rule; the transpose swaps its own)."""
        if self._backend is not None and name in _TAKES_OPTIONS and "backend" not in kwargs:
            kwargs = {**kwargs, "backend": self._backend}
        result = _call(getattr(self._lazy, name), args, kwargs, name, self._backend)
        if isinstance(result, LazyTensor) and name != "t":
            _inherit(result, [self, *_operands(args)], name)
        return result


class ComplexLazyTensor(LazyTensor):
    """A complex symbolic array (KeOps's ``pykeops.numpy.ComplexLazyTensor``): ``ComplexLazyTensor(z)`` of a
    complex array z as LazyTensor takes a real one, or of a real one (zero imaginary part). ``LazyTensor(z)``
    of a complex array, and any LazyTensor combined with a complex operand, is one too. Its reductions give
    complex arrays; ``real``, ``imag``, ``abs()``, ``angle()`` give real LazyTensors (semiring_ops.lazy.complex)."""

    __slots__ = ()

    def __init__(self, x: Any = None, axis: int | None = None, is_complex: bool = True) -> None:
        super().__init__(x, axis, is_complex=True)

    @property
    def real(self) -> LazyTensor:
        return self._wrap(self._lazy.real, self._backend)

    @property
    def imag(self) -> LazyTensor:
        return self._wrap(self._lazy.imag, self._backend)

    def conj(self) -> LazyTensor:
        return self._forward("conj", (), {})

    def angle(self) -> LazyTensor:
        return self._forward("angle", (), {})


def _operands(args: Any) -> list[LazyTensor]:
    """The NumPy LazyTensors among args (inside tuples and lists too)."""
    if isinstance(args, LazyTensor):
        return [args]
    if isinstance(args, (tuple, list)):
        return [lazy for a in args for lazy in _operands(a)]
    return []


def _same_ranges(a: tuple, b: tuple) -> bool:
    return a is b or all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _inherit(result: LazyTensor, operands: list[LazyTensor], what: str) -> None:
    """Gives ``result`` (made from ``operands``) the backend and the ranges its operands have, as KeOps's
    LazyTensors do; operands with different ones raise ValueError."""
    for name, get, same in (
        ("backend", lambda lazy: lazy._backend, lambda a, b: a == b),
        ("ranges", lambda lazy: lazy._lazy.ranges, _same_ranges),
    ):
        found = [v for v in map(get, operands) if v is not None]
        if not found:
            continue
        if any(not same(found[0], v) for v in found[1:]):
            raise ValueError(f"{what}: the operands have different {name}: {found[0]!r:.80} and another")
        if name == "backend":
            result._backend = found[0]
        elif result._lazy.ranges is None:
            result._lazy.ranges = found[0]


def _takes_options(fn: Any) -> bool:
    """Whether a method of the torch LazyTensor takes keyword options (**kwargs): the reductions."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _forwarder(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The NumPy LazyTensor's method ``name``: the torch LazyTensor's ``fn`` on converted arguments."""

    @functools.wraps(fn)
    def method(self: LazyTensor, *args: Any, **kwargs: Any) -> Any:
        return self._forward(name, args, kwargs)

    return method


def _static_forwarder(fn: Callable[..., Any]) -> staticmethod:
    """A static method of the torch LazyTensor (``cat``, ``concatenate``) on NumPy LazyTensors."""

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        result = _call(fn, args, kwargs, fn.__name__, None)
        if isinstance(result, LazyTensor):
            _inherit(result, _operands(args), fn.__name__)
        return result

    return staticmethod(method)


def _property_forwarder(name: str, prop: property) -> property:
    """A read-only property of the torch LazyTensor (``symbolic_variables``), its value converted."""
    return property(lambda self: _to_numpy(getattr(self._lazy, name), self._backend), doc=prop.__doc__)


def _install_forwarders() -> frozenset[str]:
    """Adds to LazyTensor every public method and property of the torch LazyTensor (and its operators) that
    LazyTensor does not define itself; returns the names of the methods that take reduction options."""
    takes = set()
    for name, value in vars(_lt.LazyTensor).items():
        public = not name.startswith("_") or name in _FORWARDED_DUNDERS
        if not public or name in vars(LazyTensor):
            continue
        if isinstance(value, property):
            setattr(LazyTensor, name, _property_forwarder(name, value))
        elif isinstance(value, staticmethod):
            setattr(LazyTensor, name, _static_forwarder(value.__func__))
        elif isinstance(value, types.FunctionType):
            setattr(LazyTensor, name, _forwarder(name, value))
            if _takes_options(value):
                takes.add(name)
    return frozenset(takes | {"__matmul__"})


_TAKES_OPTIONS = _install_forwarders()


# ---------------------------------------------------------------- construction


def _parameter_vector(values: list, what: str) -> _lt.LazyTensor:
    """A list of numbers as a parameter of dimension len(values) whose dtype is the formula's (KeOps's lists)."""
    if not values or not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        raise TypeError(f"{what}: a list makes a parameter vector of numbers, got {values!r}")
    return _lt.LazyTensor([float(v) for v in values])


def _variable(x: Any, axis: int | None, what: str) -> _lt.LazyTensor:
    """The torch LazyTensor of ``LazyTensor(x, axis)`` (see LazyTensor's docstring)."""
    if isinstance(x, LazyTensor):
        return _lt.LazyTensor(x._lazy)  # a copy: setting its ranges leaves x's alone
    if isinstance(x, list):
        return _parameter_vector(x, what)
    if isinstance(x, np.ndarray) and axis == 2:
        return _lt.Pm(_tensor(x))
    x = _to_torch(x, what)
    return _lt.LazyTensor(x) if axis is None else _lt.LazyTensor(x, axis)


def _indexed(factory: Callable[..., _lt.LazyTensor], x_or_ind: Any, dim: int | None, what: str) -> LazyTensor:
    """Vi / Vj / Pm of an array, or of (ind, dim): a symbolic variable, given its array when the reduction is
    called."""
    if dim is not None:
        return LazyTensor._wrap(factory(x_or_ind, dim))
    return LazyTensor._wrap(factory(_to_torch(x_or_ind, what)))


def Vi(x_or_ind: Any, dim: int | None = None) -> LazyTensor:
    """An i-variable from an array of shape (..., M, D); ``Vi(ind, dim)``: a symbolic one, where the torch front
    end has them."""
    return _indexed(_lt.Vi, x_or_ind, dim, "Vi(x)")


def Vj(x_or_ind: Any, dim: int | None = None) -> LazyTensor:
    """A j-variable from an array of shape (..., N, D); ``Vj(ind, dim)``: a symbolic one, where the torch front
    end has them."""
    return _indexed(_lt.Vj, x_or_ind, dim, "Vj(x)")


def Pm(x_or_ind: Any, dim: int | None = None) -> LazyTensor:
    """A parameter from a number (its dtype the formula's), a list of numbers, or an array of shape (D,) or ()."""
    if isinstance(x_or_ind, list) and dim is None:
        return LazyTensor._wrap(_parameter_vector(x_or_ind, "Pm(x)"))
    return _indexed(_lt.Pm, x_or_ind, dim, "Pm(x)")
