"""Linear systems of lazy formulas: KeOps' ``LazyTensor.solve``, by conjugate gradients on reductions.

A :class:`LinearSystem` is (alpha Id + A) a = b with A a linear map given by a formula: A(a)_r = sum over the
reduced axis of F[x := a], F a formula of the LazyTensor ``template`` linear in its unknown x, a symbolic
variable of the reduced category. ``K.solve(b)`` (a scalar K) is the formula K * x_j; ``F.solve(b, var=x)``
is F itself. Its transpose is the formula's symbolic vjp with respect to x (formula.vjp), with the cotangent a
symbolic variable of the rows' category: the sum over the rows of d F / dx^T u, one more formula reduced by
the same engine. The gradient is implicit: u = (alpha Id + A^T)^-1 g, then g_b = u and g_theta =
-d/dtheta <u, A_theta(a)> for the formula's tensors theta (the reduction's own gradient).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from .formula import Formula, Var, substitute, variables, vjp
from .options import ReduceOptions
from .reductions import semiring_reduction
from .symbolic import instantiate, symbolic_var

if TYPE_CHECKING:
    from .lazy_tensor import LazyTensor

__all__ = ["LinearSystem", "solve_system"]


@dataclass(frozen=True)
class LinearSystem:
    """(alpha Id + A) a = b, A(a) = template[unknown := a] summed over ``over`` (module docstring).
    ``unknown``: the template's placeholder variable, of category ``over``; ``index``: its symbolic index."""

    template: LazyTensor
    unknown: Var
    index: int
    over: str
    alpha: float
    opts: ReduceOptions

    @property
    def rows(self) -> str:
        """The category of b and of A(a)'s rows."""
        return "i" if self.over == "j" else "j"

    def apply(self, a: torch.Tensor, alpha: float | None = None) -> torch.Tensor:
        """(alpha Id + A) a, a of shape (..., n, E)."""
        filled = instantiate(self.template, {self.index: a}, [], "solve")
        ka = filled._reduce(semiring_reduction("std"), self.over, "solve", opts=self.opts)[0]
        alpha = self.alpha if alpha is None else alpha
        return ka + alpha * a if alpha else ka

    def transposed(self) -> LinearSystem:
        """(alpha Id + A^T): A^T(u) = sum over the rows of vjp(F, x, u)."""
        f = self.template.formula
        u = symbolic_var(self.index, f.dim, "ij".index(self.rows), "solve")
        (g,) = vjp(f, [self.unknown], u)
        if g is None:
            raise ValueError(f"solve: the formula does not depend on the unknown: {f!r:.200}")
        if any(v.tensor is self.unknown.tensor and v.cat == self.over for v in variables(g)):
            raise ValueError(f"solve: the formula is not linear in the unknown: {f!r:.200}")
        return replace(self, template=self.with_formula(g).template, unknown=u, over=self.rows)

    def with_formula(self, formula: Formula) -> LinearSystem:
        t = self.template
        made = t._make(formula, t.batch, t.n_i, t.n_j, t.device, t.dtype, t.deferred, symbolic=True)
        made.ranges = t.ranges
        return replace(self, template=made)


def solve_system(system: LinearSystem, b: torch.Tensor, eps: float) -> torch.Tensor:
    """a with (alpha Id + A) a = b, differentiable (once) with respect to b and the formula's tensors."""
    tensors = system.template.variables
    transposed = system.transposed()  # also the check that the formula is linear in the unknown
    return _KernelSolve.apply(system, transposed, eps, b, *tensors)


class _KernelSolve(torch.autograd.Function):
    """a = (alpha Id + A)^-1 b by conjugate gradients, with the implicit gradient (module docstring)."""

    @staticmethod
    def forward(ctx, system: LinearSystem, transposed: LinearSystem, eps: float, b: torch.Tensor, *tensors):
        ctx.system, ctx.transposed, ctx.eps = system, transposed, eps
        a = conjugate_gradient(system.apply, b, eps)
        ctx.save_for_backward(a, *tensors)
        return a

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        system = ctx.system
        a, *tensors = ctx.saved_tensors
        u = conjugate_gradient(ctx.transposed.apply, g, ctx.eps)
        wanted = [k for k, need in enumerate(ctx.needs_input_grad[4:]) if need]
        grads: list[torch.Tensor | None] = [None] * len(tensors)
        if wanted:
            leaves = [t.detach().requires_grad_(k in wanted) for k, t in enumerate(tensors)]

            def leaf(v: Var) -> Formula:
                k = next((k for k, t in enumerate(tensors) if t is v.tensor), None)
                return v if k is None else Var(v.cat, v.dim, tensor=leaves[k])

            with torch.enable_grad():
                ka = system.with_formula(substitute(system.template.formula, leaf)).apply(a, alpha=0.0)
                got = torch.autograd.grad(-(u * ka).sum(), [leaves[k] for k in wanted], allow_unused=True)
            for k, gk in zip(wanted, got, strict=True):
                grads[k] = torch.zeros_like(tensors[k]) if gk is None else gk
        return (None, None, None, u if ctx.needs_input_grad[3] else None, *grads)


def conjugate_gradient(linop, b: torch.Tensor, eps: float) -> torch.Tensor:
    """x with linop(x) = b (linop symmetric positive definite) by conjugate gradients from 0, inner products over
    all of b's entries (a batch is one block-diagonal system): stops when |r|^2 < numel(b) eps^2, or after
    10 n + 10 iterations (n = numel(b)) with a RuntimeWarning."""
    x = torch.zeros_like(b)
    r = b.clone()
    rr = (r * r).sum()
    delta = b.numel() * eps**2
    p = r.clone()
    limit = 10 * b.numel() + 10
    for _ in range(limit):
        if rr < delta:
            return x
        q = linop(p)
        step = rr / (p * q).sum()
        x = x + step * p
        r = r - step * q
        rr, rr_old = (r * r).sum(), rr
        p = r + (rr / rr_old) * p
    if rr >= delta:
        warnings.warn(
            f"solve: conjugate gradients stopped after {limit} iterations with |r|^2 = {float(rr):.3g} "
            f"(tolerance {delta:.3g}); is K symmetric positive definite?",
            RuntimeWarning,
            stacklevel=4,
        )
    return x
