"""Where the compilers come from (semiring_ops.build.toolkit) and when a wheel's prebuilt kernels may be loaded
(semiring_ops.build.prebuilt), on fake toolkits and manifests: no GPU, no download, no compile."""

from __future__ import annotations

import json
import os
import platform
import stat
import sys
import types
from pathlib import Path

import pytest
import torch

from semiring_ops.build import prebuilt, toolkit
from semiring_ops.build.families import family


def _nvcc(path: Path, release: str) -> None:
    """A stand-in nvcc that prints `release` like the real one's --version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _system_toolkit(home: Path, release: str) -> Path:
    _nvcc(home / "bin" / "nvcc", release)
    (home / "include").mkdir(parents=True, exist_ok=True)
    (home / "include" / "cuda_runtime.h").write_text("")
    return home


def _pip_toolkit(site: Path, major: int = 13, with_nvvm: bool = True) -> Path:
    """site/nvidia/cu<major> laid out as NVIDIA's CUDA 13 wheels install it (nvcc, nvvm, crt, cccl, runtime)."""
    root = site / "nvidia" / f"cu{major}"
    _nvcc(root / "bin" / "nvcc", f"{major}.0")
    (root / "bin" / "ptxas").write_text("")
    if with_nvvm:
        (root / "nvvm" / "bin").mkdir(parents=True)
        (root / "nvvm" / "bin" / "cicc").write_text("")
    (root / "include" / "crt").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "include" / "crt" / "host_config.h").write_text("")
    (root / "lib").mkdir()
    (root / "lib" / f"libcudart.so.{major}").write_text("")
    return root


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No toolkit visible: no CUDA_HOME / CUDA_PATH, no nvcc on PATH, no /usr/local/cuda, no nvidia package;
    torch reports CUDA 13.0. Returns a fresh cache folder."""
    for var in ("CUDA_HOME", "CUDA_PATH", "SEMIRING_OPS_CUDA_TOOLKIT"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(toolkit, "DEFAULT_HOME", tmp_path / "no-usr-local-cuda")
    monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))  # a namespace with no path
    monkeypatch.setattr(toolkit, "_site_paths", list)  # nor a site folder (CI's venv holds the cuda13 extra)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    toolkit._search.cache_clear()
    yield tmp_path / "cache"
    toolkit._search.cache_clear()


def _use_site(monkeypatch, site: Path, on_sys_path: bool = False) -> None:
    """The pip toolkit under `site`: seen through the nvidia package's path, or as a sys.path entry."""
    if on_sys_path:
        monkeypatch.setattr(toolkit, "_site_paths", lambda: [str(site)])
    else:
        fake = types.ModuleType("nvidia")
        fake.__path__ = [str(site / "nvidia")]
        monkeypatch.setitem(sys.modules, "nvidia", fake)


def test_no_toolkit_gives_the_reason_with_the_pip_extra(clean, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/nowhere/cuda")
    assert toolkit.find_cuda_toolkit(clean) is None
    reason = toolkit.missing_toolkit_reason(clean)
    assert "$CUDA_HOME=/nowhere/cuda does not exist" in reason
    assert "pip install 'semiring_ops[cuda13]'" in reason and "prebuilt semiring_ops wheel" in reason
    assert "376 ms instead of 8.8" in reason, "the warning says what the fallback costs"


@pytest.mark.parametrize("on_sys_path", [False, True], ids=["nvidia-package", "sys-path"])
def test_a_pip_toolkit_gets_a_cuda_home_assembled_in_the_cache(clean, monkeypatch, tmp_path, on_sys_path):
    root = _pip_toolkit(tmp_path / "site")
    _use_site(monkeypatch, tmp_path / "site", on_sys_path)
    tk = toolkit.find_cuda_toolkit(clean)
    assert tk is not None and tk.from_pip and tk.version == "13.0"
    assert tk.home.parent == clean
    assert (tk.home / "bin").resolve() == (root / "bin").resolve()
    assert (tk.home / "nvvm").resolve() == (root / "nvvm").resolve()
    assert (tk.home / "include" / "crt" / "host_config.h").is_file()
    assert (tk.home / "lib64" / "libcudart.so").resolve() == (root / "lib" / "libcudart.so.13").resolve()
    toolkit._search.cache_clear()
    assert toolkit.find_cuda_toolkit(clean) == tk, "a second process reuses the assembled folder"


def test_a_pip_toolkit_without_nvvm_is_not_taken(clean, monkeypatch, tmp_path):
    _pip_toolkit(tmp_path / "site", with_nvvm=False)  # nvidia-nvvm holds cicc: nvcc alone cannot compile
    _use_site(monkeypatch, tmp_path / "site")
    assert toolkit.find_cuda_toolkit(clean) is None


def test_a_system_toolkit_comes_first_and_cuda_home_first_of_all(clean, monkeypatch, tmp_path):
    _pip_toolkit(tmp_path / "site")
    _use_site(monkeypatch, tmp_path / "site")
    on_path = _system_toolkit(tmp_path / "on-path", "13.0")
    monkeypatch.setenv("PATH", str(on_path / "bin"))
    tk = toolkit.find_cuda_toolkit(clean)
    assert tk.home == on_path and tk.source == "nvcc on PATH"
    toolkit._search.cache_clear()
    explicit = _system_toolkit(tmp_path / "explicit", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(explicit))
    assert toolkit.find_cuda_toolkit(clean).home == explicit


def test_the_choice_can_be_limited_to_the_pip_or_the_system_toolkit(clean, monkeypatch, tmp_path):
    _pip_toolkit(tmp_path / "site")
    _use_site(monkeypatch, tmp_path / "site")
    monkeypatch.setenv("CUDA_HOME", str(_system_toolkit(tmp_path / "system", "13.0")))
    for which, from_pip in (("auto", False), ("pip", True), ("system", False)):
        monkeypatch.setenv("SEMIRING_OPS_CUDA_TOOLKIT", which)
        toolkit._search.cache_clear()
        assert toolkit.find_cuda_toolkit(clean).from_pip is from_pip, which
    monkeypatch.setenv("SEMIRING_OPS_CUDA_TOOLKIT", "nvcc")
    toolkit._search.cache_clear()
    assert "SEMIRING_OPS_CUDA_TOOLKIT=nvcc is not auto, pip or system" in toolkit.missing_toolkit_reason(clean)


def test_a_system_toolkit_of_another_major_is_passed_over(clean, monkeypatch, tmp_path):
    old = _system_toolkit(tmp_path / "cuda-12", "12.4")
    monkeypatch.setenv("CUDA_HOME", str(old))
    assert toolkit.find_cuda_toolkit(clean) is None
    assert f"nvcc 12.4 at {old} ($CUDA_HOME) is not CUDA 13, torch's" in toolkit.missing_toolkit_reason(clean)
    _pip_toolkit(tmp_path / "site")
    _use_site(monkeypatch, tmp_path / "site")
    toolkit._search.cache_clear()
    assert toolkit.find_cuda_toolkit(clean).from_pip


def test_cuda_12_is_told_that_pip_has_no_nvcc(clean, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    reason = toolkit.missing_toolkit_reason(clean)
    assert "CUDA 12's pip packages carry no nvcc" in reason and "conda install -c nvidia cuda-nvcc=12.8" in reason


def test_cuda_home_for_build_sets_and_restores_cpp_extension(clean, monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    home = _system_toolkit(tmp_path / "tk", "13.0")
    tk = toolkit.CudaToolkit(home, "test", "13.0")
    before, env_before = cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME")
    with toolkit.cuda_home_for_build(tk):
        assert str(home) == cpp_extension.CUDA_HOME and os.environ["CUDA_HOME"] == str(home)
    assert before == cpp_extension.CUDA_HOME and os.environ.get("CUDA_HOME") == env_before


# ---------------------------------------------------------------- prebuilt manifests


def _manifest(**changes) -> dict:
    info = prebuilt.build_manifest(["cpu_bmm", "cuda_bmm"], ["8.0", "9.0", "12.0+PTX"], "x86-64-v3")
    info.update(changes)
    return info


def test_a_matching_manifest_is_loaded(monkeypatch):
    monkeypatch.setattr(prebuilt, "_cpu_flags", lambda: set(prebuilt.AOT_CPU_FLAGS))
    assert prebuilt.mismatch(family("cpu", "bmm"), _manifest()) is None
    assert prebuilt.mismatch(family("cpu", "chain"), _manifest()) == "the wheel has no such module"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"torch": "2.0.0"}, "they were built for torch 2.0.0"),
        ({"torch_cuda": "11.8"}, "(CUDA 11.8)"),
        ({"cxx11_abi": None}, "another C++ ABI"),
        ({"machine": "riscv64"}, "they were built for riscv64"),
    ],
)
def test_a_manifest_for_another_torch_or_machine_is_refused(changes, expected):
    why = prebuilt.mismatch(family("cpu", "bmm"), _manifest(**changes))
    assert why is not None and expected in why


def test_cpu_kernels_for_x86_64_v3_are_refused_on_an_older_cpu(monkeypatch):
    monkeypatch.setattr(prebuilt, "_cpu_flags", lambda: {"avx", "sse4_2"})
    why = prebuilt.mismatch(family("cpu", "bmm"), _manifest())
    assert why is not None and "x86-64-v3" in why and "avx2" in why


@pytest.mark.parametrize(
    ("archs", "capability", "runs"),
    [
        (["8.0", "9.0"], (9, 0), True),
        (["8.0", "9.0"], (8, 6), True),  # sm_80 SASS runs on sm_86
        (["8.0", "9.0"], (7, 5), False),
        (["9.0"], (12, 0), False),  # no PTX: nothing for a newer major
        (["8.0", "12.0+PTX"], (12, 1), True),
        (["8.0", "9.0+PTX"], (10, 0), True),  # the driver compiles the PTX
        (["9.0a"], (9, 0), True),  # arch-specific SASS (wgmma): that GPU alone
        (["9.0a"], (9, 1), False),
        (["10.0f", "8.0"], (10, 3), False),
    ],
)
def test_cuda_architectures_decide_whether_the_gpu_runs_them(archs, capability, runs):
    assert prebuilt._arch_runs(archs, capability) is runs


def test_an_unreadable_architecture_refuses_the_wheel_rather_than_failing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    why = prebuilt.mismatch(family("cuda", "bmm"), _manifest(cuda_archs=["sm90"]), device_index=0)
    assert why == "its manifest says unreadable CUDA architecture 'sm90'"


def test_a_refused_wheel_says_so_once_and_the_family_compiles_instead(monkeypatch, tmp_path, capsys):
    (tmp_path / prebuilt.MANIFEST_NAME).write_text(json.dumps(_manifest(torch="1.0.0")))
    monkeypatch.setattr(prebuilt, "_PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(prebuilt, "_told", set())
    prebuilt.manifest.cache_clear()
    try:
        assert prebuilt.load_prebuilt(family("cpu", "bmm")) is None
        assert prebuilt.load_prebuilt(family("cpu", "bmm")) is None
        assert prebuilt.load_prebuilt(family("cpu", "chain")) is None  # not in the wheel: nothing to say
    finally:
        prebuilt.manifest.cache_clear()
    err = capsys.readouterr().err
    assert err.count("semiring_ops: not loading the prebuilt kernels") == 1
    assert f"built for torch 1.0.0 (CUDA {torch.version.cuda}), this is torch {torch.__version__}" in err
    assert "compiling them on first use instead" in err


def test_manifest_records_this_torch_and_machine():
    info = prebuilt.build_manifest(["cpu_bmm"], [], "x86-64-v3")
    assert info["torch"] == torch.__version__ and info["machine"] == platform.machine()
    assert info["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
