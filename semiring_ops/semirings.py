"""The semirings, defined once in Python (their C++ twins live in csrc/semiring.h).

A semiring is a class with class-level operations, in the style of torch-struct, so it can be passed
around as a value (``semiring=LogSemiring``) and structures can be written once, generic over it::

    S = LogSemiring
    S.zero, S.one              # identities of plus and times, as Python floats
    S.plus(x, y)               # elementwise semiring sum
    S.times(x, y)              # elementwise semiring product
    S.sum(x, dim)              # semiring sum over a dimension
    S.matmul(a, b)             # (..., n, k) (x) (..., k, m) -> (..., n, m) on this project's kernels

``kernel_id`` names the C++ struct (``kId``) that implements the semiring in the compiled kernels;
a user-defined semiring with ``kernel_id = None`` still works everywhere, through the blocked
PyTorch reference path.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from .hooks import Hook

# The semiring matrix product behind Semiring.matmul (ops/matmul.py installs semiring_matmul, a layer above).
semiring_matmul = Hook("Semiring.matmul", "semiring_ops.ops.matmul")

__all__ = [
    "SEMIRINGS",
    "LogSemiring",
    "MaxSemiring",
    "MinSemiring",
    "Semiring",
    "StdSemiring",
    "resolve_semiring",
]


class Semiring:
    """Base class. Subclasses set the class attributes and implement plus / times / sum."""

    name: ClassVar[str]
    zero: ClassVar[float]
    one: ClassVar[float]
    kernel_id: ClassVar[int | None] = None
    selects: ClassVar[bool] = False
    """True when plus picks one of its operands (max, min): such semirings have an argmax and their
    gradient flows to the selected term only."""

    lead: ClassVar[int] = 0
    """How many leading dimensions a value carries besides the potentials' own (0 here; KMax(k): one, of size k;
    the entropy semiring: one, of size 2). Structures index their charts from the right (``x[..., i]``, negative
    dims), so the same dynamic program runs over values of any lead."""

    def __init__(self) -> None:  # pragma: no cover - guard
        raise TypeError(f"{type(self).__name__} is used as a class, not instantiated")

    @staticmethod
    def plus(x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def sum(x: Tensor, dim: int = -1) -> Tensor:
        raise NotImplementedError

    @classmethod
    def matmul(cls, a: Tensor, b: Tensor) -> Tensor:
        """Semiring matrix product with torch.matmul's shape rules: (..., n, k), (..., k, m) -> (..., n, m)."""
        return semiring_matmul(a, b, semiring=cls)

    @classmethod
    def convert(cls, potentials: Tensor) -> Tensor:
        """Potentials (*shape) as semiring values (*lead sizes, *shape)."""
        return potentials

    @classmethod
    def unconvert(cls, value: Tensor) -> Tensor:
        """A structure's result (*lead sizes, B) back as what the semiring reports (here: itself)."""
        return value

    @classmethod
    def zeros(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Values (*lead sizes, *shape) equal to the semiring's zero, with ``like``'s dtype and device."""
        return torch.full(shape, cls.zero, dtype=like.dtype, device=like.device)

    @classmethod
    def ones(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Values (*lead sizes, *shape) equal to the semiring's one."""
        return torch.full(shape, cls.one, dtype=like.dtype, device=like.device)

    @classmethod
    def mask(cls, keep: Tensor, x: Tensor) -> Tensor:
        """x where ``keep`` (a bool tensor broadcast against x's trailing dims), the semiring's zero elsewhere."""
        return torch.where(keep, x, cls.zeros((1,) * (x.dim() - cls.lead), like=x))

    @classmethod
    def dot(cls, a: Tensor, b: Tensor) -> Tensor:
        """(+)_i a[..., i] (x) b[..., i]: the semiring inner product over the last dim."""
        return cls.sum(cls.times(a, b), -1)

    @classmethod
    def identity(cls, n: int, *, dtype: torch.dtype | None = None, device=None) -> Tensor:
        """The (n, n) identity matrix of this semiring: ``one`` on the diagonal, ``zero`` elsewhere."""
        eye = torch.full((n, n), cls.zero, dtype=dtype, device=device)
        return eye.fill_diagonal_(cls.one)


class LogSemiring(Semiring):
    """(logsumexp, +): sums of probabilities in log space. Its gradient gives marginals."""

    name = "log"
    zero = -math.inf
    one = 0.0
    kernel_id = 0

    @staticmethod
    def plus(x: Tensor, y: Tensor) -> Tensor:
        return torch.logaddexp(x, y)

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    @staticmethod
    def sum(x: Tensor, dim: int = -1) -> Tensor:
        """logsumexp over ``dim``, whose gradient is 0 (not NaN) where every term is -inf."""
        return _SafeLogSumExp.apply(x, dim)


class _SafeLogSumExp(torch.autograd.Function):
    """torch.logsumexp with the gradient exp(x - out) taken as 0 where out = -inf (all terms -inf: torch's own
    gives exp(-inf - -inf) = NaN). The backward is made of differentiable operations on the input and the
    saved output, so second derivatives work too."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        out = torch.logsumexp(x, dim=dim)
        ctx.dim = dim
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, out = ctx.saved_tensors
        dim = ctx.dim if ctx.dim >= 0 else ctx.dim + x.dim()
        out_k = out.unsqueeze(dim)
        safe = torch.where(torch.isneginf(out_k), torch.zeros_like(out_k), out_k)  # x - safe = -inf there: weight 0
        return grad.unsqueeze(dim) * (x - safe).exp(), None


class MaxSemiring(Semiring):
    """(max, +): Viterbi. Its gradient is the indicator of the best path."""

    name = "max"
    zero = -math.inf
    one = 0.0
    kernel_id = 1
    selects = True

    @staticmethod
    def plus(x: Tensor, y: Tensor) -> Tensor:
        return torch.maximum(x, y)

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    @staticmethod
    def sum(x: Tensor, dim: int = -1) -> Tensor:
        """max over ``dim``; its gradient goes to one term, the first of tied maxima (the kernels' rule), and
        is 0 where every term is -inf."""
        return _select(x, dim, largest=True) if x.size(dim) else _empty_reduce(x, dim, -math.inf)


class MinSemiring(Semiring):
    """(min, +): shortest paths, edit distances."""

    name = "min"
    zero = math.inf
    one = 0.0
    kernel_id = 2
    selects = True

    @staticmethod
    def plus(x: Tensor, y: Tensor) -> Tensor:
        return torch.minimum(x, y)

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    @staticmethod
    def sum(x: Tensor, dim: int = -1) -> Tensor:
        """min over ``dim``; its gradient goes to the first of tied minima, and is 0 where every term is +inf."""
        return _select(x, dim, largest=False) if x.size(dim) else _empty_reduce(x, dim, math.inf)


class StdSemiring(Semiring):
    """(+, x): the ordinary ring of real numbers; its matmul is torch.matmul."""

    name = "std"
    zero = 0.0
    one = 1.0
    kernel_id = 3

    @staticmethod
    def plus(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        return x * y

    @staticmethod
    def sum(x: Tensor, dim: int = -1) -> Tensor:
        return torch.sum(x, dim=dim)


def _select(x: Tensor, dim: int, largest: bool) -> Tensor:
    """max (min) over ``dim`` whose gradient reaches one term, the first of tied extrema (torch.max / torch.min
    with a dim), and none where the extremum is the semiring's zero (every term -inf / +inf)."""
    value = (x.max(dim) if largest else x.min(dim)).values
    empty = torch.isneginf(value) if largest else torch.isposinf(value)
    return torch.where(empty, value.detach(), value)


def _empty_reduce(x: Tensor, dim: int, value: float) -> Tensor:
    shape = list(x.shape)
    del shape[dim]
    return x.new_full(shape, value)


SEMIRINGS: dict[str, type[Semiring]] = {s.name: s for s in (LogSemiring, MaxSemiring, MinSemiring, StdSemiring)}


def resolve_semiring(semiring: str | type[Semiring]) -> type[Semiring]:
    """Accepts a name ("log", "max", "min", "std") or a Semiring subclass."""
    if isinstance(semiring, str):
        try:
            return SEMIRINGS[semiring]
        except KeyError:
            raise ValueError(
                f"semiring={semiring!r} is not one of {sorted(SEMIRINGS)} (or pass a Semiring subclass)"
            ) from None
    if isinstance(semiring, type) and issubclass(semiring, Semiring) and semiring is not Semiring:
        return semiring
    raise TypeError(f"semiring must be a name in {sorted(SEMIRINGS)} or a Semiring subclass, got {semiring!r}")
