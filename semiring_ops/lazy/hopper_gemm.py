"""The route's promoted 3xTF32 GEMM on Hopper (sm_90: H100, H200): C = A B^T for float32 3xTF32 operands, on
wgmma fed by TMA, each 32-deep tile's products added into IEEE float32 registers (csrc/lazy/tf32x3_gemm.cuh).

gemm_route's PROMOTED product: more accurate than the SGEMM (unit-norm near neighbours at D = 768: 3.6e-7 max error
of x.y against float64, the SGEMM 1.6e-6, cuBLAS's 3xTF32 5.2e-6) at 1.9x its speed (16,384^2 at D = 768: 4.55 ms,
the SGEMM 8.46, cuBLAS's unpromoted 3xTF32 3.56; benchmarks/wgmma_probe.py, docs/perf_notes.md).

Compiled by NVRTC for sm_90a on first use (one line names the cache, as for the lazy kernels), launched through
the driver with the operands' TMA descriptors (cuTensorMapEncodeTiled, made per call on the host: ~2 us each).
``available(device)`` says whether it runs there: an sm_90 device, an NVRTC that targets sm_90a (12.0 on), a driver
with cuTensorMapEncodeTiled, and SEMIRING_OPS_LAZY_WGMMA not "0". Elsewhere the route takes the SGEMM.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch
import torch.nn.functional as F

from ..build.nvrtc import _capability, _device_index, _driver, _nvrtc, device_sm_count, nvrtc_available
from .nvrtc import CudaFunction, compile_cuda_module

__all__ = ["available", "describe", "mm_nt"]

SOURCE = '#include "lazy/tf32x3_gemm.cuh"\n'
KERNEL = "tf32x3_gemm_nt"
# csrc/lazy/tf32x3_gemm.cuh's kTileM = kTileN, kTileK, kThreads and kSharedBytes
TILE, TILE_K, THREADS = 128, 32, 384
SHARED_BYTES = 6 * 2 * TILE * TILE_K * 4 + 1024
MAP_BYTES = 128  # sizeof(CUtensorMap)
# cuTensorMapEncodeTiled's enumerations (cuda.h)
_FLOAT32, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS = 7, 0, 3, 3, 0

_functions: dict[int, CudaFunction] = {}
_lock = threading.Lock()


def available(device: torch.device) -> bool:
    """Whether mm_nt runs on ``device`` (module docstring)."""
    return (
        device.type == "cuda"
        and os.environ.get("SEMIRING_OPS_LAZY_WGMMA", "1") != "0"
        and _supported(_device_index(device))
    )


def describe(index: int) -> str:
    """What gemm_route's PROMOTED product runs as on CUDA device ``index`` (python -m semiring_ops info)."""
    if available(torch.device("cuda", index)):
        return "promoted 3xTF32 (wgmma, sm_90a)"
    off = os.environ.get("SEMIRING_OPS_LAZY_WGMMA", "1") == "0"
    why = "SEMIRING_OPS_LAZY_WGMMA=0" if off else "needs sm_90 and an NVRTC for sm_90a"
    return f"the SGEMM ({why})"


@functools.cache
def _supported(index: int) -> bool:
    if _capability(index) != 90 or not nvrtc_available()[0]:
        return False
    archs = _nvrtc().supported_archs
    return (archs is None or 90 in archs) and hasattr(_driver().lib, "cuTensorMapEncodeTiled")


def mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C (M, N) = a (M, K) @ b (N, K)^T, float32 on one sm_90 device, with a and b 3xTF32 operands (every value
    exact in TF32: gemm_route._three_tf32), summed to IEEE float32 accuracy per 32-deep tile (module docstring)."""
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise TypeError(f"hopper_gemm.mm_nt: a and b must be float32, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        shapes = f"{tuple(a.shape)} and {tuple(b.shape)}"
        raise ValueError(f"hopper_gemm.mm_nt: a (M, K) and b (N, K) expected, got {shapes}")
    if a.device != b.device or not available(a.device):
        raise ValueError(f"hopper_gemm.mm_nt: a and b must be on one sm_90 device, got {a.device} and {b.device}")
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    if m == 0 or n == 0 or k == 0:
        return a.new_zeros(m, n)
    if k % 4:  # TMA: rows 16-byte aligned
        a, b = F.pad(a, (0, 4 - k % 4)), F.pad(b, (0, 4 - k % 4))
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty(m, n, device=a.device, dtype=torch.float32)
    tiles = -(-m // TILE) * -(-n // TILE)
    index = _device_index(a.device)
    _function(index).launch(
        (min(tiles, device_sm_count(index)), 1, 1),
        (THREADS, 1, 1),
        SHARED_BYTES,
        torch.cuda.current_stream(a.device).cuda_stream,
        (_tensor_map(a), _tensor_map(b), c.data_ptr(), m, n, a.shape[1]),
    )
    return c


def _function(index: int) -> CudaFunction:
    function = _functions.get(index)
    if function is None:
        with _lock:
            function = _functions.get(index)
            if function is None:
                module = compile_cuda_module(SOURCE, [KERNEL], index, arch_specific=True)
                blob, i32 = ctypes.c_char * MAP_BYTES, ctypes.c_int
                function = module.function(KERNEL, [blob, blob, ctypes.c_void_p, i32, i32, i32])
                function.set_max_dynamic_shared(SHARED_BYTES)
                _functions[index] = function
    return function


@functools.cache
def _encoder() -> ctypes._CFuncPtr:
    fn = _driver().lib.cuTensorMapEncodeTiled
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    fn.argtypes = [vp, ctypes.c_int, u32, vp, vp, vp, vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _tensor_map(t: torch.Tensor) -> bytes:
    """The TMA descriptor of a contiguous (rows, K) float32 tensor: boxes of TILE_K x TILE, 128-byte swizzle,
    reads past the ends zero-filled."""
    rows, k = t.shape
    storage = ctypes.create_string_buffer(MAP_BYTES + 64)
    address = (ctypes.addressof(storage) + 63) // 64 * 64  # CUtensorMap is 64-byte aligned
    dims = (ctypes.c_uint64 * 2)(k, rows)
    strides = (ctypes.c_uint64 * 1)(k * 4)
    box = (ctypes.c_uint32 * 2)(TILE_K, TILE)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encoder()(
        address, _FLOAT32, 2, t.data_ptr(), dims, strides, box, element_strides,
        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS,
    )  # fmt: skip
    _driver().check(rc, f"cuTensorMapEncodeTiled of a ({rows}, {k}) float32 tensor")
    return ctypes.string_at(address, MAP_BYTES)
