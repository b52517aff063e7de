"""The k-best reductions (Kmin, argKmin, Kmin_argKmin, Kmax, argKmax, Kmax_argKmax) of the generated kernels
(csrc/lazy/kbest.h) against a float64 reference: torch.sort(stable=True) of the dense formula, whose order is
torch.topk's (NaN the largest value) with ties broken by the lower index; its values are checked against
torch.topk's too.

The data are small integers with +-inf (and NaN from inf * 0) so that float32 computes them exactly and ties
are everywhere. Covered: K from 1 to 64 (the scan insertion, K > 32 the count-and-memmove one, and the
unrolled register insertion the CUDA kernels use, forced on the CPU), both directions, reductions over j and
over i, formulas of 2 components, batch dimensions, the gradient of Kmin values; the reducer's other entry
points (add_chunk, the CUDA kernels' chunked loop, and merge, the CUDA split's combine of partial lists, with
ranges shorter than K) through a small C++ harness; and the CUDA source of several K, compiled by nvcc when
it is installed (no GPU needed; ptxas' report says whether the lists stay in registers) and, marked slow, by
libnvrtc, the runtime's compiler."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import nvrtc_compiles
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.build.jit import source_root
from semiring_ops.lazy import LazyTensor, Vi, Vj, cpu_kernels, reductions
from semiring_ops.lazy.codegen import cpu_source, cuda_config, cuda_source
from semiring_ops.lazy.formula import canonicalize
from semiring_ops.lazy.host_compiler import compile_host_library, host_compiler_available
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import kbest

pytestmark = pytest.mark.skipif(not host_compiler_available(), reason="no C++ compiler")

NAN, INF = float("nan"), float("inf")
NAMES = ("Kmin", "argKmin", "Kmin_argKmin", "Kmax", "argKmax", "Kmax_argKmax")


def _special_ints(g: torch.Generator, shape: tuple[int, ...], specials: float) -> torch.Tensor:
    """Integers in [-2, 2], a fraction ``specials`` of them +-inf (float64)."""
    t = torch.randint(-2, 3, shape, generator=g).double()
    pick = torch.rand(shape, generator=g) < specials
    signs = torch.where(torch.rand(shape, generator=g) < 0.5, -INF, INF).double()
    return torch.where(pick, signs, t)


def _reference(dense: torch.Tensor, k: int, largest: bool, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k best along ``dim`` of a float64 dense tensor (..., M, N, D), moved to
    (..., rows, K, D); checked against torch.topk's values."""
    vals, idx = torch.sort(dense, dim=dim, descending=largest, stable=True)
    vals, idx = vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)
    top = torch.topk(dense, k, dim=dim, largest=largest, sorted=True).values
    torch.testing.assert_close(vals, top, equal_nan=True, rtol=0, atol=0)
    if dim == dense.dim() - 3:  # reduced over i: rows are j
        vals, idx = vals.movedim(dim, -2), idx.movedim(dim, -2)
    return vals, idx


def _check(
    lazy: LazyTensor, dense: torch.Tensor, k: int, largest: bool, dim: int, dtype: torch.dtype = torch.float32
) -> None:
    """Every k-best method of ``lazy`` (..., M, N), a formula of D components, over ``dim`` (>= 0) equals the
    float64 reference of ``dense`` (..., M, N, D) (on the CPU; ``lazy`` on any device)."""
    rv, ri = _reference(dense, k, largest, dim)
    if dense.shape[-1] == 1:
        rv, ri = rv[..., 0], ri[..., 0]
    for name in NAMES:
        if ("Kmax" in name) != largest:
            continue
        out = getattr(lazy, name)(k, dim=dim)
        vals, idx = out if "_" in name else ((None, out) if name.startswith("arg") else (out, None))
        if vals is not None:
            assert vals.dtype == dtype and vals.shape == rv.shape, name
            torch.testing.assert_close(vals.double().cpu(), rv, equal_nan=True, rtol=0, atol=0, msg=name)
        if idx is not None:
            assert idx.dtype == torch.int64 and torch.equal(idx.cpu(), ri), name


def _plan(lazy: LazyTensor, k: int, largest: bool) -> Plan:
    """The plan of ``lazy``'s k-best over j."""
    canon, tvars = canonicalize(lazy.formula)
    return Plan(canon, tuple(v.cat for v in tvars), tuple(v.dim for v in tvars), kbest(k, largest), "i", False)


@pytest.fixture
def register_lists(monkeypatch) -> None:
    """The CPU kernels with the CUDA kernels' unrolled register insertion forced (the same C++ runs on both, so
    the CPU checks it), compiled anew (the kernels of a plan are cached by its key, which does not say)."""
    monkeypatch.setitem(reductions.KBEST_REGISTER_WORDS, "cpu", 10**6)
    monkeypatch.setattr(cpu_kernels, "_functions", {})


@settings(max_examples=6, deadline=None)
@given(
    k=st.sampled_from([1, 7, 64]),
    m=st.integers(1, 40),
    extra=st.integers(0, 70),
    specials=st.sampled_from([0.0, 0.2]),
    seed=st.integers(0, 2**31),
)
def test_kmin_over_j_matches_the_float64_reference(compiled, k, m, extra, specials, seed):
    """Kmin & co over j of x_i * y_j, K from 1 to 64, ties, +-inf, NaN; n = K .. K + 70 terms (the vector
    lanes of 16 and the tail)."""
    g = torch.Generator().manual_seed(seed)
    n = k + extra
    x, y = _special_ints(g, (m, 1), specials), _special_ints(g, (n, 1), 0.0)
    _check(Vi(x.float()) * Vj(y.float()), x[:, None] * y[None], k, False, 1)


@settings(max_examples=5, deadline=None)
@given(k=st.sampled_from([3, 40]), n=st.integers(1, 30), extra=st.integers(0, 50), seed=st.integers(0, 2**31))
def test_kmax_over_i_matches_the_float64_reference(compiled, k, n, extra, seed):
    """Kmax & co over i (rows are j), with NaN (the largest: first) and ties."""
    g = torch.Generator().manual_seed(seed)
    m = k + extra
    x, y = _special_ints(g, (m, 1), 0.2), _special_ints(g, (n, 1), 0.0)
    _check(Vi(x.float()) * Vj(y.float()), x[:, None] * y[None], k, True, 0)


@pytest.mark.parametrize("largest", [False, True])
def test_register_insertion_of_the_cuda_kernels(compiled, register_lists, largest):
    """The unrolled insertion of the CUDA kernels' lists in registers, on tie-heavy data with +-inf and NaN."""
    g = torch.Generator().manual_seed(3)
    x, y = _special_ints(g, (37, 1), 0.2), _special_ints(g, (45, 1), 0.0)
    lazy = Vi(x.float()) * Vj(y.float())
    assert f"KBestReducer<float, 1, 7, {str(largest).lower()}, true>" in cpu_source(_plan(lazy, 7, largest), "float32")
    for k in (7,) if largest else (1, 7):  # K = 1: the list is its own K-th value
        _check(lazy, x[:, None] * y[None], k, largest, 1)


@pytest.mark.cuda
@settings(max_examples=12, deadline=None)
@given(
    k=st.sampled_from([1, 10, 40]),
    largest=st.booleans(),
    m=st.integers(1, 300),
    n=st.integers(257, 3000),
    components=st.sampled_from([1, 2]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    specials=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**31),
)
def test_cuda_rows_split_in_parts_of_one_tile(
    compiled, monkeypatch, k, largest, m, n, components, dtype, specials, seed
):
    """The CUDA k-best with every row split over j in parts of one tile (the most parts, each with its own list,
    merged by lazy_merge): equal to the float64 reference on tie-heavy data (equal values in many parts), +-inf
    and NaN, both directions, lists in registers (K <= 10) and in memory (K = 40), 2 components, float64."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from semiring_ops.lazy import cuda_kernels

    parts = lambda blocks, n_inner, tile, sms, max_split=64, per_sm=2: (max(1, -(-n_inner // tile)), tile)  # noqa: E731
    monkeypatch.setattr(cuda_kernels, "split_count", parts)
    monkeypatch.setattr(cuda_kernels, "_launches", {})
    g = torch.Generator().manual_seed(seed)
    x, y = _special_ints(g, (m, components), specials), _special_ints(g, (n, components), 0.0)
    lazy = LazyTensor(x.to("cuda", dtype)[:, None, :]) * LazyTensor(y.to("cuda", dtype)[None, :, :])
    _check(lazy, x[:, None, :] * y[None, :, :], k, largest, 1, dtype)
    assert cuda_kernels._launches and all(launch.grid[1] >= 2 for launch in cuda_kernels._launches.values())


def test_components_and_batch_dimensions(compiled):
    """A formula of 2 components keeps one list per component; batch dimensions (B, M, N) reduce per batch."""
    g = torch.Generator().manual_seed(5)
    x, y = _special_ints(g, (3, 20, 2), 0.1), _special_ints(g, (3, 33, 2), 0.0)
    lazy = LazyTensor(x.float()[:, :, None, :]) * LazyTensor(y.float()[:, None, :, :])
    dense = x[:, :, None, :] * y[:, None, :, :]
    _check(lazy, dense, 5, False, 2)
    _check(lazy, dense, 4, True, 1)


def test_kmin_gradient_is_the_dense_gradient(compiled):
    """d Kmin / d x: the gradient of each selected term (no ties: continuous data), K = 20."""
    g = torch.Generator().manual_seed(7)
    x0, y0 = torch.randn(30, 2, generator=g, dtype=torch.float64), torch.randn(50, 2, generator=g, dtype=torch.float64)
    x, xd = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    out = Vi(x).sqdist(Vj(y0)).Kmin(20, dim=1)
    ref = torch.sort(((xd[:, None] - y0[None]) ** 2).sum(-1), dim=1).values[:, :20]
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    (gx,) = torch.autograd.grad(out, x, go)
    (gref,) = torch.autograd.grad(ref, xd, go)
    torch.testing.assert_close(gx, gref, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- the reducer's entry points, in C++

# (name, D, K, largest, registers): the register insertion, the scan (K <= 32) and the count-and-memmove one
_HARNESS = [
    ("kb_reg_min", 1, 5, False, True),
    ("kb_reg_max", 2, 6, True, True),
    ("kb_scan_min", 2, 7, False, False),
    ("kb_rank_min", 1, 40, False, False),
    ("kb_rank_max", 2, 33, True, False),
]
_HARNESS_SOURCE = """#include "lazy/reducers.h"
using namespace semiring_ops::lazy;
// f[j * kIn + d], j in [0, n), cut into the ranges [cuts[s], cuts[s + 1]) (some shorter than K, some empty),
// each reduced on its own by add (mode 0), add_chunk<4> (1), add_chunk<8> (4, the kernels' chunk) or add_lanes<16>
// (2) then add for the rest, and the reducers merged in order, as the CUDA split's lazy_merge does (mode 3: adds
// after merges too)
template <class R> void run(double* vals, int64_t* idx, const double* f, const int64_t* cuts, int nranges,
                            int mode) {
  R acc;
  acc.init();
  for (int s = 0; s < nranges; ++s) {
    if (mode == 3 && s % 2 == 1) {  // mode 3: every other range added to the merged reducer itself
      for (int64_t j = cuts[s]; j < cuts[s + 1]; ++j) acc.add(f + j * R::kIn, (int32_t)j);
      continue;
    }
    R r;
    r.init();
    int64_t j = cuts[s];
    const int64_t end = cuts[s + 1];
    if (mode == 1)
      for (; j + 4 <= end; j += 4) r.template add_chunk<4>(f + j * R::kIn, (int32_t)j);
    if (mode == 4)
      for (; j + 8 <= end; j += 8) r.template add_chunk<8>(f + j * R::kIn, (int32_t)j);
    if (mode == 2)
      for (; j + 16 <= end; j += 16) {
        double buf[R::kIn * 16];
        for (int l = 0; l < 16; ++l)
          for (int d = 0; d < R::kIn; ++d) buf[d * 16 + l] = f[(j + l) * R::kIn + d];
        r.template add_lanes<16>(buf, (int32_t)j);
      }
    for (; j < end; ++j) r.add(f + j * R::kIn, (int32_t)j);
    if (s == 0)
      acc = r;
    else
      acc.merge(r);
  }
  acc.store(vals, idx);
}
"""


@pytest.fixture(scope="module")
def harness():
    """name -> the C++ harness function of that reducer (one library for all of _HARNESS)."""
    lines = [_HARNESS_SOURCE]
    for name, d, k, largest, registers in _HARNESS:
        red = f"KBestReducer<double, {d}, {k}, {str(largest).lower()}, {str(registers).lower()}>"
        lines.append(
            f'extern "C" void {name}(double* v, int64_t* i, const double* f, const int64_t* c, int n, int m) '
            f"{{ run<{red}>(v, i, f, c, n, m); }}"
        )
    lib = compile_host_library("\n".join(lines), [h[0] for h in _HARNESS])
    p, i = ctypes.c_void_p, ctypes.c_int
    return {h[0]: lib.function(h[0], [p, p, p, p, i, i]) for h in _HARNESS}


@settings(max_examples=150, deadline=None)
@given(
    which=st.sampled_from(_HARNESS),
    n=st.integers(0, 90),
    mode=st.sampled_from([0, 1, 2, 3, 4]),
    cuts=st.lists(st.floats(0, 1), max_size=5),
    seed=st.integers(0, 2**31),
)
def test_reducer_chunks_lanes_and_merge_of_partial_lists(harness, which, n, mode, cuts, seed):
    """The reducer over [0, n) in ranges merged in order equals the reference; fewer than K terms in all
    (n < K) leave the tail empty: +inf (-inf for max) with index -1, as the kernels store it."""
    name, d, k, largest, _ = which
    g = torch.Generator().manual_seed(seed)
    f = _special_ints(g, (n, d), 0.15)
    f = torch.where(torch.rand(f.shape, generator=g) < 0.1, NAN, f)
    bounds = sorted({0, n, *(int(c * n) for c in cuts)})
    bounds_t = torch.tensor(bounds, dtype=torch.int64)
    vals = torch.full((k, d), -7.0, dtype=torch.float64)
    idx = torch.full((k, d), -7, dtype=torch.int64)
    harness[name].call(vals.data_ptr(), idx.data_ptr(), f.data_ptr(), bounds_t.data_ptr(), len(bounds) - 1, mode)
    kept = min(k, n)
    if kept:
        rv, ri = _reference(f[None], kept, largest, 1)  # (1, kept, d): one row reducing f's n terms
        torch.testing.assert_close(vals[:kept], rv[0], equal_nan=True, rtol=0, atol=0)
        assert torch.equal(idx[:kept], ri[0])
    assert torch.all(vals[kept:] == (-INF if largest else INF)) and torch.all(idx[kept:] == -1)


# ---------------------------------------------------------------- the CUDA source, compiled without a GPU


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(default) if default.is_file() else None


def _cuda_kbest_source(k: int, largest: bool, dtype_name: str, components: int = 1) -> str:
    """The CUDA source of the k-best of |x_i - y_j|^2 in 3-D (1 component) or of x_i * y_j in 2-D (2)."""
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    f = Vi(x).sqdist(Vj(y)) if components == 1 else Vi(x[:, :2]) * Vj(y[:, :2])
    plan = _plan(f, k, largest)
    return cuda_source(plan, dtype_name, cuda_config(plan, dtype_name))


def _nvcc_compile(tmp_path: Path, source: str, name: str) -> str:
    """ptxas' report of compiling ``source`` for sm_90 with nvcc -c (fails the test on a compile error)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin or /usr/local/cuda/bin)")
    src = tmp_path / f"{name}.cu"
    src.write_text(source)
    cmd = [nvcc, "-c", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-I", str(source_root()), str(src)]
    proc = subprocess.run([*cmd, "-o", str(tmp_path / f"{name}.o")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"nvcc failed on the generated k-best source:\n{proc.stderr[-4000:]}"
    return proc.stderr


def _stack_bytes(ptxas: str) -> int:
    """lazy_reduce's stack frame in ptxas' report: local memory for the lists (0: all in registers)."""
    at = ptxas.index("Function properties for lazy_reduce")
    found = re.search(r"(\d+) bytes stack frame", ptxas[at:])
    assert found, ptxas[at : at + 300]
    return int(found.group(1))


def test_cuda_kbest_source_compiles_with_lists_in_registers(tmp_path):
    """argKmin K = 10 (the 1M x 1M target's): nvcc compiles the generated CUDA source, and lazy_reduce has
    no stack frame, so the list is in registers (a dynamically indexed list would live in local memory)."""
    assert _stack_bytes(_nvcc_compile(tmp_path, _cuda_kbest_source(10, False, "float32"), "k10")) == 0


@pytest.mark.extended
@pytest.mark.parametrize(
    "k,largest,dtype_name,components",
    [(1, False, "float32", 1), (32, True, "float32", 1), (16, False, "float32", 2), (21, False, "float64", 1)],
)
def test_cuda_kbest_sources_compile_in_registers(tmp_path, k, largest, dtype_name, components):
    """Up to KBEST_REGISTER_WORDS (64) 32-bit words of list per row: registers, no stack frame."""
    source = _cuda_kbest_source(k, largest, dtype_name, components)
    assert ", true>" in source
    assert _stack_bytes(_nvcc_compile(tmp_path, source, f"k{k}")) == 0


@pytest.mark.extended
@pytest.mark.parametrize("k,dtype_name,components", [(33, "float32", 1), (64, "float32", 1), (11, "float64", 2)])
def test_cuda_kbest_sources_compile_with_lists_in_memory(tmp_path, k, dtype_name, components):
    """Longer lists: the memory insertion (the lists in local memory: a stack frame) compiles too."""
    source = _cuda_kbest_source(k, False, dtype_name, components)
    assert ", false>" in source
    assert _stack_bytes(_nvcc_compile(tmp_path, source, f"k{k}")) >= k * 8


@pytest.mark.extended
@pytest.mark.parametrize("k,dtype_name", [(10, "float32"), (64, "float32"), (21, "float64")])
def test_cuda_kbest_sources_compile_with_nvrtc(k, dtype_name):
    """The runtime's own compiler (libnvrtc, no GPU needed) accepts the k-best source, to an sm_90 cubin."""
    assert nvrtc_compiles(_cuda_kbest_source(k, False, dtype_name), "sm_90", f"test_kbest_{k}")
