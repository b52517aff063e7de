"""Fast paths: a fused kernel registered for a (structure, semiring) pair, taken instead of the structure's
PyTorch dynamic program when it applies (the semiring, the dtype and a compiled backend on the device).

A structure's file states its dynamic program once, generic over the semiring; a kernel is optional. Eisner's,
CKY's, the semi-Markov model's, the linear chain's (torch-struct's layout) and the alignment's dynamic programs
under log, max and min run as one launch each way (csrc/span_dp.h, chain_dp.h and alignment_dp.h through
ops/span_ops.py);
everything else (other semirings: KMax, sampling, entropy; 16-bit inputs are upcast) runs the PyTorch program.
``generic_only()`` turns the fast paths off (tests compare the two).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..ops import span_ops
from ..semirings import LogSemiring, MaxSemiring, MinSemiring, Semiring

__all__ = ["generic_active", "generic_only", "generic_totals", "span_fast_path", "span_gradient", "span_totals"]

_state = threading.local()
_SPAN_SEMIRINGS = (LogSemiring, MaxSemiring, MinSemiring)


@contextmanager
def generic_only() -> Iterator[None]:
    """Within the block, every structure runs its PyTorch dynamic program (this thread)."""
    before = getattr(_state, "generic", False)
    _state.generic = True
    try:
        yield
    finally:
        _state.generic = before


def generic_active() -> bool:
    """Whether this thread is inside a ``generic_only()`` block."""
    return getattr(_state, "generic", False)


def _kernels_for(device: torch.device):
    return backend_for(device).family("span")  # None without the compiled span kernels


def span_fast_path(potentials: Tensor, semiring: type[Semiring]) -> bool:
    """Whether the span kernels take ``potentials`` (of a structure that has one) under ``semiring``."""
    if generic_active() or semiring not in _SPAN_SEMIRINGS or potentials.shape[-1] == 0:
        return False
    if potentials.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return False
    return _kernels_for(potentials.device) is not None


def _in_kernel_dtype(potentials: Tensor) -> Tensor:
    """The potentials as the span kernels take them: float32 and float64 as they are, 16-bit ones in float32."""
    return potentials if potentials.dtype in (torch.float32, torch.float64) else potentials.float()


def span_totals(
    potentials: Tensor, lengths: Tensor, structure: int, semiring: type[Semiring], multiroot: bool
) -> Tensor:
    """The span kernel's totals (B,) (16-bit potentials computed in float32)."""
    return span_ops.span_total(_in_kernel_dtype(potentials), lengths, structure, semiring.kernel_id, multiroot)


def span_gradient(
    potentials: Tensor, lengths: Tensor, structure: int, semiring: type[Semiring], multiroot: bool
) -> Tensor:
    """d sum_b total_b / d potentials (the potentials' shape and dtype) by span_inside then span_adjoint, with no
    autograd graph (16-bit potentials computed in float32, the gradient cast back)."""
    # eager: the extension itself (no dispatch layers); traced by torch.compile: the custom ops
    kernels = _kernels_for(potentials.device) if span_ops.direct_call_ok(potentials) else span_ops
    span_inside, span_adjoint = kernels.span_inside, kernels.span_adjoint
    p = _in_kernel_dtype(potentials)
    with torch.no_grad():
        total, charts = span_inside(p, lengths, structure, semiring.kernel_id, multiroot)
        grad = span_adjoint(p, lengths, structure, semiring.kernel_id, multiroot, charts, torch.ones_like(total))
    return grad.to(potentials.dtype)


@span_ops.generic_totals.install
def generic_totals(potentials: Tensor, lengths: Tensor, structure: int, semiring_id: int, multiroot: bool) -> Tensor:
    """The same totals by the structure's PyTorch dynamic program (the span kernels' double backward)."""
    from .alignment import Alignment
    from .cky import CKYTree
    from .dependency import DependencyTree
    from .linear_chain import LinearChain
    from .semimarkov import SemiMarkov

    semiring = next(s for s in _SPAN_SEMIRINGS if s.kernel_id == semiring_id)
    with generic_only():
        if structure == span_ops.ALIGNMENT:  # (a band is already in the potentials, as the semiring's zero)
            return Alignment(local=multiroot).logpartition(potentials, lengths, semiring)
        if structure == span_ops.LINEARCHAIN:
            return LinearChain().logpartition(potentials, lengths, semiring)
        if structure == span_ops.SEMIMARKOV:
            return SemiMarkov().logpartition(potentials, lengths, semiring)
        if structure == span_ops.EISNER:
            return DependencyTree(multiroot).inside(potentials, lengths, semiring)
        return CKYTree().inside(potentials, lengths, semiring)
