"""Bad input to semiring_ops.lazy raises a clear exception (naming the operands' shapes, dtypes or devices)
before anything is compiled or run; a kernel that fails to compile raises LazyCompileError with the
compiler's log."""

from __future__ import annotations

import math
import os
import re
import stat

import pytest
import torch
from conftest import HAS_CUDA

from semiring_ops.lazy import LazyCompileError, LazyTensor, Pm, Vi, Vj, autograd, cpu_kernels


class _Ran(Exception):
    """Raised by the stand-in of the reduction engine: the input passed the checks and a reduction ran."""


@pytest.fixture
def nothing_runs(tmp_path, monkeypatch):
    """No kernel may be compiled or run: the engine entry point raises _Ran, and the kernel cache is an
    empty folder that must stay empty."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_CACHE", str(tmp_path))

    def refuse(*args, **kwargs):
        raise _Ran

    monkeypatch.setattr(autograd, "execute", refuse)
    monkeypatch.setattr(cpu_kernels, "compile_host_library", refuse)
    yield
    assert not any(tmp_path.iterdir()), f"compiled before the input was checked: {list(tmp_path.iterdir())}"


def _x(m=5, d=2, dtype=torch.float32, device="cpu"):
    return torch.randn(m, d, dtype=dtype, device=device)


def test_the_guard_sees_a_valid_reduction(nothing_runs):
    """The positive control of the fixture: a well-formed reduction does reach the engine."""
    with pytest.raises(_Ran):
        Vi(_x()).sqdist(Vj(_x(6))).sum(1)


# ---------------------------------------------------------------- shapes


BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "|": lambda a, b: a | b,
    "**": lambda a, b: a**b,
    "clamp": lambda a, b: a.clamp(b, 1),
    "ifelse": lambda a, b: a.ifelse(b, 0),
    "sqdist": lambda a, b: a.sqdist(b),
}


@pytest.mark.parametrize("op", list(BINARY))
def test_vector_dimensions_that_do_not_broadcast_name_both_shapes(nothing_runs, op):
    a, b = Vi(_x(5, 2)), Vj(_x(6, 3))
    with pytest.raises(ValueError, match=r"\(5, 1, 2\).*\(1, 6, 3\)") as info:
        BINARY[op](a, b)
    assert "vector dimension" in str(info.value)
    assert a.concat(b).shape == (5, 6, 5)  # concat takes any two dimensions


def test_mismatched_numbers_of_i_or_j(nothing_runs):
    with pytest.raises(ValueError, match=r"5 and 4 i-indices.*\(5, 1, 2\).*\(4, 1, 2\)"):
        Vi(_x(5)) + Vi(_x(4))
    with pytest.raises(ValueError, match=r"6 and 7 j-indices"):
        Vj(_x(6)) * Vj(_x(7))
    with pytest.raises(ValueError, match=r"7 and 6 j-indices"):
        Vi(_x(5)).sqdist(Vj(_x(7))) @ torch.randn(6, 2)
    with pytest.raises(ValueError, match=r"7 and 6 j-indices"):
        Vi(_x(5)).sqdist(Vj(_x(7))).logsumexp(1, weight=Vj(_x(6, 1)))


def test_batch_shapes_that_do_not_broadcast(nothing_runs):
    x = LazyTensor(torch.randn(2, 5, 1, 3))
    y = LazyTensor(torch.randn(3, 1, 6, 3))
    with pytest.raises(ValueError, match=r"batch shapes \(2,\) and \(3,\)"):
        x - y


@pytest.mark.parametrize("axis", [3, -4, 7])
def test_reduction_over_an_axis_that_is_not_one(nothing_runs, axis):
    f = Vi(_x()).sqdist(Vj(_x(6)))
    for name in ("sum", "logsumexp", "max", "argmin", "Kmin"):
        args = (2,) if name == "Kmin" else ()
        with pytest.raises(ValueError, match=rf"axis {axis} is not a reduction axis.*\(5, 6, 1\)"):
            getattr(f, name)(*args, dim=axis)
        with pytest.raises(ValueError, match="not a reduction axis"):
            getattr(f, name)(*args, axis=axis)


def test_with_batch_dimensions_dim_0_is_a_batch_axis(nothing_runs):
    f = LazyTensor(torch.randn(2, 5, 1, 3)) - LazyTensor(torch.randn(2, 1, 6, 3))
    with pytest.raises(ValueError, match=r"axis 0 is not a reduction axis.*use 1 or -3 \(over i\), 2 or -2"):
        f.sum(0)


def test_reductions_without_an_axis(nothing_runs):
    f = Vi(_x()).sqdist(Vj(_x(6)))
    for name in ("sum_reduction", "logsumexp", "max_reduction", "min_argmin"):  # sum() / max(): the vector (KeOps)
        with pytest.raises(ValueError, match="give the axis"):
            getattr(f, name)()


def test_selections_over_the_vector_dimension(nothing_runs):
    f = Vi(_x()) - Vj(_x(6))
    for name in ("max_argmax", "min_argmin"):  # argmax(-1) / argmin(-1): KeOps' ArgMax / ArgMin operations
        with pytest.raises(ValueError, match=f"{name} over the vector dimension is not available"):
            getattr(f, name)(-1)
    for name in ("Kmin", "argKmax", "Kmin_argKmin"):
        with pytest.raises(ValueError, match=f"{name} over the vector dimension is not available"):
            getattr(f, name)(2, dim=-1)


def test_a_weight_with_the_vector_dimension_is_refused(nothing_runs):
    f = Vi(_x()) - Vj(_x(6))
    with pytest.raises(ValueError, match="weight"):
        f.logsumexp(-1, weight=Vj(_x(6, 1)))


def test_conflicting_dim_and_axis_are_refused(nothing_runs):
    f = Vi(_x()) - Vj(_x(6))
    with pytest.raises(ValueError, match=r"dim.*axis|axis.*dim"):
        f.max(dim=1, axis=0)


def test_a_dense_tensor_is_not_a_variable(nothing_runs):
    with pytest.raises(ValueError, match=r"LazyTensor\(x\) of shape \(4, 5, 2\).*dense"):
        LazyTensor(torch.randn(4, 5, 2))
    with pytest.raises(ValueError, match=r"\(3, 4, 5, 2\)"):
        LazyTensor(torch.randn(3, 4, 5, 2))


def test_a_two_dimensional_tensor_needs_an_axis(nothing_runs):
    for axis in (None, 2, -1):
        with pytest.raises(ValueError, match=r"\(4, 2\).*axis=0.*axis=1"):
            LazyTensor(torch.randn(4, 2), axis=axis)


def test_wrong_ranks_for_vi_vj_pm(nothing_runs):
    with pytest.raises(ValueError, match=r"Vi\(x\).*\(5,\)"):
        Vi(torch.randn(5))
    with pytest.raises(ValueError, match=r"Vj\(x\).*\(\)"):
        Vj(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"Pm\(x\).*\(2, 3\)"):
        Pm(torch.randn(2, 3))
    with pytest.raises(TypeError, match=r"Vi\(x\).*list"):
        Vi([[1.0, 2.0]])
    with pytest.raises(TypeError, match=r"LazyTensor.*str"):
        LazyTensor("x")


# ---------------------------------------------------------------- k-best and @


def test_k_out_of_range_or_of_a_wrong_type(nothing_runs):
    f = Vi(_x(5)).sqdist(Vj(_x(6)))
    for k in (7, 0, -1):
        with pytest.raises(ValueError, match=rf"K={k} must be between 1 and the reduced size 6"):
            f.Kmin(k, dim=1)
    with pytest.raises(ValueError, match="K=6 must be between 1 and the reduced size 5"):
        f.argKmax(6, dim=0)
    for k in (2.0, True, "2", None):
        with pytest.raises(TypeError, match=f"K must be an int, got {type(k).__name__}"):
            f.Kmin_argKmin(k, dim=1)


def test_extract_and_elem_out_of_range(nothing_runs):
    x = Vi(_x(5, 3))
    for m, d in ((1, 3), (3, 1), (-1, 1), (0, 0), (0, 4)):
        with pytest.raises(ValueError, match=rf"extract\({m}, {d}\).*\(5, 1, 3\).*out of range"):
            x.extract(m, d)
    with pytest.raises(ValueError, match="out of range"):
        x.elem(3)


def test_matmul_needs_a_scalar_formula_and_a_tensor(nothing_runs):
    f = Vi(_x(5, 2)) - Vj(_x(6, 2))
    with pytest.raises(ValueError, match=r"@ needs a scalar formula.*\(5, 6, 2\)"):
        f @ torch.randn(6, 1)
    s = f.sum(-1)
    with pytest.raises(ValueError, match=r"\(\.\.\., N, E\) or \(N,\).*\(\)"):
        s @ torch.tensor(1.0)  # a vector v (N,) is KeOps' matrix-vector product (test_lazy_keops_api.py)
    with pytest.raises(TypeError, match="tensor"):
        s @ [[1.0]]
    with pytest.raises(TypeError, match="LazyTensor"):
        s @ Vj(_x(6, 1))


def test_constants_only_have_nothing_to_reduce(nothing_runs):
    with pytest.raises(ValueError, match="constants"):
        (LazyTensor(2.0) + 1).sum(1)
    with pytest.raises(ValueError, match="constants"):
        LazyTensor(3).dense()


# ---------------------------------------------------------------- dtypes and devices


def test_integer_and_bool_tensors_are_refused(nothing_runs):
    for dt in (torch.int64, torch.int32, torch.bool):  # (complex tensors make complex LazyTensors)
        t = torch.ones(5, 2, dtype=dt)
        for make in (Vi, Vj, lambda t: LazyTensor(t, axis=0), lambda t: Pm(t[0])):
            with pytest.raises(TypeError, match=rf"got {dt} \(shape \((5, )?2,?\)\)"):
                make(t)
        with pytest.raises(TypeError, match=str(dt)):
            Vi(_x()) + t[None]
        with pytest.raises(TypeError, match=str(dt)):
            Vi(_x()).sqdist(Vj(_x(5))) @ t


def test_mixed_dtypes_are_refused_and_named(nothing_runs):
    a = Vi(_x(5, 2, torch.float32))
    for dt in (torch.float64, torch.float16, torch.bfloat16):
        b = Vj(_x(6, 2, dt))
        with pytest.raises(TypeError, match=rf"different dtypes \(torch.float32 and {dt}\)"):
            a - b
    s = a.sqdist(Vj(_x(6, 2)))
    with pytest.raises(TypeError, match=r"float32 and torch\.float64"):
        s @ torch.randn(6, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"float32 and torch\.float64"):
        s.logsumexp(1, weight=Vj(_x(6, 1, torch.float64)))
    with pytest.raises(TypeError, match=r"float32 and torch\.float64"):
        s * torch.tensor([2.0], dtype=torch.float64)


def test_mixed_devices_are_refused_and_named(nothing_runs):
    a = Vi(_x())
    b = Vj(torch.randn(6, 2, device="meta"))
    with pytest.raises(ValueError, match=r"different devices \(cpu and meta\)"):
        a - b
    with pytest.raises(ValueError, match="devices"):
        a.sqdist(Vj(_x(6))) @ torch.randn(6, 1, device="meta")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_mixed_cpu_and_cuda_are_refused_and_named(nothing_runs):
    a = Vi(_x())
    b = Vj(_x(6, device="cuda"))
    with pytest.raises(ValueError, match=r"different devices \(cpu and cuda:0\)"):
        a - b
    with pytest.raises(ValueError, match="devices"):
        Vi(_x(device="cuda")).sqdist(b) @ torch.randn(6, 1)


def test_a_number_parameter_works_in_float64():
    x = torch.randn(5, 2, dtype=torch.float64)
    y = torch.randn(6, 2, dtype=torch.float64)
    out = (Vi(x).sqdist(Vj(y)) * Pm(0.5)).sum(1)
    torch.testing.assert_close(out, 0.5 * ((x[:, None] - y[None]) ** 2).sum(-1).sum(1, keepdim=True))


def test_a_number_parameter_takes_the_dtype_of_the_formula_it_joins():
    """Pm(number) is deferred: it takes the dtype (and device) of the other operand, on either side, through
    unary operations and other deferred numbers; the float64 value is exact (0.1 is not float32's 0.1)."""
    x = torch.randn(5, 2, dtype=torch.float64)
    y = torch.randn(6, 2, dtype=torch.float64)
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
    for f in (
        Pm(0.1) * Vi(x).sqdist(Vj(y)),
        Vi(x).sqdist(Vj(y)) / Pm(10),
        (Pm(0.2) * 0.5).exp().log() * Vi(x).sqdist(Vj(y)),
        Vi(x).sqdist(Vj(y)) * (Pm(0.05) + Pm(0.05)),
        (Vi(x).sqdist(Vj(y)) * Pm(0.1)).T.T,
    ):
        assert f.dtype == torch.float64 and f.device == x.device and not f.deferred
        assert all(t.dtype == torch.float64 for t in f.variables)
        torch.testing.assert_close(f.sum(1), (0.1 * d2).sum(1, keepdim=True), rtol=1e-14, atol=0)
    (p,) = (Vi(x) * Pm(0.1)).variables[1:]
    assert p.item() == 0.1
    # with 16-bit variables the number rounds like the variables
    h = Vi(x.half()) * Pm(0.1)
    assert h.dtype == torch.float16 and h.variables[1].dtype == torch.float16


def test_a_formula_of_number_parameters_only_is_float32_on_the_cpu():
    p = Pm(2.0) * Pm(3) + 0.5
    assert p.deferred and p.dtype == torch.float32 and p.device == torch.device("cpu")
    assert p.shape == (1, 1, 1)
    assert torch.equal(p.sum(0), torch.tensor([[6.5]]))
    assert torch.equal(p.dense(), torch.tensor([[[6.5]]]))
    # a 0-d or (D,) tensor is a parameter of its own dtype, not a deferred number
    t = Pm(torch.tensor(2.0, dtype=torch.float64))
    assert not t.deferred and t.dtype == torch.float64
    with pytest.raises(TypeError, match=r"float32 and torch\.float64"):
        Vi(_x()) * t


def test_numbers_are_made_tensors_once_per_value_dtype_and_device(monkeypatch):
    """Pm(float) and a formula's number vector (its Python numbers, formula.Num) each go through a cache: the
    same numbers are not copied again (a synchronous host-to-device copy on a GPU), and -0.0 / 0.0 and NaN
    keep their own bits."""
    import semiring_ops.lazy.lazy_tensor as lt
    import semiring_ops.lazy.plan as lp

    x = _x(dtype=torch.float64)
    first = (Vi(x) * Pm(0.37)).variables[1]
    assert (Vi(x) * Pm(0.37)).variables[1] is first
    assert (Vi(_x()) * Pm(0.37)).variables[1] is not first  # float32: another tensor
    assert lp.numbers_tensor([0.37, 2.0], x) is lp.numbers_tensor([0.37, 2.0], x)
    assert lp.numbers_tensor([0.37, 2.0], _x()).dtype == torch.float32  # another tensor: the compute dtype
    (Vi(x) * 0.37 + Pm(0.37) * 2).sum(1)
    made = []
    real = torch.tensor
    monkeypatch.setattr(lt.torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    for _ in range(5):
        (Vi(x) * 0.37 + Pm(0.37) * 2).sum(1)  # a new formula each time, the same numbers
    assert made == []
    neg, pos = (Vi(x) * Pm(-0.0)).variables[1], (Vi(x) * Pm(0.0)).variables[1]
    assert neg is not pos and math.copysign(1, neg.item()) == -1 and math.copysign(1, pos.item()) == 1
    neg, pos = lp.numbers_tensor([-0.0], x), lp.numbers_tensor([0.0], x)
    assert neg is not pos and math.copysign(1, neg.item()) == -1 and math.copysign(1, pos.item()) == 1
    assert lp.numbers_tensor([math.nan], x) is lp.numbers_tensor([math.nan], x)
    assert lt._cached_number.cache_info().maxsize == lt.NUMBER_CACHE_SIZE
    assert lp._cached_numbers.cache_info().maxsize == lp.NUMBERS_CACHE_SIZE


def test_a_cached_number_first_made_in_inference_mode_still_records_gradients():
    x = _x(dtype=torch.float64)
    with torch.inference_mode():
        (Vi(x) * 0.123457 + Vj(x)).sum(1)
    x.requires_grad_(True)
    (Vi(x) * 0.123457 + Vj(x)).sum(1).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, (0.123457 + 1) * 5))  # x is i and j


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_a_number_parameter_follows_a_cuda_formula():
    x = _x(device="cuda", dtype=torch.float64)
    f = Vi(x) * Pm(0.5) + Pm(1)
    assert f.device == x.device and all(t.device == x.device for t in f.variables)
    torch.testing.assert_close(f.sum(1), (x * 0.5 + 1) * 1)


def test_a_vector_tensor_exponent():
    x = torch.rand(5, 3, dtype=torch.float64) + 0.5
    p = torch.tensor([1.5, 2.0, 0.5], dtype=torch.float64)
    y = torch.randn(4, 3, dtype=torch.float64)
    out = (Vi(x) ** p + Vj(y)).sum(1)
    torch.testing.assert_close(out, (x[:, None] ** p + y[None]).sum(1))


# ---------------------------------------------------------------- failed compiles


@pytest.fixture
def fresh_compile(tmp_path, monkeypatch, compiled):
    """The compiled CPU backend with an empty kernel cache and no kernel loaded in this process."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEMIRING_OPS_LAZY_CACHE", str(cache))
    monkeypatch.setattr(cpu_kernels, "_functions", {})
    return cache


def test_a_broken_generated_source_raises_lazy_compile_error_with_the_log(fresh_compile, monkeypatch):
    real = cpu_kernels.cpu_source
    monkeypatch.setattr(
        cpu_kernels, "cpu_source", lambda plan, dt: real(plan, dt) + '\nstatic_assert(false, "zz_broken_kernel");\n'
    )
    with pytest.raises(LazyCompileError) as info:
        (Vi(_x()) - Vj(_x(6))).sum(1)
    err = info.value
    assert "zz_broken_kernel" in str(err) and "zz_broken_kernel" in err.log
    assert "failed to compile" in str(err)
    assert err.source_path is not None and err.source_path.is_file()
    assert "zz_broken_kernel" in err.source_path.read_text()
    assert err.log_path is not None and "zz_broken_kernel" in err.log_path.read_text()
    assert not list(fresh_compile.glob("*.so")), "no library may be published for a failed build"


def test_a_failing_compiler_raises_lazy_compile_error_with_its_output(fresh_compile, tmp_path, monkeypatch):
    script = tmp_path / "fake-cxx"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "fake-cxx 1.0"; exit 0; fi\n'
        'echo "fake-cxx: error: zz_simulated_failure" >&2\n'
        "exit 3\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(script))
    with pytest.raises(LazyCompileError, match=r"(?s)exit 3.*zz_simulated_failure") as info:
        (Vi(_x()) * Vj(_x(6))).sum(-1).logsumexp(1)
    assert "zz_simulated_failure" in info.value.log
    assert re.search(re.escape(os.path.basename(script)), info.value.log)
    # the compiler back: the same formula now compiles and runs
    monkeypatch.delenv("CXX")
    x, y = _x(), _x(6)
    out = (Vi(x) * Vj(y)).sum(-1).logsumexp(1)
    torch.testing.assert_close(out, (x @ y.T).logsumexp(1, keepdim=True))
