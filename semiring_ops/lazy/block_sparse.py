"""Block-sparse reductions (KeOps' ``ranges``): the 6-tuple checked and laid out for the kernels.

KeOps describes a block-sparse reduction by two halves, one per reduced axis:

    (ranges_i, slices_i, redranges_j,  ranges_j, slices_j, redranges_i)

Reducing over j, the output rows ``ranges_i[k] = [a, b)`` reduce over the j of every range
``redranges_j[slices_i[k - 1]:slices_i[k]]`` (``slices_i[-1]`` read as 0); reducing over i, the same with the
roles swapped. Rows in no block reduce over nothing (the semiring zero, index 0).

A half becomes a :class:`RangeMap` here, three int64 CPU tensors the kernels read:

- ``starts`` (S + 1,): segments of output rows ``[starts[s], starts[s + 1])`` that cover ``[0, n_outer)``:
  the blocks, sorted, with the rows between them as segments of their own (reducing over nothing);
- ``offsets`` (S + 1,): segment s reduces over the ranges ``inner[offsets[s]:offsets[s + 1]]``;
- ``inner`` (M, 2): the ranges ``[lo, hi)`` of inner indices, those of each block in KeOps' order.

A reduction passes the six tensors of both maps, its own axis's first: the gradient of the inner variables is
a reduction over the other axis, which reads the second map (KeOps' rule), so the two halves must describe the
same pairs; :func:`check_transposed` says so when that gradient is taken.

The maps of a ranges tuple are kept (``MAP_CACHE_SIZE`` tuples, by the identity and version of its tensors), so
reducing with ``K.ranges`` set checks and lays out the pattern once.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["RangeMap", "check_transposed", "mean_terms", "oriented_ranges", "range_map", "segment_rows", "swapped"]

MAP_CACHE_SIZE = 64
_I64 = torch.int64


@dataclass(frozen=True)
class RangeMap:
    """One half of a ranges tuple laid out for the kernels (module docstring); ``min_terms``: the fewest terms
    any output row reduces over (0 when a row is in no block)."""

    starts: torch.Tensor
    offsets: torch.Tensor
    inner: torch.Tensor
    min_terms: int

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.starts, self.offsets, self.inner


def _within_runs(lengths: torch.Tensor) -> torch.Tensor:
    """For runs of ``lengths`` laid end to end, each position's index within its run: [0, 1, 0, 1, 2] for [2, 3]."""
    return torch.arange(int(lengths.sum()), dtype=_I64) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths
    )


def range_map(triple: tuple, n_outer: int, n_inner: int, what: str) -> RangeMap:
    """The RangeMap of KeOps' (ranges, slices, redranges) triple for an axis of ``n_outer`` output rows reducing
    over ``n_inner`` indices, checked: shapes (Mc, 2), (Mc,), (Mcc, 2); blocks within [0, n_outer] and
    disjoint; slices non-decreasing up to Mcc; inner ranges within [0, n_inner]. ValueError names the fault."""
    shapes = [tuple(r.shape) for r in triple]
    pairs = len(shapes[0]) == 2 and shapes[0][1] == 2 and len(shapes[2]) == 2 and shapes[2][1] == 2
    if not pairs or shapes[1] != shapes[0][:1]:
        raise ValueError(
            f"{what}: ranges= needs a (ranges, slices, redranges) triple of shapes (Mc, 2), (Mc,), (Mcc, 2) for "
            f"the reduced axis, got {shapes}"
        )
    blocks, slices, inner = (r.to(device="cpu", dtype=_I64) for r in triple)
    bounds = torch.cat([slices.new_zeros(1), slices])
    if bool((bounds[1:] < bounds[:-1]).any()) or int(bounds[-1]) > len(inner):
        raise ValueError(
            f"{what}: ranges=: the slices {slices.tolist()} must be non-decreasing and at most {len(inner)}"
        )
    if len(inner) and bool(((inner[:, 0] < 0) | (inner[:, 0] > inner[:, 1]) | (inner[:, 1] > n_inner)).any()):
        raise ValueError(f"{what}: ranges=: the reduction ranges {inner.tolist()} must lie within [0, {n_inner}]")
    if len(blocks) and bool(((blocks[:, 0] < 0) | (blocks[:, 0] > blocks[:, 1]) | (blocks[:, 1] > n_outer)).any()):
        raise ValueError(f"{what}: ranges=: the blocks of rows {blocks.tolist()} must lie within [0, {n_outer}]")
    kept = (blocks[:, 1] > blocks[:, 0]).nonzero().squeeze(1)  # blocks of no rows reduce nothing anywhere
    order = kept[torch.argsort(blocks[kept, 0], stable=True)]
    lo, hi = blocks[order, 0], blocks[order, 1]
    clash = (lo[1:] < hi[:-1]).nonzero()
    if len(clash):
        first, second = blocks[order[int(clash[0])]].tolist(), blocks[order[int(clash[0]) + 1]].tolist()
        raise ValueError(f"{what}: ranges=: the blocks of rows {first} and {second} overlap")
    # segments: before each block the rows since the previous one (when there are any), then the block
    previous_end = torch.cat([lo.new_zeros(1), hi])
    gap = lo > previous_end[:-1]
    seg_start = torch.stack([previous_end[:-1], lo], 1).reshape(-1)
    present = torch.stack([gap, torch.ones_like(gap)], 1).reshape(-1)
    counts = bounds[order + 1] - bounds[order]
    seg_count = torch.stack([torch.zeros_like(counts), counts], 1).reshape(-1)
    seg_start, seg_count = seg_start[present], seg_count[present]
    end = int(previous_end[-1])
    if end < n_outer:  # the rows after the last block
        seg_start = torch.cat([seg_start, seg_start.new_tensor([end])])
        seg_count = torch.cat([seg_count, seg_count.new_zeros(1)])
    starts = torch.cat([seg_start, seg_start.new_tensor([n_outer])])
    offsets = torch.cat([seg_count.new_zeros(1), torch.cumsum(seg_count, 0)])
    # the inner ranges of the blocks in row order: block order[k]'s are inner[bounds[order[k]] + 0 .. counts[k])
    total = int(offsets[-1])
    first = torch.repeat_interleave(bounds[order], counts)
    laid = inner[first + _within_runs(counts)].reshape(total, 2).contiguous()
    lengths = laid[:, 1] - laid[:, 0]
    per_segment = torch.zeros(len(starts) - 1, dtype=_I64)
    per_segment.index_add_(0, torch.repeat_interleave(torch.arange(len(per_segment)), offsets.diff()), lengths)
    min_terms = int(per_segment.min()) if len(per_segment) else 0
    return RangeMap(starts.contiguous(), offsets.contiguous(), laid, min_terms)


class _ByTensors:
    """An LRU of values made from tensors, keyed by the tensors' identities and versions (and more hashables).
    It keeps the tensors, so their ids stay theirs while cached; a value whose making raises is not kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, tuple[tuple, object]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tensors: tuple, extra: tuple, make: Callable[[], object]) -> object:
        key = (*map(id, tensors), *[t._version for t in tensors], extra)
        hit = self._entries.get(key)  # a hit takes no lock (a reduction's every call looks up; dict reads are atomic)
        if hit is not None:
            with contextlib.suppress(KeyError):  # evicted meanwhile by another thread: still a right answer
                self._entries.move_to_end(key)
            return hit[1]
        value = make()
        with self._lock:
            self._entries[key] = (tuple(tensors), value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value


_maps_cache = _ByTensors(MAP_CACHE_SIZE)  # a ranges tuple's two RangeMaps
_checked = _ByTensors(MAP_CACHE_SIZE)  # oriented range tensors whose halves check_transposed passed
_chunks_cache = _ByTensors(MAP_CACHE_SIZE)  # segment_rows of a RangeMap's starts
_terms_cache = _ByTensors(MAP_CACHE_SIZE)  # mean_terms of a RangeMap's starts and inner ranges


def _maps(ranges: tuple, n_i: int, n_j: int, what: str) -> tuple[RangeMap, RangeMap]:
    """(the map reducing over j (rows i), the map reducing over i (rows j)) of a 6-tuple, cached."""

    def make() -> tuple[RangeMap, RangeMap]:
        return range_map(ranges[0:3], n_i, n_j, what), range_map(ranges[3:6], n_j, n_i, what)

    return _maps_cache.get(tuple(ranges), (n_i, n_j), make)


def oriented_ranges(ranges: tuple, outer: str, n_i: int, n_j: int, what: str) -> tuple[tuple, int]:
    """(the six tensors a reduction with ``outer`` rows passes (its own map first, then the other axis's), the
    fewest terms of its rows)."""
    over_j, over_i = _maps(ranges, n_i, n_j, what)
    own, other = (over_j, over_i) if outer == "i" else (over_i, over_j)
    return (*own.tensors, *other.tensors), own.min_terms


def swapped(ranges: tuple) -> tuple:
    """The six tensors for the reduction over the other axis."""
    return (*ranges[3:6], *ranges[0:3])


def _rectangles(starts: torch.Tensor, offsets: torch.Tensor, inner: torch.Tensor, transpose: bool) -> torch.Tensor:
    """(R, 4) int64 [row lo, row hi, col lo, col hi) of the (segment, inner range) pairs that hold pairs."""
    segment = torch.repeat_interleave(torch.arange(len(starts) - 1), offsets.diff())
    rects = torch.stack([starts[segment], starts[segment + 1], inner[:, 0], inner[:, 1]], 1)
    if transpose:
        rects = rects[:, [2, 3, 0, 1]]
    return rects[(rects[:, 1] > rects[:, 0]) & (rects[:, 3] > rects[:, 2])]


def _counted(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.unique(rows, dim=0, return_counts=True)


def _grid_spans(rects: torch.Tensor, row_cuts: torch.Tensor, col_cuts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(first row piece, row pieces, first col piece, col pieces) of each rectangle on the grid cut at
    row_cuts x col_cuts."""
    r0, r1 = torch.searchsorted(row_cuts, rects[:, 0]), torch.searchsorted(row_cuts, rects[:, 1])
    c0, c1 = torch.searchsorted(col_cuts, rects[:, 2]), torch.searchsorted(col_cuts, rects[:, 3])
    return r0, r1 - r0, c0, c1 - c0


def _cells(rects: torch.Tensor, row_cuts: torch.Tensor, col_cuts: torch.Tensor) -> torch.Tensor:
    """(P, 2) the (row piece, col piece) cells of the grid cut at row_cuts x col_cuts that the rectangles
    cover, one per rectangle covering it."""
    r0, nr, c0, nc = _grid_spans(rects, row_cuts, col_cuts)
    rect = torch.repeat_interleave(torch.arange(len(rects)), nr * nc)
    k = _within_runs(nr * nc)
    return torch.stack([r0[rect] + k // nc[rect], c0[rect] + k % nc[rect]], 1)


def _cell_count(rects: torch.Tensor, row_cuts: torch.Tensor, col_cuts: torch.Tensor) -> int:
    _, nr, _, nc = _grid_spans(rects, row_cuts, col_cuts)
    return int((nr * nc).sum())


CHECK_CELLS = 1 << 24  # the most grid cells check_transposed compares; beyond, it warns instead


def check_transposed(ranges: tuple, what: str = "backward of a block-sparse reduction") -> None:
    """Raises ValueError unless both maps of ``ranges`` (six tensors, as oriented_ranges gives) hold the same
    (row, column) pairs, as many times each: the gradient of the inner variables needs it (the forward reads
    the first map, that gradient the second, as in KeOps). Equal rectangles (from_matrix's tuples) are seen
    at once; otherwise both are cut on the grid of all their bounds and the cells compared. Kept once passed
    (the tensors are a cached RangeMap's, so a training loop checks its pattern once)."""
    _checked.get(tuple(ranges), (), lambda: _check_transposed(ranges, what))


def _check_transposed(ranges: tuple, what: str) -> None:
    own = _rectangles(*ranges[0:3], transpose=False)
    other = _rectangles(*ranges[3:6], transpose=True)
    if own.shape == other.shape and all(torch.equal(a, b) for a, b in zip(_counted(own), _counted(other), strict=True)):
        return
    both = torch.cat([own, other])
    row_cuts, col_cuts = torch.unique(both[:, 0:2]), torch.unique(both[:, 2:4])
    if _cell_count(own, row_cuts, col_cuts) + _cell_count(other, row_cuts, col_cuts) > CHECK_CELLS:
        warnings.warn(
            f"{what}: the two halves of ranges= are too finely cut to check against each other; the gradient of "
            f"the reduced variables reads the other half (KeOps' rule), which must hold the same pairs",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    a, b = _counted(_cells(own, row_cuts, col_cuts)), _counted(_cells(other, row_cuts, col_cuts))
    if a[0].shape != b[0].shape or not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
        raise ValueError(
            f"{what}: the two halves of ranges= hold different (i, j) pairs, and the gradient of the reduced "
            f"variables reads the other half (KeOps' rule); give both halves of one pattern, as "
            f"semiring_ops.lazy.cluster.from_matrix makes them"
        )


def mean_terms(starts: torch.Tensor, inner: torch.Tensor) -> int:
    """The terms a segment reduces over, on average (the inner ranges' lengths summed, over the segments):
    the launch shapes' stand-in for n_inner; cached by the tensors (a per-call sum cost ~14 µs on the CPU)."""

    def make() -> int:
        return int((inner[:, 1] - inner[:, 0]).sum()) // max(1, len(starts) - 1)

    return _terms_cache.get((starts, inner), (), make)


def segment_rows(starts: torch.Tensor, rows_per_chunk: int) -> torch.Tensor:
    """(C, 3) int64 chunks (row lo, row hi, segment) of at most ``rows_per_chunk`` rows each, covering every
    segment (the kernels' work items: all rows of one share its inner ranges); cached by starts."""
    return _chunks_cache.get((starts,), (rows_per_chunk,), lambda: _segment_rows(starts, rows_per_chunk))


def _segment_rows(starts: torch.Tensor, rows_per_chunk: int) -> torch.Tensor:
    lengths = starts.diff()
    per = (lengths + rows_per_chunk - 1) // rows_per_chunk
    segment = torch.repeat_interleave(torch.arange(len(lengths)), per)
    k = _within_runs(per)
    lo = starts[segment] + k * rows_per_chunk
    hi = torch.minimum(lo + rows_per_chunk, starts[segment + 1])
    return torch.stack([lo, hi, segment], 1).contiguous()
