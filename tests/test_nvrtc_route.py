"""The NVRTC route of the CUDA kernel families (semiring_ops/build/nvrtc_kernels.py, csrc/cuda/kernel_ref.h): every
CUDA kernel compiles under NVRTC (no GPU needed), the launchers spell their kernels'
template arguments as NVRTC names them, the host code builds with the C++ compiler alone, the route is chosen as
documented, the cache's files are checked whole; on a GPU, the route's kernels against the float64 reference, with
cold caches, in concurrent processes, from a damaged cache and inside a CUDA graph capture."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from semiring_ops.build import backends, families, jit, nvrtc_kernels

ROOT = jit.source_root()
HAS_CUDA = torch.cuda.is_available()


def _nvrtc_present() -> bool:
    from semiring_ops.build import nvrtc

    try:
        nvrtc._nvrtc()
    except OSError:
        return False
    return nvrtc_kernels.cuda_runtime_paths() is not None


needs_nvrtc = pytest.mark.skipif(not _nvrtc_present(), reason="no libnvrtc or CUDA runtime headers (a CPU torch)")


def _semirings() -> list[str]:
    """The semirings of semiring.h's registry, so that a new one is compiled here too."""
    text = (ROOT / "semiring.h").read_text()
    block = text[text.index("#define SEMIRING_OPS_FOR_EACH_SEMIRING(X)") :].split("\n\n")[0]
    return re.findall(r"X\((\w+)\)", block)


def _bmm_family_kernels() -> list[tuple[str, str]]:
    """(kernel file, expression) of every kernel the bmm family's launchers instantiate."""
    engine = "semiring_ops::cuda::contraction_kernel<semiring_ops::cuda::{}>"
    out = []
    for s in _semirings():
        for t in ("c10::Half", "c10::BFloat16", "float", "double"):
            out.append(("cuda/bmm_kernels.cu", engine.format(f"SemiringBmmPolicy<semiring_ops::{s}, {t}, false>")))
    for s in ("MaxSemiring", "MinSemiring"):
        for t in ("c10::Half", "c10::BFloat16", "float", "double"):
            out.append(("cuda/bmm_kernels.cu", engine.format(f"SemiringBmmPolicy<semiring_ops::{s}, {t}, true>")))
    for t in ("float", "double"):
        for l1 in ("false", "true"):
            for r1 in ("false", "true"):
                out.append(("cuda/log_contract_kernels.cu", engine.format(f"LogContractPolicy<{t}, {l1}, {r1}>")))
    out.append(("cuda/log_grads_kernels.cu", "semiring_ops::cuda::log_grads::log_bmm_grads_fused_kernel"))
    return out


def _other_family_kernels() -> list[tuple[str, str]]:
    """(kernel file, expression): every kernel template of the other CUDA families, each element type, the semirings
    and variants that change its code paths."""
    out = []
    chain = "semiring_ops::cuda::chain::chain_kernel<semiring_ops::{}, {}, {}, {}, {}, {}, {}>"
    for t in ("float", "double"):
        for s in ("LogSemiring",) if t == "float" else ("StdSemiring",):
            for variant in (
                ("false", "false", "false", "false", "false"),  # the matrix read from L2
                ("false", "true", "false", "false", "false"),  # on chip
                ("false", "true", "false", "false", "true"),  # a cluster
            ):
                out.append(("cuda/chain_kernels.cuh", chain.format(s, t, *variant)))
        out.append(("cuda/chain_kernels.cuh", chain.format("MaxSemiring", t, "true", "true", "false", "false", "true")))
        for grad in (("true", "false", "false", "false"), ("true", "true", "true", "true")):
            out.append(("cuda/chain_kernels.cuh", chain.format("LogSemiring", t, "false", *grad)))
        span = "semiring_ops::cuda::span::{}<semiring_ops::{}, " + t + "{}>"
        for s in ("LogSemiring",) if t == "float" else ("MaxSemiring",):  # a summing and a selecting semiring
            for kernel, extra in (
                ("span_inside_kernel", ", 256"),
                ("span_adjoint_kernel", ", 1024"),
                ("alignment_inside_kernel", ""),
                ("alignment_adjoint_kernel", ""),
                ("chain_inside_kernel", ", 8, true"),
                ("chain_inside_kernel", ", 32, false"),
                ("chain_adjoint_kernel", ""),
            ):
                out.append(("cuda/span_kernels.cuh", span.format(kernel, s, extra)))
        ctc = "semiring_ops::cuda::ctc::"
        for kernel in (
            f"ctc_log_kernel<{t}, 1, false>",
            f"ctc_log_kernel<{t}, 2, false>",
            f"ctc_log_kernel<{t}, 1, true>",
            f"ctc_collect_kernel<{t}>",
            f"ctc_viterbi_kernel<{t}>",
            f"rnnt_lattice_kernel<{t}, true>",
            f"rnnt_lattice_kernel<{t}, false>",
        ):
            out.append(("cuda/ctc_kernels.cu", ctc + kernel))  # fmt: skip
    out.append(("cuda/sequence_kernels.cu", "semiring_ops::cuda::sequence::sequence_kernel"))
    for t in ("float", "c10::Half", "c10::BFloat16"):
        for passes in ("1", "3"):
            out.append(
                ("cuda/log_bmm_fast_kernels.cu", f"semiring_ops::cuda::fast_log::log_bmm_fast_kernel<{t}, {passes}>")
            )
        scaled = "semiring_ops::cuda::fast_log_scaled::kernels::"
        for kernel in ("row_factors", "column_maxima", "column_factors"):
            out.append(("cuda/fast_log_scaled_kernels.cu", f"{scaled}{kernel}<{t}>"))
        for is_max in ("true", "false"):
            out.append(("cuda/packed_select_kernels.cu", f"semiring_ops::cuda::packed::select_kernel<{t}, {is_max}>"))
    for vector in ("true", "false"):
        out.append(
            ("cuda/fast_log_scaled_kernels.cu", f"semiring_ops::cuda::fast_log_scaled::kernels::epilogue<{vector}>")
        )
    return out


def _compile_all(kernels: list[tuple[str, str]]) -> None:
    from semiring_ops.build import nvrtc

    FAILED = nvrtc_kernels.cache_dir() / "failed"

    include, _ = nvrtc_kernels.cuda_runtime_paths()
    options = nvrtc_kernels.nvrtc_options("sm_90", include)
    for program, expression in kernels:
        image, (lowered,) = nvrtc.nvrtc_compile_named(
            f'#include "{program}"\n', options, True, "test", (f"&{expression}",), FAILED
        )
        assert image[:4] == b"\x7fELF" and lowered.startswith("_ZN12semiring_ops4cuda"), expression


@needs_nvrtc
def test_every_bmm_kernel_compiles_with_nvrtc():
    kernels = _bmm_family_kernels()
    assert len(kernels) == 4 * len(_semirings()) + 8 + 8 + 1
    _compile_all(kernels)


@needs_nvrtc
def test_the_other_families_kernels_compile_with_nvrtc():
    _compile_all(_other_family_kernels())


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_the_engines_tiles_are_addressed_in_32_bits_under_nvrtc(dtype):
    """NVRTC keeps pointers into shared memory 64 bits wide, where nvcc narrows them; the engine reads and writes its
    tiles through 32-bit shared-window addresses instead (csrc/cuda/shared_span.cuh), so that ptxas gets the program
    nvcc's build gives it (docs/perf_notes.md, "The NVRTC route's kernels"). Every shared access of the log forward's
    PTX takes a 32-bit register."""
    from semiring_ops.build import nvrtc

    include, _ = nvrtc_kernels.cuda_runtime_paths()
    policy = f"semiring_ops::cuda::SemiringBmmPolicy<semiring_ops::LogSemiring, {dtype}, false>"
    expression = f"semiring_ops::cuda::contraction_kernel<{policy}>"
    ptx, (lowered,) = nvrtc.nvrtc_compile_named(
        '#include "cuda/bmm_kernels.cu"\n', nvrtc_kernels.nvrtc_options("compute_90", include), False, "test",
        (f"&{expression}",), nvrtc_kernels.cache_dir() / "failed",
    )  # fmt: skip
    text = ptx.decode()
    body = text[text.index(f".entry {lowered}") :]
    addresses = re.findall(r"\b(?:ld|st)\.shared\S*\s[^;]*?\[(%\w+)", body[: body.index("\n}\n")])
    assert len(addresses) > 16, addresses
    assert all(re.fullmatch(r"%r\d+", a) for a in addresses), sorted(set(addresses))


def _compile_and_run(tmp_path: Path, body: str) -> str:
    source = tmp_path / "spell.cpp"
    source.write_text(
        '#include <cstdio>\n#include "cuda/kernel_ref.h"\n'
        "namespace semiring_ops { struct LogSemiring; namespace cuda {\n"
        "template <class S, class T, bool kArg> struct SemiringBmmPolicy;\ntemplate <class T, int N> struct Tile;\n"
        "} }\nusing namespace semiring_ops; using namespace semiring_ops::cuda;\n" + body
    )
    exe = tmp_path / "spell"
    include, _ = nvrtc_kernels.cuda_runtime_paths()  # kernel_ref.h declares its launch helper with the runtime API
    cmd = ["g++", "-std=c++17", f"-I{ROOT}", f"-I{include}", "-idirafter", str(ROOT / "nvrtc_host"), str(source)]
    subprocess.run([*cmd, "-o", str(exe)], check=True, capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@needs_nvrtc
@pytest.mark.skipif(not __import__("shutil").which("g++"), reason="no g++")
def test_launchers_spell_kernel_template_arguments_as_nvrtc_names_them(tmp_path):
    out = _compile_and_run(
        tmp_path,
        textwrap.dedent("""
        template <bool kArg> void spell() {
          std::puts(kernel_expression<SemiringBmmPolicy<LogSemiring, float, kArg>>("contraction_kernel").c_str());
          std::puts(kernel_expression<double, SEMIRING_OPS_VALUE(kArg), SEMIRING_OPS_VALUE(-3), Tile<float, 1024>>(
              "k").c_str());
        }
        int main() { spell<true>(); spell<false>(); }
        """),
    )
    assert out.splitlines() == [
        "semiring_ops::cuda::contraction_kernel<semiring_ops::cuda::SemiringBmmPolicy<semiring_ops::LogSemiring, "
        "float, true>>",
        "semiring_ops::cuda::k<double, true, -3, semiring_ops::cuda::Tile<float, 1024>>",
        "semiring_ops::cuda::contraction_kernel<semiring_ops::cuda::SemiringBmmPolicy<semiring_ops::LogSemiring, "
        "float, false>>",
        "semiring_ops::cuda::k<double, false, -3, semiring_ops::cuda::Tile<float, 1024>>",
    ]


@needs_nvrtc
def test_nvrtc_route_host_code_builds_with_the_cpp_compiler_alone(tmp_path, monkeypatch):
    """The bmm family's host code for the NVRTC route: no nvcc (it is not looked for), the CUDA runtime's headers
    from PyTorch's pip packages or a toolkit, csrc/nvrtc_host for the two that come with nvcc."""
    monkeypatch.setenv("SEMIRING_OPS_CACHE", str(tmp_path))
    spec = families.family("cuda", "bmm").spec(nvrtc=True)
    assert spec.nvrtc and not spec.is_cuda and families.NVRTC_HOST_DEFINE in spec.cflags
    assert jit.build_directory(spec) != jit.build_directory(families.family("cuda", "bmm").spec())
    code = (
        "from semiring_ops.build import families, jit\n"
        "m = jit.load(families.family('cuda', 'bmm').spec(nvrtc=True))\n"
        "print(sorted(n for n in dir(m) if not n.startswith('_')))\n"
    )
    env = {**os.environ, "SEMIRING_OPS_CACHE": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'set_kernel_source'" in out.stdout and "'bmm_forward'" in out.stdout


@pytest.mark.parametrize(
    ("choice", "toolkit_found", "nvrtc_ok", "route"),
    [
        ("", True, True, "nvcc"),  # auto: a toolkit's nvcc build where one is found (today's kernels' speed)
        ("", False, True, "nvrtc"),  # auto: NVRTC where none is
        ("", False, False, "nvcc"),  # neither: the nvcc spec, whose missing toolkit the loader reports
        ("nvrtc", True, True, "nvrtc"),
        ("nvrtc", True, False, "nvcc"),
        ("nvcc", False, True, "nvcc"),
    ],
)
def test_the_route_is_chosen_as_documented(monkeypatch, choice, toolkit_found, nvrtc_ok, route):
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, choice)
    monkeypatch.setattr(backends.toolkit, "find_cuda_toolkit", lambda cache: object() if toolkit_found else None)
    monkeypatch.setattr(nvrtc_kernels, "route_problem", lambda: None if nvrtc_ok else "no NVRTC")
    spec, tk = backends.jit_build(families.family("cuda", "bmm"))
    assert ("nvrtc" if spec.nvrtc else "nvcc") == route
    assert (tk is None) == (spec.nvrtc or not toolkit_found)
    for fam in families.families_for("cuda"):  # the families marked for the route take it; the others nvcc's
        assert backends.jit_build(fam)[0].nvrtc == (fam.nvrtc and route == "nvrtc"), fam.name
    assert families.family("cuda", "bmm").nvrtc
    cpu, cpu_tk = backends.jit_build(families.family("cpu", "bmm"))
    assert not cpu.nvrtc and cpu_tk is None


@pytest.mark.parametrize(
    ("toolkit_found", "problem", "says"),
    [(False, None, "not needed"), (False, "no NVRTC", "cannot be built"), (True, None, "nvcc 13.0")],
)
def test_info_calls_a_missing_toolkit_a_problem_only_when_nvrtc_cannot_stand_in(
    monkeypatch, toolkit_found, problem, says
):
    """`python -m semiring_ops info` with no toolkit: where the NVRTC route builds every CUDA family, the toolkit
    line says it is not needed (not that the PyTorch reference runs); where NVRTC does not serve, the warning."""
    from semiring_ops import info

    class Toolkit:
        home, source, version = Path("/cuda"), "system", "13.0"

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv(nvrtc_kernels.ROUTE_ENV, raising=False)
    monkeypatch.setattr(info.toolkit, "find_cuda_toolkit", lambda cache: Toolkit() if toolkit_found else None)
    monkeypatch.setattr(nvrtc_kernels, "route_problem", lambda: problem)
    line = next(x for x in info.format_info(info.backend_info()).splitlines() if x.startswith("CUDA toolkit: "))
    assert says in line, line
    assert ("PyTorch reference runs" in line) == (says == "cannot be built"), line
    if says == "not needed":  # but a CUDA family that falls back (no C++ compiler for the host code) keeps the warning
        real = info.backends.family_status
        monkeypatch.setattr(
            info.backends,
            "family_status",
            lambda dt, name: ("reference", "no C++ compiler") if dt == "cuda" else real(dt, name),
        )
        line = next(x for x in info.format_info(info.backend_info()).splitlines() if x.startswith("CUDA toolkit: "))
        assert "cannot be built" in line, line


def test_a_build_for_later_takes_the_route_wherever_the_host_code_builds(monkeypatch):
    """`python -m semiring_ops build` and a wheel's build (parallel.py) need the CUDA runtime's headers for the
    NVRTC route's host code, not the GPU and NVRTC its kernels need when they run."""
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, "auto")
    monkeypatch.setattr(backends.toolkit, "find_cuda_toolkit", lambda cache: None)
    monkeypatch.setattr(nvrtc_kernels, "route_problem", lambda: "PyTorch sees no CUDA device")
    monkeypatch.setattr(nvrtc_kernels, "cuda_runtime_paths", lambda: (Path("/include"), Path("/libcudart.so.13")))
    bmm = families.family("cuda", "bmm")
    assert backends.jit_build(bmm, building=True)[0].nvrtc and not backends.jit_build(bmm)[0].nvrtc
    monkeypatch.setattr(nvrtc_kernels, "cuda_runtime_paths", lambda: None)
    assert not backends.jit_build(bmm, building=True)[0].nvrtc


@pytest.mark.parametrize(
    ("choice", "toolkit_found", "problem", "route"),
    [
        ("auto", True, None, "nvcc"),  # a toolkit: kernels ahead of time, as before
        ("auto", False, None, "nvrtc"),  # none: the host code, kernels on the user's GPU
        ("auto", False, "no headers", None),  # neither: CPU kernels only
        ("nvrtc", True, None, "nvrtc"),
        ("nvrtc", True, "no headers", None),
        ("nvcc", False, None, None),
    ],
)
def test_a_wheels_cuda_route(choice, toolkit_found, problem, route):
    from semiring_ops.build import prebuilt

    assert prebuilt.wheel_cuda_route(choice, toolkit_found, problem) == route


def test_a_wheels_nvrtc_modules_load_on_any_gpu_where_nvrtc_serves(monkeypatch):
    """An NVRTC wheel's manifest lists no architectures: its CUDA modules are refused only where the route cannot
    serve (by name), or where $SEMIRING_OPS_CUDA_KERNELS=nvcc asks for the other route; an nvcc wheel's still by
    architecture."""
    from semiring_ops.build import prebuilt

    info = prebuilt.build_manifest(["cuda_bmm", "cpu_bmm"], [], "x86-64-v3", "nvrtc")
    assert info["cuda_route"] == "nvrtc" and prebuilt.cuda_route(info) == "nvrtc"
    assert prebuilt.cuda_route({"torch": "x"}) == "nvcc"  # a manifest from before the field
    bmm = families.family("cuda", "bmm")
    monkeypatch.setattr(prebuilt.torch.cuda, "get_device_capability", lambda index: (12, 1))
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, "auto")
    monkeypatch.setattr(nvrtc_kernels, "route_problem", lambda: None)
    assert prebuilt.mismatch(bmm, info, device_index=0) is None
    monkeypatch.setattr(nvrtc_kernels, "route_problem", lambda: "libnvrtc not found")
    assert "NVRTC on their first launch, which cannot serve here: libnvrtc not found" in prebuilt.mismatch(
        bmm, info, device_index=0
    )
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, "nvcc")
    assert "SEMIRING_OPS_CUDA_KERNELS=nvcc" in prebuilt.mismatch(bmm, info, device_index=0)
    nvcc_wheel = prebuilt.build_manifest(["cuda_bmm"], ["9.0"], "x86-64-v3")
    assert "does not run on this GPU (sm 12.1)" in prebuilt.mismatch(bmm, nvcc_wheel, device_index=0)


def test_a_bad_route_names_the_variable(monkeypatch):
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, "clang")
    with pytest.raises(ValueError, match="SEMIRING_OPS_CUDA_KERNELS must be one of auto, nvrtc, nvcc"):
        nvrtc_kernels.route_choice()


def test_cache_files_are_read_only_when_whole():
    packed = nvrtc_kernels._pack("_Z6kernelv", b"\x7fELF image bytes")
    assert nvrtc_kernels._unpack(packed) == (b"_Z6kernelv", b"\x7fELF image bytes")
    assert nvrtc_kernels._unpack(packed[:-3]) is None  # truncated
    assert nvrtc_kernels._unpack(packed[:-1] + b"X") is None  # overwritten
    assert nvrtc_kernels._unpack(b"\x7fELF a cubin of another version") is None


def test_the_cache_key_follows_the_kernel_files_headers():
    files = jit.project_files([ROOT / "cuda/bmm_kernels.cu"], ROOT)
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"cuda/bmm_policy.cuh", "cuda/tile_engine.cuh", "semiring.h", "cuda/kernel_ref.h"} <= names


# ---------------------------------------------------------------- on the GPU

_CHECK = textwrap.dedent("""
    import sys, torch, semiring_ops as so
    from semiring_ops.build import backends
    torch.manual_seed(int(sys.argv[1]))
    ops = {"log": so.logbmm, "max": so.maxbmm, "min": so.minbmm}
    ref = {"log": lambda s: s.logsumexp(-2), "max": lambda s: s.amax(-2), "min": lambda s: s.amin(-2)}
    for name, op in ops.items():
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            a = torch.randn(3, 37, 65, device="cuda", dtype=dtype)
            b = torch.randn(3, 65, 29, device="cuda", dtype=dtype)
            want = ref[name](a.double()[..., :, :, None] + b.double()[..., None, :, :])
            tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
            assert torch.allclose(op(a, b).double(), want, atol=tol, rtol=tol), (name, dtype)
    a = torch.randn(2, 33, 70, device="cuda", dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 70, 41, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(so.logbmm, (a, b))
    kind, detail = backends.family_status("cuda", "bmm")
    assert kind == "compiled", (kind, detail)
    print("ok", sys.argv[1])
""")


def _run(env: dict[str, str], *args: str, code: str = _CHECK) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_nvrtc_kernels_from_a_cold_cache_in_concurrent_processes_then_from_a_damaged_one(tmp_path):
    env = {**os.environ, nvrtc_kernels.ROUTE_ENV: "nvrtc", "SEMIRING_OPS_NVRTC_CACHE": str(tmp_path)}
    procs = [_run(env, str(seed)) for seed in (1, 2, 3)]
    outs = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for rc, out, err in outs:
        assert rc == 0 and out.startswith("ok"), err[-3000:]
    files = sorted(tmp_path.glob("*.cubin"))
    assert files and not list(tmp_path.glob("*.tmp*"))
    compiled = sum(err.count("with NVRTC") for _, _, err in outs)
    assert compiled == len(files)  # each kernel compiled once, by one of the three
    damaged = files[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    proc = _run(env, "4")
    rc, (out, err) = proc.wait(timeout=600), proc.communicate()
    assert rc == 0 and out.startswith("ok"), err[-3000:]
    assert "is damaged; compiling it again" in err and damaged.stat().st_size > 100


_GRAPH = textwrap.dedent("""
    import torch, semiring_ops as so
    a = torch.randn(4, 64, 48, device="cuda"); b = torch.randn(4, 48, 80, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # the kernel's first launch, and so its compile and load, inside the capture
            out = so.maxbmm(a, b)
    g.replay(); torch.cuda.synchronize()
    want = (a[..., :, :, None] + b[..., None, :, :]).amax(-2)
    assert torch.equal(out, want)
    print("ok")
""")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_an_nvrtc_kernel_first_launched_inside_a_cuda_graph_capture(tmp_path):
    env = {**os.environ, nvrtc_kernels.ROUTE_ENV: "nvrtc", "SEMIRING_OPS_NVRTC_CACHE": str(tmp_path)}
    proc = _run(env, code=_GRAPH)
    rc, (out, err) = proc.wait(timeout=600), proc.communicate()
    assert rc == 0 and out.startswith("ok"), err[-3000:]


def test_a_missing_nvrtc_is_named_and_the_nvcc_spec_is_kept(monkeypatch):
    from semiring_ops.build import nvrtc

    monkeypatch.setattr(nvrtc, "nvrtc_available", lambda: (False, "libnvrtc not found (pip install nvidia-cuda-nvrtc)"))
    assert nvrtc_kernels.route_problem() == "libnvrtc not found (pip install nvidia-cuda-nvrtc)"
    monkeypatch.setenv(nvrtc_kernels.ROUTE_ENV, "nvrtc")
    spec, _ = backends.jit_build(families.family("cuda", "bmm"))
    assert not spec.nvrtc  # the next route: nvcc's build, whose own absence the loader reports


def test_gpus_of_different_architectures_share_ptx_of_the_oldest(monkeypatch):
    caps = [(9, 0), (8, 0), (9, 0)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    assert nvrtc_kernels._target() == ("compute_80", False)


def test_cuda12_pip_layout_is_found(tmp_path, monkeypatch):
    """A torch CUDA 12 build's packages: nvidia/cuda_runtime/{include,lib} (no cu12 folder), no toolkit."""
    site = tmp_path / "site"
    include, lib = site / "nvidia" / "cuda_runtime" / "include", site / "nvidia" / "cuda_runtime" / "lib"
    include.mkdir(parents=True)
    lib.mkdir(parents=True)
    for name in ("cuda_runtime_api.h", "cuda_fp16.h"):
        (include / name).write_text("")
    (lib / "libcudart.so.12").write_text("")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(sys, "path", [str(site)])
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    nvrtc_kernels.cuda_runtime_paths.cache_clear()
    try:
        # the pip packages come before /usr/local/cuda, whatever that holds
        assert nvrtc_kernels.cuda_runtime_paths() == (include.resolve(), (lib / "libcudart.so.12").resolve())
        monkeypatch.setattr(torch.version, "cuda", "11.8")  # a runtime of torch's major or nothing
        nvrtc_kernels.cuda_runtime_paths.cache_clear()
        found = nvrtc_kernels.cuda_runtime_paths()
        assert found is None or found[1].name.startswith("libcudart.so.11")
    finally:
        nvrtc_kernels.cuda_runtime_paths.cache_clear()


@pytest.mark.parametrize(
    ("device", "supported", "target"),
    [
        (90, (75, 80, 86, 89, 90, 100), ("sm_90", True)),  # NVRTC knows the GPU: a cubin
        (120, (75, 80, 86, 89, 90, 100), ("compute_100", False)),  # a newer GPU than NVRTC: PTX, the driver finishes it
        (90, None, ("sm_90", True)),  # an NVRTC that cannot list its targets (before 11.2): try the cubin
    ],
)
def test_the_target_follows_the_gpu_and_what_nvrtc_can_build(monkeypatch, device, supported, target):
    from semiring_ops.build import nvrtc

    class FakeNvrtc:
        supported_archs = supported
        version = (12, 8)

    monkeypatch.setattr(nvrtc, "_capability", lambda index: device)
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: FakeNvrtc())
    assert nvrtc._target(0) == target


def test_no_kernel_needs_an_architecture_specific_target():
    """The route compiles for sm_XY (or compute_XY), never sm_XYa / sm_XYf: a cubin for 9.0a runs on Hopper alone, and
    none of the kernels uses what only such a target allows (wgmma, setmaxnreg, the tensor-memory and bulk tensor
    copies of sm_90a / sm_100a, or a test of __CUDA_ARCH_FEAT_*). A kernel that starts to must make _target ask for
    the 'a' target of the GPU in use, and this test says so."""
    features = re.compile(r"wgmma|setmaxnreg|tcgen05|cp\.async\.bulk\.tensor|__CUDA_ARCH_FEAT_|__CUDA_ARCH_SPECIFIC__")
    sources = [p for p in (ROOT / "cuda").rglob("*") if p.suffix in (".cu", ".cuh", ".h")]
    assert len(sources) > 20
    using = [str(p.relative_to(ROOT)) for p in sources if features.search(p.read_text())]
    assert not using, f"{using} use architecture-specific features: the NVRTC route's target must follow"


def test_an_nvrtc_older_than_the_gpu_family_is_refused_by_name(monkeypatch):
    from semiring_ops.build import nvrtc

    class FakeNvrtc:
        supported_archs = (90, 100)
        version = (12, 8)

    monkeypatch.setattr(nvrtc, "_capability", lambda index: 80)
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: FakeNvrtc())
    with pytest.raises(RuntimeError, match=r"NVRTC 12\.8 targets none of sm_80 or older"):
        nvrtc._target(0)


# a folder holding another CUDA's NVRTC and runtime headers as NVIDIA's pip wheels lay them out, unpacked (e.g.
# nvidia-cuda-nvrtc-cu12 and nvidia-cuda-runtime-cu12: nvidia/cuda_nvrtc/lib, nvidia/cuda_runtime/include)
_OTHER_NVRTC = os.environ.get("SEMIRING_OPS_TEST_NVRTC_ROOT", "")


def _other_nvrtc_files(root: Path) -> tuple[Path, Path]:
    """(libnvrtc, the folder of cuda_runtime_api.h) in such a folder."""
    libs = [
        p for p in sorted(root.glob("nvidia/*/lib/libnvrtc.so.*")) if "builtins" not in p.name and ".alt." not in p.name
    ]
    assert libs, f"no libnvrtc.so.* under {root}/nvidia/*/lib"
    return libs[0], next(root.glob("nvidia/*/include/cuda_runtime_api.h")).parent


@pytest.mark.skipif(not _OTHER_NVRTC, reason="$SEMIRING_OPS_TEST_NVRTC_ROOT names no other CUDA's NVRTC")
def test_every_kernel_compiles_with_another_cudas_nvrtc_and_headers(monkeypatch):
    """What a user of torch's CUDA 12 builds gets (docs/build.md, "CUDA 12"): that NVRTC's version and targets
    read, the target it gives each GPU generation, and every kernel of the tests above compiled by it against its
    own runtime headers (the stand-ins of csrc/nvrtc in front)."""
    from semiring_ops.build import nvrtc

    lib, include = _other_nvrtc_files(Path(_OTHER_NVRTC))
    nv = nvrtc._Nvrtc(nvrtc._open_nvrtc(str(lib)), str(lib))
    assert nv.version[0] >= 12 and nv.supported_archs, (nv.version, nv.supported_archs)
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: nv)
    for capability in (80, 90, 120):
        monkeypatch.setattr(nvrtc, "_capability", lambda index, capability=capability: capability)
        expected = (f"sm_{capability}", True) if capability in nv.supported_archs else None
        assert expected is None or nvrtc._target(0) == expected
    options = nvrtc_kernels.nvrtc_options("sm_90", include)
    failed = nvrtc_kernels.cache_dir() / "failed"
    for program, expression in _bmm_family_kernels() + _other_family_kernels():
        image, (lowered,) = nvrtc.nvrtc_compile_named(
            f'#include "{program}"\n', options, True, "other_nvrtc", (f"&{expression}",), failed
        )
        assert image[:4] == b"\x7fELF" and lowered.startswith("_ZN12semiring_ops4cuda"), expression


# the NVRTC route with another CUDA's NVRTC and runtime headers (a folder as above): the kernels compiled by it
_OTHER_NVRTC_ROUTE = textwrap.dedent("""
    import sys
    from semiring_ops.build import nvrtc, nvrtc_kernels
    lib, include = sys.argv[2:4]  # libnvrtc, the folder of its runtime headers
    other = nvrtc._Nvrtc(nvrtc._open_nvrtc(lib), lib)
    nvrtc._nvrtc = lambda: other
    options = nvrtc_kernels.nvrtc_options
    nvrtc_kernels.nvrtc_options = lambda target, _include: options(target, include)
    print(f"other NVRTC {other.version[0]}.{other.version[1]}, target {nvrtc_kernels._target()[0]}", file=sys.stderr)
""")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.skipif(not _OTHER_NVRTC, reason="$SEMIRING_OPS_TEST_NVRTC_ROOT names no other CUDA's NVRTC")
def test_kernels_from_another_cudas_nvrtc_run_on_the_gpu(tmp_path):
    """What a user of torch's CUDA 12 builds runs: the bmm family's kernels compiled by that NVRTC against its own
    runtime headers (the host code as built here), loaded by this driver, against the float64 reference."""
    env = {**os.environ, nvrtc_kernels.ROUTE_ENV: "nvrtc", "SEMIRING_OPS_NVRTC_CACHE": str(tmp_path)}
    lib, include = _other_nvrtc_files(Path(_OTHER_NVRTC))
    proc = _run(env, "5", str(lib), str(include), code=_OTHER_NVRTC_ROUTE + _CHECK)
    rc, (out, err) = proc.wait(timeout=900), proc.communicate()
    assert rc == 0 and out.startswith("ok"), err[-3000:]
    version = err.split("other NVRTC ", 1)[1].split(",")[0]
    assert version.split(".")[0] != (torch.version.cuda or "").split(".")[0], version  # not torch's own
    assert err.count(" with NVRTC ") == len(list(tmp_path.glob("*.cubin"))) > 0
