"""Python numbers in lazy formulas (issue 15): every number is an entry of the number vector, a call argument
of the kernel (formula.Num), so formulas that differ only in their numbers share one compiled kernel and a
kernel source holds no literals; ints beyond int64 are floats, as torch takes them; numbers keep their exact
value in the compute dtype. Large formulas stay linear: keys, canonical forms and derivatives of DAGs whose
trees are exponential, a chain of 2,000 additions compiled and checked against float64."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import CUDA

from semiring_ops.lazy import LazyTensor, Pm, Vi, Vj, cpu_kernels
from semiring_ops.lazy import autograd as lazy_autograd
from semiring_ops.lazy import formula as F
from semiring_ops.lazy.codegen import cpu_source, cuda_config, cuda_source
from semiring_ops.lazy.formula import FormulaError, Var, canonical_numbers, canonicalize, node_count, vjp
from semiring_ops.lazy.formula_key import parse_formula
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import semiring_reduction

DEVICES = ["cpu", CUDA]
F64 = torch.float64


def _points(device: str, m: int = 7, n: int = 5, d: int = 2, dtype: torch.dtype = F64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=F64)
    y = torch.randn(n, d, generator=g, dtype=F64)
    return x.to(device, dtype), y.to(device, dtype)


def _plan(f: LazyTensor, reduction=None) -> Plan:
    canon, tvars = canonicalize(f.formula)
    cats, dims = tuple(v.cat for v in tvars), tuple(v.dim for v in tvars)
    return Plan(canon, cats, dims, reduction or semiring_reduction("std"), "i", False)


# ---------------------------------------------------------------- ints beyond int64


BIG = 10**30
# name: (lazy formula of D, the same with torch on the dense float64 D); D >= 1 (a squared distance plus 1)
BIG_INT_CASES = {
    "mul": (lambda d: d * BIG, lambda d: d * float(BIG)),
    "rmul": (lambda d: BIG * d, lambda d: float(BIG) * d),
    "add_2_64": (lambda d: d + 2**64, lambda d: d + float(2**64)),
    "rsub": (lambda d: BIG - d, lambda d: float(BIG) - d),
    "div": (lambda d: d / BIG, lambda d: d / float(BIG)),
    "rdiv": (lambda d: BIG / d, lambda d: float(BIG) / d),
    "clamp": (lambda d: d.clamp(2**64, BIG), lambda d: d.clamp(float(2**64), float(BIG))),
    "ifelse": (
        lambda d: (d - 2).ifelse(BIG, -BIG),
        lambda d: torch.where(d - 2 >= 0, d * 0 + float(BIG), d * 0 - float(BIG)),
    ),
    "lt": (lambda d: d < BIG, lambda d: (d < float(BIG)).to(F64)),
    "pow_2_63": (lambda d: d ** (2**63), lambda d: d ** float(2**63)),  # was IntPow(int) overflowing C's int
    "pow_big": (lambda d: d**BIG, lambda d: d ** float(BIG)),
    "pow_neg_big": (lambda d: d ** (-BIG), lambda d: d ** (-float(BIG))),
    "pow_float_1e30": (lambda d: d**1e30, lambda d: d**1e30),
    "pow_signed_base": (lambda d: (d - 2) ** (2**64), lambda d: (d - 2) ** float(2**64)),
    "pow_int_max": (lambda d: d**F.IntPow.MAX, lambda d: d ** float(F.IntPow.MAX)),
    "pow_past_int_max": (lambda d: d ** (F.IntPow.MAX + 1), lambda d: d ** float(F.IntPow.MAX + 1)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BIG_INT_CASES))
def test_ints_beyond_int64_are_floats_as_in_torch(backend, device, name):
    """torch takes a Python int into a float tensor's operation as a float; so do the formulas, on every
    path that evaluates them: the kernels, the PyTorch fallback, .dense(), a max reduction's gradient."""
    lazy, dense = BIG_INT_CASES[name]
    x, y = _points(device)
    d = Vi(x).sqdist(Vj(y)) + 1
    ref = dense(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1, keepdim=True) + 1)
    f = lazy(d)
    torch.testing.assert_close(f.dense(), ref)
    torch.testing.assert_close(f.sum(1), ref.sum(1))
    torch.testing.assert_close(f.max(1), ref.max(1).values)


def test_gradients_through_numbers_beyond_int64():
    x, y = _points("cpu")
    x.requires_grad_()
    (got,) = torch.autograd.grad((Vi(x).sqdist(Vj(y)) * BIG / 2**100).logsumexp(1).sum(), x)
    xr = x.detach().clone().requires_grad_()
    dense = ((xr[:, None, :] - y[None, :, :]) ** 2).sum(-1) * float(BIG) / float(2**100)
    (want,) = torch.autograd.grad(dense.logsumexp(1).sum(), xr)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: d * 10**400,
        lambda d: 10**400 - d,
        lambda d: d ** (10**400),
        lambda d: d.clamp(0, 10**400),
        lambda d: Pm(10**400),
        lambda d: LazyTensor(-(10**400)),
    ],
)
def test_ints_beyond_the_float_range_raise_overflow_error(make):
    x, y = _points("cpu")
    with pytest.raises(OverflowError, match=r"too large for a float"):
        make(Vi(x).sqdist(Vj(y)))


# ---------------------------------------------------------------- one kernel per structure


def _gauss(x, y, s, c):
    return (-(Vi(x).sqdist(Vj(y))) * s + c).exp()


def _dense_gauss(x, y, s, c):
    return (-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1, keepdim=True) * s + c).exp()


NUMBER_SETS = [(0.3, 2), (0.7, -5), (1.25, 0.125), (2, 3)]  # ints and floats alike


def test_formulas_differing_only_in_numbers_share_one_cpu_kernel(compiled, monkeypatch):
    """One compile for all the number sets: the plan keys are equal (the numbers are Num slots) and the kernel
    compiled for the first set gives the right results for the others (the values travel with the call)."""
    builds: list[str] = []
    real = cpu_kernels.compile_host_library

    def counting(source, functions):
        builds.append(source)
        return real(source, functions)

    monkeypatch.setattr(cpu_kernels, "_functions", {})
    monkeypatch.setattr(cpu_kernels, "compile_host_library", counting)
    x, y = _points("cpu", 40, 37)  # 37: full groups of lanes and a tail
    keys = set()
    for s, c in NUMBER_SETS:
        f = _gauss(x, y, s, c)
        keys.add(_plan(f).key)
        torch.testing.assert_close(f.sum(1), _dense_gauss(x, y, s, c).sum(1))
        torch.testing.assert_close(f.logsumexp(1), _dense_gauss(x, y, s, c).logsumexp(1))
    assert len(keys) == 1 and "Num0()" in keys.pop()
    assert len(builds) == 2  # the sum and the logsumexp, once each
    assert not re.search(r"T\(-?[0-9]", builds[0])  # no number written into the source


@pytest.mark.cuda
def test_formulas_differing_only_in_numbers_share_one_cuda_kernel(compiled, monkeypatch):
    """The CUDA twin: the number vector is one more kernel argument (after the variables' pointers)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from semiring_ops.lazy import cuda_kernels

    builds: list[str] = []
    real = cuda_kernels.compile_cuda_module

    def counting(source, names, device, *rest):
        builds.append(source)
        return real(source, names, device, *rest)

    monkeypatch.setattr(cuda_kernels, "_kernels", {})
    monkeypatch.setattr(cuda_kernels, "_launches", {})
    monkeypatch.setattr(cuda_kernels, "compile_cuda_module", counting)
    x, y = _points("cuda", 300, 517)
    for s, c in NUMBER_SETS:
        f = _gauss(x, y, s, c)
        torch.testing.assert_close(f.sum(1), _dense_gauss(x, y, s, c).sum(1))
        torch.testing.assert_close(f.logsumexp(1), _dense_gauss(x, y, s, c).logsumexp(1))
    assert len(builds) == 2
    assert "const T* __restrict__ nums" in builds[0] and not re.search(r"T\(-?[0-9]", builds[0])


def test_a_kernel_reads_its_numbers_where_they_are_used():
    """The numbers are read from the vector in the cell (the scalar skeleton of large formulas re-reads them
    each j, behind an asm the compiler cannot hoist loads over), never copied into one local each."""
    x, y = _points("cpu")
    small = _plan(Vi(x).sqdist(Vj(y)) * 3 + 0.5)
    src = cpu_source(small, "float64")
    assert "numbers[0]" in src and "numbers[1]" in src and "asm" not in src
    f = Vi(x).sqdist(Vj(y))
    for k in range(300):
        f = f + k / 7
    src = cpu_source(_plan(f), "float64")
    assert 'asm("" : "+r"(nums))' in src and src.count("nums[") == 300 and "numbers[299]" not in src


@pytest.mark.parametrize("device", DEVICES)
def test_numbers_keep_their_value_in_the_compute_dtype(compiled, device):
    """float64 formulas get float64 numbers (1 + 2^-40 is not a float32); 16-bit ones float32 numbers, the
    dtype they are computed in (100000.5 is inf as a float16)."""
    x = torch.zeros(3, 1, dtype=F64, device=device)
    out = (Vi(x) + (1 + 2**-40)).sum(1)
    assert out.flatten().tolist() == [1 + 2**-40] * 3
    x16 = torch.rand(6, 2, device=device).half()
    y16 = torch.rand(5, 2, device=device).half()
    f = (Vi(x16) * Vj(y16) * 100000.5 - 100000.25) / 100000.5
    want = ((x16.double()[:, None] * y16.double()[None] * 100000.5 - 100000.25) / 100000.5).sum(1)
    torch.testing.assert_close(f.sum(1).double(), want, rtol=2e-3, atol=2e-3)


def test_a_call_without_its_number_vector_is_refused():
    x, y = _points("cpu")
    f = Vi(x).sqdist(Vj(y)) * 0.5
    plan = _plan(f)
    with pytest.raises(ValueError, match="number vector"):
        lazy_autograd.run_plan(plan, lazy_autograd.Extent((), 7, 5), [x, y])


# ---------------------------------------------------------------- linear in the formula's size


def test_keys_of_dags_are_linear_and_parse_back():
    """f = f * f + f, 60 times: a tree of 2^60 leaves, a key of a few hundred characters (repeated
    sub-formulas are written @n), parsed back to the same DAG, the same key."""
    x = Vi(torch.rand(4, 1, dtype=F64))
    f = x
    for _ in range(60):
        f = f * f + f
    canon, _ = canonicalize(f.formula)
    assert len(canon.key) < 60 * 40 and "@" in canon.key
    parsed = parse_formula(canon.key)
    assert parsed.key == canon.key and node_count(parsed) == node_count(canon) == 121


def test_structurally_equal_subformulas_are_computed_once():
    """Two equal sub-formulas built separately are one node of the canonical formula, emitted once."""
    x, y = _points("cpu")

    def k():
        return (-(Vi(x).sqdist(Vj(y)))).exp()

    f = k() * k() + k().sqrt()
    canon, _ = canonicalize(f.formula)
    em = F.Emitter(lambda v, d: f"v{v.slot}_{d}")
    em.emit(canon)
    assert sum(line.count("lz_exp") for line in em.lines) == 1
    want = _dense_gauss(x, y, 1.0, 0.0)
    torch.testing.assert_close(f.sum(1), (want * want + want.sqrt()).sum(1))


def test_bad_references_in_keys_raise_formula_error():
    for key in ("Mul(Vi0:1(),@1)", "@0", "Mul(Vi0:1(),@)", "Num-1()"):
        with pytest.raises(FormulaError):
            parse_formula(key)
    same = parse_formula("Mul(Vi0:1(),@0)")
    assert same.children[0] is same.children[1]


def test_a_number_without_a_value_is_refused():
    with pytest.raises(FormulaError, match="no value"):
        canonicalize(F.Add(Var("i", 1, slot=0), F.Num(2)), numbered=1)


def _chain(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[LazyTensor, torch.Tensor, list[float]]:
    numbers = [0.5 + k / (n + 1) for k in range(n)]  # distinct floats
    f = Vi(x).sqdist(Vj(y))
    ref = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1, keepdim=True)
    for c in numbers:
        f = f + c
        ref = ref + c
    return f, ref, numbers


@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_of_2000_additions_matches_float64(compiled, device):
    """D + c_1 + ... + c_2000 with distinct numbers: one number vector, a cell linear in the formula (the
    compile took 132 s with a parameter per number), the value of float64 torch."""
    x, y = _points(device, 9, 21)
    f, ref, numbers = _chain(x, y, 2000)
    assert canonical_numbers(f.formula) == tuple(numbers)
    assert node_count(canonicalize(f.formula)[0]) == 5 + 2 * 2000  # D, then an Add and a Num per number
    torch.testing.assert_close(f.sum(1), ref.sum(1))


def test_the_derivative_of_a_long_chain_stays_linear():
    """vjp visits each node once and sends no cotangent into the numbers: the derivative of the chain with
    respect to x has a size of the order of the formula, as its canonical form and key."""
    x, y = _points("cpu")
    f, _, _ = _chain(x, y, 2000)
    (v,) = canonicalize(f.formula)[1][:1]
    g = Var("i", 1, tensor=torch.ones(7, 1, dtype=F64))
    (d,) = vjp(F.SoftmaxWeight(f.formula, g), [Var(v.cat, v.dim, tensor=v.tensor)], g)
    canon, _ = canonicalize(d)
    size = 5 + 2 * 2000  # the chain's
    assert node_count(canon) < size + 50 and len(canon.key) < 20 * size


def test_cuda_sources_take_the_number_vector_and_one_cell_for_large_formulas():
    """The CUDA source (pure codegen, no GPU needed): the number vector is the argument after the variables'
    pointers, read in place; a formula of thousands of nodes gets one row per thread and no chunked loop, so
    the source holds one copy of its cell (the Gaussian keeps its 8 rows)."""
    x, y = _points("cpu")
    f, _, _ = _chain(x, y, 2000)
    plan = _plan(f, semiring_reduction("log"))
    cfg = cuda_config(plan, "float32")
    assert (cfg.rows, cfg.chunk) == (1, 1)
    src = cuda_source(plan, "float32", cfg)
    assert "const T* __restrict__ a1, const T* __restrict__ nums, long long bs0" in src
    assert src.count("const T r0_f[") == 1 and "numsj[1999]" in src and not re.search(r"T\(-?[0-9]", src)
    # read behind an empty asm per j, in a loop not unrolled: NVVM hoisted the loads out of the loop otherwise
    assert 'asm volatile("" : "+l"(numsj));' in src and "#pragma unroll 1\n" in src
    gauss = _plan((-(Vi(x).sqdist(Vj(y))) / 0.5).exp() * Vj(y).elem(0))
    assert cuda_config(gauss, "float32").rows == 8
    small = cuda_source(gauss, "float32", cuda_config(gauss, "float32"))
    assert "asm volatile" not in small and "#pragma unroll 4\n" in small
