"""The lazy route's own kernels on Hopper (sm_90: H100, H200), on one engine (csrc/lazy/hopper_mma.cuh: wgmma fed
by TMA, warp-specialised, persistent) over float32 3xTF32 operands (gemm_route._three_tf32):

- mm_nt: C = A B^T, each 32-deep tile's products added into IEEE float32 registers (tf32x3_gemm.cuh): gemm_route's
  PROMOTED product, more accurate than the SGEMM (unit-norm near neighbours at D = 768: 3.6e-7 max error of x.y
  against float64, the SGEMM 1.6e-6, cuBLAS's 3xTF32 5.2e-6) at ~2x its speed (16,384^2 at D = 768: 4.30 ms, the
  SGEMM 8.59, cuBLAS's unpromoted 3xTF32 3.50; docs/benchmarks.md, docs/perf_notes.md "The Hopper engine");
- kbest_nt: each row's K best keys (a dot product, or a squared distance summed again where it cancels) selected
  from the tiles on chip, no matrix written (tf32x3_kbest.cuh): the route's fused selections (gemm_route: k-NN at
  D = 128-256 by default, where they beat the matrix; 50,000^2 at D = 128: 8.85 ms against 12.80).

Compiled by NVRTC for sm_90a on first use (one line names the cache, as for the lazy kernels; kbest_nt one module
per (K, largest)), launched through the driver with the operands' TMA descriptors (cuTensorMapEncodeTiled, made per
call on the host). ``available(device)`` says whether they run there: an sm_90 device, an NVRTC that targets
sm_90a (12.0 on), a driver with cuTensorMapEncodeTiled, and SEMIRING_OPS_LAZY_WGMMA not "0". Elsewhere the route
takes the SGEMM.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import threading

import torch
import torch.nn.functional as F

from ..build.nvrtc import _capability, _device_index, _driver, _nvrtc, device_sm_count, nvrtc_available
from .nvrtc import CudaFunction, compile_cuda_module

__all__ = ["KBEST_MAX", "Distance", "available", "describe", "kbest_nt", "mm_nt"]

SOURCE = '#include "lazy/tf32x3_gemm.cuh"\n'
KERNEL = "tf32x3_gemm_nt"
KBEST_SOURCE = '#define SO_KBEST {k}\n#define SO_LARGEST {largest}\n#include "lazy/tf32x3_kbest.cuh"\n'
KBEST_KERNEL = "tf32x3_kbest_nt"
KBEST_MAX = 16  # longer lists: the generated kernels on the route's matrices (registers: 2 K a thread)
# column parts of kbest_nt (_column_parts): fewer parts, fewer first tiles (where every key of a row passes), so as
# few as keep the row tiles of the blocks running at once (SMs / parts, each 128 x depth floats, read again for every
# column tile) within 3/5 of the L2; at most MAX_PARTS; more where the row tiles alone would not fill the GPU twice.
# H200, kbest_nt alone, K = 10, ms by parts 1 / 2 / 4 / 8 / 16 (the rule's choice in bold):
#   50,000^2 at D = 128: **6.81** / 7.20 / 7.47 / 8.15 / 8.92 (row tiles of 1 part at once: 26 MB)
#   50,000^2 at D = 784: 48.52 / 43.45 / 43.25 / **39.16** / 39.06
#   10,000 x 60,000 at D = 784: 11.51 / 11.14 / 11.18 / **9.47** / 9.72
#   20,000^2 at D = 2048: 20.59 / 20.64 / 18.31 / 17.69 / **16.50**
MAX_PARTS = 16
# csrc/lazy/hopper_mma.cuh's kTileM = kTileN, kTileK, kThreads; tf32x3_gemm.cuh's kGemmSharedBytes (6 stages) and
# tf32x3_kbest.cuh's kKBestSharedBytes (4 stages and the warpgroups' scratch)
TILE, TILE_K, THREADS = 128, 32, 384
STAGE_BYTES = 2 * TILE * TILE_K * 4
# tf32x3_kbest.cuh: a warpgroup's staged keys (64, kStride), column norms, pass masks (64, 4) and bounds (64, 2)
_KBEST_WARPGROUP_BYTES = 64 * (TILE + 8) * 4 + TILE * 4 + 64 * 4 * 4 + 64 * 2 * 4
SHARED_BYTES = {"gemm": 6 * STAGE_BYTES + 1024, "kbest": 4 * STAGE_BYTES + 2 * _KBEST_WARPGROUP_BYTES + 1024}
MAP_BYTES = 128  # sizeof(CUtensorMap)
# cuTensorMapEncodeTiled's enumerations (cuda.h)
_FLOAT32, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS = 7, 0, 3, 3, 0

_functions: dict[tuple[int, int, bool], CudaFunction] = {}  # (device, K (0: the GEMM), largest)
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
    a, b = _operands("mm_nt", a, b)
    m, n = a.shape[0], b.shape[0]
    if m == 0 or n == 0 or a.shape[1] == 0:
        return a.new_zeros(m, n)
    c = torch.empty(m, n, device=a.device, dtype=torch.float32)
    index = _device_index(a.device)
    tiles = -(-m // TILE) * -(-n // TILE)
    _launch(index, 0, False, tiles, a, (_tensor_map(a), _tensor_map(b), c.data_ptr(), m, n, a.shape[1]))
    return c


@dataclasses.dataclass
class Distance:
    """kbest_nt's squared distance: row_norms_i + col_norms_j - 2 a_i . b_j (gemm_route's shifted, weighted norms and
    operands), summed again from x, y (and w) where it cancels: below ``cancel`` (1 / codegen.GRAM_CANCEL) of
    row_norms_i + col_norms_j, or NaN."""

    row_norms: torch.Tensor  # (M,) float32
    col_norms: torch.Tensor  # (N,) float32
    x: torch.Tensor  # (M, D) float32, as given
    y: torch.Tensor  # (N, D) float32, as given
    w: torch.Tensor | None  # (D,) float32: sum_d w_d (x_d - y_d)^2
    cancel: float


def kbest_nt(a: torch.Tensor, b: torch.Tensor, k: int, largest: bool, distance: Distance | None = None) -> torch.Tensor:
    """(M, k) int64: for each row i of a, the k columns j (ascending by key, ties by the lower j; -1 where b has
    fewer than k rows) of the smallest (or largest) key: a_i . b_j, or ``distance``'s squared distance, from the
    3xTF32 operands a (M, K) and b (N, K) (unpromoted, cuBLAS's 3xTF32 accuracy) selected on chip (filtered in
    registers, merged in shared memory): no M x N matrix is written (csrc/lazy/tf32x3_kbest.cuh). NaN keys order as
    the plain kernel's: last for the smallest, first for the largest."""
    if not 1 <= k <= KBEST_MAX:
        raise ValueError(f"hopper_gemm.kbest_nt: k must be in 1..{KBEST_MAX}, got {k}")
    a, b = _operands("kbest_nt", a, b)
    m, n = a.shape[0], b.shape[0]
    if m == 0 or n == 0:
        return torch.full((m, k), -1, dtype=torch.int64, device=a.device)
    terms: tuple = (0, 0, 0, 0, 0, 0, 0.0)
    if distance is not None:
        d = distance
        dim = d.x.shape[1]
        wanted = {"row_norms": (m,), "col_norms": (n,), "x": (m, dim), "y": (n, dim), "w": (dim,)}
        for name, shape in wanted.items():
            t = getattr(d, name)
            if t is not None and (t.shape != shape or t.dtype != torch.float32 or t.device != a.device):
                raise ValueError(f"hopper_gemm.kbest_nt: distance.{name} must be {shape} float32 on {a.device}")
        held = [t.contiguous() for t in (d.row_norms, d.col_norms, d.x, d.y)]
        w = d.w.contiguous() if d.w is not None else None
        pointers = [t.data_ptr() for t in held] + [w.data_ptr() if w is not None else 0]
        terms = (*pointers, dim, d.cancel)
    index = _device_index(a.device)
    tiles_m, tiles_n = -(-m // TILE), -(-n // TILE)
    parts = _column_parts(index, tiles_m, tiles_n, a.shape[1])
    per_part = -(-tiles_n // parts)
    parts = -(-tiles_n // per_part)
    keys = torch.empty(parts, m, k, dtype=torch.int64, device=a.device)
    maps = (_tensor_map(a), _tensor_map(b))
    sizes = (keys.data_ptr(), m, n, a.shape[1], parts, per_part)
    _launch(index, k, largest, tiles_m * parts, a, (*maps, *terms, *sizes))
    # the parts' lists merged: the k smallest keys (int64 order is the keys' order)
    merged = keys[0] if parts == 1 else keys.permute(1, 0, 2).reshape(m, parts * k).topk(k, 1, largest=False).values
    columns = merged & 0xFFFFFFFF
    return torch.where(columns == 0xFFFFFFFF, -1, columns)


def _column_parts(index: int, tiles_m: int, tiles_n: int, depth: int) -> int:
    """kbest_nt's column parts (MAX_PARTS' comment): the fewest, a power of 2, whose blocks' row tiles fit 3/5 of the
    L2, at most MAX_PARTS, but enough that the items fill the GPU twice; at most tiles_n."""
    sms = device_sm_count(index)
    resident = sms * TILE * depth * 4  # bytes of the row tiles of sms blocks on one part each
    budget = max(1, torch.cuda.get_device_properties(index).L2_cache_size * 3 // 5)
    parts = 1
    while parts < MAX_PARTS and resident > parts * budget:
        parts *= 2
    return max(1, min(tiles_n, max(parts, -(-2 * sms // tiles_m))))


def _operands(name: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b checked, contiguous, their depth padded to a multiple of 4 (TMA: rows 16-byte aligned)."""
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise TypeError(f"hopper_gemm.{name}: a and b must be float32, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        shapes = f"{tuple(a.shape)} and {tuple(b.shape)}"
        raise ValueError(f"hopper_gemm.{name}: a (M, K) and b (N, K) expected, got {shapes}")
    if a.device != b.device or not available(a.device):
        raise ValueError(f"hopper_gemm.{name}: a and b must be on one sm_90 device, got {a.device} and {b.device}")
    depth = a.shape[1]
    if depth % 4:
        a, b = F.pad(a, (0, 4 - depth % 4)), F.pad(b, (0, 4 - depth % 4))
    return a.contiguous(), b.contiguous()


def _launch(index: int, k: int, largest: bool, items: int, like: torch.Tensor, args: tuple) -> None:
    """The GEMM (k = 0) or the k-best kernel for (k, largest), on device ``index``, persistent: one block per SM at
    most."""
    _function(index, k, largest).launch(
        (min(items, device_sm_count(index)), 1, 1),
        (THREADS, 1, 1),
        SHARED_BYTES["kbest" if k else "gemm"],
        torch.cuda.current_stream(like.device).cuda_stream,
        args,
    )


def _function(index: int, k: int, largest: bool) -> CudaFunction:
    function = _functions.get((index, k, largest))
    if function is None:
        with _lock:
            function = _functions.get((index, k, largest))
            if function is None:
                blob, i32, p = ctypes.c_char * MAP_BYTES, ctypes.c_int, ctypes.c_void_p
                if k == 0:
                    module = compile_cuda_module(SOURCE, [KERNEL], index, arch_specific=True)
                    function = module.function(KERNEL, [blob, blob, p, i32, i32, i32])
                else:
                    source = KBEST_SOURCE.format(k=k, largest=int(largest))
                    module = compile_cuda_module(source, [KBEST_KERNEL], index, arch_specific=True)
                    argtypes = [blob, blob, p, p, p, p, p, i32, ctypes.c_float, p, i32, i32, i32, i32, i32]
                    function = module.function(KBEST_KERNEL, argtypes)
                function.set_max_dynamic_shared(SHARED_BYTES["kbest" if k else "gemm"])
                _functions[(index, k, largest)] = function
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
