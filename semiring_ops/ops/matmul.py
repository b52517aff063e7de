"""The public semiring batched matmul: torch.matmul's shape rules over any semiring."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import semirings
from ..build.reference import generic_bmm
from ..hooks import Hook
from ..semirings import LogSemiring, Semiring, StdSemiring, resolve_semiring
from . import fast_log, registry
from .validation import check_same_device_and_dtype, check_tensor, matmul_shapes

# A 2-D product into a host output, block by block on the operands' device (blocks/api.py installs it).
blocks_matmul_into = Hook("semiring_matmul(out=<a host tensor>)", "semiring_ops.blocks")

__all__ = ["PRECISIONS", "logbmm", "maxbmm", "minbmm", "semiring_matmul", "stdbmm"]

PRECISIONS = ("exact", "fast")


def semiring_matmul(
    a: Tensor,
    b: Tensor,
    semiring: str | type[Semiring] = "log",
    *,
    return_argmax: bool = False,
    precision: str = "exact",
    out: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """C = A (x) B over a semiring, with torch.matmul's shape rules.

    Args:
        a: (..., n, k) floating tensor (float16, bfloat16, float32, float64), any strides.
        b: (..., k, m) tensor of a's dtype and device; batch dimensions broadcast against a's.
        semiring: "log" (logsumexp, +), "max" (max, +), "min" (min, +), "std" (+, x), or a Semiring
            subclass (one without a compiled kernel runs on the blocked PyTorch path).
        return_argmax: max / min only: also return the int64 index k of the selected term,
            (..., n, m); ties go to the lowest k.
        precision: "exact" (default) or "fast". "fast" runs the log semiring on CUDA float32 / bfloat16 /
            float16 inputs (GPUs of compute capability 8.0+) on tensor cores: each k-tile of 32 terms becomes
            a TF32 product of exponentials scaled by the tile's row / column maxima, combined with a running
            maximum. Absolute error <= ~1e-3 (nats) on top of the exact kernel's own float32 rounding;
            outputs whose scaled sum underflows (a tile's row and column maxima far apart, e.g. values
            spread over hundreds of nats) and rows / columns holding NaN, +inf or |x| > 2^125 are detected
            and recomputed exactly, so a fast result is never -inf or garbage where the exact one is finite.
            The backward is the exact log backward (computed from the fast output). Everything else (CPU,
            float64, the other semirings, older GPUs, and products under fast_log.MIN_CELLS = 2^29 cells,
            where the exact kernel is faster) runs exact; see docs/semiring_matmul.md.

        out: a tensor to write C into (no autograd, no return_argmax). A host (CPU) ``out`` for 2-D a and b
            is filled block by block by semiring_ops.blocks.matmul on a's GPU (or CPU workers), so C may be
            larger than the device's memory; any other ``out`` receives a copy of the result.

    Returns:
        (..., n, m) in a's dtype (16-bit inputs accumulate in float32), or (values, argmax); ``out`` when given.

    Under torch.autocast the log / max / min products run in float32 (like logsumexp), so inputs of
    mixed precision are accepted there; "std" follows autocast's matmul policy.
    """
    S = resolve_semiring(semiring)
    fn = f"semiring_matmul[{S.name}]"
    if precision not in PRECISIONS:
        raise ValueError(f"{fn}: precision must be one of {PRECISIONS}, got {precision!r}")
    a = check_tensor(fn, "a", a)
    b = check_tensor(fn, "b", b)
    if return_argmax and not S.selects:
        raise ValueError(f"{fn}: return_argmax=True needs a selecting semiring (max, min), not {S.name!r}")
    if out is not None:
        return _matmul_into(out, a, b, S, fn, return_argmax, precision)
    if S is StdSemiring:
        if not _autocast(a):
            check_same_device_and_dtype(fn, ("a", "b"), a, b)
        matmul_shapes(fn, a, b)
        if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
            return torch.bmm(a, b)  # the common batched case, without torch.matmul's shape dispatch
        return torch.matmul(a, b)
    if _any_autocast(a, b):
        a, b = a.float(), b.float()
    check_same_device_and_dtype(fn, ("a", "b"), a, b)
    batch, n, k, m = matmul_shapes(fn, a, b)
    B = math.prod(batch)
    a3 = a if a.shape == (B, n, k) else a.expand(*batch, n, k).reshape(B, n, k)
    b3 = b if b.shape == (B, k, m) else b.expand(*batch, k, m).reshape(B, k, m)
    if S.kernel_id is None:
        return generic_bmm(a3, b3, S).reshape(*batch, n, m)
    needs_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    with_arg = S.selects and (return_argmax or needs_grad)
    if precision == "fast" and S is LogSemiring and fast_log.supports(a3) and B * n * k * m >= fast_log.MIN_CELLS:
        out, arg = fast_log.log_bmm_fast(a3, b3), None
    # elif precision == "fast" and S.selects ...: the place for a fast max / min path (packed half2); exact for now
    else:
        out, arg = registry.bmm_forward_eager(a3, b3, S.kernel_id, with_arg)
    if out.dtype != a.dtype:
        out = out.to(a.dtype)
    if len(batch) != 1:
        out = out.reshape(*batch, n, m)
    if return_argmax:
        return out, arg.reshape(out.shape)
    return out


def _matmul_into(out: Tensor, a: Tensor, b: Tensor, S: type[Semiring], fn: str, return_argmax: bool, precision: str):
    """semiring_matmul's ``out=``: a host output of a 2-D product block by block (semiring_ops.blocks), any
    other a copy of the result."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{fn}: out must be a torch.Tensor, got {type(out).__name__}")
    if return_argmax:
        raise ValueError(f"{fn}: out= with return_argmax=True is not supported")
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad):
        raise RuntimeError(f"{fn}: out= does not support automatic differentiation (torch's rule for out=)")
    if out.device.type == "cpu" and a.dim() == 2 and b.dim() == 2 and a.device == b.device:
        return blocks_matmul_into(a, b, S, out)
    result = semiring_matmul(a, b, S, precision=precision)
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(
            f"{fn}: out has shape {tuple(out.shape)} and {out.dtype}; C has {tuple(result.shape)} and {result.dtype}"
        )
    return out.copy_(result)


_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "hpu", "mps")  # a static set: dynamo traces it


def _autocast(t: Tensor) -> bool:
    device_type = t.device.type
    return device_type in _AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type)


def _any_autocast(a: Tensor, b: Tensor) -> bool:
    """Whether autocast is on for a's or b's device type: eager calls first ask whether it is on anywhere (one
    query, ~0.1 us; the two per-device queries cost ~1.4 us of a 4 x 4 product's host time)."""
    if not torch.compiler.is_compiling() and not torch._C._is_any_autocast_enabled():
        return False
    return _autocast(a) or _autocast(b)


def logbmm(a: Tensor, b: Tensor, *, precision: str = "exact") -> Tensor:
    """Log-semiring matmul: C[..., i, j] = logsumexp_k (a[..., i, k] + b[..., k, j]).
    precision="fast": tensor cores on CUDA fp32 / 16-bit inputs, ~1e-3 error (see semiring_matmul)."""
    return semiring_matmul(a, b, "log", precision=precision)


def maxbmm(a: Tensor, b: Tensor, return_argmax: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max-plus (Viterbi) matmul: C[..., i, j] = max_k (a[..., i, k] + b[..., k, j]); optionally argmax."""
    return semiring_matmul(a, b, "max", return_argmax=return_argmax)


def minbmm(a: Tensor, b: Tensor, return_argmax: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Min-plus (tropical) matmul: C[..., i, j] = min_k (a[..., i, k] + b[..., k, j]); optionally argmin."""
    return semiring_matmul(a, b, "min", return_argmax=return_argmax)


def stdbmm(a: Tensor, b: Tensor) -> Tensor:
    """The standard semiring: torch.matmul (3-D operands of one batch go straight to torch.bmm, whose own
    checks name a bad argument: a launch-bound call costs what torch.bmm costs)."""
    if type(a) is Tensor and type(b) is Tensor and a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        return torch.bmm(a, b)
    return semiring_matmul(a, b, "std")


semirings.semiring_matmul.install(semiring_matmul)
