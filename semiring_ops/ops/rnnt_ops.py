"""RNN-T's fused lattice program, registered with torch.library (contract in csrc/ops.h, program in
csrc/rnnt_dp.h; the ctc family builds it):

semiring_ops::rnnt_lattice(potentials, frames, labels, max, need_posteriors) -> (total (B,), posteriors)
    potentials (B, T, U + 1, 2) float32 / float64 (each cell's blank and next-label potential), frames / labels
    (B,) int64; one launch. posteriors: (B, T, U + 1, 2) d total / d potentials with need_posteriors (max: 1 on
    the best path's moves), else (0,). Not differentiable itself: alignment/rnnt.py forms the logits' gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ctc_ops import ctc_kernels_or_raise

__all__ = ["rnnt_lattice"]


@torch.library.custom_op("semiring_ops::rnnt_lattice", mutates_args=())
def rnnt_lattice(
    potentials: Tensor, frames: Tensor, labels: Tensor, max: bool, need_posteriors: bool
) -> tuple[Tensor, Tensor]:
    """(total (B,), posteriors): see the module docstring."""
    module = ctc_kernels_or_raise(potentials.device, "rnnt_lattice")
    return tuple(module.rnnt_lattice(potentials, frames, labels, max, need_posteriors))


@rnnt_lattice.register_fake
def _(potentials, frames, labels, max, need_posteriors):
    return potentials.new_empty(potentials.shape[:1]), potentials.new_empty(
        potentials.shape if need_posteriors else (0,)
    )
