"""LazyTensors of NumPy arrays, as KeOps's ``pykeops.numpy`` front end:

    from semiring_ops.lazy.numpy import LazyTensor, Vi, Vj, Pm     # was: from pykeops.numpy import ...

The same LazyTensor, its arrays wrapped as tensors without a copy (torch.from_numpy): NumPy arrays and numbers
combine with it on either side, ``K @ v`` takes an array, ``out=`` an array (written in place), and every
reduction returns NumPy arrays (values and int64 indices). The computation is the torch one (CPU kernels, or a
GPU with ``backend="GPU"`` / ``device_id=``, the result copied back); there is no autograd on arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import lazy_tensor as _lt

__all__ = ["LazyTensor", "Pm", "Vi", "Vj"]


def _tensor(x: Any) -> Any:
    """A NumPy array as a tensor sharing its memory (a copy only for negative strides), a NumPy number as a
    Python number; anything else as it is."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x if all(s >= 0 for s in x.strides) else np.ascontiguousarray(x))
    if isinstance(x, np.generic):
        return x.item()
    return x


def _array(x: Any) -> Any:
    """Tensors (alone or in a tuple) as NumPy arrays."""
    if isinstance(x, tuple):
        return tuple(_array(t) for t in x)
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


class LazyTensor(_lt.LazyTensor):
    """A LazyTensor built from NumPy arrays, whose reductions return NumPy arrays (see the module docstring)."""

    __slots__ = ()
    __array_ufunc__ = None  # ``array * lazy``: NumPy defers to __rmul__ instead of broadcasting over objects

    def __init__(self, x: Any, axis: int | None = None) -> None:
        super().__init__(_tensor(x), axis)

    @classmethod
    def _of(cls, lazy: _lt.LazyTensor) -> LazyTensor:
        if isinstance(lazy, cls):
            return lazy
        return cls._make(lazy.formula, lazy.batch, lazy.n_i, lazy.n_j, lazy.device, lazy.dtype, lazy.deferred)

    def _lift(self, other: Any) -> _lt.LazyTensor:
        return self._of(super()._lift(_tensor(other)))

    @staticmethod
    def _output(result: Any, opts: Any, what: str) -> Any:
        return _array(_lt.LazyTensor._output(result, opts, what))

    def __matmul__(self, v: Any, **kwargs: Any) -> np.ndarray:
        return super().__matmul__(_tensor(v), **kwargs)

    def dense(self) -> np.ndarray:
        return _array(super().dense())


def Vi(x: Any) -> LazyTensor:
    """An i-variable from an array of shape (..., M, D)."""
    return LazyTensor._of(_lt.Vi(_tensor(x)))


def Vj(x: Any) -> LazyTensor:
    """A j-variable from an array of shape (..., N, D)."""
    return LazyTensor._of(_lt.Vj(_tensor(x)))


def Pm(x: Any) -> LazyTensor:
    """A parameter from a number or an array of shape (D,)."""
    return LazyTensor._of(_lt.Pm(_tensor(x)))
