"""KeOps' symbolic variables and callable reductions (``call=False``) for the LazyTensor.

    from semiring_ops.lazy import LazyTensor, Vi, Vj, Pm
    x, y, b, s = Vi(0, 3), Vj(1, 3), Vj(2, 4), Pm(3, 1)   # (index, dimension): tensors given later
    gauss = ((-x.sqdist(y) / s).exp() * b).sum(dim=1)      # a callable: nothing to reduce yet
    out = gauss(x_data, y_data, b_data, s_data)            # (M, 4): the argument k is variable k's tensor
    fun = (Vi(x_data) * Vj(y_data)).sum(dim=1, call=False) # a callable of the tensors it holds: fun()

A symbolic variable ``Vi(k, D)`` / ``Vj(k, D)`` / ``Pm(k, D)`` (also ``LazyTensor((k, D, cat))``, cat 0, 1 or 2)
is a :class:`~semiring_ops.lazy.formula.Var` of its category and dimension whose tensor is a placeholder, one
per index k (so ``Vi(0, 3)`` written twice is one variable, as in KeOps). A reduction of a LazyTensor holding
one, or any reduction called with ``call=False``, returns a :class:`ReducedLazyTensor` instead of a tensor:
calling it with one tensor per index (positionally, index k the k-th argument) substitutes them for the
placeholders and runs the reduction, with autograd, on the data given. Its axis is resolved when it is made,
so a batch of the tensors given later does not change which of i and j it reduces.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .formula import Formula, Var, substitute, variables

if TYPE_CHECKING:
    from .lazy_tensor import LazyTensor

__all__ = ["ReducedLazyTensor", "deferrable", "is_placeholder", "symbolic_var", "symbolic_variables"]

CATEGORIES = ("i", "j", "p")  # KeOps' cat 0, 1, 2
_NAMES = {"i": "Vi", "j": "Vj", "p": "Pm"}

_lock = threading.Lock()
_placeholders: dict[int, torch.Tensor] = {}  # index -> its placeholder tensor (kept forever: a handful)
_index_of: dict[int, int] = {}  # id(placeholder) -> index (the placeholders never die, so their ids stay theirs)


def _placeholder(index: int) -> torch.Tensor:
    """The placeholder tensor (empty, never read) standing for the tensor of symbolic variable ``index``."""
    t = _placeholders.get(index)
    if t is None:
        with _lock:
            t = _placeholders.get(index)
            if t is None:
                t = torch.empty(0)
                _placeholders[index] = t
                _index_of[id(t)] = index
    return t


def is_placeholder(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is the placeholder of a symbolic variable."""
    return t is not None and id(t) in _index_of and _placeholders[_index_of[id(t)]] is t


def _index(v: Var) -> int | None:
    """The index of a symbolic variable node, None for a variable of a tensor."""
    return _index_of[id(v.tensor)] if is_placeholder(v.tensor) else None


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def symbolic_var(index: Any, dim: Any, cat: Any, what: str) -> Var:
    """The formula leaf of KeOps' symbolic variable (index, dim, cat): index >= 0, dim >= 1 and cat 0 (i), 1 (j) or
    2 (a parameter), all ints; a ValueError naming ``what`` otherwise."""
    if not (_int(index) and _int(dim) and _int(cat)):
        raise ValueError(f"{what}: a symbolic variable is (index, dim, cat), three ints; got {(index, dim, cat)!r}")
    if index < 0 or dim < 1 or cat not in (0, 1, 2):
        raise ValueError(
            f"{what}: a symbolic variable needs index >= 0, dim >= 1 and cat 0 (i), 1 (j) or 2 (parameter); got "
            f"({index}, {dim}, {cat})"
        )
    return Var(CATEGORIES[cat], dim, tensor=_placeholder(index))


def _signature(formulas: list[Formula]) -> dict[int, tuple[str, int]]:
    """index -> (category, dimension) of the symbolic variables of the formulas; an index used with two
    categories or dimensions raises ValueError."""
    found: dict[int, tuple[str, int]] = {}
    for f in formulas:
        for v in variables(f):
            k = _index(v)
            if k is None:
                continue
            seen = found.setdefault(k, (v.cat, v.dim))
            if seen != (v.cat, v.dim):
                raise ValueError(
                    f"symbolic variable {k} is used as {_NAMES[seen[0]]}({k}, {seen[1]}) and as "
                    f"{_NAMES[v.cat]}({k}, {v.dim}); one index is one variable"
                )
    return dict(sorted(found.items()))


def symbolic_variables(formula: Formula) -> tuple[tuple[int, int, int], ...]:
    """KeOps' ``symbolic_variables`` of a formula: its (index, dim, cat) triples, by index."""
    return tuple((k, d, CATEGORIES.index(c)) for k, (c, d) in _signature([formula]).items())


def _describe(sig: dict[int, tuple[str, int]]) -> str:
    return ", ".join(f"{_NAMES[c]}({k}, {d})" for k, (c, d) in sig.items())


# ---------------------------------------------------------------- filling in the tensors


def _checked(t: Any, cat: str, dim: int, what: str) -> torch.Tensor:
    """t as the tensor of a variable of category ``cat`` and dimension ``dim``: (..., n, dim) for i and j, (dim,)
    (or (..., dim), or 0-d for dim 1) for a parameter."""
    from .lazy_tensor import _check_dtype

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
    _check_dtype(t, what)
    if cat == "p" and t.dim() == 0 and dim == 1:
        return t.reshape(1)
    need = 1 if cat == "p" else 2
    if t.dim() < need or t.shape[-1] != dim:
        form = f"(..., {'M' if cat == 'i' else 'N'}, {dim})" if cat != "p" else f"({dim},)"
        raise ValueError(f"{what}: the tensor must have shape {form}, got {tuple(t.shape)}")
    return t


def instantiate(
    lazy: LazyTensor, by_index: dict[int, torch.Tensor], swaps: list[tuple[torch.Tensor, torch.Tensor]], what: str
) -> LazyTensor:
    """``lazy`` with the tensor ``by_index[k]`` for its symbolic variable k, and ``new`` for each tensor ``old``
    of ``swaps`` (compared with ``is``): a LazyTensor of tensors only, its sizes, batch, device and dtype
    those of the tensors (checked against each other, as an operation checks its operands); its deferred
    numbers (``Pm(2.0)``) take their dtype and device. Keeps ``lazy.ranges``."""
    from .lazy_tensor import LazyTensor, _materialise, _Number

    def fill(v: Var) -> Formula:
        k = _index(v)
        if k is not None:
            label = f"{what}: argument {k} ({_NAMES[v.cat]}({k}, {v.dim}))"
            return Var(v.cat, v.dim, tensor=_checked(by_index[k], v.cat, v.dim, label))
        for old, new in swaps:
            if old is v.tensor:
                label = f"{what}: the tensor of shape {tuple(old.shape)} ({_NAMES[v.cat]} of dimension {v.dim})"
                return Var(v.cat, v.dim, tensor=_checked(new, v.cat, v.dim, label))
        return v

    formula = substitute(lazy.formula, fill) if by_index or swaps else lazy.formula
    found = variables(formula)
    parts = []
    for v in found:
        if not isinstance(v, _Number):
            part = LazyTensor.__new__(LazyTensor)
            part._variable(v.tensor, v.cat)
            parts.append(part)
    if not parts:
        out = LazyTensor._make(formula, lazy.batch, None, None, lazy.device, lazy.dtype, lazy.deferred)
    else:
        batch, n_i, n_j, device, dtype, _ = parts[0]._join(parts[1:], what)
        if any(isinstance(v, _Number) for v in found):
            formula = _materialise(formula, dtype, device)
        out = LazyTensor._make(formula, batch, n_i, n_j, device, dtype)
    out.ranges = lazy.ranges
    return out


# ---------------------------------------------------------------- callable reductions


def _symbolic_argument(lazy: type, args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether a LazyTensor (of class ``lazy``) among the arguments holds a symbolic variable (weights, b). Loops,
    not generators: this runs on every reduction."""
    for a in args:
        if type(a) is lazy and a.symbolic:
            return True
    if kwargs:
        for a in kwargs.values():
            if type(a) is lazy and a.symbolic:
                return True
    return False


def _lazies(args: tuple, kwargs: dict[str, Any]) -> list[LazyTensor]:
    from .lazy_tensor import LazyTensor

    return [a for a in (*args, *kwargs.values()) if isinstance(a, LazyTensor)]


class ReducedLazyTensor:
    """A reduction to be run later: KeOps' callable LazyTensor (a reduction of symbolic variables, or one made
    with ``call=False``).

    ``f(*tensors, **options)`` runs it: ``tensors[k]`` is the tensor of symbolic variable k ((..., M, D) for
    ``Vi(k, D)``, (..., N, D) for ``Vj(k, D)``, (D,) for ``Pm(k, D)``), one per index 0 .. n - 1 (none without
    symbolic variables); ``options`` are reduction options (``backend=``, ``out=``, ...) added to those it was
    made with. ``f.callfun(*all_tensors)`` also takes the formula's own tensors, after the symbolic ones, in the
    order of ``f.variables`` (KeOps' Genred-like function). Gradients flow to every tensor, as for any
    reduction."""

    __slots__ = ("_args", "_kwargs", "_lazy", "_method", "_over", "_signature", "name")

    def __init__(self, lazy: LazyTensor, method: Callable[..., Any], args: tuple, kwargs: dict[str, Any], over: str):
        self._lazy, self._method, self._args, self._kwargs, self._over = lazy, method, args, kwargs, over
        self.name: str = method.__name__
        self._signature = _signature([x.formula for x in (lazy, *_lazies(args, kwargs))])

    @property
    def symbolic_variables(self) -> tuple[tuple[int, int, int], ...]:
        """The (index, dim, cat) of the symbolic variables, by index (KeOps' attribute)."""
        return tuple((k, d, CATEGORIES.index(c)) for k, (c, d) in self._signature.items())

    @property
    def nargs(self) -> int:
        """The number of tensors a call takes: the largest symbolic index plus one (0 without any)."""
        return max(self._signature, default=-1) + 1

    @property
    def variables(self) -> list[torch.Tensor]:
        """The tensors the formula (and its LazyTensor arguments: weights, right-hand sides) holds, each once."""
        out: list[torch.Tensor] = []
        for x in (self._lazy, *_lazies(self._args, self._kwargs)):
            for v in variables(x.formula):
                if not is_placeholder(v.tensor) and not any(v.tensor is t for t in out):
                    out.append(v.tensor)
        return out

    def __call__(self, *tensors: torch.Tensor, **options: Any) -> Any:
        """The reduction of the formula with ``tensors[k]`` for symbolic variable k (see the class docstring)."""
        if len(tensors) != self.nargs:
            wanted = f"one per symbolic variable: {_describe(self._signature)}" if self._signature else "none"
            raise TypeError(f"{self!r} takes {self.nargs} tensors ({wanted}), got {len(tensors)}")
        return self._run(dict(enumerate(tensors)), [], options)

    @property
    def callfun(self) -> Callable[..., Any]:
        """The reduction as a function of all its tensors: the symbolic variables' (by index), then the formula's
        own (``variables``, in order), then options: ``f.callfun(*tensors, *f.variables)`` is ``f(*tensors)``."""
        return _CallFun(self)

    def _run(self, by_index: dict, swaps: list, options: dict[str, Any]) -> Any:
        what = f"{self.name}(...)"

        def fill(x: Any) -> Any:
            from .lazy_tensor import LazyTensor

            if isinstance(x, LazyTensor) and (by_index or swaps):
                return instantiate(x, by_index, swaps, what)
            return x

        args = [fill(a) for a in self._args]
        kwargs = {k: fill(v) for k, v in self._kwargs.items()} | options
        return self._method(fill(self._lazy), *args, **kwargs)

    def __repr__(self) -> str:
        over = {"i": " over i", "j": " over j"}.get(self._over, "")
        symbols = f"; symbolic variables {_describe(self._signature)}" if self._signature else ""
        return f"ReducedLazyTensor({self.name}{over} of {self._lazy.describe()}{symbols}: {self._lazy.formula!r})"

    __str__ = __repr__


class _CallFun:
    """ReducedLazyTensor.callfun: the reduction as a function of all of its tensors."""

    __slots__ = ("_reduced",)

    def __init__(self, reduced: ReducedLazyTensor) -> None:
        self._reduced = reduced

    def __call__(self, *tensors: torch.Tensor, **options: Any) -> Any:
        r = self._reduced
        own = r.variables
        if len(tensors) != r.nargs + len(own):
            raise TypeError(
                f"{self!r} takes {r.nargs + len(own)} tensors ({r.nargs} for the symbolic variables, then "
                f"{len(own)} for the formula's own), got {len(tensors)}"
            )
        swaps = list(zip(own, tensors[r.nargs :], strict=True))
        return r._run(dict(enumerate(tensors[: r.nargs])), swaps, options)

    def __repr__(self) -> str:
        return f"callfun of {self._reduced!r}"


# ---------------------------------------------------------------- the decorator of the reductions


def deferrable(vector_default: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator of the LazyTensor's reductions: ``call=False``, or a symbolic variable in the LazyTensor or
    among the LazyTensor arguments, makes the call return a :class:`ReducedLazyTensor` (with its axis resolved
    now), except over the vector dimension (a LazyTensor then, as in KeOps). ``vector_default``: without an axis
    (no positional argument, no dim= / axis=), reduce the vector dimension (KeOps' ``axis=-1`` default of sum,
    min, max, argmin and argmax). The common call (no symbolic variable, no call=) costs a few dict lookups."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        # no inspect.Signature in the closure: torch.compile traces the common call through it and cannot hold one
        takes_axis = "dim" in inspect.signature(method).parameters

        @functools.wraps(method)
        def reduction(self: LazyTensor, *args: Any, **kwargs: Any) -> Any:
            if vector_default and not args and kwargs.get("dim") is None and kwargs.get("axis") is None:
                kwargs["dim"] = -1
                kwargs.pop("axis", None)
            call = kwargs.pop("call", True) if "call" in kwargs else True
            if call is True and not self.symbolic and not _symbolic_argument(type(self), args, kwargs):
                return method(self, *args, **kwargs)
            if not isinstance(call, bool):
                raise TypeError(f"{method.__name__}: call must be True or False, got {call!r}")
            try:
                bound = inspect.signature(method).bind(self, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{method.__name__}: {exc}") from None
            over = ""
            if takes_axis:
                dim, axis = bound.arguments.get("dim"), bound.arguments.get("axis")
                over = self._axis(dim, axis, method.__name__)
                if over == "vector":  # not a reduction: the LazyTensor of the vector's sum / max / ...
                    return method(self, *args, **kwargs)
                bound.arguments["dim"], bound.arguments["axis"] = (-3 if over == "i" else -2), None
            return ReducedLazyTensor(self, method, bound.args[1:], bound.kwargs, over)

        return reduction

    return wrap
