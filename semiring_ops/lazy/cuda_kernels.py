"""Running a plan on a CUDA device: the generated kernels (codegen.cuda_source) compiled once per plan,
dtype and architecture by NVRTC, launched on PyTorch's current stream.

The 1-D scheme launches one block per ``block * rows`` output rows of every batch. When that gives fewer
than two blocks per multiprocessor and the reduction is long, the 2-D scheme splits j into ``nsplit`` ranges
(grid.y): each block parks its reducers in a workspace, and lazy_merge folds them per row.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch

from .codegen import CudaConfig, cuda_source, cuda_tile
from .nvrtc import CudaFunction, compile_cuda_module, device_sm_count
from .plan import CallArgs, Plan, new_outputs

__all__ = ["CudaKernels", "run_cuda"]

DEFAULT_CONFIG = CudaConfig()


@dataclass
class CudaKernels:
    reduce: CudaFunction
    merge: CudaFunction
    reducer_bytes: int
    tile: int
    cfg: CudaConfig


_kernels: dict[tuple, CudaKernels] = {}
_lock = threading.Lock()


def kernels_for(plan: Plan, dtype: torch.dtype, device: torch.device, cfg: CudaConfig = DEFAULT_CONFIG) -> CudaKernels:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (plan.key, dtype, index, cfg)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _lock:
        k = _kernels.get(key)
        if k is None:
            dtype_name = str(dtype).removeprefix("torch.")
            source = cuda_source(plan, dtype_name, cfg)
            names = ["lazy_reduce", "lazy_merge", "lazy_sizeof"]
            module = compile_cuda_module(source, names, torch.device("cuda", index))
            n = len(plan.arg_cats)
            p, i64 = ctypes.c_void_p, ctypes.c_int64
            reduce = module.function("lazy_reduce", [p, p, p] + [p] * n + [i64] * n + [i64] * 5)
            merge = module.function("lazy_merge", [p, p, p, i64, ctypes.c_int32])
            sizeof = module.function("lazy_sizeof", [p])
            out = torch.empty(1, dtype=torch.int64, device=torch.device("cuda", index))
            with torch.cuda.device(index):
                sizeof.launch((1, 1, 1), (1, 1, 1), 0, torch.cuda.current_stream(index).cuda_stream, [out.data_ptr()])
            k = CudaKernels(reduce, merge, int(out.item()), cuda_tile(plan, dtype_name, cfg), cfg)
            _kernels[key] = k
    return k


def split_count(blocks: int, n_inner: int, tile: int, sms: int) -> int:
    """How many ranges of j the 2-D scheme uses: enough blocks for ~4 per multiprocessor, each range at
    least two tiles long; 1 (the 1-D scheme) when the rows alone fill the GPU."""
    if blocks >= 2 * sms:
        return 1
    want = -(-4 * sms // max(blocks, 1))
    return max(1, min(want, n_inner // (2 * tile)))


def run_cuda(
    plan: Plan, call: CallArgs, device: torch.device, cfg: CudaConfig = DEFAULT_CONFIG
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (nbatch, n_outer, value_dim), indices (nbatch, n_outer, index_dim) or None)."""
    k = kernels_for(plan, call.dtype, device, cfg)
    vals, idx = new_outputs(plan, call, device)
    rows_total = call.nbatch * call.n_outer
    if rows_total == 0:
        return vals, idx
    per_block = cfg.block * cfg.rows
    blocks_per_batch = -(-call.n_outer // per_block)
    blocks = blocks_per_batch * call.nbatch
    nsplit = split_count(blocks, call.n_inner, k.tile, device_sm_count(device))
    j_per_block = -(-call.n_inner // nsplit) if call.n_inner else 1
    j_per_block = -(-j_per_block // k.tile) * k.tile
    nsplit = max(1, -(-call.n_inner // j_per_block))
    stream = torch.cuda.current_stream(device).cuda_stream
    partial = None
    if nsplit > 1:
        partial = torch.empty(nsplit * rows_total * k.reducer_bytes, dtype=torch.uint8, device=device)
    vptr, iptr = vals.data_ptr(), (idx.data_ptr() if idx is not None else 0)
    args = [
        vptr,
        iptr,
        partial.data_ptr() if partial is not None else 0,
        *[t.data_ptr() for t in call.tensors],
        *call.batch_strides,
        call.n_outer,
        call.n_inner,
        blocks_per_batch,
        j_per_block,
        rows_total,
    ]
    k.reduce.launch((blocks, nsplit, 1), (cfg.block, 1, 1), 0, stream, args)
    if partial is not None:
        merge_args = [vptr, iptr, partial.data_ptr(), rows_total, nsplit]
        k.merge.launch((-(-rows_total // 256), 1, 1), (256, 1, 1), 0, stream, merge_args)
    return vals, idx
