"""Lazy kernel reductions over the semirings (a KeOps for semirings).

    from semiring_ops.lazy import LazyTensor, Vi, Vj, Pm

Formulas over i-indexed variables, j-indexed variables and parameters are compiled to kernels (C++ on the
CPU, CUDA through NVRTC on GPUs), cached on disk, and reduced over i or j by a semiring (sum, logsumexp, max,
min) or its k-best variant, without the M x N matrix ever existing; gradients are new reductions of the
formula's symbolic derivative. ``Vi(0, 3)`` (KeOps' symbolic variables) and ``call=False`` make reductions
callables of the tensors (ReducedLazyTensor). See docs/lazy.md.
"""

from .complex import ComplexLazyTensor
from .formula import FormulaError
from .kernel_cache import LazyCompileError
from .lazy_tensor import LazyTensor, Pm, Vi, Vj
from .symbolic import ReducedLazyTensor

__all__ = ["ComplexLazyTensor", "FormulaError", "LazyCompileError", "LazyTensor", "Pm", "ReducedLazyTensor", "Vi", "Vj"]
