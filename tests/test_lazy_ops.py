"""Every operation of semiring_ops.lazy.LazyTensor, reduced by the compiled kernels (sum over j and sum over i),
against the same formula written by hand with torch in float64 on broadcast (M, 1, D) / (1, N, D) tensors; and
``.dense()`` against the hand computation too (the kernels and ``.dense()`` must not be checked only against
each other, since ``.dense()`` shares the torch evaluator with the PyTorch fallback).

Each formula below compiles two CPU kernels (one per direction), so the set is fixed and small; hypothesis
draws the sizes (on both sides of the CPU's 16 lanes and of the CUDA blocks of 256 x 2 rows and j-tiles of
256) and the data.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj

# the generated kernels, never the PyTorch fallback (which shares .dense()'s evaluator)
pytestmark = pytest.mark.usefixtures("compiled")

SIZES = st.one_of(st.sampled_from([1, 2, 15, 16, 17, 31, 33]), st.sampled_from([255, 257, 513, 1030]))


def make_inputs(m: int, n: int, seed: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=None):
        t = (
            torch.randn(*shape, generator=g, dtype=torch.float64)
            if lo is None
            else torch.rand(*shape, generator=g, dtype=torch.float64) + lo
        )
        return t.to(device)

    return {
        "x": r(m, 3, lo=0.1),  # i-variable, positive (log, sqrt, fractional powers)
        "t": r(m, 1, lo=0.5),  # i-variable of dimension 1, positive
        "y": r(n, 3),  # j-variable
        "s": r(n, 1),  # j-variable of dimension 1
        "p": r(3),  # parameter (3,)
        "q": r(1, lo=0.5),  # parameter (1,), positive
    }


def lazy_vars(v: dict[str, torch.Tensor]) -> SimpleNamespace:
    return SimpleNamespace(
        x=Vi(v["x"]), t=Vi(v["t"]), y=Vj(v["y"]), s=Vj(v["s"]), p=Pm(v["p"]), q=Pm(v["q"]), raw=SimpleNamespace(**v)
    )


def dense_vars(v: dict[str, torch.Tensor]) -> SimpleNamespace:
    """The variables as broadcastable float64 tensors: i (M, 1, D), j (1, N, D), parameters (D,)."""
    return SimpleNamespace(
        x=v["x"][:, None, :], t=v["t"][:, None, :], y=v["y"][None], s=v["s"][None], p=v["p"], q=v["q"]
    )


def _step(z):
    return (z >= 0).to(z.dtype)


def _cat(*ts):
    """torch.cat over the last dimension, the leading dimensions broadcast."""
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in ts))
    return torch.cat([t.expand(*lead, t.shape[-1]) for t in ts], -1)


# name: (the LazyTensor formula, the same formula by hand in torch)
FORMULAS = {
    # + - * / between LazyTensors, dimension 1 broadcast against 3, i against j
    "add_sub": (
        lambda v: v.x + v.y - v.s + v.t - (v.y - v.x) + v.s - v.x,
        lambda v: v.x + v.y - v.s + v.t - (v.y - v.x) + v.s - v.x,
    ),
    "mul_div": (
        lambda v: v.x * v.y / (v.s.abs() + 1) * v.t - v.y / v.x + v.s / v.x - v.y / v.q,
        lambda v: v.x * v.y / (v.s.abs() + 1) * v.t - v.y / v.x + v.s / v.x - v.y / v.q,
    ),
    # Python numbers on both sides: ints (written into the kernel) and non-integer floats (parameters)
    "numbers": (
        lambda v: 2 * v.x + 3 - v.y * 4 + 1.5 * v.y - v.x / 2.5 + 0.25 - 7 / v.x + (2 - v.s) * 1.5 + v.y / 4 - 1,
        lambda v: 2 * v.x + 3 - v.y * 4 + 1.5 * v.y - v.x / 2.5 + 0.25 - 7 / v.x + (2 - v.s) * 1.5 + v.y / 4 - 1,
    ),
    # torch tensors on both sides (their shape makes them parameters, i- or j-variables)
    "tensors": (
        lambda v: (
            v.x * v.raw.p
            + v.raw.y[None]
            - v.raw.p
            + v.raw.t[:, None, :] * v.y
            - v.raw.s[None] / v.x
            + LazyTensor(v.raw.y, axis=1) / v.raw.q
            + LazyTensor(v.raw.x, axis=0) * LazyTensor(v.raw.q[0])
        ),
        lambda v: v.x * v.p + v.y - v.p + v.t * v.y - v.s / v.x + v.y / v.q + v.x * v.q,
    ),
    # unary minus and integer powers (negative, 0, 1, 2, 3)
    "neg_intpow": (
        lambda v: -((-v.x) ** 3) + v.y**2 + v.x**-2 - (v.y**0) * v.s + v.x**1 + (v.y.abs() + 1) ** -1 - v.y,
        lambda v: -((-v.x) ** 3) + v.y**2 + v.x**-2 - (v.y**0) * v.s + v.x**1 + (v.y.abs() + 1) ** -1 - v.y,
    ),
    # 0.5, -0.5, a non-integer float, a one-element tensor and a LazyTensor as exponents
    "fracpow": (
        lambda v: v.x**0.5 + v.x**-0.5 + v.x**1.7 - (v.y.abs() + 1) ** -2.5 + v.x ** v.s.abs() + v.x**v.raw.q,
        lambda v: v.x**0.5 + v.x**-0.5 + v.x**1.7 - (v.y.abs() + 1) ** -2.5 + v.x ** v.s.abs() + v.x**v.q,
    ),
    "exp_log_sqrt": (
        lambda v: (
            (v.y * v.t).exp()
            + v.x.log()
            + v.x.sqrt()
            + v.x.rsqrt()
            + (-v.y * v.q).exp()
            + (v.y.abs() / v.t + 0.1).sqrt().log()
        ),
        lambda v: (
            (v.y * v.t).exp()
            + v.x.log()
            + v.x.sqrt()
            + v.x.rsqrt()
            + (-v.y * v.q).exp()
            + (v.y.abs() / v.t + 0.1).sqrt().log()
        ),
    ),
    "abs_sign_relu_step": (
        lambda v: (v.x - v.y).abs() + (v.y - v.t).sign() * 2 + (v.y - v.x).relu() + (v.y - 0.3).step() * 3 + abs(v.s),
        lambda v: (v.x - v.y).abs() + (v.y - v.t).sign() * 2 + (v.y - v.x).relu() + _step(v.y - 0.3) * 3 + v.s.abs(),
    ),
    "trig_square": (
        lambda v: (v.x * v.y).sin() + (v.y - v.t).cos() * v.x + (v.x - v.y).square() - v.s.square().cos(),
        lambda v: (v.x * v.y).sin() + (v.y - v.t).cos() * v.x + (v.x - v.y).square() - v.s.square().cos(),
    ),
    "clamp_ifelse": (
        lambda v: (
            (v.x - v.y).clamp(-0.5, 0.5)
            + v.y.clamp(v.t - 1, v.t)
            + v.y.clamp(-1, 1)
            + (v.y - v.t).ifelse(v.x, v.y * 2)
            + v.s.ifelse(1, -2)
        ),
        lambda v: (
            (v.x - v.y).clamp(-0.5, 0.5)
            + torch.minimum(torch.maximum(v.y, v.t - 1), v.t)
            + v.y.clamp(-1, 1)
            + torch.where(v.y - v.t >= 0, v.x, v.y * 2)
            + torch.where(v.s >= 0, 1.0, -2.0)
        ),
    ),
    # reductions over the vector dimension (lazy: the result is a formula of dimension 1)
    "vector_reductions": (
        lambda v: (v.x * v.y).sum(-1) + (v.x - v.y).logsumexp(-1) - (v.x + v.y).max(-1) * 2 + (v.x * v.y).min(axis=-1),
        lambda v: (
            (v.x * v.y).sum(-1, keepdim=True)
            + (v.x - v.y).logsumexp(-1, keepdim=True)
            - (v.x + v.y).amax(-1, keepdim=True) * 2
            + (v.x * v.y).amin(-1, keepdim=True)
        ),
    ),
    "dot_norms": (
        lambda v: (v.x | v.y) + (v.y | v.raw.p) + (v.x - v.y).sqnorm2() + v.y.norm2() * v.s + v.x.sqdist(v.y) / 3,
        lambda v: (
            (v.x * v.y).sum(-1, keepdim=True)
            + (v.y * v.p).sum(-1, keepdim=True)
            + ((v.x - v.y) ** 2).sum(-1, keepdim=True)
            + v.y.norm(dim=-1, keepdim=True) * v.s
            + ((v.x - v.y) ** 2).sum(-1, keepdim=True) / 3
        ),
    ),
    "normalize": (
        lambda v: v.y.normalize() * v.x + (v.x - v.y).normalize() + v.p.normalize(),
        lambda v: (
            v.y / v.y.norm(dim=-1, keepdim=True) * v.x
            + (v.x - v.y) / (v.x - v.y).norm(dim=-1, keepdim=True)
            + v.p / v.p.norm()
        ),
    ),
    # concat (i with j, j with a parameter), elem, extract
    "concat_extract": (
        lambda v: v.x.concat(v.s).extract(1, 3) * v.y.elem(2) + v.y.concat(v.x).elem(4) + v.p.concat(v.y).extract(2, 3),
        lambda v: _cat(v.x[..., 1:], v.s) * v.y[..., 2:3] + v.x[..., 1:2] + _cat(v.p[2:].expand(1, 1, 1), v.y[..., :2]),
    ),
}


def _assert_sum_close(got: torch.Tensor, terms: torch.Tensor, dim: int):
    """got == terms.sum(dim) up to float64 rounding, measured against sum |terms| (the condition) plus the largest
    term: a cell is itself a sum of sub-terms (sin + cos * x + ...) whose rounding, of the order of the largest
    term for these inputs, stays when they cancel to a near-zero cell (a row of one such cell failed otherwise)."""
    ref = terms.sum(dim)
    assert got.dtype == torch.float64
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert torch.isfinite(terms).all(), "the test's inputs must give finite terms"
    assert torch.isfinite(got).all(), "non-finite output (poisoned, unwritten?)"
    bound = 1e-12 * (terms.shape[dim] + 10) * (terms.abs().sum(dim) + terms.abs().amax()) + 1e-300
    err = (got - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}, bound {bound.min().item():.3g}"


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", list(FORMULAS))
@settings(max_examples=4, deadline=None)
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_operation_reduced_over_j_and_i_against_torch(name, device, m, n, seed):
    v = make_inputs(m, n, seed, device)
    lazy, ref = FORMULAS[name]
    f = lazy(lazy_vars(v))
    terms = ref(dense_vars(v))
    terms = terms.expand(m, n, terms.shape[-1])
    assert isinstance(f, LazyTensor)
    assert f.shape == (m, n, terms.shape[-1])
    # .dense() against the hand computation (a different code path from the kernels)
    dense = f.dense()
    assert dense.shape == terms.shape
    torch.testing.assert_close(dense, terms, rtol=1e-10, atol=1e-12)
    _assert_sum_close(f.sum(dim=1), terms, 1)
    _assert_sum_close(f.sum(dim=0), terms, 0)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@settings(max_examples=4, deadline=None)
@given(m=SIZES, n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_transpose_swaps_i_and_j(device, m, n, seed):
    v = make_inputs(m, n, seed, device)
    lv, dv = lazy_vars(v), dense_vars(v)
    f = ((lv.x - lv.y).abs() * lv.s + lv.t).T  # an (N, M, 3) formula: y and s now index its rows
    terms = ((dv.x - dv.y).abs() * dv.s + dv.t).transpose(0, 1)
    assert f.shape == (n, m, 3)
    torch.testing.assert_close(f.dense(), terms, rtol=1e-12, atol=1e-12)
    _assert_sum_close(f.sum(1), terms, 1)
    _assert_sum_close(f.sum(0), terms, 0)
    assert f.T.shape == (m, n, 3)


def test_every_documented_operation_is_covered():
    """A guard for this module: each operation of the issue appears in some formula above."""
    import inspect

    source = inspect.getsource(inspect.getmodule(test_every_documented_operation_is_covered))
    ops = ["exp()", "log()", "sqrt()", "rsqrt()", "abs()", "sign()", "relu()", "sin()", "cos()", "square()"]
    ops += ["clamp(", "step()", "ifelse(", ".sum(-1)", ".logsumexp(-1)", ".max(-1)", ".min(axis=-1)", " | "]
    ops += ["sqnorm2()", "norm2()", "normalize()", "sqdist(", ".T", "concat(", "elem(", "extract(", "**-2", "**0.5"]
    ops += ["**-0.5", "**1.7", "**0", "**2", "(-v.x)", "2 * v.x", "7 / v.x", "2 - v.s", "1.5 * v.y"]
    missing = [op for op in ops if op not in source]
    assert not missing, missing
