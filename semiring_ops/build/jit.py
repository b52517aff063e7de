"""Building the compiled extensions just in time, on first use: one module per kernel family (families.py).

Just-in-time builds go through torch.utils.cpp_extension.load (ninja) into a cache folder whose name
holds a hash of the sources, the flags, torch's version and the target GPU architectures, so a cached
build is never stale. An exclusive lock file (fcntl, released by the OS even if a process dies)
serialises builds of one folder across processes; a marker written atomically after a successful build
lets later processes import the library directly, without ninja. CUDA builds run with the toolkit
toolkit.py finds (a system one, or NVIDIA's pip packages).

This module imports only the standard library and torch: setup.py reads it without importing the package.

Environment:
    SEMIRING_OPS_CACHE   cache root (default: $XDG_CACHE_HOME/semiring_ops or ~/.cache/semiring_ops)
    SEMIRING_OPS_VERBOSE_BUILD=1   show the compiler's output
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .families import ExtensionSpec
    from .toolkit import CudaToolkit

__all__ = ["build_directory", "cache_root", "import_library", "is_cached", "library_path", "load", "source_root"]


def source_root() -> Path:
    """The csrc folder: inside the installed package (wheel) or beside it (source checkout)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "csrc", here.parent / "csrc"):
        if (candidate / "semiring.h").is_file():
            return candidate
    raise FileNotFoundError(f"semiring_ops C++ sources not found in {here / 'csrc'} or {here.parent / 'csrc'}")


def cache_root() -> Path:
    env = os.environ.get("SEMIRING_OPS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "semiring_ops"


def cuda_arch_list() -> list[str]:
    """Target architectures: TORCH_CUDA_ARCH_LIST if set, else those of the visible GPUs."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return sorted(set(env.replace(";", " ").split()))
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return [f"{major}.{minor}" for major, minor in sorted(caps)]


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def project_files(sources: list[Path], root: Path) -> list[Path]:
    """`sources` and every project header they include, transitively (#include "..." resolved against the csrc
    root, then the including file's folder): what a build of them depends on among csrc's files."""
    seen: dict[Path, None] = {}
    todo = list(sources)
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen[path] = None
        for name in _INCLUDE.findall(path.read_text(errors="replace")):
            todo.append(root / name if (root / name).is_file() else path.parent / name)
    return sorted(seen)


def _fingerprint(spec: ExtensionSpec, cuda_release: str = "") -> str:
    """A hash of everything a build of `spec` depends on: its sources and the headers they include (so a change
    to another family's files leaves this one's cache valid), flags, torch, Python, and for CUDA the targets and
    the nvcc release."""
    h = hashlib.sha256()
    root = source_root()
    for path in project_files([root / s for s in spec.sources], root):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    h.update(repr((spec.cflags, spec.cuda_cflags, spec.ldflags, torch.__version__, torch.version.cuda)).encode())
    h.update(sys.version.encode())
    if spec.is_cuda:
        h.update(repr((cuda_arch_list(), cuda_release)).encode())
    return h.hexdigest()[:16]


def build_directory(spec: ExtensionSpec, toolkit: CudaToolkit | None = None) -> Path:
    """The cache folder of `spec` (built with `toolkit`, for a CUDA spec)."""
    return cache_root() / f"{spec.name}-{_fingerprint(spec, toolkit.version if toolkit else '')}"


def is_cached(spec: ExtensionSpec, toolkit: CudaToolkit | None = None) -> bool:
    """Whether a build of `spec` is in the cache (its marker written), without loading it."""
    return (build_directory(spec, toolkit) / "build.ok").is_file()


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def import_library(path: Path, name: str) -> ModuleType:
    """The compiled module `name` (its PyInit_ symbol) from the library at `path`, whatever the file is called: a
    family's build in the cache, or its copy in a wheel (prebuilt.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _library_path(folder: Path, name: str) -> Path:
    return folder / f"{name}.so"  # torch.utils.cpp_extension.load's naming


def library_path(spec: ExtensionSpec, toolkit: CudaToolkit | None = None) -> Path:
    """The library a build of `spec` (with `toolkit`, for a CUDA spec) leaves in the cache."""
    return _library_path(build_directory(spec, toolkit), spec.name)


_loaded: dict[Path, ModuleType] = {}


def load(spec: ExtensionSpec, toolkit: CudaToolkit | None = None) -> ModuleType:
    """The compiled module for `spec`: from the cache, or compiled now (one message naming the folder). A CUDA spec
    needs the toolkit it builds with (toolkit.find_cuda_toolkit).

    Raises whatever the build raises; the caller decides about falling back.
    """
    folder = build_directory(spec, toolkit)
    module = _loaded.get(folder)
    if module is None:
        module = _loaded[folder] = _load_or_build(spec, folder, toolkit)
    return module


def _load_or_build(spec: ExtensionSpec, folder: Path, toolkit: CudaToolkit | None) -> ModuleType:
    marker, library = folder / "build.ok", _library_path(folder, spec.name)
    if marker.is_file():
        with contextlib.suppress(ImportError, OSError):  # a damaged cached library is rebuilt below
            return _import_intact(library, marker, spec.name)

    with _exclusive(folder.with_suffix(".lock")):
        if marker.is_file():  # built by another process while we waited, or cached but damaged
            try:
                return _import_intact(library, marker, spec.name)
            except (ImportError, OSError) as exc:
                print(f"semiring_ops: {_first_line(exc)}; rebuilding it", file=sys.stderr, flush=True)
                marker.unlink()
                library.unlink(missing_ok=True)
                try:  # usually only the library is damaged: ninja relinks it from the cached objects
                    return _build(spec, folder, marker, toolkit)
                except Exception:  # damaged objects too: everything from scratch, once
                    shutil.rmtree(folder, ignore_errors=True)
        return _build(spec, folder, marker, toolkit)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else repr(exc)


def _library_stamp(library: Path) -> str:
    """Size and BLAKE2 digest of a built library: the marker records them, and a cached library is imported
    only when they still match (a truncated shared library can kill the process in dlopen with SIGBUS,
    before any ImportError)."""
    data = library.read_bytes()
    return f"{len(data)} {hashlib.blake2b(data, digest_size=16).hexdigest()}"


def _import_intact(library: Path, marker: Path, name: str) -> ModuleType:
    """Imports a cached library whose size and digest match its marker's; ImportError if they do not."""
    recorded = marker.read_text().splitlines()[1:2]
    if not recorded:
        raise ImportError(f"the cached library {library} has no recorded digest (an older semiring_ops built it)")
    if not library.is_file() or recorded != [_library_stamp(library)]:
        raise ImportError(f"the cached library {library} is damaged or incomplete (size or digest changed)")
    return import_library(library, name)


def _build(spec: ExtensionSpec, folder: Path, marker: Path, toolkit: CudaToolkit | None) -> ModuleType:
    """Compiles `spec` into `folder` (the caller holds the folder's lock), imports it, then writes the marker."""
    folder.mkdir(parents=True, exist_ok=True)
    # torch's own baton file inside the folder can only be stale here (we hold the lock)
    (folder / "lock").unlink(missing_ok=True)
    device, _, family = spec.name.removeprefix("semiring_ops_").partition("_")
    print(
        f"semiring_ops: compiling the {device.upper()} {family} kernels (first use; {len(spec.sources)} files) into "
        f"{folder}",
        file=sys.stderr,
        flush=True,
    )
    with _quiet_cuda_home_guess(spec):
        from torch.utils.cpp_extension import load as torch_load

    from .toolkit import compiler_cflags

    root = source_root()
    # ninja's default (cpu count + 2) oversubscribes a small machine: a family has a few files, one job each
    jobs_env = os.environ.get("MAX_JOBS")
    if not jobs_env:
        os.environ["MAX_JOBS"] = str(max(1, min(os.cpu_count() or 1, len(spec.sources))))
    env_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if spec.is_cuda and not env_arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(cuda_arch_list())
    sources, includes, cflags, ldflags = [str(root / s) for s in spec.sources], [str(root)], spec.cflags, spec.ldflags
    if spec.nvrtc:
        sources, includes, cflags, ldflags = _nvrtc_host_build(spec, folder)
    try:
        with _toolkit(spec, toolkit):
            module = torch_load(
                name=spec.name,
                sources=sources,
                extra_include_paths=includes,
                extra_cflags=compiler_cflags(cflags),
                extra_cuda_cflags=list(spec.cuda_cflags),
                extra_ldflags=list(ldflags),
                build_directory=str(folder),
                verbose=os.environ.get("SEMIRING_OPS_VERBOSE_BUILD") == "1",
            )
    finally:
        if spec.is_cuda and not env_arch:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        if not jobs_env:
            os.environ.pop("MAX_JOBS", None)
    tmp = marker.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(f"{torch.__version__}\n{_library_stamp(_library_path(folder, spec.name))}\n")
    os.replace(tmp, marker)
    return module


def _nvrtc_host_build(spec: ExtensionSpec, folder: Path) -> tuple[list[str], list[str], list[str], list[str]]:
    """(sources, include paths, compiler flags, linker flags) of a family's host code for the NVRTC route: each
    kernel file compiled by the C++ compiler through a one-line .cpp in the build folder (its launchers;
    csrc/cuda/kernel_ref.h), against the CUDA runtime's headers (csrc/nvrtc_host standing in for the two that come
    with nvcc), linked with PyTorch's CUDA libraries and the CUDA runtime."""
    from .nvrtc_kernels import cuda_runtime_paths

    paths = cuda_runtime_paths()
    if paths is None:
        raise RuntimeError("the CUDA runtime's headers and library (nvidia-cuda-runtime, or a CUDA toolkit) are needed")
    include, cudart = paths
    root, hosts = source_root(), folder / "nvrtc_host"
    hosts.mkdir(exist_ok=True)
    sources = []
    for rel in spec.sources:
        if rel.endswith(".cu"):
            wrapper = hosts / (rel.replace("/", "_") + ".cpp")
            text = f'#include "{rel}"  // its launchers, for the NVRTC route\n'
            if not wrapper.is_file() or wrapper.read_text() != text:
                wrapper.write_text(text)
            sources.append(str(wrapper))
        else:
            sources.append(str(root / rel))
    torch_lib = Path(torch.__file__).parent / "lib"
    ldflags = [
        *spec.ldflags,
        f"-L{torch_lib}",
        "-lc10_cuda",
        "-ltorch_cuda",
        str(cudart),
        f"-Wl,-rpath,{cudart.parent}",
    ]
    cflags = [*spec.cflags, "-idirafter", str(root / "nvrtc_host")]
    return sources, [str(root), str(include)], cflags, ldflags


def _toolkit(spec: ExtensionSpec, toolkit: CudaToolkit | None):
    """CUDA_HOME set to the toolkit for a CUDA build; nothing for a CPU one."""
    if not spec.is_cuda:
        return contextlib.nullcontext()
    if toolkit is None:
        raise RuntimeError(f"{spec.name}: a CUDA build needs a CUDA toolkit (toolkit.find_cuda_toolkit)")
    from .toolkit import cuda_home_for_build

    return cuda_home_for_build(toolkit)


class _DropCudaHomeGuess(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No CUDA runtime is found")


@contextlib.contextmanager
def _quiet_cuda_home_guess(spec: ExtensionSpec):
    """Importing torch.utils.cpp_extension on a machine without a GPU logs "No CUDA runtime is found, using
    CUDA_HOME=..." (torch guesses the CUDA toolkit at import): noise for a CPU build, so dropped then."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    quiet = None if spec.is_cuda else _DropCudaHomeGuess()
    if quiet is not None:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        if quiet is not None:
            logger.removeFilter(quiet)
