"""Building and loading: concurrent first builds share one good cache, cached loads compile nothing,
a missing compiler falls back to the reference with one warning, and `info` reports what is active."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from semiring_ops.build import jit
from semiring_ops.build.backends import backend_for

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
    print("WARNINGS", sum("reference implementation" in str(w.message) for w in caught))
    """
)


def _run(env_extra: dict[str, str], timeout: int = 900) -> subprocess.Popen:
    env = {**os.environ, **env_extra}
    env.pop("SEMIRING_OPS_BACKEND", None)
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


@pytest.mark.slow
def test_two_processes_building_at_once_both_succeed_and_leave_a_good_cache(tmp_path):
    env = {"SEMIRING_OPS_CACHE": str(tmp_path)}
    first, second = _run(env), _run(env)
    results = [_finish(first), _finish(second)]
    for out, _ in results:
        assert "KIND compiled" in out
    messages = [err.count("semiring_ops: compiling the CPU kernels") for _, err in results]
    assert sorted(messages) == [0, 1], f"exactly one process compiles: {messages}"
    assert any(str(tmp_path) in err for _, err in results), "the message names the cache folder"
    out, err = _finish(_run(env))  # a later process loads from the cache without compiling
    assert "KIND compiled" in out and "compiling" not in err
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / "build.ok").is_file()


def test_no_compiler_falls_back_to_the_reference_with_one_warning(tmp_path):
    env = {"SEMIRING_OPS_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    out, _err = _finish(_run(env))
    assert "KIND reference" in out
    assert "WARNINGS 1" in out


def test_info_command_reports_backends_and_cache():
    res = subprocess.run([sys.executable, "-m", "semiring_ops", "info"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    assert "build cache:" in res.stdout
    assert "cpu" in res.stdout and "log matmul" in res.stdout
    assert "std matmul   torch.matmul" in res.stdout
    assert "lazy kernel cache:" in res.stdout
    assert "lazy reductions cpu: compiled (g++)" in res.stdout  # CI and this machine have g++


# Run first in the child: pretend this torch was built with CUDA on a machine without a GPU and a CUDA
# toolkit guessed at /tmp, as CI's CUDA wheel of torch does; importing torch.utils.cpp_extension then logs
# "No CUDA runtime is found, using CUDA_HOME=...", which a CPU build must not show.
FAKE_CUDA_TORCH = (
    "import torch; torch.cuda._is_compiled = lambda: True; torch.cuda.is_available = lambda: False\n"
    "torch.version.cuda = '13.0'\n"
)


def _warm_cpu_build_copied_to(cache: Path, monkeypatch) -> Path:
    """This process's compiled CPU build, copied to where a child with FAKE_CUDA_TORCH and the cache root
    `cache` looks for it -> the copy's folder."""
    if backend_for(torch.device("cpu")).kind != "compiled":
        pytest.skip("the CPU kernels are not JIT-built here (prebuilt or the reference)")
    warm = jit.build_directory(jit.CPU_EXTENSION)
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the child's fingerprint holds it
    monkeypatch.setenv("SEMIRING_OPS_CACHE", str(cache))
    target = jit.build_directory(jit.CPU_EXTENSION)
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


def test_a_corrupt_cached_library_is_rebuilt_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    folder = _warm_cpu_build_copied_to(tmp_path, monkeypatch)
    library = folder / f"{jit.CPU_EXTENSION.name}.so"
    library.write_bytes(library.read_bytes()[:4096])  # truncated, as by a full disk or a killed copy
    out, err = _run_child(tmp_path)
    assert "KIND compiled" in out and "WARNINGS 0" in out, err
    assert err.count("is damaged or incomplete") == 1 and "rebuilding it" in err
    assert "No CUDA runtime" not in err, "a CPU build must not show torch's CUDA_HOME guess"
    out, err = _run_child(tmp_path)  # the rebuilt library is cached again
    assert "KIND compiled" in out and "compiling" not in err and "rebuilding" not in err


def test_a_corrupt_cached_library_that_cannot_be_rebuilt_falls_back_with_one_warning(tmp_path, monkeypatch):
    folder = _warm_cpu_build_copied_to(tmp_path, monkeypatch)
    for damaged in [folder / f"{jit.CPU_EXTENSION.name}.so", *folder.glob("*.o")]:
        damaged.write_bytes(b"\0" * 64)
    out, err = _run_child(tmp_path, {"CXX": str(tmp_path / "no-such-compiler")})
    assert "KIND reference" in out and "WARNINGS 1" in out, err
    assert err.count("is damaged or incomplete") == 1
