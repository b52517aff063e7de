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
import ctypes
import os
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..build.jit import source_root
from ..build.nvrtc import (  # the shared plumbing, re-exported under the names this module's users know
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    CU_FUNC_ATTRIBUTE_NUM_REGS,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
    _capability,  # noqa: F401 (the tests' view of the device)
    _device_index,
    _driver,
    _InContext,
    _nvrtc,
    _primary_context,
    _target,
    device_sm_count,
    nvrtc_available,
    nvrtc_compile_named,
    nvrtc_version,
    relaxed_capture,
)
from .kernel_cache import (
    LazyCompileError,
    artifact_path,
    cached_artifact,
    headers_fingerprint,
    lazy_cache_dir,
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


# ---------------------------------------------------------------- functions and modules

_PACKABLE = set("bBhHiIlLqQfd?P")  # ctypes simple types whose _type_ code is also a struct code


def _struct_code(t: type) -> str | None:
    """The struct code of a kernel parameter's ctypes type: a simple type's, or ``<n>s`` for ``ctypes.c_char * n``
    (a structure passed by value, e.g. a 128-byte CUtensorMap, given to launch as ``bytes``)."""
    if isinstance(t, type) and issubclass(t, ctypes.Array) and t._type_ is ctypes.c_char:
        return f"{t._length_}s"
    code = getattr(t, "_type_", None)
    return code if isinstance(code, str) and code in _PACKABLE else None


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
            code = _struct_code(t)
            if code is None:
                raise TypeError(f"semiring_ops.lazy: kernel {name!r}: unsupported parameter type {t!r}")
            codes.append(code)
        fmt = "@" + "".join(codes)
        # offset of parameter i: the size of the parameters before it, aligned to its own type ("0<code>"); the
        # driver copies each parameter from its own address, so the buffer needs no more alignment than that
        offsets = tuple(struct.calcsize("@" + "".join(codes[:i]) + "0" + c[-1]) for i, c in enumerate(codes))
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


def _nvrtc_compile(source: str, options: Sequence[str], cubin: bool, key: str) -> bytes:
    """``source`` compiled; LazyCompileError (the source and log saved in the lazy cache) when it does not."""
    return nvrtc_compile_named(source, options, cubin, key, (), lazy_cache_dir() / "failed", LazyCompileError)[0]


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
    source: str,
    kernel_names: Sequence[str],
    device: torch.device | str | int,
    quick_first: bool = False,
    arch_specific: bool = False,
) -> CudaModule:
    """The module of ``source`` (CUDA C++ exporting the ``extern "C"`` kernels ``kernel_names``) for ``device``:
    taken from the disk cache, or compiled now (one line on stderr). With ``quick_first`` (results may change in
    their last bits once) a new source is compiled quickly and optimised in the background: the module
    docstring's tiers. ``arch_specific``: for the device's architecture-specific target (sm_90a: wgmma, TMA,
    setmaxnreg), which the caller has checked this NVRTC targets (a cubin). Loaded once per process and device.

    Raises LazyCompileError (with NVRTC's log) when the source does not compile, RuntimeError when a kernel
    is missing or the driver refuses the module.
    """
    index = _device_index(device)
    memo = (source, index, quick_first, arch_specific)  # a caller that refused the tiers never gets a module swapping
    module = _compiled.get(memo)
    if module is None:
        target, cubin = _target(index)
        if arch_specific:
            if not cubin:
                raise RuntimeError(f"semiring_ops: this NVRTC cannot target {target}a")
            target += "a"
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
        # out of another thread's graph capture's checks (relaxed_capture); graphs captured earlier keep the quick
        # kernels they hold (never unloaded)
        with relaxed_capture():
            path, _ = cached_artifact(key, suffix, build, folder)
            adopted = quick.adopt(_load_module(path, index))
        if not adopted:
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
