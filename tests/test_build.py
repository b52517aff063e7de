"""Building and loading, family by family: a first call compiles only its own family, concurrent first builds share
one good cache, a killed or damaged build is redone once, a missing compiler falls back to the reference with one
warning naming the fix (never a traceback), and `info` reports what is active without compiling."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from semiring_ops.build import backends, jit, prebuilt
from semiring_ops.build.families import FAMILIES, families_for, family

CPU_BMM = family("cpu", "bmm")

SCRIPT = textwrap.dedent(
    """
    import warnings, torch, semiring_ops as so
    from semiring_ops.build.backends import backend_for
    torch.manual_seed(0)
    a, b = torch.randn(3, 20, 30), torch.randn(3, 30, 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = so.logbmm(a, b)
        out2 = so.maxbmm(a, b)
    ref = torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], -2)
    assert torch.allclose(out, ref, atol=1e-5), "wrong numbers"
    print("KIND", backend_for(torch.device("cpu")).kind)
    print("FAMILIES", sorted(backend_for(torch.device("cpu")).families))
    print("WARNINGS", sum("reference runs instead" in str(w.message) for w in caught))
    for w in caught:
        print("WARNING", w.message)
    """
)


# The first use of the CTC loss, whose family (two files) is the quickest to compile: the killed build below
# compiles it once and a half.
CTC_SCRIPT = textwrap.dedent(
    """
    import torch, semiring_ops as so
    from semiring_ops.build.backends import backend_for
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(30, 2, 6, generator=g).log_softmax(-1)
    targets, tl, il = torch.tensor([[1, 2, 2, 3], [4, 5, 0, 0]]), torch.tensor([4, 2]), torch.tensor([30, 25])
    got = so.ctc_loss(lp, targets, il, tl, reduction="none")
    ref = torch.nn.functional.ctc_loss(lp, targets, il, tl, reduction="none")
    assert torch.allclose(got, ref, atol=1e-5), "wrong numbers"
    print("KIND", backend_for(torch.device("cpu")).kind)
    print("FAMILIES", sorted(backend_for(torch.device("cpu")).families))
    """
)


def _run(env_extra: dict[str, str], script: str = SCRIPT) -> subprocess.Popen:
    env = {**os.environ, **env_extra}
    env.pop("SEMIRING_OPS_BACKEND", None)
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


def _compiled_files(fam) -> list[str]:
    """A family's sources and the source files they include (a CPU family's kernels compile as one translation
    unit that includes them), relative to csrc."""
    root = jit.source_root()
    found = jit.project_files([root / s for s in fam.sources], root)
    return [str(p.relative_to(root)) for p in found if p.suffix in (".cpp", ".cu")]


def test_families_cover_every_source_file_once_per_device():
    """Every kernel source is compiled into exactly one family of its device type (and the bindings into one
    family each): a file left out would be an unresolved symbol on first use, not a build error."""
    root = jit.source_root()
    for device, folder in (("cpu", "cpu"), ("cuda", "cuda")):
        listed = [s for f in families_for(device) for s in _compiled_files(f) if s.startswith(f"{folder}/")]
        on_disk = sorted(str(p.relative_to(root)) for p in (root / folder).iterdir() if p.suffix in (".cpp", ".cu"))
        assert sorted(listed) == on_disk, device
    assert sorted(str(p.relative_to(root)) for p in (root / "bindings").glob("*.cpp")) == sorted(
        {f.bindings for f in FAMILIES}
    )
    # the C++ autograd nodes: linked into the CUDA families, a module of their own on the CPU
    nodes = sorted(str(p.relative_to(root)) for p in (root / "autograd").glob("*.cpp"))
    assert sorted(s for f in families_for("cuda") for s in f.sources if s.startswith("autograd/")) == nodes
    assert sorted(s for f in families_for("cpu") for s in _compiled_files(f) if s.startswith("autograd/")) == nodes
    assert all(s.startswith("bindings/") for f in families_for("cpu") if f.autograd_of for s in f.sources)


def test_a_family_is_fingerprinted_by_the_files_it_includes(tmp_path, monkeypatch):
    """A change to a header a family includes (directly or not) makes a new cache folder; a change to another
    family's files leaves this one's cache valid."""
    (tmp_path / "cuda").mkdir()
    (tmp_path / "semiring.h").write_text("// shared\n")
    (tmp_path / "checks.h").write_text('#include "semiring.h"\n')
    (tmp_path / "mine.cpp").write_text('#include "checks.h"\n#include <vector>\n')
    (tmp_path / "cuda" / "theirs.cuh").write_text('#include "semiring.h"\n')
    monkeypatch.setattr(jit, "source_root", lambda: tmp_path)
    spec = CPU_BMM.spec().__class__(name="x", sources=("mine.cpp",), cflags=())
    assert jit.project_files([tmp_path / "mine.cpp"], tmp_path) == sorted(
        tmp_path / n for n in ("mine.cpp", "checks.h", "semiring.h")
    )
    before = jit.build_directory(spec)
    (tmp_path / "cuda" / "theirs.cuh").write_text('#include "semiring.h"\n// changed\n')
    assert jit.build_directory(spec) == before
    (tmp_path / "semiring.h").write_text("// changed\n")
    assert jit.build_directory(spec) != before


@pytest.mark.slow
def test_a_killed_build_then_four_processes_at_once_compile_the_family_once(tmp_path):
    """A build killed midway leaves no marker; four processes making the first call at once after it compile the
    family once, and only it; a later process loads it from the cache. (One test, so CI pays for one full compile
    of the family, not two: the ctc family's, the quickest.)"""
    proc = _run({"SEMIRING_OPS_CACHE": str(tmp_path), "MAX_JOBS": "1"}, CTC_SCRIPT)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("*/build.ninja")) and time.monotonic() < deadline:  # the build has started
        assert proc.poll() is None, "the build ended before it could be killed"
        time.sleep(0.1)
    time.sleep(2.0)  # the compiler at work on the first of its files (each takes 15 s or more)
    assert proc.poll() is None, "the build ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert not (folder / "build.ok").exists(), "a killed build leaves no marker"
    env = {"SEMIRING_OPS_CACHE": str(tmp_path)}
    results = [_finish(p) for p in [_run(env, CTC_SCRIPT) for _ in range(4)]]
    for out, _ in results:
        assert "KIND compiled" in out
        assert "FAMILIES ['ctc']" in out, "a CTC loss compiles (and loads) the ctc family alone"
    messages = [err.count("semiring_ops: compiling the CPU ctc kernels") for _, err in results]
    assert sorted(messages) == [0, 0, 0, 1], f"exactly one process compiles: {messages}"
    assert any(str(tmp_path) in err for _, err in results), "the message names the cache folder"
    out, err = _finish(_run(env, CTC_SCRIPT))  # a later process loads from the cache without compiling
    assert "KIND compiled" in out and "compiling" not in err
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert folders == [folder] and (folder / "build.ok").is_file()


AUTOGRAD_SCRIPT = textwrap.dedent(
    """
    import sys, time, torch, semiring_ops as so
    from semiring_ops.build.backends import backend_for
    torch.manual_seed(0)
    a, b = torch.randn(3, 20, 30, requires_grad=True), torch.randn(3, 30, 10, requires_grad=True)
    out = so.logbmm(a, b)
    print("GRAD_FN", out.grad_fn.name())
    (ga,) = torch.autograd.grad(out.sum(), a)
    be = backend_for(torch.device("cpu"))
    print("STATE", be.families["bmm_autograd"].kind)
    print("DYNAMO", "torch._dynamo" in sys.modules)  # the Python formula's path skips the custom op's dispatch
    t0 = time.perf_counter()
    assert be.autograd_node("bmm", "bmm_autograd", wait=True) is not None
    print("WAITED", round(time.perf_counter() - t0, 1))
    out = so.logbmm(a, b)
    print("GRAD_FN", out.grad_fn.name())
    (ga2,) = torch.autograd.grad(out.sum(), a)
    assert torch.allclose(ga, ga2, atol=1e-6), "the node's gradient is the Python formula's"
    print("STATE", be.families["bmm_autograd"].kind)
    """
)


@pytest.mark.slow
def test_a_first_cpu_call_waits_for_its_kernels_alone_and_gets_its_nodes_from_a_background_build(tmp_path):
    """A first logbmm with a gradient, its kernels in the cache (copied from this process's) but not its C++ autograd
    node: it runs at once on the registered operator's Python formula (without importing torch._dynamo, 3.7 s),
    one line names the node's module being built in the background into the cache, waiting for it gives the node
    (the same gradient), and a later process loads both from the cache, compiling nothing."""
    state = backends.backend_for(torch.device("cpu"))
    state.family("bmm")
    if state.families["bmm"].kind != "compiled":
        pytest.skip("the CPU kernels are not JIT-built here (prebuilt or the reference)")
    # (nice 0: at nice 10 the build waits for CI's other test worker, and this test for it)
    env = {"SEMIRING_OPS_CACHE": str(tmp_path), "SEMIRING_OPS_AUTOGRAD_BUILD": "background"}
    env["SEMIRING_OPS_BACKGROUND_NICE"] = "0"
    warm = Path(state.families["bmm"].detail).parent
    shutil.copytree(warm, tmp_path / warm.name)
    out, err = _finish(_run(env, AUTOGRAD_SCRIPT))
    lines = out.splitlines()
    assert lines[:3] == ["GRAD_FN _BmmEagerBackward", "STATE building", "DYNAMO False"], out
    assert lines[4:] == ["GRAD_FN SemiringBmmBackward", "STATE compiled"], out
    assert err.count("compiling the CPU bmm family's C++ autograd nodes in the background") == 1, err
    assert "compiling the CPU bmm kernels" not in err and str(tmp_path) in err, err
    out, err = _finish(_run(env, AUTOGRAD_SCRIPT.replace("wait=True) is not None", "wait=False) is not None")))
    assert out.splitlines()[:2] == ["GRAD_FN SemiringBmmBackward", "STATE compiled"], out
    assert "compiling" not in err, err


def test_autograd_build_off_keeps_the_python_formulas(tmp_path, monkeypatch):
    """SEMIRING_OPS_AUTOGRAD_BUILD=off with the kernels cached and the autograd module not: no worker is started,
    no node is had (the Python formula serves), and the state says why."""
    state = backends.backend_for(torch.device("cpu"))
    state.family("bmm")
    if state.families["bmm"].kind != "compiled":
        pytest.skip("the CPU kernels are not JIT-built here (prebuilt or the reference)")
    warm = Path(state.families["bmm"].detail).parent
    shutil.copytree(warm, tmp_path / warm.name)
    monkeypatch.setenv("SEMIRING_OPS_CACHE", str(tmp_path))
    monkeypatch.setenv("SEMIRING_OPS_AUTOGRAD_BUILD", "off")
    fresh = backends.Backend("cpu")
    assert fresh.autograd_node("bmm", "bmm_autograd", wait=True) is None
    assert fresh.families["bmm_autograd"].kind == "none"
    assert "SEMIRING_OPS_AUTOGRAD_BUILD=off" in fresh.families["bmm_autograd"].detail
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["semiring_ops_cpu_bmm"], "nothing built"


def test_an_autograd_module_attaches_to_its_own_kernels_only():
    """The table a kernels' module hands over is checked by name: the chain kernels' table given to the bmm nodes is
    refused, naming the table expected."""
    be = backends.backend_for(torch.device("cpu"))
    if be.autograd_node("bmm", "bmm_autograd", wait=True) is None:
        pytest.skip("no compiled CPU autograd module here (prebuilt kernels without it, or the reference)")
    nodes = be.families["bmm_autograd"].module
    with pytest.raises(RuntimeError, match=r"expects the capsule semiring_ops\.BmmKernels\.v1"):
        nodes.attach(be.family("chain").kernel_table())
    nodes.attach(be.family("bmm").kernel_table())  # attached again to its own: the nodes still work
    a = torch.randn(1, 3, 4, requires_grad=True)
    out, _ = nodes.bmm_autograd(a, torch.randn(1, 4, 2), 0, False)
    out.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


def test_the_autograd_build_setting_is_checked(monkeypatch):
    monkeypatch.setenv("SEMIRING_OPS_AUTOGRAD_BUILD", "later")
    with pytest.raises(ValueError, match="SEMIRING_OPS_AUTOGRAD_BUILD must be one of background, now, off"):
        backends._autograd_build_mode()


def test_no_compiler_falls_back_to_the_reference_with_one_warning_naming_the_fix(tmp_path):
    env = {"SEMIRING_OPS_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    out, err = _finish(_run(env))
    assert "KIND reference" in out
    assert "WARNINGS 1" in out
    warning = next(line for line in out.splitlines() if line.startswith("WARNING "))
    assert "no C++ compiler" in warning and "no-such-compiler" in warning
    assert "apt install g++" in warning and "prebuilt semiring_ops wheel" in warning, "the fix is named"
    assert "Traceback" not in err and "compiling" not in err, "nothing is attempted, nothing is printed but the warning"


def test_info_reports_every_family_without_compiling(tmp_path):
    env = {**os.environ, "SEMIRING_OPS_CACHE": str(tmp_path), "SEMIRING_OPS_CPU_ARCH": "x86-64-v3"}
    env.pop("SEMIRING_OPS_BACKEND", None)
    res = subprocess.run(
        [sys.executable, "-m", "semiring_ops", "info"], capture_output=True, text=True, timeout=900, env=env
    )
    assert res.returncode == 0, res.stderr
    assert "compiling" not in res.stderr and not any(tmp_path.glob("semiring_ops_*")), "info compiles nothing"
    assert "build cache: " + str(tmp_path) in res.stdout and "lazy kernel cache:" in res.stdout
    assert "C++ compiler: " in res.stdout and "CPU kernels compiled here for -march=x86-64-v3" in res.stdout
    for fam in families_for("cpu"):
        assert re.search(rf"cpu  {fam.name} +not built  compiles on first use", res.stdout), fam.name
    assert "std matmul: torch.matmul" in res.stdout
    assert "lazy reductions: cpu: compiled (g++)" in res.stdout  # CI and this machine have g++
    if torch.version.cuda:
        assert "CUDA toolkit: " in res.stdout and "cuda bmm" in res.stdout


def test_the_build_commands_lines_keep_one_column_for_every_family_name(monkeypatch):
    """`python -m semiring_ops build`: one line a family, its status in one column however long the names
    (chain_autograd is longer than the others); cached families compile nothing."""
    from semiring_ops.build import parallel, prebuilt

    monkeypatch.setattr(prebuilt, "prebuilt_status", lambda fam, index: ("none", ""))
    monkeypatch.setattr(jit, "is_cached", lambda spec, tk=None: True)
    lines: list[str] = []
    fams = families_for("cpu")
    results = parallel.build_families(fams, jobs=1, echo=lines.append)
    assert [r.status for r in results] == ["cached"] * len(fams)
    assert len(lines) == len(fams) and {line.index("cached") for line in lines} == {
        len("  cpu  ") + max(len(f.name) for f in fams) + 1
    }, lines


# Run first in the child: pretend this torch was built with CUDA on a machine without a GPU and a CUDA
# toolkit guessed at /tmp, as CI's CUDA wheel of torch does; importing torch.utils.cpp_extension then logs
# "No CUDA runtime is found, using CUDA_HOME=...", which a CPU build must not show.
FAKE_CUDA_TORCH = (
    "import torch; torch.cuda._is_compiled = lambda: True; torch.cuda.is_available = lambda: False\n"
    "torch.version.cuda = '13.0'\n"
)


def _warm_cpu_build_copied_to(cache: Path, monkeypatch) -> Path:
    """This process's compiled CPU bmm family, copied to where a child with FAKE_CUDA_TORCH and the cache root
    `cache` looks for it -> the copy's folder."""
    state = backends.backend_for(torch.device("cpu"))
    state.family("bmm")
    if state.families["bmm"].kind != "compiled":
        pytest.skip("the CPU kernels are not JIT-built here (prebuilt or the reference)")
    warm = Path(state.families["bmm"].detail).parent  # the folder this process loaded the family from
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the child's fingerprint holds it
    monkeypatch.setenv("SEMIRING_OPS_CACHE", str(cache))
    target = jit.build_directory(CPU_BMM.spec())
    shutil.copytree(warm, target)
    return target


def _run_child(cache: Path, extra_env: dict[str, str] | None = None) -> tuple[str, str]:
    env = {**os.environ, "SEMIRING_OPS_CACHE": str(cache), "CUDA_HOME": "/tmp", **(extra_env or {})}
    env.pop("SEMIRING_OPS_BACKEND", None)
    res = subprocess.run(
        [sys.executable, "-c", FAKE_CUDA_TORCH + SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout, res.stderr


def test_the_cpu_target_is_native_unless_named_and_names_its_own_cache_folder(monkeypatch):
    """SEMIRING_OPS_CPU_ARCH picks the CPU families' -march (CI and setup.py: the wheel's x86-64-v3); the module's
    name stays, so a wheel ships the very library the JIT builds, and each target has its own cache folder."""
    monkeypatch.delenv("SEMIRING_OPS_CPU_ARCH", raising=False)
    native = CPU_BMM.spec()
    monkeypatch.setenv("SEMIRING_OPS_CPU_ARCH", "x86-64-v3")
    portable = CPU_BMM.spec()
    monkeypatch.setenv("SEMIRING_OPS_CPU_ARCH", "default")
    default = CPU_BMM.spec()
    assert [f for f in native.cflags if f.startswith("-march")] == ["-march=native"]
    assert [f for f in portable.cflags if f.startswith("-march")] == ["-march=x86-64-v3"]
    assert not [f for f in default.cflags if f.startswith("-march")]
    assert native.name == portable.name == default.name == "semiring_ops_cpu_bmm"
    assert len({jit.build_directory(s) for s in (native, portable, default)}) == 3
    assert not [f for f in family("cuda", "bmm").spec().cflags if f.startswith("-march")]


PREBUILT_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from semiring_ops.build import families, prebuilt
    prebuilt._PACKAGE_DIR = Path(sys.argv[1])  # a wheel's package folder
    prebuilt._cpu_flags = lambda: set(prebuilt.AOT_CPU_FLAGS)
    bmm = families.family("cpu", "bmm")
    module = prebuilt.load_prebuilt(bmm)
    assert prebuilt.load_prebuilt(bmm) is module, "imported once"
    assert prebuilt.load_prebuilt(families.family("cpu", "chain")) is None, "not in this wheel"
    a, b = torch.randn(2, 5, 7, dtype=torch.float64), torch.randn(2, 7, 3, dtype=torch.float64)
    out, _ = module.bmm_forward(a, b, module.semiring_ids()["LogSemiring"], False)
    assert torch.allclose(out, torch.logsumexp(a[..., None] + b[:, None], -2))
    print("MODULE", module.__name__, module.__file__)
    """
)


def test_a_wheels_copy_of_a_cached_build_loads_as_prebuilt(tmp_path):
    """What setup.py puts in a wheel, a family's library copied from the cache into semiring_ops/_prebuilt/ beside
    a matching manifest, is what load_prebuilt imports (once), under the module name the JIT gave it (in a process
    that has not loaded the cached build: Python would hand that back for the same name)."""
    state = backends.backend_for(torch.device("cpu"))
    state.family("bmm")
    if state.families["bmm"].kind != "compiled":
        pytest.skip("the CPU kernels are not JIT-built here (prebuilt or the reference)")
    (tmp_path / prebuilt.LIBRARY_FOLDER).mkdir()
    copy = tmp_path / prebuilt.LIBRARY_FOLDER / prebuilt.library_file(CPU_BMM)
    shutil.copyfile(state.families["bmm"].detail, copy)
    info = prebuilt.build_manifest(["cpu_bmm"], [], "x86-64-v3")
    (tmp_path / prebuilt.MANIFEST_NAME).write_text(json.dumps(info))
    res = subprocess.run(
        [sys.executable, "-c", PREBUILT_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["MODULE", "semiring_ops_cpu_bmm", str(copy)], res.stdout


def test_a_corrupt_cached_library_is_rebuilt_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    folder = _warm_cpu_build_copied_to(tmp_path, monkeypatch)
    library = folder / f"{CPU_BMM.spec().name}.so"
    library.write_bytes(library.read_bytes()[:4096])  # truncated, as by a full disk or a killed copy
    out, err = _run_child(tmp_path)
    assert "KIND compiled" in out and "WARNINGS 0" in out, err
    assert err.count("is damaged or incomplete") == 1 and "rebuilding it" in err
    assert "No CUDA runtime" not in err, "a CPU build must not show torch's CUDA_HOME guess"
    out, err = _run_child(tmp_path)  # the rebuilt library is cached again
    assert "KIND compiled" in out and "compiling" not in err and "rebuilding" not in err


def test_a_corrupt_cached_library_that_cannot_be_rebuilt_falls_back_with_one_warning(tmp_path, monkeypatch):
    folder = _warm_cpu_build_copied_to(tmp_path, monkeypatch)
    for damaged in [folder / f"{CPU_BMM.spec().name}.so", *folder.glob("*.o")]:
        damaged.write_bytes(b"\0" * 64)
    out, err = _run_child(tmp_path, {"CXX": str(tmp_path / "no-such-compiler")})
    assert "KIND reference" in out and "WARNINGS 1" in out, err
    assert err.count("is damaged or incomplete") == 1
