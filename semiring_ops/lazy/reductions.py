"""The reductions of lazy formulas: each one a semiring of the core (semirings.py) or its k-best variant.

================  ==========================  ==============================================
reduction         kind                        value per output row
================  ==========================  ==============================================
sum               semiring (std)              sum_j F_ij                          (D)
logsumexp         semiring (log)              log sum_j exp F_ij, per component   (D)
logsumexp+weight  weighted logsumexp          log sum_j exp(f_ij) w_ij            (D of w)
max / min         semiring (max / min)        per component, with argmax          (D)
Kmin / Kmax       k-best over (min / max)     K best per component, with indices  (K, D)
================  ==========================  ==============================================

Over an empty reduced axis each reduction gives its semiring zero on every backend: sum 0, logsumexp -inf,
max -inf, min +inf, and index 0 for argmax / argmin (the reducers' initial state); k-best needs 1 <= K <= n.

A reduction names its C++ reducer (csrc/lazy/reducers.h) for the generated kernels, computes itself with
torch on a dense (..., n_outer, n_inner, D) block (the PyTorch fallback and the tests' reference), and gives
the cotangent of its formula for the backward pass of the non-selecting ones (sum and logsumexp: the gradient
is a new sum reduction of the formula's symbolic derivative). Max, min and k-best route their gradient to the
selected pairs (the subgradient at the argmax), see autograd.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..semirings import SEMIRINGS, LogSemiring, Semiring, StdSemiring
from .formula import Concat, Extract, Formula, Mul, Repeat, SoftmaxWeight, VecSum

__all__ = ["Reduction", "kbest", "semiring_reduction", "weighted_logsumexp"]


# 32-bit registers the k-best lists of one output row (csrc/lazy/kbest.h) may take for the unrolled insertion,
# whose indices are all compile-time constants, so on the GPU the lists stay in registers: 2 per entry in
# float32 (value, index), 3 in float64; K * D = 32 float32 entries compile to ~127 registers of the 255 a
# thread may hold (nvcc 13, sm_90, no spills). Longer lists, and the CPU's (faster with the shifting loop),
# live in memory (on the GPU local memory, cached in L1; only the K-th values stay in registers).
KBEST_REGISTER_WORDS = {"cpu": 0, "cuda": 64}


@dataclass(frozen=True)
class Reduction:
    """A reduction over the inner index j of a formula F_ij of dimension D.

    kind: "semiring" (one accumulator of ``semiring`` per component), "weighted_lse" (F = (f, w...)) or
    "kbest" (the ``k`` best of each component; ``semiring`` is "max" or "min"). Whether a kernel tracks the
    selected indices is the plan's ``with_arg``.
    """

    kind: str
    semiring: str
    k: int = 1

    @property
    def semiring_class(self) -> type[Semiring]:
        return SEMIRINGS[self.semiring]

    @property
    def selects(self) -> bool:
        """Whether the result picks terms (max, min, k-best), so the gradient goes to the picked pairs."""
        return self.kind == "kbest" or self.semiring_class.selects

    def value_dim(self, fdim: int) -> int:
        """Values per output row, flat (k-best: K * D in (K, D) order)."""
        if self.kind == "weighted_lse":
            return fdim - 1
        return fdim * self.k if self.kind == "kbest" else fdim

    def cpp_reducer(self, ctype: str, fdim: int, with_arg: bool, target: str = "cpu") -> str:
        """The C++ type of the reducer (csrc/lazy/reducers.h) for a formula of dimension fdim, in a kernel for
        ``target`` ("cpu" or "cuda": where the k-best lists live, KBEST_REGISTER_WORDS)."""
        if self.kind == "weighted_lse":
            return f"WeightedLogSumExpReducer<{ctype}, {fdim - 1}>"
        if self.kind == "kbest":
            largest = "true" if self.semiring == "max" else "false"
            words = self.k * fdim * (3 if ctype == "double" else 2)
            registers = "true" if words <= KBEST_REGISTER_WORDS[target] else "false"
            return f"KBestReducer<{ctype}, {fdim}, {self.k}, {largest}, {registers}>"
        cls = self.semiring_class
        if cls.kernel_id is None:
            raise NotImplementedError(f"semiring {self.semiring!r} has no C++ twin, so no compiled reduction")
        arg = "true" if (with_arg and cls.selects) else "false"
        return f"SemiringReducer<{ctype}, {cls.__name__}, {fdim}, {arg}>"

    # ------------------------------------------------------------ torch

    def torch_reduce(self, f: torch.Tensor, with_arg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values (..., n_outer, value_dim), indices or None) of a dense block f (..., n_outer, n_inner, D)."""
        if self.kind == "weighted_lse":
            return _weighted_lse(f[..., :1], f[..., 1:]), None
        if self.kind == "kbest":
            d = f.shape[-1]
            idx = kbest_order(f, largest=self.semiring == "max")[..., : self.k, :]
            vals = f.gather(-2, idx)
            flat = (*f.shape[:-2], self.k * d)
            return vals.reshape(flat), idx.reshape(flat)
        cls = self.semiring_class
        if f.shape[-2] == 0:
            # nothing to reduce: the semiring zero, and index 0 where indices are tracked (the kernels'
            # reducers start from (zero, 0), csrc/semiring.h ExtremumAccumulator::init)
            vals = torch.full((*f.shape[:-2], f.shape[-1]), cls.zero, dtype=f.dtype, device=f.device)
            if not (with_arg and cls.selects):
                return vals, None
            return vals, torch.zeros(vals.shape, dtype=torch.int64, device=f.device)
        vals = cls.sum(f, dim=-2)
        if not (with_arg and cls.selects):
            return vals, None
        hit = (f == vals.unsqueeze(-2)) | (torch.isnan(f) & torch.isnan(vals).unsqueeze(-2))
        return vals, torch.argmax(hit.to(torch.uint8), dim=-2)

    # ------------------------------------------------------------ gradients of the non-selecting ones

    def cotangent(self, f: Formula, out: Formula, grad: Formula) -> Formula:
        """d(sum_i <grad_i, out_i>) / d F_ij as a formula of F, the result ``out`` and its cotangent ``grad``
        (both outer variables); the gradient of any variable is then the vjp of F with this cotangent."""
        if self.kind == "weighted_lse":
            w = _tail(f)
            weight = SoftmaxWeight(_head(f), out)  # exp(f - out_k), per weight component k
            return Concat(VecSum(Mul(Mul(grad, w), weight)), Mul(grad, weight))
        cls = self.semiring_class
        if cls is StdSemiring:
            return grad if grad.dim == f.dim else Repeat(grad, f.dim)
        if cls is LogSemiring:
            return Mul(grad, SoftmaxWeight(f, out))
        raise NotImplementedError(f"no gradient rule for lazy reductions over the {self.semiring!r} semiring")


def _head(f: Formula) -> Formula:
    return Extract(f, 0, 1)


def _tail(f: Formula) -> Formula:
    return Extract(f, 1, f.dim - 1)


def kbest_order(f: torch.Tensor, largest: bool) -> torch.Tensor:
    """The order of f (..., n, D) along dim -2, best first: by value, NaN the largest (torch.topk's
    order), ties by lowest index. Two stable sorts, so it does not depend on where a device's sort puts
    NaN (CUDA's can put it before +inf)."""
    nan = torch.isnan(f)
    by_value = torch.sort(f.masked_fill(nan, 0.0), dim=-2, descending=largest, stable=True).indices
    nan_first = nan.gather(-2, by_value).to(torch.uint8)
    by_nan = torch.sort(nan_first, dim=-2, descending=largest, stable=True).indices
    return by_value.gather(-2, by_nan)


def candidates_order(
    values: torch.Tensor, indices: torch.Tensor, largest: bool, empty: torch.Tensor | None = None
) -> torch.Tensor:
    """The order along dim -2 of candidate terms (values and their inner indices, (..., C, D), in any order), best
    first as kbest_order ranks them with ties to the lower index, the candidates where ``empty`` is true last."""
    by_index = torch.sort(indices, dim=-2, stable=True).indices  # then a stable sort by value: ties by index
    order = by_index.gather(-2, kbest_order(values.gather(-2, by_index), largest))
    if empty is not None:
        order = order.gather(-2, torch.sort(empty.gather(-2, order).to(torch.uint8), dim=-2, stable=True).indices)
    return order


def _weighted_lse(f: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """log sum_j exp(f_j) w_j over dim -2, with f (..., n, 1) and w (..., n, DW)."""
    if f.shape[-2] == 0:
        return torch.full((*w.shape[:-2], w.shape[-1]), -math.inf, dtype=w.dtype, device=w.device)
    m = f.amax(dim=-2, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = (torch.exp(f - m) * w).sum(-2)
    return torch.log(s) + m.squeeze(-2)


def semiring_reduction(semiring: str) -> Reduction:
    return _SEMIRING_REDUCTIONS.get(semiring) or Reduction("semiring", semiring)


def weighted_logsumexp() -> Reduction:
    return _WEIGHTED_LSE


# made once (not through functools.cache, which torch.compile does not trace)
_SEMIRING_REDUCTIONS = {name: Reduction("semiring", name) for name in SEMIRINGS}
_WEIGHTED_LSE = Reduction("weighted_lse", "log")


def kbest(k: int, largest: bool) -> Reduction:
    return Reduction("kbest", "max" if largest else "min", int(k))
