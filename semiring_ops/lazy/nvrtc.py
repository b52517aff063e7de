"""GPU kernels of the lazy reductions: generated CUDA source compiled at run time with NVRTC into a cubin for
the device's architecture (PTX for the driver to finish when this NVRTC cannot target it), cached on disk
(kernel_cache), loaded into the device's primary context (the one PyTorch uses) and launched with the CUDA
driver API. Everything goes through ctypes: no CUDA toolkit, CuPy or private PyTorch API is needed, only the
driver (libcuda.so.1) and libnvrtc (the pip package nvidia-cuda-nvrtc that PyTorch's CUDA wheels install,
or a toolkit under $CUDA_HOME).

The source exports ``extern "C"`` kernels and may include the csrc headers that NVRTC can compile
(``--include-path=<csrc>``); it is compiled with -std=c++17 -default-device -lineinfo and no fast-math flag.

Tiers (NVRTC 12.8 on): a source not yet in the disk cache is first compiled quickly (``--Ofast-compile=mid``:
about 0.14 s against 0.75 s for the D = 784 kernels, whose launches then take up to 1.4x longer, 3.4x for the
smallest ones) and runs at once, while a background thread compiles it fully into the cache and swaps the
optimised kernels in (the module's functions point at them from their next launch). A process that exits waits
for the compiles in flight, so that the next finds them cached. The two compiles contract multiply-adds
differently, so a formula's results can change in the last bits when the swap happens. The caller says whether
that is acceptable (``quick_first``): the lazy reductions ask for it in float32, float16 and bfloat16, not in
float64 (numerical checks: torch's gradcheck would report a backward that is not reentrant) nor under
``torch.use_deterministic_algorithms(True)``; there every call of a formula gives the same bits.
SEMIRING_OPS_LAZY_TIERS=0 turns the tiers off, =1 on for every kernel.

A launch packs its arguments with one ``struct.pack_into`` into a per-thread buffer whose ``void**``
parameter array is built once per function, so it costs a few microseconds of Python.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import glob
import os
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..build.jit import source_root
from .kernel_cache import (
    LazyCompileError,
    artifact_path,
    cached_artifact,
    headers_fingerprint,
    source_key,
)

__all__ = [
    "CudaFunction",
    "CudaModule",
    "compile_cuda_module",
    "device_sm_count",
    "nvrtc_available",
    "nvrtc_version",
    "wait_for_optimized",
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
        return RuntimeError(f"semiring_ops.lazy: {what} failed: {label}: {detail}")

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
            raise RuntimeError(f"semiring_ops.lazy: {what} failed: {self.error_string(rc)}")


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
        raise ValueError(f"semiring_ops.lazy: a CUDA device is needed, got {device}")
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


# ---------------------------------------------------------------- functions and modules

_PACKABLE = set("bBhHiIlLqQfd?P")  # ctypes simple types whose _type_ code is also a struct code


class _LaunchState(threading.local):
    """One thread's argument buffer and ``void**`` array for one function, and its current-context slot."""

    def __init__(self, size: int, offsets: tuple[int, ...]) -> None:
        self.buffer = ctypes.create_string_buffer(max(size, 1))
        base = ctypes.addressof(self.buffer)
        self.params = (ctypes.c_void_p * max(len(offsets), 1))(*[base + off for off in offsets])
        self.params_addr = ctypes.addressof(self.params)
        self.current = ctypes.c_void_p()
        self.current_ref = ctypes.pointer(self.current)


class CudaFunction:
    """One kernel of a loaded module, with its declared parameter types.

    ``launch(grid, block, shared_bytes, stream, args)``: ``args`` are Python ints / floats in the order of
    ``argtypes`` (device pointers as ints, e.g. ``tensor.data_ptr()``); ``stream`` is a CUstream handle as an
    int (``torch.cuda.current_stream(device).cuda_stream``; 0 is the legacy default stream).
    """

    def __init__(self, module: CudaModule, name: str, handle: int, argtypes: Sequence[type]) -> None:
        codes = []
        for t in argtypes:
            code = getattr(t, "_type_", None)
            if not isinstance(code, str) or code not in _PACKABLE:
                raise TypeError(f"semiring_ops.lazy: kernel {name!r}: unsupported parameter type {t!r}")
            codes.append(code)
        fmt = "@" + "".join(codes)
        # offset of parameter i: the size of the parameters before it, aligned to its own type ("0<code>")
        offsets = tuple(struct.calcsize("@" + "".join(codes[:i]) + "0" + c) for i, c in enumerate(codes))
        self.module = module
        self.name = name
        self.handle = handle
        self.argtypes = tuple(argtypes)
        self._ctx = module.context
        self._pack = struct.Struct(fmt).pack_into
        self._state = _LaunchState(struct.calcsize(fmt), offsets)
        drv = _driver()
        self._driver = drv
        self._get_current = drv.cuCtxGetCurrent
        self._launch = drv.cuLaunchKernel
        self.dynamic_shared_limit = 0  # what set_max_dynamic_shared allowed (0: the default 48 KiB)
        self._read_attributes()

    def _read_attributes(self) -> None:
        self.num_regs = self.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS)
        self.max_threads_per_block = self.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self.static_shared_bytes = self.attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        self.local_bytes = self.attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)

    def accepts_launches_of(self, other: CudaFunction) -> bool:
        """Whether every launch valid for ``other`` is valid for this function (its threads and shared memory)."""
        return (
            self.max_threads_per_block >= other.max_threads_per_block
            and self.static_shared_bytes <= other.static_shared_bytes
        )

    def _retarget(self, handle: int) -> None:
        """Launches from now on run ``handle`` (the same kernel, compiled fully: CudaModule.adopt)."""
        if self.dynamic_shared_limit:
            drv = _driver()
            with _InContext(self._ctx):
                rc = drv.cuFuncSetAttribute(
                    handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.dynamic_shared_limit
                )
            drv.check(rc, f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) of {self.name}")
        self.handle = handle  # one attribute store: a launch on another thread runs the old or the new kernel
        self._read_attributes()

    def attribute(self, attr: int) -> int:
        """cuFuncGetAttribute(attr) (e.g. CU_FUNC_ATTRIBUTE_NUM_REGS)."""
        drv, value = _driver(), ctypes.c_int()
        with _InContext(self._ctx):
            drv.check(drv.cuFuncGetAttribute(ctypes.byref(value), attr, self.handle), f"cuFuncGetAttribute({attr})")
        return value.value

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allows launches with up to ``nbytes`` of dynamic shared memory (needed above 48 KiB)."""
        drv = _driver()
        with _InContext(self._ctx):
            rc = drv.cuFuncSetAttribute(self.handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        drv.check(rc, f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) of {self.name}")
        self.dynamic_shared_limit = nbytes

    def launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        args: Sequence[Any],
    ) -> None:
        """Launches the kernel (asynchronously, on ``stream``); raises RuntimeError on a failed launch."""
        state = self._state
        try:
            self._pack(state.buffer, 0, *args)
        except struct.error as exc:
            raise TypeError(f"semiring_ops.lazy: kernel {self.name!r}: bad arguments {args!r}: {exc}") from None
        self._get_current(state.current_ref)
        pushed = state.current.value != self._ctx
        if pushed:  # another device's context (or none) is current on this thread
            self._driver.check(self._driver.cuCtxPushCurrent(self._ctx), "cuCtxPushCurrent")
        gx, gy, gz = grid
        bx, by, bz = block
        rc = self._launch(self.handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, state.params_addr, None)
        if pushed:
            self._driver.cuCtxPopCurrent(state.current_ref)
        if rc != 0:
            what = f"launch of {self.name} (grid {grid}, block {block}, {shared_bytes} B dynamic shared)"
            raise self._driver.error(rc, what)

    def __repr__(self) -> str:
        return f"CudaFunction({self.name!r}, regs={self.num_regs}, max_threads={self.max_threads_per_block})"


class CudaModule:
    """A cubin (or PTX) loaded into one device's primary context."""

    def __init__(self, path: Path, device_index: int, handle: int, context: int, tier: str = "optimized") -> None:
        self.path = path  # the cached image (for the quick tier: where the optimised one will be)
        self.device_index = device_index
        self.handle = handle
        self.context = context
        self.tier = tier  # "quick" (--Ofast-compile, until adopt) or "optimized"
        self._handles: dict[str, int] = {}
        self._functions: dict[tuple[str, tuple[type, ...]], CudaFunction] = {}
        self._lock = threading.Lock()

    def adopt(self, optimized: CudaModule) -> bool:
        """Points this quick module and its functions at the same kernels of ``optimized``, when each accepts
        every launch the quick one does (else keeps the quick kernels: False)."""
        with self._lock:
            pairs = [(fn, optimized.function(name, argtypes)) for (name, argtypes), fn in self._functions.items()]
            if not all(new.accepts_launches_of(fn) for fn, new in pairs):
                return False
            for fn, new in pairs:
                fn._retarget(new.handle)
            self._handles = dict(optimized._handles)
            self.handle, self.path, self.tier = optimized.handle, optimized.path, "optimized"
        return True

    def kernel_handle(self, name: str) -> int:
        """The CUfunction of the ``extern "C"`` kernel ``name``; RuntimeError when the module has none."""
        handle = self._handles.get(name)
        if handle is None:
            drv, out = _driver(), ctypes.c_void_p()
            with _InContext(self.context):
                rc = drv.cuModuleGetFunction(ctypes.byref(out), self.handle, name.encode())
            drv.check(rc, f'cuModuleGetFunction({name!r}) in {self.path} (is the kernel extern "C"?)')
            handle = self._handles[name] = out.value or 0
        return handle

    def function(self, name: str, argtypes: Sequence[type]) -> CudaFunction:
        """The kernel ``name`` with the given ctypes parameter types (one object per signature, cached)."""
        key = (name, tuple(argtypes))
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                fn = self._functions.get(key)
                if fn is None:
                    fn = self._functions[key] = CudaFunction(self, name, self.kernel_handle(name), argtypes)
        return fn

    def __repr__(self) -> str:
        return f"CudaModule({str(self.path)!r}, device={self.device_index})"


_module_lock = threading.Lock()
_loaded: dict[tuple[str, int], CudaModule] = {}
_compiled: dict[tuple[str, int], CudaModule] = {}


def _load_image(image: bytes, ptx: bool, index: int, what: Path) -> tuple[int, int]:
    """(module handle, context) of ``image`` (a cubin, or PTX for the driver to finish) loaded on device ``index``."""
    if ptx and not image.endswith(b"\0"):
        image += b"\0"
    ctx = _primary_context(index)
    drv, handle = _driver(), ctypes.c_void_p()
    with torch.cuda.device(index), _InContext(ctx):
        rc = drv.cuModuleLoadData(ctypes.byref(handle), image)
    drv.check(rc, f"cuModuleLoadData({what})")
    return handle.value or 0, ctx


def _load_module(path: Path, index: int) -> CudaModule:
    key = (str(path), index)
    with _module_lock:
        module = _loaded.get(key)
        if module is None:
            handle, ctx = _load_image(path.read_bytes(), path.suffix == ".ptx", index, path)
            module = _loaded[key] = CudaModule(path, index, handle, ctx)
    return module


def _target(index: int) -> tuple[str, bool]:
    """(``--gpu-architecture`` value, whether it yields a cubin) for device ``index``."""
    arch = _capability(index)
    supported = _nvrtc().supported_archs
    if supported is None or arch in supported:
        return f"sm_{arch}", True
    older = [a for a in supported if a <= arch]
    if not older:
        raise RuntimeError(
            f"semiring_ops.lazy: NVRTC {nvrtc_version()} targets none of sm_{arch} or older ({supported})"
        )
    return f"compute_{max(older)}", False  # PTX: the driver compiles it for the device


def _nvrtc_log(nv: _Nvrtc, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    if nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def _nvrtc_compile(source: str, options: Sequence[str], cubin: bool, key: str) -> bytes:
    return nvrtc_compile_named(source, options, cubin, key, ())[0]


def nvrtc_compile_named(
    source: str, options: Sequence[str], cubin: bool, key: str, expressions: Sequence[str]
) -> tuple[bytes, list[str]]:
    """(cubin or PTX, the lowered (mangled) names of ``expressions``): ``source`` compiled with ``options``, each
    name expression (e.g. ``&ns::kernel<float>``) instantiated. Raises LazyCompileError with NVRTC's log."""
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
            raise LazyCompileError.save(what, key, source, f"options: {' '.join(options)}\n{log}")
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


QUICK_OPTION = "--Ofast-compile=mid"  # the first tier's (CUDA 12.8 on); see the module docstring
_upgrades: list[threading.Thread] = []  # the background compiles of the optimised tier, this process's


def _tiers_on(quick_first: bool = True) -> bool:
    """Whether a new source runs first from its quick compile (the module docstring's tiers)."""
    setting = os.environ.get("SEMIRING_OPS_LAZY_TIERS", "")
    if setting == "0" or not (quick_first or setting == "1"):
        return False
    return _nvrtc().version >= (12, 8)


def wait_for_optimized(timeout: float | None = None) -> None:
    """Waits for the optimised compiles running in the background (tests, benchmarks, and the process's exit)."""
    for job in list(_upgrades):
        job.join(timeout)


atexit.register(wait_for_optimized)


def compile_cuda_module(
    source: str, kernel_names: Sequence[str], device: torch.device | str | int, quick_first: bool = False
) -> CudaModule:
    """The module of ``source`` (CUDA C++ exporting the ``extern "C"`` kernels ``kernel_names``) for ``device``:
    taken from the disk cache, or compiled now (one line on stderr). With ``quick_first`` (results may change in
    their last bits once) a new source is compiled quickly and optimised in the background: the module
    docstring's tiers. Loaded once per process and device.

    Raises LazyCompileError (with NVRTC's log) when the source does not compile, RuntimeError when a kernel
    is missing or the driver refuses the module.
    """
    index = _device_index(device)
    memo = (source, index, quick_first)  # a caller that refused the tiers never gets a module still swapping
    module = _compiled.get(memo)
    if module is None:
        target, cubin = _target(index)
        options = (
            f"--gpu-architecture={target}",
            "-std=c++17",
            "-default-device",
            "-lineinfo",
        )
        nv = _nvrtc()
        key = source_key(source, "\0".join(options), target, f"nvrtc {nv.version}", headers_fingerprint())
        full_options = (*options, f"--include-path={source_root()}")
        suffix = ".cubin" if cubin else ".ptx"
        final = artifact_path(key, suffix)
        tiers = not final.is_file() and _tiers_on(quick_first)

        def announce(how: str = "") -> None:
            print(
                f"semiring_ops.lazy: compiling a new formula for cuda ({target}) into {final.parent}{how}",
                file=sys.stderr,
                flush=True,
            )

        def build(tmp: Path) -> None:
            if not tiers:  # the tiers' background compile was announced with the quick one
                announce()
            tmp.write_bytes(_nvrtc_compile(source, full_options, cubin, key))

        if tiers:
            announce(" (quickly, then optimised in the background)")
            image = _nvrtc_compile(source, (*full_options, QUICK_OPTION), cubin, key)
            handle, ctx = _load_image(image, not cubin, index, final)
            module = CudaModule(final, index, handle, ctx, tier="quick")
            job = threading.Thread(
                target=_optimize,
                args=(module, key, suffix, build, index, final.parent),
                name="semiring_ops.lazy optimise",
            )
            with _module_lock:
                _upgrades[:] = [j for j in _upgrades if j.is_alive()]
                _upgrades.append(job)
            job.start()
        else:
            path, _ = cached_artifact(key, suffix, build)
            module = _load_module(path, index)
        with _module_lock:
            module = _compiled.setdefault(memo, module)
    for name in kernel_names:
        module.kernel_handle(name)  # a dict look-up once resolved: a missing kernel fails here
    return module


def _optimize(quick: CudaModule, key: str, suffix: str, build: Any, index: int, folder: Path) -> None:
    """The background tier: the full compile into the cache ``folder``, loaded, adopted by the quick module."""
    try:
        # loading a module is a call that another thread's CUDA graph capture (torch.cuda.graph's global mode)
        # forbids, and it would invalidate that capture: this thread opts out of the capture checks; the load
        # touches no stream, and graphs captured earlier keep the quick kernels they hold (never unloaded)
        mode = ctypes.c_int(CU_STREAM_CAPTURE_MODE_RELAXED)
        _driver().check(
            _driver().cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode"
        )
        path, _ = cached_artifact(key, suffix, build, folder)
        if not quick.adopt(_load_module(path, index)):
            print(
                f"semiring_ops.lazy: the optimised kernels of {path.name} need more threads' resources than the quick "
                "ones this process launches: it keeps the quick ones (later processes load the optimised)",
                file=sys.stderr,
            )
    except Exception as exc:  # the quick kernels stay; the error is said, not raised in a thread
        print(
            f"semiring_ops.lazy: the optimised compile of a formula failed ({exc}); its quick kernels stay",
            file=sys.stderr,
        )
