"""Where the block engine puts a computed block (engine.BlockWriter): a host output, dense or condensed.

Each writer writes only the cells of the block it is given (for a condensed output, only the pairs of its
side of the diagonal), so blocks written by several workers at once never touch the same memory.
"""

from __future__ import annotations

import torch

from .scheduler import Block, condensed_index

__all__ = ["CondensedWriter", "DenseWriter"]


class DenseWriter:
    """Into ``out`` (m, n) or (m, n, D): ``out[r0:r1, c0:c1] = values`` (torch's copy, multi-threaded for
    large blocks; the first touch of a fresh output's pages happens here, in parallel)."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out = out

    def write(self, block: Block, values: torch.Tensor) -> None:
        view = self.out[block.r0 : block.r1, block.c0 : block.c1]
        view.copy_(values.reshape(view.shape))


class CondensedWriter:
    """Into ``out`` (n (n - 1) / 2[, D]) in scipy.spatial.distance.pdist's layout: the pairs i < j row-major
    (with ``diagonal``: i <= j, each row's diagonal entry first). Blocks come from an upper-triangle plan, so
    a block's row i holds the consecutive entries of pairs (i, j) for j in [max(c0, i + 1), c1) (from i with
    the diagonal)."""

    def __init__(self, out: torch.Tensor, n: int, diagonal: bool) -> None:
        self.out, self.n, self.diagonal = out, n, diagonal

    def write(self, block: Block, values: torch.Tensor) -> None:
        first = 0 if self.diagonal else 1  # the first column of row i's side: i + first
        for i in range(block.r0, block.r1):
            j0 = max(block.c0, i + first)
            if j0 >= block.c1:
                continue  # (only on a diagonal block: this row has none of its pairs here)
            start = condensed_index(i, j0, self.n, self.diagonal)
            row = values[i - block.r0, j0 - block.c0 : block.c1 - block.c0]
            view = self.out[start : start + row.shape[0]]
            view.copy_(row.reshape(view.shape))
