"""The CUDA driver API and NVRTC through ctypes, for every kernel compiled at run time (the CUDA families' NVRTC
route, build/nvrtc_kernels.py; the lazy reductions' generated kernels, lazy/nvrtc.py): no CUDA toolkit, CuPy or
private PyTorch API, only the driver (libcuda.so.1) and libnvrtc (the pip package nvidia-cuda-nvrtc that PyTorch's
CUDA wheels install, or a toolkit under $CUDA_HOME). Declarations, the library search, the devices' primary contexts
(PyTorch's), the target architecture, and a compile with name expressions.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .artifacts import CompileError

__all__ = [
    "CU_STREAM_CAPTURE_MODE_RELAXED",
    "device_sm_count",
    "nvrtc_available",
    "nvrtc_compile_named",
    "nvrtc_version",
    "relaxed_capture",
]

# CUfunction_attribute values (cuda.h)
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_STREAM_CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_t_p = ctypes.POINTER(ctypes.c_size_t)
_c_void_p_p = ctypes.POINTER(ctypes.c_void_p)
_c_char_p_p = ctypes.POINTER(ctypes.c_char_p)
_c_char_buf = ctypes.POINTER(ctypes.c_char)

# ---------------------------------------------------------------- loading the libraries


def _declare(lib: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


class _Driver:
    """The CUDA driver API functions used here, declared (CUresult is an int; handles are pointers)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, u = ctypes.c_void_p, ctypes.c_uint
        self.lib = lib
        self.cuInit = _declare(lib, "cuInit", [u])
        self.cuDriverGetVersion = _declare(lib, "cuDriverGetVersion", [_c_int_p])
        self.cuGetErrorName = _declare(lib, "cuGetErrorName", [ctypes.c_int, _c_char_p_p])
        self.cuGetErrorString = _declare(lib, "cuGetErrorString", [ctypes.c_int, _c_char_p_p])
        self.cuDeviceGet = _declare(lib, "cuDeviceGet", [_c_int_p, ctypes.c_int])
        self.cuDevicePrimaryCtxRetain = _declare(lib, "cuDevicePrimaryCtxRetain", [_c_void_p_p, ctypes.c_int])
        self.cuCtxGetCurrent = _declare(lib, "cuCtxGetCurrent", [_c_void_p_p])
        self.cuCtxSetCurrent = _declare(lib, "cuCtxSetCurrent", [vp])
        self.cuCtxPushCurrent = _declare(lib, "cuCtxPushCurrent_v2", [vp])
        self.cuCtxPopCurrent = _declare(lib, "cuCtxPopCurrent_v2", [_c_void_p_p])
        self.cuModuleLoadData = _declare(lib, "cuModuleLoadData", [_c_void_p_p, ctypes.c_char_p])
        self.cuModuleGetFunction = _declare(lib, "cuModuleGetFunction", [_c_void_p_p, vp, ctypes.c_char_p])
        self.cuFuncGetAttribute = _declare(lib, "cuFuncGetAttribute", [_c_int_p, ctypes.c_int, vp])
        self.cuFuncSetAttribute = _declare(lib, "cuFuncSetAttribute", [vp, ctypes.c_int, ctypes.c_int])
        self.cuThreadExchangeStreamCaptureMode = _declare(lib, "cuThreadExchangeStreamCaptureMode", [_c_int_p])
        # library, code, jit options (count, names, values), library options (count, names, values)
        self.cuLibraryLoadData = _declare(
            lib, "cuLibraryLoadData", [_c_void_p_p, ctypes.c_char_p, vp, vp, u, vp, vp, u]
        )
        self.cuLibraryGetKernel = _declare(lib, "cuLibraryGetKernel", [_c_void_p_p, vp, ctypes.c_char_p])
        self.cuKernelGetFunction = _declare(lib, "cuKernelGetFunction", [_c_void_p_p, vp])
        # f, grid x y z, block x y z, dynamic shared bytes, stream, kernelParams, extra
        self.cuLaunchKernel = _declare(lib, "cuLaunchKernel", [vp, u, u, u, u, u, u, u, vp, vp, vp])
        self.check(self.cuInit(0), "cuInit")
        version = ctypes.c_int()
        self.check(self.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        self.version = (version.value // 1000, version.value % 1000 // 10)

    def error(self, rc: int, what: str) -> RuntimeError:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.cuGetErrorName(rc, ctypes.byref(name))
        self.cuGetErrorString(rc, ctypes.byref(text))
        label = name.value.decode() if name.value else f"CUresult {rc}"
        detail = text.value.decode() if text.value else "unknown error"
        return RuntimeError(f"semiring_ops: {what} failed: {label}: {detail}")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise self.error(rc, what)


class _Nvrtc:
    """The NVRTC functions used here, declared (nvrtcResult is an int; a program is a pointer)."""

    def __init__(self, lib: ctypes.CDLL, where: str) -> None:
        vp = ctypes.c_void_p
        self.lib = lib
        self.where = where
        self.nvrtcGetErrorString = _declare(lib, "nvrtcGetErrorString", [ctypes.c_int], ctypes.c_char_p)
        self.nvrtcVersion = _declare(lib, "nvrtcVersion", [_c_int_p, _c_int_p])
        self.nvrtcCreateProgram = _declare(
            lib, "nvrtcCreateProgram", [_c_void_p_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, vp, vp]
        )
        self.nvrtcCompileProgram = _declare(lib, "nvrtcCompileProgram", [vp, ctypes.c_int, _c_char_p_p])
        self.nvrtcGetProgramLogSize = _declare(lib, "nvrtcGetProgramLogSize", [vp, _c_size_t_p])
        self.nvrtcGetProgramLog = _declare(lib, "nvrtcGetProgramLog", [vp, _c_char_buf])
        self.nvrtcGetCUBINSize = _declare(lib, "nvrtcGetCUBINSize", [vp, _c_size_t_p])
        self.nvrtcGetCUBIN = _declare(lib, "nvrtcGetCUBIN", [vp, _c_char_buf])
        self.nvrtcGetPTXSize = _declare(lib, "nvrtcGetPTXSize", [vp, _c_size_t_p])
        self.nvrtcGetPTX = _declare(lib, "nvrtcGetPTX", [vp, _c_char_buf])
        self.nvrtcDestroyProgram = _declare(lib, "nvrtcDestroyProgram", [_c_void_p_p])
        self.nvrtcAddNameExpression = _declare(lib, "nvrtcAddNameExpression", [vp, ctypes.c_char_p])
        self.nvrtcGetLoweredName = _declare(lib, "nvrtcGetLoweredName", [vp, ctypes.c_char_p, _c_char_p_p])
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        self.supported_archs = self._supported_archs()

    def _supported_archs(self) -> tuple[int, ...] | None:
        """The architectures this NVRTC targets (e.g. 75, 80, 90), None when it cannot say (before 11.2)."""
        try:
            num_fn = _declare(self.lib, "nvrtcGetNumSupportedArchs", [_c_int_p])
            list_fn = _declare(self.lib, "nvrtcGetSupportedArchs", [_c_int_p])
        except AttributeError:
            return None
        count = ctypes.c_int()
        if num_fn(ctypes.byref(count)) != 0:
            return None
        archs = (ctypes.c_int * max(count.value, 1))()
        if list_fn(archs) != 0:
            return None
        return tuple(archs[: count.value])

    def error_string(self, rc: int) -> str:
        text = self.nvrtcGetErrorString(rc)
        return text.decode() if text else f"nvrtcResult {rc}"

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"semiring_ops: {what} failed: {self.error_string(rc)}")


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver:
    return _Driver(ctypes.CDLL("libcuda.so.1"))


def _nvrtc_candidates() -> list[str]:
    """Where libnvrtc may be, in order: loadable by name (the major of PyTorch's CUDA first), in the pip
    packages nvidia-cuda-nvrtc (nvidia/cuda_nvrtc/lib for CUDA 12, nvidia/cu13/lib for 13), in $CUDA_HOME."""
    torch_major = (torch.version.cuda or "").split(".")[0]
    names = [f"libnvrtc.so.{torch_major}"] if torch_major else []
    names += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    found: list[str] = []
    for entry in sys.path:
        base = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(base):
            found += glob.glob(os.path.join(base, "**", "lib", "libnvrtc.so*"), recursive=True)
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found += glob.glob(os.path.join(cuda_home, "lib64", "libnvrtc.so*"))
    # newest first (the names sort that way: .so.13.x > .so.12.x > .so), PyTorch's major before the others
    paths = sorted(set(found), key=os.path.basename, reverse=True)
    if torch_major:
        paths.sort(key=lambda p: not os.path.basename(p).startswith(f"libnvrtc.so.{torch_major}"))
    return list(dict.fromkeys(names + paths))


def _open_nvrtc(candidate: str) -> ctypes.CDLL:
    if os.sep in candidate:  # a file: load its builtins first, so libnvrtc's dlopen of them finds them
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(candidate), "libnvrtc-builtins.so*"))):
            with contextlib.suppress(OSError):
                ctypes.CDLL(builtins)
    return ctypes.CDLL(candidate)


@functools.lru_cache(maxsize=1)
def _nvrtc() -> _Nvrtc:
    """The first libnvrtc found whose CUDA major the driver supports (else the first found at all)."""
    try:
        driver_major: int | None = _driver().version[0]
    except (OSError, RuntimeError):
        driver_major = None
    fallback: _Nvrtc | None = None
    tried = _nvrtc_candidates()
    for candidate in tried:
        try:
            lib = _Nvrtc(_open_nvrtc(candidate), candidate)
        except (OSError, AttributeError, RuntimeError):
            continue
        if driver_major is None or lib.version[0] <= driver_major:
            return lib
        fallback = fallback or lib
    if fallback is not None:
        return fallback
    raise OSError(f"libnvrtc not found (pip install nvidia-cuda-nvrtc, or set CUDA_HOME); tried {tried}")


def nvrtc_available() -> tuple[bool, str]:
    """Whether CUDA kernels can be compiled and launched here; when not, why."""
    try:
        _driver()
    except (OSError, RuntimeError) as exc:
        return False, f"no usable CUDA driver (libcuda.so.1): {exc}"
    try:
        _nvrtc()
    except OSError as exc:
        return False, str(exc)
    if not torch.cuda.is_available():
        return False, "PyTorch sees no CUDA device"
    return True, ""


def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC in use."""
    return _nvrtc().version


# ---------------------------------------------------------------- devices and contexts


def _device_index(device: torch.device | str | int) -> int:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"semiring_ops: a CUDA device is needed, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sm_count(device: torch.device | str | int) -> int:
    """The number of streaming multiprocessors of ``device`` (cached)."""
    return _sm_count(_device_index(device))


@functools.cache
def _capability(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


_context_lock = threading.Lock()
_primary: dict[int, int] = {}


def _primary_context(index: int) -> int:
    """The primary context of device ``index`` (PyTorch's), retained once for the life of the process.

    PyTorch is made to initialise the device first, so the context exists with PyTorch's flags; when the
    calling thread has no current context (a thread the CUDA runtime has not bound yet), it becomes current.
    """
    ctx = _primary.get(index)
    if ctx is not None:
        return ctx
    with _context_lock:
        if index in _primary:
            return _primary[index]
        drv = _driver()
        torch.cuda.init()
        with torch.cuda.device(index):
            torch.cuda.current_device()  # the guard has made this device PyTorch's (the runtime's) current one
            dev, handle, current = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
            drv.check(drv.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            drv.check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(handle), dev.value), "cuDevicePrimaryCtxRetain")
            drv.check(drv.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
            if not current.value:
                drv.check(drv.cuCtxSetCurrent(handle), "cuCtxSetCurrent")
        if not handle.value:
            raise RuntimeError(f"semiring_ops.lazy: cuDevicePrimaryCtxRetain gave no context for device {index}")
        _primary[index] = handle.value
        return handle.value


class _InContext:
    """``with _InContext(ctx):`` makes ``ctx`` current for the block when it is not (push / pop)."""

    __slots__ = ("ctx", "pushed")

    def __init__(self, ctx: int) -> None:
        self.ctx = ctx
        self.pushed = False

    def __enter__(self) -> None:
        drv, current = _driver(), ctypes.c_void_p()
        drv.check(drv.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != self.ctx:
            drv.check(drv.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc: object) -> None:
        if self.pushed:
            _driver().cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p()))
            self.pushed = False


@contextlib.contextmanager
def relaxed_capture() -> Iterator[None]:
    """The calling thread out of CUDA graph captures' checks for the block, then back in its mode. Loading a module
    or library is a call that a capture in global mode (torch.cuda.graph's) forbids, and it would invalidate that
    capture; a load touches no stream, so it may run beside one."""
    drv, mode = _driver(), ctypes.c_int(CU_STREAM_CAPTURE_MODE_RELAXED)
    drv.check(drv.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        drv.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


def _target(index: int) -> tuple[str, bool]:
    """(``--gpu-architecture`` value, whether it yields a cubin) for device ``index``."""
    arch = _capability(index)
    supported = _nvrtc().supported_archs
    if supported is None or arch in supported:
        return f"sm_{arch}", True
    older = [a for a in supported if a <= arch]
    if not older:
        major, minor = _nvrtc().version
        raise RuntimeError(f"semiring_ops: NVRTC {major}.{minor} targets none of sm_{arch} or older ({supported})")
    return f"compute_{max(older)}", False  # PTX: the driver compiles it for the device


def _nvrtc_log(nv: _Nvrtc, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    if nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def nvrtc_compile_named(
    source: str,
    options: Sequence[str],
    cubin: bool,
    key: str,
    expressions: Sequence[str],
    failed: Path,
    error: type[CompileError] = CompileError,
) -> tuple[bytes, list[str]]:
    """(cubin or PTX, the lowered (mangled) names of ``expressions``): ``source`` compiled with ``options``, each
    name expression (e.g. ``&ns::kernel<float>``) instantiated. Raises ``error`` with NVRTC's log, the source and
    log saved under ``failed``."""
    nv = _nvrtc()
    prog = ctypes.c_void_p()
    rc = nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{key}.cu".encode(), 0, None, None)
    nv.check(rc, "nvrtcCreateProgram")
    try:
        for expression in expressions:
            nv.check(nv.nvrtcAddNameExpression(prog, expression.encode()), f"nvrtcAddNameExpression({expression})")
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = nv.nvrtcCompileProgram(prog, len(options), opts)
        if rc != 0:
            log = _nvrtc_log(nv, prog)
            what = f"NVRTC {nv.version[0]}.{nv.version[1]} for {options[0].split('=')[-1]} ({nv.error_string(rc)})"
            raise error.save(what, key, source, f"options: {' '.join(options)}\n{log}", failed)
        get_size, get = (nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN) if cubin else (nv.nvrtcGetPTXSize, nv.nvrtcGetPTX)
        size = ctypes.c_size_t()
        nv.check(get_size(prog, ctypes.byref(size)), "nvrtcGetCUBINSize" if cubin else "nvrtcGetPTXSize")
        buf = ctypes.create_string_buffer(size.value)
        nv.check(get(prog, buf), "nvrtcGetCUBIN" if cubin else "nvrtcGetPTX")
        lowered = []
        for expression in expressions:
            name = ctypes.c_char_p()
            nv.check(nv.nvrtcGetLoweredName(prog, expression.encode(), ctypes.byref(name)), "nvrtcGetLoweredName")
            lowered.append((name.value or b"").decode())
        return buf.raw, lowered
    finally:
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
