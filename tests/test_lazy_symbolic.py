"""KeOps' symbolic variables, callable reductions and axis defaults (semiring_ops/lazy/symbolic.py).

``Vi(k, D)`` / ``Vj(k, D)`` / ``Pm(k, D)`` / ``LazyTensor((k, D, cat))``, a reduction of them (or any reduction with
``call=False``) as a callable of the tensors, its ``callfun``, ``_shape``, and KeOps' ``axis=-1`` default of sum, min,
max, argmin and argmax (a LazyTensor over the vector dimension), each against a float64 torch computation of the
dense formula, gradients included; the error messages of bad calls. Small sizes and few distinct formulas: each
formula compiles once (~0.2 s). tests/test_keops_tutorials.py runs KeOps's own tutorials that use these.
"""

from __future__ import annotations

import pytest
import torch

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj
from semiring_ops.lazy.symbolic import ReducedLazyTensor

F64 = torch.float64


def _data(m: int = 5, n: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 3, generator=g, dtype=F64)
    y = torch.randn(n, 3, generator=g, dtype=F64)
    b = torch.randn(n, 2, generator=g, dtype=F64)
    s = torch.rand(1, generator=g, dtype=F64) + 0.5
    return x, y, b, s


def _gauss(x, y, b, s):
    """sum_j exp(-|x_i - y_j|^2 / s) b_j, dense in float64."""
    return (torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1) / s)[..., None] * b[None]).sum(1)


def _symbolic_gauss():
    x, y, b, s = Vi(0, 3), Vj(1, 3), Vj(2, 2), Pm(3, 1)
    return ((-x.sqdist(y) / s).exp() * b).sum(dim=1)


def test_symbolic_variables_called_positionally_with_gradients():
    x, y, b, s = _data()
    gauss = _symbolic_gauss()
    assert isinstance(gauss, ReducedLazyTensor)
    assert gauss.symbolic_variables == ((0, 3, 0), (1, 3, 1), (2, 2, 1), (3, 1, 2))
    assert gauss.nargs == 4 and gauss.variables == []
    leaves = [t.clone().requires_grad_() for t in (x, y, b, s)]
    got = gauss(*leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (x, y, b, s)]
    ref = _gauss(*ref_leaves)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(got, leaves, g)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    # new data of other sizes, same callable
    x2, y2, b2, s2 = _data(4, 9, seed=1)
    torch.testing.assert_close(gauss(x2, y2, b2, s2), _gauss(x2, y2, b2, s2), rtol=1e-12, atol=1e-12)


def test_one_index_is_one_variable_and_the_tuple_form():
    x, y, _, _ = _data()
    a, a2, c = Vi(0, 3), LazyTensor((0, 3, 0)), Vj(1, 3)
    f = (a * a2 - c).sum().sum(dim=1)  # Vi(0, 3) written twice: one variable, x
    assert f.symbolic_variables == ((0, 3, 0), (1, 3, 1))
    torch.testing.assert_close(f(x, y), (x[:, None] ** 2 - y[None]).sum(-1).sum(1, keepdim=True), rtol=1e-12, atol=0)


def test_mixed_fixed_and_symbolic_variables_as_in_keops_tutorial_c():
    """``Vi(x) * Vj(0, D)``: the fixed tensors stay, the symbolic one is given at the call; callfun takes both."""
    x, y, _, _ = _data()
    sigmas = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)
    bj = Vj(torch.randn(7, 4, dtype=F64))
    kxyb = LazyTensor.exp(-LazyTensor.sum((Vi(x) - Vj(0, 3)) ** 2) / sigmas**2).sum() * bj
    fun = kxyb.sum_reduction(axis=1)
    assert fun.nargs == 1 and len(fun.variables) == 3  # x, sigmas, b
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1, keepdim=True)
    ref = (torch.exp(-d2 / sigmas**2).sum(-1, keepdim=True) * bj.variables[0][None]).sum(1)
    torch.testing.assert_close(fun(y), ref, rtol=1e-12, atol=1e-12)
    # callfun: the symbolic tensors, then the formula's own (here x doubled)
    x2 = 2 * x
    d2 = ((x2[:, None] - y[None]) ** 2).sum(-1, keepdim=True)
    ref2 = (torch.exp(-d2 / sigmas**2).sum(-1, keepdim=True) * bj.variables[0][None]).sum(1)
    own = fun.variables
    torch.testing.assert_close(fun.callfun(y, x2, *own[1:]), ref2, rtol=1e-12, atol=1e-12)
    assert "Vj(0, 3)" in repr(fun) and "callfun of" in repr(fun.callfun)


def test_call_false_reads_the_tensors_at_the_call():
    x, y, _, _ = _data()
    f = Vi(x).sqdist(Vj(y))
    fun = f.sum(dim=1, call=False)
    assert isinstance(fun, ReducedLazyTensor) and fun.nargs == 0
    torch.testing.assert_close(fun(), f.sum(dim=1), rtol=0, atol=0)
    x.mul_(3)  # KeOps' callables read the tensors when called
    torch.testing.assert_close(fun(), ((x[:, None] - y[None]) ** 2).sum(-1).sum(1, keepdim=True), rtol=1e-12, atol=0)
    out = torch.empty(5, 1, dtype=F64)
    assert fun(out=out) is out  # options at the call
    # the axis is resolved when the callable is made: -3 / -2 whatever the batch of later tensors
    batched = Vi(0, 3).sqdist(Vj(1, 3)).min(dim=0)
    xb, yb = torch.randn(2, 5, 3, dtype=F64), torch.randn(2, 7, 3, dtype=F64)
    ref = ((xb[:, :, None] - yb[:, None]) ** 2).sum(-1).amin(1)[..., None]
    torch.testing.assert_close(batched(xb, yb), ref, rtol=1e-12, atol=0)


def test_solve_call_false_and_symbolic_right_hand_side():
    """KeOps' plot_test_invkernel_torch_helper: solve(..., call=False), its gradient, and a symbolic b."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(30, 2, generator=g, dtype=F64, requires_grad=True)
    b = torch.rand(30, 2, generator=g, dtype=F64)
    alpha = 0.5
    k = LazyTensor.exp(-LazyTensor.sum((Vi(x) - Vj(x)) ** 2, dim=2) / 0.5)
    cfun = LazyTensor.solve(k, Vi(b), alpha=alpha, eps=1e-12, call=False)
    c = cfun()
    dense = alpha * torch.eye(30, dtype=F64) + torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1) / 0.5)
    c_ref = torch.linalg.solve(dense, b)
    torch.testing.assert_close(c, c_ref, rtol=1e-9, atol=1e-10)
    e = torch.randn(30, 2, generator=g, dtype=F64)
    (u,) = torch.autograd.grad(c, x, e)
    (u_ref,) = torch.autograd.grad(c_ref, x, e)
    torch.testing.assert_close(u, u_ref, rtol=1e-8, atol=1e-9)
    assert "solve" in repr(cfun.callfun)
    sym = k.solve(Vi(0, 2), alpha=alpha, eps=1e-12)  # b symbolic: a callable of b
    torch.testing.assert_close(sym(b), c_ref, rtol=1e-9, atol=1e-10)


def test_other_reductions_of_symbolic_variables():
    x, y, b, _ = _data()
    d = Vi(0, 3).sqdist(Vj(1, 3))
    dense = ((x[:, None] - y[None]) ** 2).sum(-1)
    torch.testing.assert_close(d.argKmin(2, dim=1)(x, y), dense.topk(2, 1, largest=False).indices)
    lse = (-d).logsumexp(dim=1, weight=Vj(2, 2).exp())(x, y, b)
    torch.testing.assert_close(lse, torch.logsumexp(-dense[..., None] + b[None], 1), rtol=1e-12, atol=1e-12)
    mv = (-d).exp().__matmul__(b)
    assert isinstance(mv, ReducedLazyTensor)
    torch.testing.assert_close(mv(x, y), torch.exp(-dense) @ b, rtol=1e-12, atol=1e-12)
    # deferred numbers take the call's dtype; the transpose swaps the categories of symbolic variables too
    t = (Vi(0, 3).sqdist(Vj(1, 3)) * Pm(2.0)).T.sum(dim=1)
    torch.testing.assert_close(t(x, y), 2 * dense.sum(0)[:, None], rtol=1e-12, atol=1e-12)


def test_reductions_default_to_the_vector_dimension_as_in_keops():
    x, y, _, _ = _data()
    f = Vi(x) - Vj(y)
    dense = x[:, None] - y[None]
    for name, ref in (
        ("sum", dense.sum(-1, keepdim=True)),
        ("max", dense.amax(-1, keepdim=True)),
        ("min", dense.amin(-1, keepdim=True)),
        ("argmax", dense.argmax(-1, keepdim=True).to(F64)),
        ("argmin", dense.argmin(-1, keepdim=True).to(F64)),
    ):
        got = getattr(f, name)()
        assert isinstance(got, LazyTensor) and got.shape == (5, 7, 1), name
        torch.testing.assert_close(got.dense(), ref, rtol=0, atol=1e-15, msg=name)  # (the kernels: ties, below)
        assert getattr(f, name)(-1).formula.key == got.formula.key, name
    torch.testing.assert_close(LazyTensor.sum(f).dense(), dense.sum(-1, keepdim=True), rtol=0, atol=1e-15)
    ties = Vi(torch.tensor([[1.0, 3.0, 3.0, 0.0, 0.0]], dtype=F64).expand(2, 5).contiguous())
    torch.testing.assert_close(ties.argmax().sum(dim=0), torch.tensor([[2.0]], dtype=F64))  # first of the ties
    torch.testing.assert_close(ties.argmin().sum(dim=0), torch.tensor([[6.0]], dtype=F64))
    for name in ("sum_reduction", "max_reduction", "argmin_reduction", "logsumexp", "min_argmin"):
        with pytest.raises(ValueError, match="give the axis"):
            getattr(f, name)()  # KeOps: these have no default axis
    batch = LazyTensor(torch.randn(2, 5, 1, 3)) - LazyTensor(torch.randn(2, 1, 4, 3))
    assert batch._shape == batch.shape == (2, 5, 4, 3)


def test_bad_calls_are_refused_with_clear_messages():
    x, y, _, _ = _data()
    gauss = (-Vi(0, 3).sqdist(Vj(1, 3))).exp().sum(dim=1)
    with pytest.raises(
        TypeError, match=r"takes 2 tensors \(one per symbolic variable: Vi\(0, 3\), Vj\(1, 3\)\), got 1$"
    ):
        gauss(x)
    with pytest.raises(ValueError, match=r"argument 1 \(Vj\(1, 3\)\): the tensor must have shape \(\.\.\., N, 3\)"):
        gauss(x, y[:, :2])
    with pytest.raises(TypeError, match=r"argument 0 .*: expected a tensor, got list"):
        gauss([1.0], y)
    with pytest.raises(ValueError, match=r"used as Vi\(0, 3\) and as Vi\(0, 2\)"):
        (Vi(0, 3).sum() + Vi(0, 2).sum()).sum(dim=1)
    with pytest.raises(ValueError, match=r"\(index, dim, cat\)"):
        LazyTensor((0, 3))
    with pytest.raises(ValueError, match="cat 0 \\(i\\), 1 \\(j\\) or 2"):
        LazyTensor((0, 3, 5))
    with pytest.raises(ValueError, match="takes no axis"):
        LazyTensor((0, 3, 0), axis=0)
    with pytest.raises(TypeError, match=r"Vi\(ind, dim\)"):
        Vi(3)
    with pytest.raises(TypeError, match="not a tensor"):
        Vi(x, 3)
    with pytest.raises(ValueError, match="holds symbolic variables"):
        Vi(0, 3).dense()
    with pytest.raises(TypeError, match="call must be True or False"):
        Vi(x).sqdist(Vj(y)).sum(dim=1, call="no")
    with pytest.raises(TypeError, match=r"takes 0 tensors \(none\), got 1"):
        Vi(x).sqdist(Vj(y)).sum(dim=1, call=False)(x)
    with pytest.raises(TypeError, match="var must be a symbolic variable"):
        (-Vi(x).sqdist(Vj(x))).exp().solve(x, var=Vi(x))
