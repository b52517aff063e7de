"""The NVRTC route of the CUDA kernel families (docs/build.md, "Two routes to the CUDA kernels").

A family built for this route is host code alone, compiled by the C++ compiler: its kernel files' launchers, with
the device code left out (csrc/cuda/kernel_ref.h). The first launch of each kernel instantiation asks
``kernel_handle`` for it: NVRTC (libnvrtc, which PyTorch's CUDA wheels install) compiles that one instantiation from
its kernel file for this machine's GPU, the cubin is cached on disk, loaded as a CUDA library, and its kernel
handle (``cudaKernel_t``, which the runtime's launch calls take) goes back to C++, which keeps it for the process.

So a GPU user needs no CUDA toolkit: the C++ compiler, and NVRTC with the CUDA runtime's headers, both from the
pip packages that PyTorch's CUDA build depends on (``nvidia/cu13`` for CUDA 13; ``nvidia/cuda_nvrtc`` and
``nvidia/cuda_runtime`` for CUDA 12). NVRTC has no C++ standard library: the few headers the kernel files take
from it come from csrc/nvrtc.

The cache (``<cache root>/nvrtc``): one file per instantiation, named by a hash of its kernel file and every
project header that file includes, the stand-in headers, the expression, the options, the target and NVRTC's
version; built under a lock and renamed into place (build/artifacts.py), so concurrent processes compile it once
and never read half of one.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

from . import nvrtc
from .artifacts import cached_artifact, source_key
from .jit import cache_root, project_files, source_root

__all__ = [
    "ROUTE_ENV",
    "cache_dir",
    "cuda_runtime_paths",
    "kernel_handle",
    "nvrtc_options",
    "route_choice",
    "route_problem",
]

# auto (default): nvcc where a CUDA toolkit is found, else NVRTC | nvrtc: NVRTC wherever it serves | nvcc: never NVRTC
ROUTE_ENV = "SEMIRING_OPS_CUDA_KERNELS"
_ROUTES = ("auto", "nvrtc", "nvcc")


def cache_dir() -> Path:
    """$SEMIRING_OPS_NVRTC_CACHE if set, else ``<cache root>/nvrtc`` (which honours SEMIRING_OPS_CACHE)."""
    env = os.environ.get("SEMIRING_OPS_NVRTC_CACHE")
    return Path(env).expanduser() if env else cache_root() / "nvrtc"


@functools.cache
def cuda_runtime_paths() -> tuple[Path, Path] | None:
    """(the folder of cuda_runtime_api.h and cuda_fp16.h, the libcudart.so.<major> file) that the host code
    compiles and links against and NVRTC reads: $CUDA_HOME's, else those of the pip packages of PyTorch's CUDA
    build, else /usr/local/cuda's; None when none is found."""
    major = (torch.version.cuda or "").split(".")[0]
    if not major:
        return None
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    candidates = [(Path(h) / "include", Path(h) / "lib64") for h in homes if h]
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            candidates += [(base / f"cu{major}" / "include", base / f"cu{major}" / "lib")]
            candidates += [(base / "cuda_runtime" / "include", base / "cuda_runtime" / "lib")]
    candidates.append((Path("/usr/local/cuda/include"), Path("/usr/local/cuda/lib64")))
    for include, lib in candidates:
        if not (include / "cuda_runtime_api.h").is_file() or not (include / "cuda_fp16.h").is_file():
            continue
        runtimes = sorted(glob.glob(str(lib / f"libcudart.so.{major}*")))
        if runtimes:
            return include.resolve(), Path(runtimes[0]).resolve()
    return None


def route_choice() -> str:
    """$SEMIRING_OPS_CUDA_KERNELS: auto (the default: nvcc where a CUDA toolkit is found, else NVRTC), nvrtc or nvcc."""
    choice = os.environ.get(ROUTE_ENV, "").strip().lower() or "auto"
    if choice not in _ROUTES:
        raise ValueError(f"${ROUTE_ENV} must be one of {', '.join(_ROUTES)}, got {choice!r}")
    return choice


def route_problem() -> str | None:
    """Why the NVRTC route cannot serve here (None: it can): no GPU, driver, libnvrtc or CUDA runtime headers."""
    ok, why = nvrtc.nvrtc_available()
    if not ok:
        return why
    if cuda_runtime_paths() is None:
        return "the CUDA runtime's headers (nvidia-cuda-runtime, or a CUDA toolkit) are not found"
    return None


@functools.cache
def _project_digest(program: str) -> str:
    """A hash of `program` (a kernel file under csrc), the project headers it includes and csrc/nvrtc."""
    root = source_root()
    files = project_files([root / program], root) + sorted((root / "nvrtc").rglob("*"))
    h = hashlib.sha256()
    for path in files:
        if path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:24]


def nvrtc_options(target: str, include: Path) -> tuple[str, ...]:
    """NVRTC's options for a kernel file: the nvcc build's (-O3 is NVRTC's default; -lineinfo), every function a
    device one unless marked (NVRTC compiles no host code), and the include paths (the stand-ins first)."""
    root = source_root()
    return (
        f"--gpu-architecture={target}",
        "-std=c++17",
        "-default-device",
        "-lineinfo",
        f"--include-path={root / 'nvrtc'}",
        f"--include-path={root}",
        f"--include-path={include}",
    )


def _target() -> tuple[str, bool]:
    """(--gpu-architecture, whether a cubin) for this process's GPUs: the current device's cubin, or when the GPUs
    differ in architecture, PTX of the oldest, which the driver finishes for each (one handle serves every device)."""
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    if len(caps) > 1:
        major, minor = min(caps)
        return f"compute_{major}{minor}", False
    return nvrtc._target(torch.cuda.current_device())


_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}
_handles: dict[str, int] = {}
_libraries: list[int] = []  # loaded once and never unloaded: their kernels may sit in captured CUDA graphs


def kernel_handle(program: str, expression: str) -> int:
    """The ``cudaKernel_t`` (as an int) of the kernel ``expression`` (e.g. ``semiring_ops::cuda::k<float>``), which
    csrc/``program`` defines: compiled now (one line on stderr) or taken from the disk cache, loaded once per
    process. Called by the C++ launchers (csrc/cuda/kernel_ref.h) on a kernel's first launch.

    Raises RuntimeError naming what is missing (NVRTC, the CUDA headers), LazyCompileError with NVRTC's log.
    """
    paths = cuda_runtime_paths()
    if paths is None:
        raise RuntimeError(
            "semiring_ops: NVRTC needs the CUDA runtime's headers (cuda_runtime_api.h, cuda_fp16.h): none found in "
            "$CUDA_HOME, the pip packages of PyTorch's CUDA build (nvidia-cuda-runtime) or /usr/local/cuda"
        )
    target, cubin = _target()
    options = nvrtc_options(target, paths[0])
    nv = nvrtc._nvrtc()
    key = source_key(program, expression, "\0".join(options), f"nvrtc {nv.version}", _project_digest(program))
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # one thread of this process compiles and loads it; the file lock covers other processes
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = _load(program, expression, options, cubin, key)
    return handle


_MAGIC = b"semiring_ops nvrtc 1\0"


def _pack(lowered: str, image: bytes) -> bytes:
    """A cache file: a tag, the kernel's lowered name, the image's BLAKE2 digest, the image."""
    digest = hashlib.blake2b(image, digest_size=16).hexdigest().encode()
    return _MAGIC + lowered.encode() + b"\0" + digest + b"\0" + image


def _unpack(data: bytes) -> tuple[bytes, bytes] | None:
    """(lowered name, image) of a cache file, None when it is not whole (its digest does not match)."""
    if not data.startswith(_MAGIC):
        return None
    lowered, _, rest = data[len(_MAGIC) :].partition(b"\0")
    digest, _, image = rest.partition(b"\0")
    if not lowered or hashlib.blake2b(image, digest_size=16).hexdigest().encode() != digest:
        return None
    return lowered, image


def _load(program: str, expression: str, options: tuple[str, ...], cubin: bool, key: str) -> int:
    def build(tmp: Path) -> None:
        print(
            f"semiring_ops: compiling {expression} with NVRTC ({options[0].split('=')[1]}) into {cache_dir()}",
            file=sys.stderr,
            flush=True,
        )
        image, (lowered,) = nvrtc.nvrtc_compile_named(
            f'#include "{program}"\n', options, cubin, key, (f"&{expression}",), cache_dir() / "failed"
        )
        tmp.write_bytes(_pack(lowered, image))

    suffix = ".cubin" if cubin else ".ptx"
    path, built = cached_artifact(key, suffix, build, cache_dir())
    unpacked = _unpack(path.read_bytes())
    if unpacked is None and not built:  # damaged (truncated, overwritten): compiled again, once
        print(f"semiring_ops: the cached kernel {path} is damaged; compiling it again", file=sys.stderr, flush=True)
        path.unlink(missing_ok=True)
        path, _ = cached_artifact(key, suffix, build, cache_dir())
        unpacked = _unpack(path.read_bytes())
    if unpacked is None:
        raise RuntimeError(f"semiring_ops: the kernel {path} NVRTC wrote does not read back whole")
    lowered, image = unpacked
    if not cubin and not image.endswith(b"\0"):
        image += b"\0"
    drv = nvrtc._driver()
    index = torch.cuda.current_device()
    ctx = nvrtc._primary_context(index)
    library, kernel, function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    # the library loaded, and into the current device's context, now: not at a first launch a graph capture may make
    with nvrtc.relaxed_capture(), torch.cuda.device(index), nvrtc._InContext(ctx):
        drv.check(drv.cuLibraryLoadData(ctypes.byref(library), image, None, None, 0, None, None, 0),
                  f"cuLibraryLoadData({path.name})")  # fmt: skip
        with _lock:
            _libraries.append(library.value or 0)
        drv.check(drv.cuLibraryGetKernel(ctypes.byref(kernel), library, lowered), f"cuLibraryGetKernel({expression})")
        drv.check(drv.cuKernelGetFunction(ctypes.byref(function), kernel), "cuKernelGetFunction")
    return kernel.value or 0
