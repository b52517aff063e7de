"""Autograd-aware semiring operators (torch.library custom ops) and their public API."""

from .matmul import logbmm, maxbmm, minbmm, semiring_matmul, stdbmm

__all__ = ["logbmm", "maxbmm", "minbmm", "semiring_matmul", "stdbmm"]
