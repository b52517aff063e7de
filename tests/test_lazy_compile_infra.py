"""The lazy reductions' compile infrastructure: the disk cache (kernel_cache), CPU shared libraries built with
the host compiler and called through ctypes (host_compiler), CUDA modules built with NVRTC and launched with
the driver API (nvrtc): values, cache hits that compile nothing, compile errors that carry the log, and
concurrent first compiles in two processes."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from semiring_ops.lazy import LazyTensor, cuda_kernels, dispatch, host_compiler, nvrtc
from semiring_ops.lazy.kernel_cache import LazyCompileError, cached_artifact, lazy_cache_dir, source_key

HAS_CUDA = torch.cuda.is_available()
needs_compiler = pytest.mark.skipif(not host_compiler.host_compiler_available(), reason="no C++ compiler")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")

CPU_MESSAGE = "semiring_ops.lazy: compiling a new formula for cpu into"
CUDA_MESSAGE = "semiring_ops.lazy: compiling a new formula for cuda"

LSE_SOURCE = """// {tag}
#include "semiring.h"
extern "C" float lazy_test_lse(const float* x, int64_t n) {{
  semiring_ops::LogSemiring::Accumulator<float, false> acc;
  acc.init();
  for (int64_t k = 0; k < n; ++k) acc.add(semiring_ops::LogSemiring::to_kernel(x[k]), static_cast<int32_t>(k));
  return acc.result();
}}
"""
LSE_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty lazy cache folder for the test."""
    folder = tmp_path / "lazy-cache"
    monkeypatch.setenv("SEMIRING_OPS_LAZY_CACHE", str(folder))
    return folder


def _fresh_lse_source() -> str:
    return LSE_SOURCE.format(tag=uuid.uuid4().hex)  # never compiled before, in this process or on disk


# ---------------------------------------------------------------- kernel_cache


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SEMIRING_OPS_LAZY_CACHE", raising=False)
    monkeypatch.setenv("SEMIRING_OPS_CACHE", str(tmp_path / "root"))
    assert lazy_cache_dir() == tmp_path / "root" / "lazy"
    monkeypatch.setenv("SEMIRING_OPS_LAZY_CACHE", str(tmp_path / "elsewhere"))
    assert lazy_cache_dir() == tmp_path / "elsewhere"


def test_source_key_is_a_stable_hash_of_the_parts():
    key = source_key("a", b"bc")
    assert len(key) == 24 and all(c in "0123456789abcdef" for c in key)
    assert key == source_key(b"a", "bc")
    assert key != source_key("ab", "c")  # part boundaries count
    assert key != source_key("a", "bd")


def test_cached_artifact_builds_once_and_cleans_up_a_failed_build(cache):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        assert tmp.parent == cache and not tmp.exists()
        tmp.write_bytes(b"artefact")

    path, built = cached_artifact("k1", ".bin", build)
    assert built and path == cache / "k1.bin" and path.read_bytes() == b"artefact"
    assert cached_artifact("k1", ".bin", build) == (path, False)
    assert len(calls) == 1

    def broken(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise ValueError("compiler crashed")

    with pytest.raises(ValueError, match="compiler crashed"):
        cached_artifact("k2", ".bin", broken)
    assert sorted(p.name for p in cache.iterdir()) == ["k1.bin", "k1.lock", "k2.lock"]


def test_compile_error_saves_the_source_and_the_log(cache):
    log = "\n".join(f"line {i}" for i in range(100))
    err = LazyCompileError.save("g++", "abc", "int main() {}", log)
    assert err.log == log
    assert err.source_path == cache / "failed" / "abc.src" and err.source_path.read_text() == "int main() {}"
    assert err.log_path is not None and err.log_path.read_text() == log
    message = str(err)
    assert "line 39" in message and "line 40\n" not in message and "60 more lines" in message
    assert str(err.source_path) in message and str(err.log_path) in message


# ---------------------------------------------------------------- host compiler


@needs_compiler
def test_host_library_computes_logsumexp_and_a_second_compile_is_a_cache_hit(cache, capfd, monkeypatch):
    source = _fresh_lse_source()
    lib = host_compiler.compile_host_library(source, ["lazy_test_lse"])
    assert CPU_MESSAGE in capfd.readouterr().err
    fn = lib.function("lazy_test_lse", LSE_ARGTYPES, ctypes.c_float)

    x = torch.randn(1000) * 10
    x[3] = 80.0  # a term far above the others
    got = fn.call(x.data_ptr(), x.numel())
    assert got == pytest.approx(torch.logsumexp(x, 0).item(), rel=1e-5, abs=1e-5)
    empty = torch.full((5,), float("-inf"))
    assert fn.call(empty.data_ptr(), 5) == float("-inf")

    start = time.perf_counter()
    again = host_compiler.compile_host_library(source, ["lazy_test_lse"])
    assert again is lib and time.perf_counter() - start < 0.01
    # a new process finds the library on disk: no compile, no message
    monkeypatch.setattr(host_compiler, "_libraries", {})
    start = time.perf_counter()
    reloaded = host_compiler.compile_host_library(source, ["lazy_test_lse"])
    assert reloaded.path == lib.path and time.perf_counter() - start < 0.5
    assert CPU_MESSAGE not in capfd.readouterr().err
    assert sorted(p.suffix for p in cache.iterdir()) == [".cpp", ".lock", ".so"]  # source kept, no temp files


@needs_compiler
def test_host_compile_error_carries_the_compiler_log(cache):
    source = '#include "semiring.h"\nextern "C" int broken() { return undeclared_name_xyz; }\n'
    with pytest.raises(LazyCompileError, match="undeclared_name_xyz") as info:
        host_compiler.compile_host_library(source, ["broken"])
    err = info.value
    assert "undeclared_name_xyz" in err.log and "error" in err.log
    assert err.source_path is not None and err.source_path.read_text() == source
    assert str(err.source_path) in str(err)
    assert not list(cache.glob("*.so*")), "no library (or temporary file) is left behind"


@needs_compiler
def test_host_library_rejects_a_missing_function(cache):
    with pytest.raises(AttributeError, match="no_such_function"):
        host_compiler.compile_host_library(_fresh_lse_source(), ["lazy_test_lse", "no_such_function"])


PRELUDE_SOURCE = """// {tag}
#include "lazy/host_prelude.h"
extern "C" double lazy_test_max(const double* x, int64_t n) {{
  semiring_ops::MaxSemiring::Accumulator<double, false> acc;
  acc.init();
  for (int64_t k = 0; k < n; ++k) acc.add(x[k], static_cast<int32_t>(k));
  return acc.result();
}}
"""


def _max_of(source: str, x: torch.Tensor) -> float:
    lib = host_compiler.compile_host_library(source, ["lazy_test_max"])
    fn = lib.function("lazy_test_max", [ctypes.c_void_p, ctypes.c_int64], ctypes.c_double)
    return fn.call(x.data_ptr(), x.numel())


@needs_compiler
def test_kernels_including_the_prelude_compile_with_one_precompiled_header_per_cache(cache, capfd):
    """The generated kernels' first include is taken precompiled: built once per cache in the background (the first
    kernel does not wait for it), then found by g++ ahead of the header (its -H trace marks a used precompiled
    header with "!"); the libraries compute the same either way."""
    cmd = host_compiler._compiler()
    if not host_compiler._is_gcc(cmd):
        pytest.skip("precompiled headers are used with GCC only")
    x = torch.randn(77, dtype=torch.float64)
    assert _max_of(PRELUDE_SOURCE.format(tag=uuid.uuid4().hex), x) == x.max().item()  # starts the header's build
    folder = host_compiler.precompiled_prelude(cmd, wait=True)
    assert folder is not None and folder.parent == cache
    header = folder / "lazy" / "host_prelude.h.gch"
    source = PRELUDE_SOURCE.format(tag=uuid.uuid4().hex)
    assert _max_of(source, x) == x.max().item()
    err = capfd.readouterr().err
    assert err.count("precompiling lazy/host_prelude.h") == 1 and err.count(CPU_MESSAGE) == 2, err
    assert list(cache.glob("pch-*/lazy/*")) == [header], "no temporary file is left"
    src = cache / f"{host_compiler.source_key(source)}.cpp"
    src.write_text(source)
    out = cache / "traced.so"
    trace = subprocess.run(
        [*host_compiler.compile_command(cmd, src, out, uses_prelude=True), "-H"], capture_output=True, text=True
    )
    assert trace.returncode == 0 and f"! {header}" in trace.stderr.splitlines()[0], trace.stderr[:500]


@needs_compiler
def test_a_precompiled_header_that_cannot_be_built_leaves_the_kernels_compiling_without(cache, capfd, monkeypatch):
    cmd = host_compiler._compiler()
    if not host_compiler._is_gcc(cmd):
        pytest.skip("precompiled headers are used with GCC only")
    monkeypatch.setattr(host_compiler, "_PCH_FLAGS", (*host_compiler._PCH_FLAGS, "-fno-such-option-xyz"))
    assert host_compiler.precompiled_prelude(cmd, wait=True) is None
    assert host_compiler.precompiled_prelude(cmd, wait=True) is None, "not tried again in this process"
    x = torch.randn(9, dtype=torch.float64)
    assert _max_of(PRELUDE_SOURCE.format(tag=uuid.uuid4().hex), x) == x.max().item()
    err = capfd.readouterr().err
    assert err.count("precompiling") == 1 and err.count("no precompiled header") == 1, err
    assert "fno-such-option-xyz" in err, "the compiler's complaint is quoted"
    assert not list(cache.glob("pch-*/lazy/*.gch*")), "no header, no temporary file"


@needs_compiler
def test_no_precompiled_header_when_the_environment_says_so(cache, monkeypatch):
    monkeypatch.setenv("SEMIRING_OPS_LAZY_PCH", "0")
    assert host_compiler.precompiled_prelude(host_compiler._compiler(), wait=True) is None
    _max_of(PRELUDE_SOURCE.format(tag=uuid.uuid4().hex), torch.randn(3, dtype=torch.float64))
    assert not list(cache.glob("pch-*"))


def _compile_in_child(source: str, barrier, results) -> None:
    barrier.wait()
    lib = host_compiler.compile_host_library(source, ["lazy_test_lse"])
    fn = lib.function("lazy_test_lse", LSE_ARGTYPES, ctypes.c_float)
    x = (ctypes.c_float * 3)(0.0, 0.0, 0.0)
    results.put((str(lib.path), fn.call(ctypes.addressof(x), 3)))


@needs_compiler
def test_two_processes_compiling_one_new_source_share_one_build(cache, capfd):
    source = _fresh_lse_source()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(source, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert outcomes[0][0] == outcomes[1][0]
    for _, value in outcomes:
        assert value == pytest.approx(torch.logsumexp(torch.zeros(3), 0).item(), rel=1e-6)
    assert capfd.readouterr().err.count(CPU_MESSAGE) == 1, "exactly one process compiles"
    assert len(list(cache.glob("*.so"))) == 1 and not list(cache.glob("*.tmp*"))


# ---------------------------------------------------------------- NVRTC

AXPI_SOURCE = """// {tag}
extern "C" __global__ void lazy_test_axpi(const float* __restrict__ x, float* __restrict__ out, long long n) {{
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * 2.0f + (float)i;
}}

extern "C" __global__ void lazy_test_many(const float* a, const double* b, float* out, long long n, int k, float s,
                                          double t, long long u, int v, float w, double y, long long z) {{
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + (float)b[i] + k + s + (float)t + (float)u + v + w + (float)y + (float)z;
}}
"""
AXPI_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
MANY_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float]
MANY_ARGTYPES += [ctypes.c_double, ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_double, ctypes.c_int64]


def _run_axpi(module: nvrtc.CudaModule, n: int) -> torch.Tensor:
    fn = module.function("lazy_test_axpi", AXPI_ARGTYPES)
    x = torch.randn(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(n))
    out = torch.full_like(x, float("nan"))
    block = 256
    grid = ((n + block - 1) // block, 1, 1)
    fn.launch(grid, (block, 1, 1), 0, torch.cuda.current_stream().cuda_stream, [x.data_ptr(), out.data_ptr(), n])
    expected = x * 2 + torch.arange(n, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(out, expected)
    return out


def test_nvrtc_available_says_why_not():
    ok, reason = nvrtc.nvrtc_available()
    assert ok == (reason == "")
    if HAS_CUDA:
        assert ok, reason


@pytest.mark.cuda
@needs_cuda
def test_nvrtc_kernel_launches_and_a_second_compile_is_a_cache_hit(cache, capfd, monkeypatch):
    source = AXPI_SOURCE.format(tag=uuid.uuid4().hex)
    start = time.perf_counter()
    module = nvrtc.compile_cuda_module(source, ["lazy_test_axpi", "lazy_test_many"], torch.device("cuda"))
    first = time.perf_counter() - start
    err = capfd.readouterr().err
    assert CUDA_MESSAGE in err and str(cache) in err
    assert first < 5.0, f"first compile took {first:.2f} s"
    _run_axpi(module, 1000)
    _run_axpi(module, 1)

    start = time.perf_counter()
    assert nvrtc.compile_cuda_module(source, ["lazy_test_axpi"], "cuda") is module
    assert time.perf_counter() - start < 0.01
    nvrtc.wait_for_optimized()  # the optimised tier lands in the cache
    assert module.tier == "optimized" and module.path.is_file()
    monkeypatch.setattr(nvrtc, "_compiled", {})
    monkeypatch.setattr(nvrtc, "_loaded", {})
    reloaded = nvrtc.compile_cuda_module(source, ["lazy_test_axpi"], torch.device("cuda", 0))
    assert reloaded is not module and reloaded.path == module.path
    _run_axpi(reloaded, 777)
    assert CUDA_MESSAGE not in capfd.readouterr().err

    fn = module.function("lazy_test_axpi", AXPI_ARGTYPES)
    assert fn.num_regs > 0 and fn.max_threads_per_block >= 256
    fn.set_max_dynamic_shared(64 * 1024)
    with pytest.raises(RuntimeError, match="cuModuleGetFunction"):
        module.function("no_such_kernel", AXPI_ARGTYPES)
    with pytest.raises(TypeError, match="bad arguments"):
        fn.launch((1, 1, 1), (1, 1, 1), 0, 0, [0, 0])


@pytest.mark.cuda
@needs_cuda
def test_a_new_source_runs_its_quick_tier_then_its_functions_move_to_the_optimised_kernels(cache, monkeypatch):
    """A source not in the cache: compiled with --Ofast-compile first (the module's tier "quick", nothing on disk),
    the full compile in the background; once done, the functions already made launch the optimised kernels (their
    handles change, their dynamic shared memory setting carries over), the cubin is cached, results are equal."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_TIERS", "1")
    if not nvrtc._tiers_on():
        pytest.skip("this NVRTC has no --Ofast-compile")
    release = threading.Event()
    real = nvrtc._optimize

    def held(*args):
        release.wait(60)
        real(*args)

    monkeypatch.setattr(nvrtc, "_optimize", held)
    module = nvrtc.compile_cuda_module(AXPI_SOURCE.format(tag=uuid.uuid4().hex), ["lazy_test_axpi"], "cuda")
    fn = module.function("lazy_test_axpi", AXPI_ARGTYPES)
    fn.set_max_dynamic_shared(64 * 1024)
    quick_handle = fn.handle
    assert module.tier == "quick" and not module.path.exists(), "nothing is cached before the full compile"
    quick_out = _run_axpi(module, 513)
    release.set()
    nvrtc.wait_for_optimized()
    assert module.tier == "optimized" and module.path.is_file()
    assert fn.handle != quick_handle and fn.dynamic_shared_limit == 64 * 1024
    assert fn.attribute(nvrtc.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) == 64 * 1024
    torch.testing.assert_close(_run_axpi(module, 513), quick_out, rtol=0, atol=0)


@pytest.mark.cuda
@needs_cuda
def test_the_optimised_tier_landing_during_a_cuda_graph_capture_leaves_the_capture_valid(cache, monkeypatch):
    """The background compile's module load happens while another thread captures a CUDA graph (torch's global
    capture mode forbids such calls and would invalidate the capture): the graph still captures and replays
    the quick kernels it holds; launches after it run the optimised ones."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_TIERS", "1")
    if not nvrtc._tiers_on():
        pytest.skip("this NVRTC has no --Ofast-compile")
    release, real = threading.Event(), nvrtc._optimize
    monkeypatch.setattr(nvrtc, "_optimize", lambda *args: (release.wait(60), real(*args)))
    module = nvrtc.compile_cuda_module(AXPI_SOURCE.format(tag=uuid.uuid4().hex), ["lazy_test_axpi"], "cuda")
    fn = module.function("lazy_test_axpi", AXPI_ARGTYPES)
    n = 1000
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))

    def launch() -> None:
        stream = torch.cuda.current_stream().cuda_stream
        fn.launch((4, 1, 1), (256, 1, 1), 0, stream, [x.data_ptr(), out.data_ptr(), n])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
        release.set()
        nvrtc.wait_for_optimized()
    assert module.tier == "optimized"
    expected = x * 2 + torch.arange(n, device="cuda", dtype=torch.float32)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)
    out.fill_(float("nan"))
    launch()
    torch.testing.assert_close(out, expected)


@pytest.mark.cuda
@needs_cuda
def test_without_tiers_a_new_source_is_compiled_fully_before_its_first_launch(cache, monkeypatch):
    monkeypatch.delenv("SEMIRING_OPS_LAZY_TIERS", raising=False)  # the default: as the caller asks
    module = nvrtc.compile_cuda_module(AXPI_SOURCE.format(tag=uuid.uuid4().hex), ["lazy_test_axpi"], "cuda")
    assert module.tier == "optimized" and module.path.is_file()
    _run_axpi(module, 65)
    monkeypatch.setenv("SEMIRING_OPS_LAZY_TIERS", "0")  # off even where the caller would take the quick compile
    source = AXPI_SOURCE.format(tag=uuid.uuid4().hex)
    module = nvrtc.compile_cuda_module(source, ["lazy_test_axpi"], "cuda", quick_first=True)
    assert module.tier == "optimized" and module.path.is_file()


@pytest.fixture
def compiles(cache, monkeypatch) -> list[tuple[bool, str]]:
    """(quick_first, the module's tier when returned) of every compile the lazy CUDA kernels ask for, each plan
    compiled anew into the test's empty cache (no kernel, launch or module of an earlier test kept)."""
    monkeypatch.delenv("SEMIRING_OPS_LAZY_TIERS", raising=False)
    if not nvrtc._tiers_on():
        pytest.skip("this NVRTC has no --Ofast-compile")
    asked: list[tuple[bool, str]] = []
    real = nvrtc.compile_cuda_module

    def spy(source, names, device, quick_first=False):
        module = real(source, names, device, quick_first)
        asked.append((quick_first, module.tier))
        return module

    monkeypatch.setattr(cuda_kernels, "compile_cuda_module", spy)
    monkeypatch.setattr(cuda_kernels, "_kernels", {})
    monkeypatch.setattr(cuda_kernels, "_launches", {})  # (which hold their kernels: whatever ran a plan before)
    monkeypatch.setattr(nvrtc, "_compiled", {})
    return asked


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(
    "dtype, deterministic, quick",
    [
        (torch.float32, False, True),
        (torch.float16, False, True),
        (torch.float64, False, False),
        (torch.float32, True, False),
    ],
)
def test_lazy_kernels_take_the_quick_compile_first_unless_float64_or_deterministic(
    compiles, dtype, deterministic, quick
):
    """The lazy reductions ask for the tiers where a last-bit change after the swap is harmless: not in float64
    (gradcheck's reentrancy) nor under torch.use_deterministic_algorithms."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        x = torch.randn(300, 1, 7, device="cuda", dtype=dtype)
        y = torch.randn(1, 200, 7, device="cuda", dtype=dtype)
        c = 0.37
        got = (-((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1) * c).exp().sum(1)
    finally:
        torch.use_deterministic_algorithms(was)
    nvrtc.wait_for_optimized()
    want = (-((x.double() - y.double()) ** 2).sum(-1) * c).exp().sum(1, keepdim=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-2 if dtype == torch.float16 else 1e-5, atol=1e-3)
    assert [q for q, _ in compiles] == [quick], (
        f"compiles asked: {compiles}; lazy backend {dispatch.lazy_backend('cuda')}, "
        f"SEMIRING_OPS_LAZY_GEMM={os.environ.get('SEMIRING_OPS_LAZY_GEMM')}"
    )


@pytest.mark.cuda
@needs_cuda
def test_a_deterministic_call_never_runs_kernels_compiled_quick_first(compiles):
    """After a float32 call took the tiers, the same formula under torch.use_deterministic_algorithms gets a
    module of its own, compiled fully (not the first call's, whose kernels may still be swapped)."""
    x = torch.randn(300, 1, 7, device="cuda")
    y = torch.randn(1, 200, 7, device="cuda")
    formula = (-((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1) * 0.29).exp()
    first = formula.sum(1)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        second = formula.sum(1)
    finally:
        torch.use_deterministic_algorithms(was)
    nvrtc.wait_for_optimized()
    # (the first module's tier is "quick" when returned, unless its swap beat the return: not asserted)
    assert [q for q, _ in compiles] == [True, False] and compiles[1][1] == "optimized", compiles
    torch.testing.assert_close(first, second)


@pytest.mark.cuda
@needs_cuda
def test_nvrtc_launch_of_twelve_arguments_is_cheap(cache):
    module = nvrtc.compile_cuda_module(AXPI_SOURCE.format(tag="many"), ["lazy_test_many"], "cuda")
    fn = module.function("lazy_test_many", MANY_ARGTYPES)
    n = 64
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda", dtype=torch.float64)
    out = torch.empty_like(a)
    stream = torch.cuda.current_stream().cuda_stream
    args = [a.data_ptr(), b.data_ptr(), out.data_ptr(), n, 1, 2.0, 3.0, 4, 5, 6.0, 7.0, 8]
    fn.launch((1, 1, 1), (n, 1, 1), 0, stream, args)
    torch.testing.assert_close(out, a + b.float() + 36.0)
    reps = 2000
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn.launch((1, 1, 1), (n, 1, 1), 0, stream, args)
    per_launch = (time.perf_counter() - start) / reps
    torch.cuda.synchronize()
    print(f"launch of a 12-argument kernel: {per_launch * 1e6:.1f} us")
    assert per_launch < 50e-6


@pytest.mark.cuda
@needs_cuda
def test_nvrtc_ptx_fallback_loads_and_runs(cache, monkeypatch):
    arch = nvrtc._capability(torch.cuda.current_device())
    monkeypatch.setattr(nvrtc, "_target", lambda index: (f"compute_{arch}", False))
    module = nvrtc.compile_cuda_module(AXPI_SOURCE.format(tag="ptx"), ["lazy_test_axpi"], "cuda")
    assert module.path.suffix == ".ptx"
    _run_axpi(module, 300)
    nvrtc.wait_for_optimized()
    assert module.tier == "optimized" and module.path.is_file()
    _run_axpi(module, 300)


@pytest.mark.cuda
@needs_cuda
def test_nvrtc_compile_error_carries_the_program_log(cache):
    source = 'extern "C" __global__ void broken(float* x) { x[0] = undeclared_name_xyz; }\n'
    with pytest.raises(LazyCompileError, match="undeclared_name_xyz") as info:
        nvrtc.compile_cuda_module(source, ["broken"], "cuda")
    assert "undeclared_name_xyz" in info.value.log
    assert info.value.source_path is not None and info.value.source_path.read_text() == source
    assert not list(cache.glob("*.cubin*")) and not list(cache.glob("*.ptx*"))


@pytest.mark.cuda
@needs_cuda
def test_device_sm_count():
    props = torch.cuda.get_device_properties(0)
    assert nvrtc.device_sm_count("cuda:0") == props.multi_processor_count
    assert nvrtc.device_sm_count(torch.device("cuda", 0)) == props.multi_processor_count
