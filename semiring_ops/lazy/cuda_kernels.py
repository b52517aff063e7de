"""Running a plan on a CUDA device: the generated kernels (codegen.cuda_source) compiled once per plan,
dtype and architecture by NVRTC, launched on PyTorch's current stream.

The policy (codegen.cuda_config) gives each thread as many output rows as fit in registers; a block then
covers ``block * rows`` rows of one batch. The launch shape is chosen per call:

- rows per thread: fewer than the policy's when the rows alone (even with j split) could not fill the GPU;
- j split (the 2-D scheme, grid.y): the reduced range is cut into ``nsplit`` ranges of whole tiles when that
  fills the GPU (at least two blocks per multiprocessor) or evens the work per multiprocessor (the blocks
  are equal, so a multiprocessor's time is its block count: 489 blocks on 132 SMs is 3.7 each, so 93 SMs
  run 4 and the rest idle 7%; cutting j in 4 makes it 14.8 per SM, under 2% idle). Each block then parks
  its reducers in a workspace and lazy_merge folds them per row.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .block_sparse import mean_terms, segment_rows
from .codegen import MERGE_BLOCK, CudaConfig, chunk_layout, cuda_config, cuda_source, cuda_tile
from .nvrtc import CudaFunction, compile_cuda_module, device_sm_count
from .plan import CallArgs, Plan, new_outputs

__all__ = ["CudaKernels", "run_cuda"]

MIN_BALANCE = 0.95  # accepted ratio of mean to largest per-multiprocessor work
WORKSPACE_BYTES = 256 << 20  # the most the split's reducers may park
# blocks per multiprocessor the split aims at for plans with chunked wide sums (wide_chunks.py): blocks of
# WIDE_BLOCK = 128 threads and one row each, so 2 blocks (the default) left 14 of 64 warps active (ncu, H200)
WIDE_BLOCKS_PER_SM = 8


@dataclass
class CudaKernels:
    reduce: CudaFunction
    merge: CudaFunction
    reducer_bytes: int
    tile: int
    cfg: CudaConfig


_kernels: dict[tuple, CudaKernels] = {}
_lock = threading.Lock()


def kernels_for(plan: Plan, dtype: torch.dtype, device: torch.device, cfg: CudaConfig) -> CudaKernels:
    index = device.index if device.index is not None else torch.cuda.current_device()
    # a quick compile first where the last bits may change once (nvrtc's tiers): not for float64's numerical
    # checks, nor under torch.use_deterministic_algorithms (whose calls get a module of their own: never one
    # that a non-deterministic call compiled quick first and swaps later)
    quick_first = dtype != torch.float64 and not torch.are_deterministic_algorithms_enabled()
    key = (plan.key, dtype, index, cfg, quick_first)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _lock:
        k = _kernels.get(key)
        if k is None:
            dtype_name = str(dtype).removeprefix("torch.")
            source = cuda_source(plan, dtype_name, cfg)
            names = ["lazy_reduce", "lazy_merge", "lazy_sizeof"]
            module = compile_cuda_module(source, names, torch.device("cuda", index), quick_first)
            n = len(plan.arg_cats)
            p, i64 = ctypes.c_void_p, ctypes.c_int64
            # the variables, the number vector, a routed plan's matrices, a ranged plan's chunks, offsets and ranges
            pointers = n + (1 if plan.n_numbers else 0) + 3 * plan.grams + (4 if plan.ranged else 0)
            reduce = module.function("lazy_reduce", [p, p, p] + [p] * pointers + [i64] * n + [i64] * 5)
            merge = module.function("lazy_merge", [p, p, p, i64, ctypes.c_int32])
            sizeof = module.function("lazy_sizeof", [p])
            out = torch.empty(1, dtype=torch.int64, device=torch.device("cuda", index))
            with torch.cuda.device(index):
                sizeof.launch((1, 1, 1), (1, 1, 1), 0, torch.cuda.current_stream(index).cuda_stream, [out.data_ptr()])
            k = CudaKernels(reduce, merge, int(out.item()), cuda_tile(plan, dtype_name, cfg), cfg)
            _kernels[key] = k
    return k


def rows_per_thread(policy_rows: int, n_outer: int, nbatch: int, n_inner: int, tile: int, sms: int, block: int) -> int:
    """The policy's rows per thread, halved while the blocks, even with j cut into one-tile ranges, would
    give fewer than two per multiprocessor."""
    rows = policy_rows
    while rows > 1 and nbatch * -(-n_outer // (block * rows)) * max(1, n_inner // tile) < 2 * sms:
        rows //= 2
    return rows


def split_count(
    blocks: int, n_inner: int, tile: int, sms: int, max_split: int = 64, per_sm: int = 2
) -> tuple[int, int]:
    """(nsplit, j per range): the fewest ranges of whole tiles that give at least ``per_sm`` blocks per
    multiprocessor (or as many as there are tiles) and spread them evenly (MIN_BALANCE); 1 range when
    the rows alone do."""
    if n_inner <= 0:
        return 1, tile
    tiles = -(-n_inner // tile)
    limit = max(1, min(max_split, tiles))
    want = min(per_sm * sms, blocks * limit)
    best: tuple[float, int, int] | None = None
    for s in range(1, limit + 1):
        per = -(-tiles // s) * tile  # j per range, whole tiles
        nsplit = max(1, -(-n_inner // per))
        units = blocks * nsplit
        balance = units / (sms * -(-units // sms))
        if units >= want and balance >= MIN_BALANCE:
            return nsplit, per
        score = balance * min(1.0, units / want)
        if best is None or score > best[0] + 1e-9:
            best = (score, nsplit, per)
    assert best is not None
    return best[1], best[2]


@dataclass(frozen=True)
class Launch:
    """Everything a call of one plan at one size launches, decided once (see the module docstring)."""

    kernels: CudaKernels
    blocks_per_batch: int
    grid: tuple[int, int, int]
    j_per_block: int
    workspace_bytes: int  # the split's reducers; 0 for the 1-D scheme


_launches: dict[tuple, Launch] = {}
MAX_LAUNCHES = 4096  # remembered (plan, dtype, device, sizes) launch shapes


def launch_for(
    plan: Plan, call: CallArgs, device: torch.device, cfg: CudaConfig | None = None, nsplit: int | None = None
) -> Launch:
    """The kernels and launch shape of a call (cached by plan, dtype, device and sizes unless overridden)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (plan.key, call.dtype, index, call.nbatch, call.n_outer, call.n_inner)
    key += (torch.are_deterministic_algorithms_enabled(),)  # (kernels_for: a module of their own)
    if cfg is None and nsplit is None:
        hit = _launches.get(key)
        if hit is not None:
            return hit
    sms = device_sm_count(device)
    if cfg is None:
        cfg = cuda_config(plan, str(call.dtype).removeprefix("torch."))
        rows = rows_per_thread(cfg.rows, call.n_outer, call.nbatch, call.n_inner, cfg.tile, sms, cfg.block)
        cfg = dataclasses.replace(cfg, rows=rows) if rows != cfg.rows else cfg
        auto = nsplit is None
    else:
        auto = False
    k = kernels_for(plan, call.dtype, torch.device("cuda", index), cfg)
    rows_total = call.nbatch * call.n_outer
    blocks_per_batch = -(-call.n_outer // (cfg.block * cfg.rows))
    blocks = blocks_per_batch * call.nbatch
    if nsplit is None:
        max_split = max(1, WORKSPACE_BYTES // max(1, rows_total * k.reducer_bytes))
        per_sm = WIDE_BLOCKS_PER_SM if chunk_layout(plan) is not None else 2
        nsplit, j_per_block = split_count(blocks, call.n_inner, k.tile, sms, min(64, max_split), per_sm)
    else:
        per_range = -(-call.n_inner // nsplit)
        j_per_block = -(-per_range // k.tile) * k.tile
        nsplit = max(1, -(-call.n_inner // max(1, j_per_block)))
    launch = Launch(
        k,
        blocks_per_batch,
        (blocks, nsplit, 1),
        max(1, j_per_block),
        nsplit * rows_total * k.reducer_bytes if nsplit > 1 else 0,
    )
    if auto:
        if len(_launches) >= MAX_LAUNCHES:
            _launches.clear()
        _launches[key] = launch
    return launch


def run_cuda(
    plan: Plan, call: CallArgs, device: torch.device, cfg: CudaConfig | None = None, nsplit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (nbatch, n_outer, value_dim), indices (nbatch, n_outer, index_dim) or None). ``cfg`` and
    ``nsplit`` override the policy and the launch shape (for tuning)."""
    vals, idx = new_outputs(plan, call, device)
    rows_total = call.nbatch * call.n_outer
    if rows_total == 0:
        return vals, idx
    stream = current_stream_handle(device)
    if call.ranges is not None:
        ranged = _ranged_launch(plan, call, device, cfg)
        kernels, grid = ranged.kernels, (ranged.grid if nsplit is None else (ranged.grid[0], nsplit, 1))
        pattern = [t.data_ptr() for t in ranged.copies]
        shape = [1, kernels.tile]  # blocks_per_batch and j_per_block: a ranged kernel reads neither
        workspace = grid[1] * rows_total * kernels.reducer_bytes if grid[1] > 1 else 0
    else:
        launch = launch_for(plan, call, device, cfg, nsplit)
        kernels, grid, pattern = launch.kernels, launch.grid, []
        shape = [launch.blocks_per_batch, launch.j_per_block]
        workspace = launch.workspace_bytes
    partial = torch.empty(workspace, dtype=torch.uint8, device=device) if workspace else None
    vptr, iptr = vals.data_ptr(), (idx.data_ptr() if idx is not None else 0)
    pptr = partial.data_ptr() if partial is not None else 0
    args = [
        vptr,
        iptr,
        pptr,
        *[t.data_ptr() for t in call.tensors],
        *([] if call.numbers is None else [call.numbers.data_ptr()]),
        *[t.data_ptr() for t in call.grams],
        *pattern,
        *call.batch_strides,
        call.n_outer,
        call.n_inner,
        *shape,
        rows_total,
    ]
    kernels.reduce.launch(grid, (kernels.cfg.block, 1, 1), 0, stream, args)
    if partial is not None:  # the 2-D scheme: the split's reducers merged per row
        merge_args = [vptr, iptr, pptr, rows_total, grid[1]]
        kernels.merge.launch((-(-rows_total // MERGE_BLOCK), 1, 1), (MERGE_BLOCK, 1, 1), 0, stream, merge_args)
    return vals, idx


_range_copies: OrderedDict[tuple, RangedLaunch] = OrderedDict()
RANGE_COPIES = 64  # ranged launches kept (pattern, plan, dtype, device, sizes), with their device copies


# a ranged launch takes the most rows per thread whose blocks' row slots are this full: on an H100, 64 clusters of
# 3,125 rows ran in 6.9 ms at 0.95 (1 row per thread), 7.1 ms at 0.85 (2), 11.2 ms at 0.75 (8: a quarter idle);
# blocks of 128 or 64 threads were no faster (a sweep recorded in docs/perf_notes.md "Block-sparse lazy reductions");
# nor were they for segments of 31 rows, where 256 x 1 leaves 88% of the slots idle: 18 us at 256 or 128 threads,
# 23 at 64, 29 at 32 (H200, 2,000 points): the rows there are few and long, so a block's time is its rows' terms
RANGED_FILL = 0.95


def ranged_config(policy: CudaConfig, lengths: torch.Tensor) -> CudaConfig:
    """Rows per thread for segments of ``lengths`` rows: a block covers rows of one segment only, so a
    segment of 3,125 rows in blocks of 2,048 leaves a quarter of the row slots idle. The most rows per thread
    (each staged term then serves more rows) whose slots are at least RANGED_FILL full, else the fullest."""
    total = max(1, int(lengths.sum()))
    best: tuple[float, CudaConfig] | None = None
    rows = policy.rows
    while rows >= 1:
        per = policy.block * rows
        fill = total / max(1, int(((lengths + per - 1) // per).sum()) * per)
        cfg = dataclasses.replace(policy, rows=rows)
        if fill >= RANGED_FILL:
            return cfg
        if best is None or fill > best[0] + 1e-9:
            best = (fill, cfg)
        rows //= 2
    assert best is not None
    return best[1]


# short segments leave most warps of a ranged block without rows (31 rows in 256 threads: 1 live warp of 8), so the
# GPU needs more blocks for as many live warps as a dense launch's two full blocks per multiprocessor: up to this
# many per multiprocessor, by smaller staging tiles and more j ranges. H100, 2,000 points in 64 clusters (the
# reduction kernel): 13.9 us at 2 (256-term tiles, 3 ranges), 7.6 at 4 (64, 11), 9.3 at 8 (32, 21: the tiles'
# staging and synchronisation then weigh more than the terms); 20,000 points: 158.6, 147.9, 147.9 us
RANGED_MAX_BLOCKS_PER_SM = 4
RANGED_MIN_TILE = 32


def ranged_split_target(cfg: CudaConfig, chunks: int, rows: int) -> int:
    """Blocks per multiprocessor a ranged launch of ``chunks`` blocks covering ``rows`` rows aims for: two, times
    the block's warps over its live ones (warps holding rows), at most RANGED_MAX_BLOCKS_PER_SM."""
    live_warps = max(1, -(-rows // max(1, chunks * cfg.rows * 32)))
    return max(2, min(RANGED_MAX_BLOCKS_PER_SM, 2 * (cfg.block // 32) // live_warps))


def ranged_tile(cfg: CudaConfig, chunks: int, terms: int, per_sm: int, sms: int) -> CudaConfig:
    """cfg with the largest staging tile (halving from cfg.tile down to RANGED_MIN_TILE) whose tiles of a mean
    segment's terms, over all chunks, give ``per_sm`` blocks per multiprocessor: the j ranges split_count then
    cuts are whole tiles, so few terms in large tiles cannot be cut finely enough."""
    tile = cfg.tile
    while tile > RANGED_MIN_TILE and chunks * -(-terms // tile) < per_sm * sms:
        tile //= 2
    return cfg if tile == cfg.tile else dataclasses.replace(cfg, tile=tile)


@dataclass(frozen=True)
class RangedLaunch:
    """A ranged call's kernels, grid and device copies of its pattern (see _ranged_launch)."""

    kernels: CudaKernels
    grid: tuple[int, int, int]
    copies: tuple[torch.Tensor, ...]  # chunks, offsets, ranges, firsts on the device
    pattern: tuple[torch.Tensor, ...]  # the host tensors, kept so that their ids stay theirs while cached


def _ranged_launch(plan: Plan, call: CallArgs, device: torch.device, cfg: CudaConfig | None) -> RangedLaunch:
    """The launch of a ranged call: blocks of at most block * rows rows of one segment
    (block_sparse.segment_rows; the shape of ranged_config), the segments' terms cut into grid.y parts as
    split_count cuts the dense j (the mean segment's terms standing for n_inner). Kept (RANGE_COPIES) by
    pattern, plan, dtype and device, so reducing with one pattern again decides and copies nothing."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    starts, offsets, inner = call.ranges[0:3]
    key = (id(starts), id(offsets), id(inner), plan.key, call.dtype, index, call.n_outer, call.n_inner)
    if cfg is None:
        with _lock:
            hit = _range_copies.get(key)
            if hit is not None:
                _range_copies.move_to_end(key)
                return hit
    tuned = cfg is not None
    if cfg is None:
        cfg = ranged_config(cuda_config(plan, str(call.dtype).removeprefix("torch.")), starts.diff())
    chunks = segment_rows(starts, cfg.block * cfg.rows)
    firsts = torch.cat([inner.new_zeros(1), torch.cumsum(inner[:, 1] - inner[:, 0], 0)])
    terms = mean_terms(starts, inner)
    sms = device_sm_count(device)
    per_sm = ranged_split_target(cfg, max(1, len(chunks)), call.n_outer)
    if not tuned:
        cfg = ranged_tile(cfg, max(1, len(chunks)), terms, per_sm, sms)
    kernels = kernels_for(plan, call.dtype, torch.device("cuda", index), cfg)
    target = torch.device("cuda", index)
    copies = tuple(t.to(target) for t in (chunks, offsets, inner, firsts))
    max_split = max(1, WORKSPACE_BYTES // max(1, call.n_outer * kernels.reducer_bytes))
    nsplit, _ = split_count(max(1, len(chunks)), terms, kernels.tile, sms, min(64, max_split), per_sm)
    launch = RangedLaunch(kernels, (max(1, len(chunks)), nsplit, 1), copies, (starts, offsets, inner))
    if not tuned:
        with _lock:
            _range_copies[key] = launch
            while len(_range_copies) > RANGE_COPIES:
                _range_copies.popitem(last=False)
    return launch


def current_stream_handle(device: torch.device) -> int:
    """The raw cudaStream_t of PyTorch's current stream on ``device`` (without building a Stream object)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream
