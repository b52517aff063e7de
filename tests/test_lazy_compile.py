"""Lazy reductions inside PyTorch's tracing: the registered operator ``semiring_ops::lazy_reduce`` (its plan
passed as a key string that parses back, formula_key.py), torch.compile(fullgraph=True) of every reduction
kind with its gradients against eager, FakeTensor shapes, torch.library.opcheck, and the torch operators
with a LazyTensor operand (``tensor * lazy``)."""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lazy_grad import CASES, _args
from test_lazy_keops_api import FORMULAS as KEOPS_FORMULAS
from test_lazy_keops_api import _inputs as keops_inputs
from test_lazy_keops_api import _lazy as keops_lazy
from test_lazy_ops import FORMULAS as OP_FORMULAS
from test_lazy_ops import lazy_vars, make_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

from semiring_ops.lazy import FormulaError, Pm, Vi, Vj
from semiring_ops.lazy import autograd as lazy_autograd
from semiring_ops.lazy import formula as F
from semiring_ops.lazy.autograd import lazy_reduce
from semiring_ops.lazy.formula import Var, canonicalize, vjp
from semiring_ops.lazy.formula_key import _CLASSES, parse_formula
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import kbest, semiring_reduction, weighted_logsumexp

DEVICES = ["cpu", CUDA]


def _ops_of(key: str) -> set[str]:
    """The operations named in a formula key (longest match first, as the parser reads them)."""
    ops = set()
    for part in key.replace(")", "(").replace(",", "(").split("("):
        for op in sorted(_CLASSES, key=len, reverse=True):
            if part.startswith(op):
                ops.add(op)
                break
    return ops


def _canonical_formulas() -> list:
    """The canonical formula of every operation test (test_lazy_ops.py, test_lazy_keops_api.py), and of its
    derivative with respect to each variable."""
    v = lazy_vars(make_inputs(3, 2, 0, "cpu"))
    kv = keops_lazy(keops_inputs(3, 2, 0, "cpu"))
    out = []
    formulas = [lazy(v).formula for lazy, _ in OP_FORMULAS.values()]
    for f in formulas + [lazy(kv).formula for lazy, _ in KEOPS_FORMULAS.values()]:
        canon, tvars = canonicalize(f)
        out.append(canon)
        wrt = [Var(t.cat, t.dim, tensor=t.tensor) for t in tvars]
        g = Var("i", f.dim, tensor=torch.ones(3, f.dim, dtype=torch.float64))
        out.extend(canonicalize(d)[0] for d in vjp(f, wrt, g) if d is not None)
    out.append(F.Exp2(F.Recip(Var("i", 1, slot=0))))  # made by the kernels' rewriting only (formula.py)
    out.append(F.Mul(Var("i", 1, slot=0), F.Const(1.4426950408889634)))  # canonical formulas hold Num, not Const
    # made by the matrix-unit route only (lazy/inner_products.py)
    out.append(F.InnerProduct(F.Square(F.Sub(Var("i", 3, slot=0), Var("j", 3, slot=1))), "sqdist", 0))
    return out


def test_every_formula_key_parses_back_to_the_same_formula():
    seen: set[str] = set()
    for canon in _canonical_formulas():
        parsed = parse_formula(canon.key)
        assert parsed.key == canon.key
        assert parsed.dim == canon.dim
        seen |= _ops_of(canon.key)
    # the operation tests and their derivatives use every node class, so every from_params is exercised
    assert seen == set(_CLASSES), f"never parsed: {sorted(set(_CLASSES) - seen)}"


@pytest.mark.parametrize(
    "reduction", [semiring_reduction("log"), semiring_reduction("max"), kbest(3, False), weighted_logsumexp()]
)
def test_a_plan_parses_back_from_its_key(reduction):
    x, y = Vi(torch.randn(4, 2)), Vj(torch.randn(5, 2))
    f = ((x - y) ** 2).sum(-1) if reduction.kind != "weighted_lse" else ((x - y) ** 2).concat(y.exp())
    canon, tvars = canonicalize(f.formula)
    plan = Plan(canon, tuple(v.cat for v in tvars), tuple(v.dim for v in tvars), reduction, "j", True)
    parsed = Plan.from_key(plan.key)
    assert parsed.formula.key == plan.formula.key  # formulas compare by identity; their keys by structure
    assert dataclasses.replace(parsed, formula=plan.formula) == plan


@pytest.mark.parametrize(
    "key",
    [
        "",
        "Exp(",
        "Exp(Vi0:3()))",
        "Exp(Vi0:3())trailing",
        "Nope(Vi0:3())",
        "Vi#7f00:3()",  # a tensor variable: not canonical
        "Extract1(Vi0:3())",
        "Exp(Vi0:3())|semiring:std:1|q|0",
        "Exp(Vi0:3())|semiring:std:1|i",
        "Exp(Vi2:3())|semiring:std:1|i|0",  # slot 2 without slots 0 and 1
    ],
)
def test_malformed_keys_raise_formula_error(key):
    with pytest.raises(FormulaError):
        Plan.from_key(key) if "|" in key else parse_formula(key)


def test_parsing_a_deep_formula_does_not_recurse():
    key = "Vi0:1()"
    for _ in range(5000):
        key = f"Neg({key})"
    assert parse_formula(key).key == key


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_torch_compile_fullgraph_matches_eager_with_gradients(compiled, device, name):
    """Every reduction kind (and `K @ b`) compiled whole: a graph break would raise. aot_eager traces the
    forward and the backward through the fake implementation, as inductor does, without inductor's compile."""
    torch._dynamo.reset()
    fn = CASES[name]
    args = _args(device, m=5, n=4)
    eager = fn(*args)
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    torch.testing.assert_close(out, eager)
    w = torch.randn_like(eager)
    for g, ref in zip(
        torch.autograd.grad((out * w).sum(), args, allow_unused=True),
        torch.autograd.grad((eager * w).sum(), args, allow_unused=True),
        strict=True,
    ):
        torch.testing.assert_close(g, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_with_inductor_of_a_training_step(compiled, device):
    """The default backend: a Gaussian-kernel step with an argmin, a float parameter that changes (no
    recompile needed for the kernel), and torch operations around the reductions that inductor fuses."""
    torch._dynamo.reset()

    def step(x, y, b, sigma):
        k = (-((Vi(x) - Vj(y)) ** 2).sum(-1) / (2 * sigma**2)).exp()
        nearest = ((Vi(x) - Vj(y)) ** 2).sum(-1).argmin(1)
        return (k @ b).square().mean() + (x - y[nearest[:, 0]]).abs().mean()

    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = torch.randn(29, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(29, 2, generator=g, dtype=torch.float64).to(device)
    compiled_step = torch.compile(step, fullgraph=True)
    for sigma in (0.7, 1.3):
        eager = step(x, y, b, sigma)
        out = compiled_step(x, y, b, sigma)
        torch.testing.assert_close(out, eager)
        for got, ref in zip(torch.autograd.grad(out, (x, y)), torch.autograd.grad(eager, (x, y)), strict=True):
            torch.testing.assert_close(got, ref)


def test_fake_tensors_give_shapes_without_running_a_kernel(monkeypatch):
    def no_kernel(*args):
        raise AssertionError("a kernel ran on fake tensors")

    monkeypatch.setattr(lazy_autograd, "execute", no_kernel)
    with FakeTensorMode():
        x = torch.empty(6, 3, dtype=torch.float64)
        y = torch.empty(9, 3, dtype=torch.float64)
        b = torch.empty(9, 2, dtype=torch.float64)
        d = ((Vi(x) - Vj(y)) ** 2).sum(-1)
        total = d.sum(1)
        assert total.shape == (6, 1) and total.dtype == torch.float64
        vals, idx = d.Kmin_argKmin(4, 0)
        assert vals.shape == idx.shape == (9, 4) and idx.dtype == torch.int64
        assert d.argmax(1).shape == (6, 1)
        assert ((-d).exp() @ b).shape == (6, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["sum", "logsumexp", "max", "Kmin"])
def test_opcheck_of_the_registered_operator(compiled, device, reduction):
    """torch.library.opcheck: the schema, the fake implementation against the kernel, and the autograd
    registration, on a call recorded from a real reduction."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = torch.randn(5, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()
    s = torch.rand(1, generator=g, dtype=torch.float64).to(device).requires_grad_()
    f = (-((Vi(x) - Vj(y)) ** 2).sum(-1) * Pm(s)).formula
    canon, tvars = canonicalize(f)
    red = {"sum": semiring_reduction("std"), "logsumexp": semiring_reduction("log")}.get(reduction)
    red = red or (semiring_reduction("max") if reduction == "max" else kbest(2, False))
    plan = Plan(canon, tuple(v.cat for v in tvars), tuple(v.dim for v in tvars), red, "i", reduction != "sum")
    torch.library.opcheck(lazy_reduce, (plan.key, [7, 5], [v.tensor for v in tvars]))


def test_torch_operators_with_a_lazy_operand():
    x, t = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    y = torch.randn(5, 3, dtype=torch.float64)
    for lhs, rhs in ((t * Vi(x), Vi(x) * t), (t - Vi(x), -(Vi(x) - t)), (t / Vi(x), (Vi(x) / t) ** -1)):
        torch.testing.assert_close((lhs + Vj(y)).sum(1), (rhs + Vj(y)).sum(1))
    with pytest.raises(TypeError):
        torch.exp(Vi(x))
    with pytest.raises(TypeError):
        torch.randn(2, 4) @ Vi(x)  # K @ v only: a tensor on the left has no meaning here


@pytest.mark.cuda
@pytest.mark.parametrize(("dim", "route"), [(3, "auto"), (40, "on")])
def test_torch_compile_reduce_overhead_replays_the_reductions_in_a_cuda_graph(compiled, monkeypatch, dim, route):
    """mode="reduce-overhead": inductor captures the graph, our kernels included (they launch on torch's
    current stream and allocate through torch), and replays it; each replay with new data matches eager. With
    route="on" the matrix-unit route runs inside the capture: its GEMMs, and the k-NN's winners evaluated again
    (lazy/winners.py: torch ops, no host sync)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", route)
    torch._dynamo.reset()

    def f(x, y, b):
        d = ((Vi(x) - Vj(y)) ** 2).sum(-1)
        return (-d).exp() @ b, d.argKmin(3, 1)

    run = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    g = torch.Generator().manual_seed(7)
    for _ in range(5):  # warm-up calls, the capture, then replays
        x, y, b = (torch.randn(n, d, generator=g).cuda() for n, d in ((300, dim), (700, dim), (700, 2)))
        out, idx = run(x, y, b)
        want, want_idx = f(x, y, b)
        torch.testing.assert_close(out, want)
        assert torch.equal(idx, want_idx)


def test_variables_are_the_same_when_their_tensor_is_the_same_object():
    """Variable identity (formula._VarIndex, which canonicalize and vjp use) is the tensor object, compared
    with `is` (torch.compile cannot take the id() of a tensor made inside the compiled function): Vi(x)
    twice is one kernel argument, a clone of x another, the same tensor as i and as j two."""
    x = torch.randn(4, 2)
    _, tvars = canonicalize((Vi(x) * Vi(x) + Vi(x.clone())).formula)
    assert len(tvars) == 2
    _, tvars = canonicalize((Vi(x) - Vj(x)).formula)
    assert [v.cat for v in tvars] == ["i", "j"]
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad((Vi(xg) * Vi(xg)).sum(-1).sum(1).sum(), xg)  # both uses reach x's gradient
    torch.testing.assert_close(g, 2 * xg.detach())

    def fn(x):
        y = x * 2  # a tensor made inside the compiled function
        return ((Vi(y) - Vj(y)) ** 2).sum(-1).sum(1) + (Vi(y) * Vi(y)).sum(-1).sum(1)

    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, fullgraph=True, backend="eager")(x), fn(x))


_UNARY = ["exp", "log", "sqrt", "rsqrt", "abs", "sign", "relu", "step", "sin", "cos", "square", "sqnorm2"]
_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "rsub": lambda a, b: b - a,
    "pow": operator.pow,
}
_VECTOR = {
    "sum": lambda f: f.sum(-1),
    "elem": lambda f: f.elem(1),
    "concat": lambda f: f.concat(f),
    "extract": lambda f: f.extract(1, 2),
    "normalize": lambda f: f.normalize(),
    "neg": operator.neg,
    "clamp": lambda f: f.clamp(-1.0, 2.0),
}


def _random_formula(data, depth: int):
    """A random valid LazyTensor formula over i / j variables, parameters and numbers (hypothesis data)."""
    x, y = Vi(torch.rand(3, 3) + 0.5), Vj(torch.randn(4, 3))
    t, s = Vi(torch.rand(3, 1) + 0.5), Vj(torch.randn(4, 1))
    leaves = [x, y, t, s, Pm(torch.randn(3)), Pm(torch.rand(1) + 0.5), Pm(0.25)]
    f = data.draw(st.sampled_from(leaves))
    for _ in range(depth):
        kind = data.draw(st.sampled_from(["unary", "binary", "number", "vector"]))
        if kind == "unary":
            f = getattr(f, data.draw(st.sampled_from(_UNARY)))()
        elif kind == "binary":
            g = data.draw(st.sampled_from([o for o in leaves if o.formula.dim in (1, f.formula.dim)]))
            f = _BINARY[data.draw(st.sampled_from(["add", "sub", "mul", "div", "rsub"]))](f, g)
        elif kind == "number":
            c = data.draw(st.sampled_from([2, 3, -1, 0.5, -1.75, 1e-3]))
            f = _BINARY[data.draw(st.sampled_from(list(_BINARY)))](f, c)
        else:
            names = list(_VECTOR) if f.formula.dim > 2 else ["neg", "clamp"]
            f = _VECTOR[data.draw(st.sampled_from(names))](f)
    return f


@settings(max_examples=60, deadline=None)
@given(data=st.data(), depth=st.integers(1, 7))
def test_random_formulas_and_their_derivatives_parse_back(data, depth):
    """Keys of random formulas (and of their symbolic derivatives, which bring the gradient-only nodes)
    parse back to formulas with the same key, and their plans too."""
    f = _random_formula(data, depth).formula
    canon, tvars = canonicalize(f)
    assert parse_formula(canon.key).key == canon.key
    wrt = [Var(v.cat, v.dim, tensor=v.tensor) for v in tvars]
    g = Var("i", f.dim, tensor=torch.ones(3, f.dim))
    for d in vjp(f, wrt, g):
        if d is not None:
            dc, dv = canonicalize(d)
            assert parse_formula(dc.key).key == dc.key
            plan = Plan(dc, tuple(v.cat for v in dv), tuple(v.dim for v in dv), semiring_reduction("std"), "j", False)
            assert Plan.from_key(plan.key).key == plan.key
