"""Finding the compilers the kernels need: a C++ compiler, and for the CUDA kernels a CUDA toolkit whose major
version matches torch's: a system one, or NVIDIA's compiler installed from PyPI (``pip install
'semiring_ops[cuda13]'``), for which a CUDA_HOME that torch.utils.cpp_extension can use is assembled in the cache.

Order, for CUDA (the first usable one wins):
  1. $CUDA_HOME, then $CUDA_PATH, when it holds bin/nvcc and include/cuda_runtime.h;
  2. the toolkit of the nvcc on PATH (its real location's parent; a wrapper script elsewhere is skipped);
  3. /usr/local/cuda;
  4. the pip toolkit: nvidia/cu<major>/ in site-packages with nvcc, cicc (nvidia-nvvm), the crt headers and the
     CUDA runtime (CUDA 13's wheels; CUDA 12's nvidia-cuda-nvcc-cu12 holds ptxas but not nvcc).
A system toolkit of another major version than torch's is passed over (what it builds would need another CUDA
runtime); it is named in the reason when nothing else is found. SEMIRING_OPS_CUDA_TOOLKIT=pip looks only for the
pip toolkit (=system: only for a system one; default auto: both, in this order).

This module imports only the standard library and torch: setup.py uses it before torch.utils.cpp_extension is
imported (which reads CUDA_HOME once, at import).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "CudaToolkit",
    "cuda_home_for_build",
    "cxx_compiler",
    "find_cuda_toolkit",
    "missing_compiler_reason",
    "missing_toolkit_reason",
]


DEFAULT_HOME = Path("/usr/local/cuda")  # where NVIDIA's installers put the toolkit


@dataclass(frozen=True)
class CudaToolkit:
    """A usable CUDA toolkit: the folder cpp_extension gets as CUDA_HOME, where it was found, nvcc's version."""

    home: Path
    source: str  # e.g. "CUDA_HOME", "nvcc on PATH", "/usr/local/cuda", "pip (nvidia-cuda-nvcc 13.0.88)"
    version: str  # nvcc's release, e.g. "13.0"

    @property
    def from_pip(self) -> bool:
        return self.source.startswith("pip")


def torch_cuda_major() -> int | None:
    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


def _nvcc_release(nvcc: Path) -> str | None:
    """nvcc's release ("13.0"), or None when it does not run."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def _has_runtime_headers(home: Path) -> bool:
    return any((home / sub / "cuda_runtime.h").is_file() for sub in ("include", "targets/x86_64-linux/include"))


def _system_candidates() -> Iterator[tuple[Path, str]]:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            yield Path(os.environ[var]), f"${var}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        yield Path(nvcc).resolve().parent.parent, "nvcc on PATH"
    yield DEFAULT_HOME, str(DEFAULT_HOME)


def _site_paths() -> list[str]:
    return sys.path


def _pip_toolkit_root(major: int) -> Path | None:
    """site-packages/nvidia/cu<major> holding a whole compiler (CUDA 13's wheel layout), or None. Looked for on
    sys.path (any site folder, a --target install, PYTHONPATH) and in the nvidia package's path."""
    bases = [Path(entry) / "nvidia" for entry in _site_paths() if entry]
    with contextlib.suppress(ImportError):
        import nvidia  # the package of NVIDIA's wheels (torch's CUDA wheels install some)

        bases += [Path(base) for base in getattr(nvidia, "__path__", [])]
    needed = ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/crt/host_config.h")
    for base in bases:
        root = base / f"cu{major}"
        if all((root / rel).exists() for rel in needed) and any((root / "lib").glob("libcudart.so*")):
            return root
    return None


def _pip_version() -> str:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version("nvidia-cuda-nvcc")
    return "?"


def _assemble_home(root: Path, cache: Path) -> Path:
    """A CUDA_HOME over a pip toolkit: bin, include and nvvm linked, and lib64 with the unversioned libcudart.so that
    cpp_extension's -lcudart needs (the wheel ships libcudart.so.<major> only). Made once per toolkit folder, under
    a temporary name and renamed into place, so concurrent processes never see half of one."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    home = cache / f"cuda-home-{root.name}-{digest}"
    if (home / "lib64" / "libcudart.so").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{home.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "lib64").mkdir(parents=True)
    for sub in ("bin", "include", "nvvm"):
        (tmp / sub).symlink_to(root / sub, target_is_directory=True)
    for lib in sorted((root / "lib").glob("libcudart.so*")):
        (tmp / "lib64" / lib.name).symlink_to(lib)
    versioned = sorted((root / "lib").glob("libcudart.so.*"))
    if not (tmp / "lib64" / "libcudart.so").exists() and versioned:
        (tmp / "lib64" / "libcudart.so").symlink_to(versioned[0])
    try:
        os.replace(tmp, home)
    except OSError:  # another process put it in place first
        shutil.rmtree(tmp, ignore_errors=True)
    return home


@dataclass(frozen=True)
class _Search:
    toolkit: CudaToolkit | None
    passed_over: tuple[str, ...]  # system toolkits seen and not used, with why


@functools.cache
def _search(cache: Path) -> _Search:
    major = torch_cuda_major()
    passed: list[str] = []
    seen: set[Path] = set()
    which = os.environ.get("SEMIRING_OPS_CUDA_TOOLKIT", "auto")
    if which not in ("auto", "pip", "system"):
        passed.append(f"SEMIRING_OPS_CUDA_TOOLKIT={which} is not auto, pip or system")
    for home, source in _system_candidates() if which in ("auto", "system") else ():
        nvcc = home / "bin" / "nvcc"
        if home in seen or not home.is_dir():
            if source.startswith("$") and not home.is_dir():
                passed.append(f"{source}={home} does not exist")
            continue
        seen.add(home)
        if not nvcc.is_file() or not _has_runtime_headers(home):
            if source.startswith("$"):
                passed.append(f"{source}={home} has no bin/nvcc and include/cuda_runtime.h")
            continue
        release = _nvcc_release(nvcc)
        if release is None:
            passed.append(f"{nvcc} does not run")
        elif major is not None and int(release.split(".")[0]) != major:
            passed.append(f"nvcc {release} at {home} ({source}) is not CUDA {major}, torch's")
        else:
            return _Search(CudaToolkit(home, source, release), tuple(passed))
    if major is not None and which in ("auto", "pip"):
        root = _pip_toolkit_root(major)
        if root is not None:
            release = _nvcc_release(root / "bin" / "nvcc")
            if release is not None:
                home = _assemble_home(root, cache)
                return _Search(CudaToolkit(home, f"pip (nvidia-cuda-nvcc {_pip_version()})", release), tuple(passed))
            passed.append(f"the pip toolkit's nvcc at {root / 'bin'} does not run")
    return _Search(None, tuple(passed))


def find_cuda_toolkit(cache: Path) -> CudaToolkit | None:
    """The CUDA toolkit the kernels build with (module docstring), or None; cached per process. `cache`: where a
    pip toolkit's CUDA_HOME is assembled (the build cache)."""
    return _search(cache).toolkit


def cuda_extra() -> str:
    """The pip extra that installs a compiler for this torch's CUDA, e.g. 'semiring_ops[cuda13]'."""
    major = torch_cuda_major()
    return f"semiring_ops[cuda{major}]" if major else "semiring_ops[cuda13]"


def missing_toolkit_reason(cache: Path) -> str:
    """Why no CUDA toolkit is usable, what that costs and the exact fix (the one warning's text)."""
    search = _search(cache)
    major = torch_cuda_major()
    seen = f" ({'; '.join(search.passed_over)})" if search.passed_over else ""
    if major is not None and major >= 13:
        fix = (
            f"pip install '{cuda_extra()}' (NVIDIA's compiler as wheels, about 105 MB, for torch's CUDA "
            f"{torch.version.cuda}), or install a prebuilt semiring_ops wheel made for torch {torch.__version__}"
        )
    else:
        fix = (
            f"install a prebuilt semiring_ops wheel made for torch {torch.__version__}, or a CUDA {major} toolkit "
            f"(conda install -c nvidia cuda-nvcc={torch.version.cuda}, or NVIDIA's installer) and set CUDA_HOME; "
            f"CUDA {major}'s pip packages carry no nvcc"
        )
    return (
        f"no CUDA {major} compiler found{seen}, so the CUDA kernels cannot be built: the PyTorch reference runs "
        f"instead, 40-400x slower (an H100: logbmm fwd+bwd B=8 n=1024 376 ms instead of 8.8; a CRF train step "
        f"79 ms instead of 0.78). Fix: {fix}"
    )


def cxx_compiler() -> str | None:
    """The C++ compiler cpp_extension will run ($CXX, else c++), as a path, or None when it is not there."""
    name = os.environ.get("CXX", "c++")
    return shutil.which(name)


@functools.cache
def cxx_is_gcc(compiler: str | None = None) -> bool:
    """Whether `compiler` (default: cxx_compiler()) is GCC, whose options families.GCC_ONLY_CFLAGS are: its
    --version names the Free Software Foundation (clang's does not)."""
    path = compiler or cxx_compiler()
    if path is None:
        return False
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


def compiler_cflags(cflags: tuple[str, ...] | list[str], compiler: str | None = None) -> list[str]:
    """`cflags` for `compiler`: without families.GCC_ONLY_CFLAGS unless it is GCC."""
    from .families import GCC_ONLY_CFLAGS

    return [f for f in cflags if f not in GCC_ONLY_CFLAGS or cxx_is_gcc(compiler)]


def missing_compiler_reason(device_type: str) -> str:
    name = os.environ.get("CXX", "c++")
    where = f"$CXX={name}" if "CXX" in os.environ else "c++ on PATH"
    return (
        f"no C++ compiler ({where} not found), so the {device_type} kernels cannot be built: the PyTorch reference "
        f"runs instead, several times to 100x slower. Fix: install one (apt install g++, dnf install gcc-c++, "
        f"conda install -c conda-forge gxx), or install a prebuilt semiring_ops wheel made for torch "
        f"{torch.__version__}"
    )


@contextlib.contextmanager
def cuda_home_for_build(toolkit: CudaToolkit) -> Iterator[None]:
    """CUDA_HOME pointing at `toolkit` for the duration of a build: the environment (nvcc's subprocesses, setup.py)
    and torch.utils.cpp_extension's module global, which it read once at import."""
    from torch.utils import cpp_extension

    saved_env = {k: os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")}
    saved_global = cpp_extension.CUDA_HOME
    os.environ["CUDA_HOME"] = str(toolkit.home)
    os.environ.pop("CUDA_PATH", None)
    cpp_extension.CUDA_HOME = str(toolkit.home)
    try:
        yield
    finally:
        cpp_extension.CUDA_HOME = saved_global
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
