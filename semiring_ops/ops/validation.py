"""Argument checks that turn bad input into a clear exception naming the argument, its shape, dtype or
device, before any kernel runs."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FLOAT_DTYPES", "check_same_device_and_dtype", "check_tensor", "describe", "matmul_shapes"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(fn: str, name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{fn}: {name} has dtype {x.dtype} ({describe(x)}); expected one of float16, bfloat16, float32, float64"
        )
    return x


def check_same_device_and_dtype(fn: str, names: tuple[str, str], a: Tensor, b: Tensor) -> None:
    if a.device != b.device:
        raise ValueError(
            f"{fn}: {names[0]} and {names[1]} are on different devices: {names[0]} on {a.device}, "
            f"{names[1]} on {b.device}"
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"{fn}: {names[0]} and {names[1]} have different dtypes: {names[0]} {a.dtype}, "
            f"{names[1]} {b.dtype} (cast one, or run under torch.autocast)"
        )


def matmul_shapes(fn: str, a: Tensor, b: Tensor) -> tuple[torch.Size, int, int, int]:
    """torch.matmul's shape rules for a (..., n, k) and b (..., k, m), both at least 2-D.

    Returns (batch shape, n, k, m).
    """
    sa, sb = a.shape, b.shape
    if len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0] and sa[2] == sb[1]:  # one batch dimension, equal: the hot case
        return sa[:1], sa[1], sa[2], sb[2]
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(
            f"{fn}: a and b must be at least 2-D (..., n, k) and (..., k, m); got a of shape "
            f"{tuple(a.shape)} and b of shape {tuple(b.shape)} (unsqueeze a vector first)"
        )
    n, k = a.shape[-2:]
    k2, m = b.shape[-2:]
    if k != k2:
        raise ValueError(
            f"{fn}: inner dimensions differ: a has shape {tuple(a.shape)} (k={k}) and b has shape "
            f"{tuple(b.shape)} (k={k2}); need a (..., n, k) and b (..., k, m)"
        )
    batch = _broadcast(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    if batch is None:
        raise ValueError(
            f"{fn}: batch dimensions do not broadcast: a has shape {tuple(a.shape)} (batch "
            f"{tuple(a.shape[:-2])}) and b has shape {tuple(b.shape)} (batch {tuple(b.shape[:-2])})"
        )
    return torch.Size(batch), n, k, m


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy broadcasting of two shapes, or None (plain Python: torch.broadcast_shapes costs ~10 us)."""
    if x == y:
        return x
    if len(x) < len(y):
        x, y = y, x
    y = (1,) * (len(x) - len(y)) + y
    out = []
    for i, j in zip(x, y, strict=True):
        if i != j and i != 1 and j != 1:
            return None
        out.append(j if i == 1 else i)
    return tuple(out)
