"""``pykeops.numpy.utils.WarmUpGpu``, which KeOps's NumPy tutorials call before timing."""

from __future__ import annotations

import numpy as np
import torch

from .lazy_tensor import Vi, Vj

__all__ = ["WarmUpGpu"]


def WarmUpGpu() -> None:
    """Two small float64 Gaussian-kernel sums on the GPU, when there is one, so that later timings leave out
    CUDA's start-up and the kernel's compilation; nothing without a GPU. As KeOps's, it draws its two (10, 1)
    arrays from NumPy's global generator (only with a GPU), so the draws after it are KeOps's too."""
    if not torch.cuda.is_available():
        return
    x, b = np.random.rand(10, 1), np.random.rand(10, 1)
    for _ in range(2):
        (-Vi(x).sqdist(Vj(x))).exp().__matmul__(b, backend="GPU")
