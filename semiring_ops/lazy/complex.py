"""Complex LazyTensors (KeOps' ``ComplexLazyTensor``): a complex formula as its real and imaginary parts.

A :class:`ComplexLazyTensor` holds two real LazyTensors, ``re`` and ``im``, either of which may be None for a
part that is exactly zero (``x.real2complex()``, ``1j * x``, so ``(1j * x).exp()`` costs a cosine and a sine,
as KeOps' exp1j). Complex arithmetic is written with the real operations, so the kernels, the symbolic
derivatives and torch.func need nothing of their own:

    (a + ib)(c + id) = (ac - bd) + i(ad + bc)        exp(a + ib) = e^a (cos b + i sin b)

A sum over i or j reduces ``re`` and ``im`` concatenated, in one kernel, and returns a complex tensor
(complex64 for float32 and 16-bit inputs, complex128 for float64), differentiable with respect to the complex
tensors the formula was made of (through their ``.real`` / ``.imag`` views). ``LazyTensor(z)`` of a complex
tensor, and any real LazyTensor combined with a complex number, tensor or LazyTensor, makes one.
"""

from __future__ import annotations

from typing import Any

import torch

from . import lazy_tensor as lt

__all__ = ["ComplexLazyTensor", "is_complex_operand"]

Part = lt.LazyTensor | None  # None: exactly zero


def is_complex_operand(x: Any) -> bool:
    """Whether x makes a real LazyTensor's operation complex: a complex number, tensor or LazyTensor."""
    return isinstance(x, (complex, ComplexLazyTensor)) or (isinstance(x, torch.Tensor) and x.is_complex())


def _add(a: Part, b: Part) -> Part:
    return b if a is None else a if b is None else a + b


def _sub(a: Part, b: Part) -> Part:
    return a if b is None else -b if a is None else a - b


def _mul(a: Part, b: Part) -> Part:
    return None if a is None or b is None else a * b


def _neg(a: Part) -> Part:
    return None if a is None else -a


def _number(x: float) -> Part:
    return None if x == 0 else lt.LazyTensor(x)


class ComplexLazyTensor:
    """A symbolic complex (*batch, M, N, D) tensor (module docstring).

    ``ComplexLazyTensor(z, axis=None)``: z a complex tensor, taken as ``LazyTensor`` takes a real one (its shape
    gives the variable kind), or a complex number (a parameter). Operations: ``+ - * /`` with complex or real
    LazyTensors, tensors and numbers, unary ``-``, ``conj``, ``exp``, ``real``, ``imag``, ``abs``, ``angle``,
    ``sum`` (over i or j: a complex tensor; over the vector dimension: a ComplexLazyTensor), ``@``, ``T``,
    ``dense``.
    """

    __slots__ = ("im", "re")
    __array_priority__ = 1000
    is_complex = True

    def __init__(self, z: Any = None, axis: int | None = None) -> None:
        if isinstance(z, ComplexLazyTensor):
            self.re, self.im = z.re, z.im
        elif isinstance(z, (complex, int, float)) and not isinstance(z, bool):
            z = complex(z)
            self.re, self.im = _number(z.real), _number(z.imag)
            if self.re is None and self.im is None:
                self.re = lt.LazyTensor(0.0)
        elif isinstance(z, torch.Tensor):
            if not z.is_complex():
                raise TypeError(f"ComplexLazyTensor(z): z must be a complex tensor, got {z.dtype} {tuple(z.shape)}")
            args = () if axis is None else (axis,)
            self.re, self.im = lt.LazyTensor(z.real, *args), lt.LazyTensor(z.imag, *args)
        else:
            raise TypeError(f"ComplexLazyTensor(z): z must be a complex tensor or number, got {type(z).__name__}")

    @classmethod
    def of(cls, re: Part, im: Part) -> ComplexLazyTensor:
        """The complex LazyTensor re + i im (None: a zero part; not both)."""
        out = cls.__new__(cls)
        out.re, out.im = (re, im) if (re is not None or im is not None) else (lt.LazyTensor(0.0), None)
        return out

    @classmethod
    def lift(cls, x: Any) -> ComplexLazyTensor:
        """x (a complex or real LazyTensor, tensor or number) as a complex LazyTensor."""
        if isinstance(x, ComplexLazyTensor):
            return x
        if isinstance(x, lt.LazyTensor):
            return cls.of(x, None)
        if isinstance(x, torch.Tensor) and not x.is_complex():
            return cls.of(lt.LazyTensor(x), None)
        return cls(x)

    # ------------------------------------------------------------ description

    def _whole(self) -> lt.LazyTensor:
        """A real LazyTensor with this one's batch, sizes, device and dtype (for its metadata only)."""
        return _add(self.re, self.im)  # type: ignore[return-value]

    @property
    def shape(self) -> tuple[int, ...]:
        """(*batch, M, N, D), D the number of complex components."""
        return self._whole().shape

    @property
    def _shape(self) -> tuple[int, ...]:
        return self.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return self.ndim

    @property
    def nbatchdims(self) -> int:
        return self._whole().nbatchdims

    @property
    def device(self) -> torch.device | None:
        return self._whole().device

    @property
    def dtype(self) -> torch.dtype | None:
        """complex64 (float32 and 16-bit parts) or complex128 (float64 parts); None for numbers only."""
        whole = self._whole()
        if whole.dtype is None or whole.deferred:
            return None
        return torch.complex128 if whole.dtype == torch.float64 else torch.complex64

    @property
    def deferred(self) -> bool:
        return self._whole().deferred

    @property
    def ranges(self) -> tuple | None:
        """KeOps' block-sparsity pattern of the reductions (see LazyTensor.ranges): the parts'."""
        return self._whole().ranges

    @ranges.setter
    def ranges(self, value: tuple | None) -> None:
        for part in (self.re, self.im):
            if part is not None:
                part.ranges = value

    @property
    def variables(self) -> list[torch.Tensor]:
        """The tensors of both parts' formulas, each once (a complex tensor z appears as z.real and z.imag)."""
        seen: dict[int, torch.Tensor] = {}
        for part in (self.re, self.im):
            for t in [] if part is None else part.variables:
                seen.setdefault(id(t), t)
        return list(seen.values())

    def __repr__(self) -> str:
        parts = f"re: {self.re!r}, im: {self.im!r}"
        return f"ComplexLazyTensor of shape {self.shape} ({parts})"

    # ------------------------------------------------------------ arithmetic

    def __add__(self, o: Any) -> ComplexLazyTensor:
        o = ComplexLazyTensor.lift(o)
        return self.of(_add(self.re, o.re), _add(self.im, o.im))

    __radd__ = __add__

    def __sub__(self, o: Any) -> ComplexLazyTensor:
        o = ComplexLazyTensor.lift(o)
        return self.of(_sub(self.re, o.re), _sub(self.im, o.im))

    def __rsub__(self, o: Any) -> ComplexLazyTensor:
        return ComplexLazyTensor.lift(o) - self

    def __mul__(self, o: Any) -> ComplexLazyTensor:
        o = ComplexLazyTensor.lift(o)
        a, b, c, d = self.re, self.im, o.re, o.im
        return self.of(_sub(_mul(a, c), _mul(b, d)), _add(_mul(a, d), _mul(b, c)))

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> ComplexLazyTensor:
        o = ComplexLazyTensor.lift(o)
        a, b, c, d = self.re, self.im, o.re, o.im
        if d is None:  # a real divisor
            return self.of(None if a is None else a / c, None if b is None else b / c)
        norm = _add(_mul(c, c), _mul(d, d))
        return self.of(
            _divide(_add(_mul(a, c), _mul(b, d)), norm),
            _divide(_sub(_mul(b, c), _mul(a, d)), norm),
        )

    def __rtruediv__(self, o: Any) -> ComplexLazyTensor:
        return ComplexLazyTensor.lift(o) / self

    def __neg__(self) -> ComplexLazyTensor:
        return self.of(_neg(self.re), _neg(self.im))

    def conj(self) -> ComplexLazyTensor:
        """The complex conjugate."""
        return self.of(self.re, _neg(self.im))

    def exp(self) -> ComplexLazyTensor:
        """e^re (cos im + i sin im)."""
        if self.im is None:
            return self.of(self.re.exp(), None)
        cos, sin = self.im.cos(), self.im.sin()
        if self.re is None:
            return self.of(cos, sin)
        scale = self.re.exp()
        return self.of(scale * cos, scale * sin)

    # ------------------------------------------------------------ real results

    def _zero(self) -> lt.LazyTensor:
        return self._whole() * 0.0

    @property
    def real(self) -> lt.LazyTensor:
        """The real part: a real LazyTensor."""
        return self._zero() if self.re is None else self.re

    @property
    def imag(self) -> lt.LazyTensor:
        """The imaginary part: a real LazyTensor."""
        return self._zero() if self.im is None else self.im

    def abs(self) -> lt.LazyTensor:
        """The modulus sqrt(re^2 + im^2)."""
        if self.re is None or self.im is None:
            return (self.re if self.im is None else self.im).abs()
        return (self.re.square() + self.im.square()).sqrt()

    __abs__ = abs

    def angle(self) -> lt.LazyTensor:
        """The argument atan2(im, re), in (-pi, pi]."""
        return self.imag.atan2(self.real)

    def real2complex(self) -> ComplexLazyTensor:
        raise ValueError("real2complex cannot be applied to a complex LazyTensor")

    def imag2complex(self) -> ComplexLazyTensor:
        raise ValueError("imag2complex cannot be applied to a complex LazyTensor")

    def exp1j(self) -> ComplexLazyTensor:
        raise ValueError("exp1j cannot be applied to a complex LazyTensor")

    # ------------------------------------------------------------ layout

    @property
    def T(self) -> ComplexLazyTensor:
        return self.of(None if self.re is None else self.re.T, None if self.im is None else self.im.T)

    def t(self) -> ComplexLazyTensor:
        return self.T

    def dense(self) -> torch.Tensor:
        """The formula at every (i, j): a complex (*batch, M, N, D) tensor."""
        re, im = self.real.dense(), self.imag.dense()
        re, im = torch.broadcast_tensors(_complex_part(re), _complex_part(im))
        return torch.complex(re, im)

    # ------------------------------------------------------------ reductions

    def sum(self, dim: int | None = None, axis: int | None = None, **kwargs: Any) -> Any:
        """The sum over i or j: a complex tensor (*batch, rows, D); over the vector dimension (-1, the default as
        in KeOps): a ComplexLazyTensor of one component. ``kwargs``: the reduction options of LazyTensor.sum."""
        whole = self._whole()
        if dim is None and axis is None:
            axis = -1
        if whole._axis(dim, axis, "sum") == "vector":
            return self.of(*(None if p is None else p.sum(-1) for p in (self.re, self.im)))
        d = whole.formula.dim
        if self.re is None or self.im is None:
            part = self.re if self.im is None else self.im
            res = part.sum(dim, axis, **kwargs)
            real = self.im is None
            return _Complexified(res, d, real) if callable(res) else _join(res, d, real)
        re, im = self.re, self.im
        if re.formula.dim != im.formula.dim:  # one part broadcast over the other's components: widen both
            re, im = re + im * 0.0, im + re * 0.0
        res = re.concat(im).sum(dim, axis, **kwargs)
        return _Complexified(res, d, None) if callable(res) else _split(res, d)

    sum_reduction = sum

    def __matmul__(self, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """sum_j K_ij v_j for a scalar complex formula K and a (complex or real) v of shape (N, E) or (N,)."""
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"@: the right operand must be a tensor (N, E) or (N,), got {type(v).__name__}")
        if self._whole().formula.dim != 1:
            raise ValueError(f"@ needs a scalar formula (vector dimension 1), got shape {self.shape}")
        if v.dim() not in (1, 2):
            raise ValueError(f"@: the right operand must have shape (N, E) or (N,), got {tuple(v.shape)}")
        column = v.dim() == 1
        col = v.unsqueeze(-1) if column else v
        vj = ComplexLazyTensor(col, axis=1) if col.is_complex() else lt.LazyTensor(col, axis=1)
        out = (self * vj).sum(1, **kwargs)
        return out.squeeze(-1) if column else out


def _divide(a: Part, b: lt.LazyTensor) -> Part:
    return None if a is None else a / b


def _complex_part(t: torch.Tensor) -> torch.Tensor:
    """A reduction's real values in a dtype torch.complex takes (16-bit ones as float32)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _split(res: torch.Tensor, d: int) -> torch.Tensor:
    """The values (..., 2D) of re and im concatenated as a complex tensor (..., D)."""
    res = _complex_part(res)
    return torch.complex(res[..., :d], res[..., d:])


def _join(res: torch.Tensor, d: int, real: bool) -> torch.Tensor:
    """The values (..., D) of the one part that is not zero as a complex tensor."""
    res = _complex_part(res)
    zero = torch.zeros_like(res)
    return torch.complex(res, zero) if real else torch.complex(zero, res)


class _Complexified:
    """A reduction of a complex formula made with ``call=False`` (or holding symbolic variables): calling it
    calls the real reduction and returns its values as a complex tensor."""

    __slots__ = ("_d", "_fn", "_real")

    def __init__(self, fn: Any, d: int, real: bool | None) -> None:
        self._fn, self._d, self._real = fn, d, real  # real: only the real part (True), the imaginary (False), both

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        res = self._fn(*args, **kwargs)
        return _split(res, self._d) if self._real is None else _join(res, self._d, self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


def real2complex(x: lt.LazyTensor) -> ComplexLazyTensor:
    """x + 0i."""
    return ComplexLazyTensor.of(x, None)


def imag2complex(x: lt.LazyTensor) -> ComplexLazyTensor:
    """0 + ix."""
    return ComplexLazyTensor.of(None, x)


def exp1j(x: lt.LazyTensor) -> ComplexLazyTensor:
    """exp(ix) = cos x + i sin x."""
    return ComplexLazyTensor.of(x.cos(), x.sin())


def complex_binary(x: lt.LazyTensor, other: Any, op: str, reflected: bool) -> ComplexLazyTensor:
    """A real LazyTensor's operation ``x op other`` (``other op x`` when reflected) with a complex operand."""
    a, b = ComplexLazyTensor.of(x, None), ComplexLazyTensor.lift(other)
    if reflected:
        a, b = b, a
    return _OPS[op](a, b)


_OPS = {
    "+": ComplexLazyTensor.__add__,
    "-": ComplexLazyTensor.__sub__,
    "*": ComplexLazyTensor.__mul__,
    "/": ComplexLazyTensor.__truediv__,
}


lt.register_complex(
    ComplexLazyTensor,
    is_complex_operand,
    complex_binary,
    {"real2complex": real2complex, "imag2complex": imag2complex, "exp1j": exp1j},
)
