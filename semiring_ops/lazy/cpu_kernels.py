"""Running a plan on the CPU: the generated C++ (codegen.cpu_source) compiled once per plan and dtype by
host_compiler, then called through ctypes (which releases the GIL) with OpenMP over the output rows."""

from __future__ import annotations

import ctypes
import threading

import torch

from .block_sparse import mean_terms, segment_rows
from .codegen import cpu_source, staged_inner_slots
from .host_compiler import HostFunction, compile_host_library
from .plan import CallArgs, Plan, new_outputs

__all__ = ["run_cpu"]

# below this many (output row, reduced index) pairs a call runs on one thread: the work is a few tens of
# microseconds at most, less than waking an OpenMP team (and less than the oversubscription it risks when
# the caller already runs in parallel)
SERIAL_PAIRS = 1 << 15

_ARGTYPES = [
    ctypes.c_void_p,  # vals
    ctypes.c_void_p,  # idx
    ctypes.c_void_p,  # const T* const* args
    ctypes.c_void_p,  # const int64_t* bstride
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int,
    ctypes.c_void_p,  # const int64_t* chunks (a ranged plan's, block_sparse.segment_rows; else null)
    ctypes.c_int64,  # chunks
    ctypes.c_void_p,  # const int64_t* offsets (its RangeMap's)
    ctypes.c_void_p,  # const int64_t* ranges
]
RANGED_CHUNK_ROWS = 64  # output rows per work item of a ranged call: each gathers its segment's terms once
_functions: dict[tuple[str, torch.dtype], HostFunction] = {}
_lock = threading.Lock()


def _function(plan: Plan, dtype: torch.dtype) -> HostFunction:
    key = (plan.key, dtype)
    fn = _functions.get(key)
    if fn is None:
        with _lock:
            fn = _functions.get(key)
            if fn is None:
                source = cpu_source(plan, str(dtype).removeprefix("torch."))
                fn = compile_host_library(source, ["lazy_reduce"]).function("lazy_reduce", _ARGTYPES)
                _functions[key] = fn
    return fn


def cpu_threads(rows: int, n_inner: int) -> int:
    """OpenMP threads for a call of ``rows`` output rows (batch included) reducing ``n_inner`` terms each:
    1 below SERIAL_PAIRS pairs, else torch's thread count, at most one per row."""
    if rows * max(n_inner, 1) < SERIAL_PAIRS:
        return 1
    return max(1, min(torch.get_num_threads(), rows))


def run_cpu(plan: Plan, call: CallArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (nbatch, n_outer, value_dim), indices (nbatch, n_outer, index_dim) or None)."""
    fn = _function(plan, call.dtype)
    vals, idx = new_outputs(plan, call, torch.device("cpu"))
    if vals.numel() == 0 and (idx is None or idx.numel() == 0):
        return vals, idx
    # inner variables go transposed, (B, D, n), so the kernel's loop over j lanes reads contiguous memory (but
    # those a routed plan reads only where a distance cancels: (n, D), codegen.staged_inner_slots)
    staged = staged_inner_slots(plan)
    tensors = [call.batched(k).transpose(-1, -2).contiguous() if k in staged else t for k, t in enumerate(call.tensors)]
    if call.numbers is not None:
        tensors.append(call.numbers)  # args[slots]: the number vector (no batch stride)
    tensors += call.grams  # a routed plan's matrices (gemm_route.py)
    ptrs = (ctypes.c_void_p * max(1, len(tensors)))(*[t.data_ptr() for t in tensors])
    strides = (ctypes.c_int64 * max(1, len(tensors)))(*call.batch_strides)
    rows = call.nbatch * call.n_outer
    n_inner = call.n_inner
    range_map: list = [None, 0, None, None]
    if call.ranges is not None:
        starts, offsets, inner = call.ranges[0:3]
        chunks = segment_rows(starts, RANGED_CHUNK_ROWS)
        range_map = [chunks.data_ptr(), len(chunks), offsets.data_ptr(), inner.data_ptr()]
        n_inner = mean_terms(starts, inner)
    threads = cpu_threads(rows, n_inner)
    fn.call(
        vals.data_ptr(),
        idx.data_ptr() if idx is not None else None,
        ctypes.addressof(ptrs),
        ctypes.addressof(strides),
        call.nbatch,
        call.n_outer,
        call.n_inner,
        threads,
        *range_map,
    )
    return vals, idx
