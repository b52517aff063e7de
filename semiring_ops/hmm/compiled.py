"""The hmm family's compiled CPU ops (csrc/cpu/hmm_*.cpp), looked up one way for every caller."""

from __future__ import annotations

import torch
from torch import Tensor

from ..build.backends import backend_for

__all__ = ["compiled_op"]

_DTYPES = (torch.float32, torch.float64)


def compiled_op(name: str, *tensors: Tensor, gradient_free: bool = True):
    """The hmm family's compiled op ``name`` for these tensors, or None when torch computes instead: a tensor off
    the CPU, dtypes other than one float32 / float64 for all, a gradient wanted from one of them (when
    ``gradient_free``: the compiled ops have no backward), or the family not built here."""
    first = tensors[0]
    if first.device.type != "cpu" or first.dtype not in _DTYPES:
        return None
    if any(t.device != first.device or t.dtype != first.dtype for t in tensors[1:]):
        return None
    if gradient_free and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return getattr(backend_for(first.device).family("hmm"), name, None)
