"""Where the block engine puts a computed block (engine.BlockWriter): a host output, dense or condensed.

Each writer writes only the cells of the block it is given (for a condensed output, only the pairs of its
side of the diagonal), so blocks written by several workers at once never touch the same memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..build.backends import backend_for
from .scheduler import Block, row_start

__all__ = ["CondensedWriter", "DenseWriter", "compiled_condensed_scatter", "compiled_stream_copy", "is_row_block"]


def compiled_condensed_scatter():
    """The host writers' ``condensed_scatter(out, values, n, r0, c0, diagonal)`` (csrc/ops.h), or None when
    those CPU kernels are not compiled."""
    return getattr(backend_for(torch.device("cpu")).family("host_writers"), "condensed_scatter", None)


def compiled_stream_copy() -> Callable[[torch.Tensor, torch.Tensor], None] | None:
    """The CPU extension's ``stream_copy(dst, src)`` (csrc/ops.h: dst = src for dst a block of rows, src
    contiguous, streaming stores from 1 MiB), or None when those CPU kernels are not compiled."""
    return getattr(backend_for(torch.device("cpu")).family("host_writers"), "stream_copy", None)


def is_row_block(t: torch.Tensor) -> bool:
    """Whether ``t`` (rows, ...) is what ``stream_copy`` writes: each ``t[i]`` contiguous (dims 1.. dense,
    row-major) and rows not overlapping (any row stride of at least a row's elements); with at most one dim,
    contiguous; empty, whatever its strides. E.g. ``out[r0:r1, c0:c1]`` of a contiguous (m, n[, D]) ``out``."""
    if t.numel() == 0:
        return True
    if t.dim() <= 1:
        return t.is_contiguous()
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return t.shape[0] <= 1 or t.stride(0) >= expected


class DenseWriter:
    """Into ``out`` (m, n) or (m, n, D): ``out[r0:r1, c0:c1] = values``, by the CPU extension's
    ``stream_copy`` (pieces in parallel, non-temporal stores for a block of at least 1 MiB:
    csrc/cpu/stream_copy_cpu.cpp) when the block's view of ``out`` is a block of rows (``out``'s rows
    contiguous) and ``values`` is a contiguous host tensor; otherwise, or without a compiled CPU backend,
    torch's ``copy_`` (multi-threaded for large blocks). The first touch of a fresh output's pages happens
    here, in parallel."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out = out
        self._stream_copy = compiled_stream_copy()

    def write(self, block: Block, values: torch.Tensor) -> None:
        view = self.out[block.r0 : block.r1, block.c0 : block.c1]
        values = values.reshape(view.shape)
        if (
            self._stream_copy is not None
            and values.device.type == "cpu"
            and view.device.type == "cpu"
            and values.dtype == view.dtype
            and values.is_contiguous()
            and is_row_block(view)
        ):
            self._stream_copy(view, values)
        else:
            view.copy_(values)


class CondensedWriter:
    """Into ``out`` (n (n - 1) / 2[, D]), contiguous, in scipy.spatial.distance.pdist's layout: the pairs i < j
    row-major (with ``diagonal``: i <= j, each row's diagonal entry first). Blocks come from an upper-triangle
    plan: a block's row i holds the consecutive entries of pairs (i, j), j in [max(c0, i + 1), c1) (from i
    with the diagonal), so a block is one copy per row: the CPU extension's ``condensed_scatter`` (rows in
    parallel, streaming stores for a block of at least 1 MiB as ``stream_copy``,
    csrc/cpu/condensed_scatter_cpu.cpp); without a compiled CPU backend, one ``index_copy_`` of
    the block's cells to their condensed positions (a block crossing the diagonal keeps only its side's)."""

    def __init__(self, out: torch.Tensor, n: int, diagonal: bool) -> None:
        self.out, self.n, self.diagonal = out, n, diagonal
        self._rows = out.view(out.shape[0], -1)  # (size, D): one row per pair
        self._scatter = compiled_condensed_scatter()

    def write(self, block: Block, values: torch.Tensor) -> None:
        if self._scatter is not None:
            values = values.reshape(block.rows, block.cols, -1).contiguous()
            self._scatter(self.out, values, self.n, block.r0, block.c0, self.diagonal)
            return
        first = 0 if self.diagonal else 1  # row i's pairs start at column i + first
        i = torch.arange(block.r0, block.r1, dtype=torch.int64)[:, None]
        j = torch.arange(block.c0, block.c1, dtype=torch.int64)[None, :]
        dest = row_start(i, self.n, self.diagonal) + j - i - first  # (rows, cols): condensed_index of every cell
        vals = values.reshape(block.rows * block.cols, -1)
        if block.c0 >= block.r1 - 1 + first:  # wholly on the pairs' side of the diagonal
            self._rows.index_copy_(0, dest.reshape(-1), vals)
        else:
            keep = (j >= i + first).reshape(-1)
            self._rows.index_copy_(0, dest.reshape(-1)[keep], vals[keep])
