"""Clustering helpers for block-sparse reductions: the counterpart of KeOps' ``pykeops.torch.cluster``.

    from semiring_ops.lazy.cluster import grid_cluster, cluster_ranges_centroids, sort_clusters, from_matrix

    x_lab = grid_cluster(x, eps)                                   # (M,) int32 cluster labels
    x_ranges, x_centroids, _ = cluster_ranges_centroids(x, x_lab)  # (C, 2) int64 [start, end), (C, D)
    x, x_lab = sort_clusters(x, x_lab)                             # clusters contiguous in memory
    ...                                                            # the same for y
    keep = ((x_centroids[:, None] - y_centroids[None]) ** 2).sum(-1) < r**2   # (Cx, Cy) bool
    K.ranges = from_matrix(x_ranges, y_ranges, keep)               # KeOps' 6-tuple, for K's reductions

Same functions, arguments, outputs (values, dtypes) as KeOps 2.3's, vectorised PyTorch on the inputs'
device. Where KeOps' implementation falls short of its own description this follows the description:
``grid_cluster`` takes any dimension D (KeOps: D <= 3, and cells beyond 1024 per axis collide), and
``cluster_ranges`` counts in int64 (KeOps' float32 cumulative sum is inexact past 2^24 points).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TypeVar

import torch

__all__ = [
    "cluster_centroids",
    "cluster_ranges",
    "cluster_ranges_centroids",
    "from_matrix",
    "grid_cluster",
    "sort_clusters",
    "swap_axes",
]

Points = TypeVar("Points", torch.Tensor, tuple, list)


def _desc(t: object) -> str:
    """A short description of an argument for error messages."""
    if isinstance(t, torch.Tensor):
        return f"a tensor of shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"
    return f"a {type(t).__name__}"


def _points(what: str, x: object) -> torch.Tensor:
    """x, checked to be an (M, D) floating-point tensor."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 2 and x.is_floating_point()):
        raise TypeError(f"{what}: x must be an (M, D) floating-point tensor of points, got {_desc(x)}")
    return x


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _labels(what: str, lab: object, m: int | None = None, device: torch.device | None = None) -> torch.Tensor:
    """lab, checked to be an (M,) tensor of non-negative integer labels (of length m, on device, if given)."""
    if not (isinstance(lab, torch.Tensor) and lab.dim() == 1 and _is_int(lab)):
        raise TypeError(f"{what}: lab must be an (M,) integer tensor of cluster labels, got {_desc(lab)}")
    if m is not None and lab.shape[0] != m:
        raise ValueError(f"{what}: lab has {lab.shape[0]} labels but x has {m} points (lab: {_desc(lab)})")
    if device is not None and lab.device != device:
        raise ValueError(f"{what}: lab is on {lab.device} but x is on {device}")
    if lab.numel() and bool(lab.min() < 0):
        raise ValueError(f"{what}: lab must hold non-negative labels, got a minimum of {int(lab.min())}")
    return lab


def _counts(what: str, lab: torch.Tensor, Nlab: object, name: str = "Nlab") -> torch.Tensor:
    """The (C,) number of points per label: ``Nlab`` checked against lab, or counted (C = max(lab) + 1)."""
    if Nlab is None:
        return torch.bincount(lab).float()
    if not (isinstance(Nlab, torch.Tensor) and Nlab.dim() == 1 and Nlab.dtype != torch.bool):
        raise TypeError(f"{what}: {name} must be a (C,) tensor of counts per cluster, got {_desc(Nlab)}")
    if Nlab.device != lab.device:
        raise ValueError(f"{what}: {name} is on {Nlab.device} but lab is on {lab.device}")
    if lab.numel() and int(lab.max()) >= Nlab.shape[0]:
        raise ValueError(f"{what}: lab holds the label {int(lab.max())} but {name} has {Nlab.shape[0]} clusters")
    return Nlab


def grid_cluster(x: torch.Tensor, size: float | torch.Tensor) -> torch.Tensor:
    """Labels the points by the cubic cell ("voxel") of a regular grid that holds them.

    The grid starts at the points' minimum along each axis; cells of side ``size`` (one value, or one per
    axis). Labels are compact, ``[0, C)`` for the C non-empty cells, numbered in the lexicographic order of
    the cells' integer coordinates (first axis slowest), which is KeOps' order.

    Args:
        x: (M, D) floating-point tensor, the points (any D >= 1; KeOps' takes D <= 3).
        size: positive float, or (D,) / () tensor, the cells' side lengths.

    Returns:
        (M,) int32 tensor on x's device: ``labels[i] == labels[j]`` iff points i and j share a cell.

    Example:
        >>> grid_cluster(torch.tensor([[0.0], [0.1], [0.9], [0.05], [0.5]]), 0.2)
        tensor([0, 0, 2, 0, 1], dtype=torch.int32)
    """
    what = "grid_cluster"
    x = _points(what, x)
    m, d = x.shape
    if d == 0:
        raise ValueError(f"{what}: x must have at least one coordinate per point, got {_desc(x)}")
    if isinstance(size, torch.Tensor):
        if size.is_complex() or size.dim() > 1 or (size.dim() == 1 and size.shape[0] not in (1, d)):
            raise ValueError(f"{what}: size must be a float or a ({d},) tensor of cell sides, got {_desc(size)}")
        positive = bool((size > 0).all()) and bool(torch.isfinite(size).all())
    elif isinstance(size, numbers.Real) and not isinstance(size, bool):
        positive = 0 < size < float("inf")
    else:
        raise TypeError(f"{what}: size must be a float or a ({d},) tensor of cell sides, got {_desc(size)}")
    if not positive:
        raise ValueError(f"{what}: size must be positive and finite, got {size}")
    if m == 0:
        return torch.zeros(0, dtype=torch.int32, device=x.device)
    with torch.no_grad():
        if isinstance(size, torch.Tensor):
            size = size.to(x.device)
        lo, hi = torch.aminmax(x, dim=0, keepdim=True)
        # the last cell along each axis: the cells are monotone in the coordinates, so it is the top point's
        top = ((hi - lo) / size).floor()
        if not bool(torch.isfinite(top).all()):
            raise ValueError(f"{what}: x holds non-finite coordinates (NaN or inf), or size {size} is too small")
        extents = [int(t) + 1 for t in top.reshape(-1).tolist()]
        if max(extents) > 2**62:
            raise ValueError(f"{what}: size {size} is too small: {max(extents)} cells along an axis")
        total = math.prod(extents)
        itype = torch.int32 if total < 2**31 else torch.int64
        cells = ((x - lo) / size).floor().to(torch.int32 if max(extents) < 2**31 else torch.int64)
        if total < 2**62:  # mixed radix: one key per cell, in lexicographic order
            key = cells[:, 0].to(itype)
            for axis in range(1, d):
                key = key * extents[axis] + cells[:, axis]
            if total <= 4 * m + 4096:  # few cells: number the occupied ones of a dense table
                occupied = torch.bincount(key, minlength=total) > 0
                labels = (torch.cumsum(occupied, 0, dtype=torch.int32) - 1)[key]
            else:
                labels = torch.unique(key, sorted=True, return_inverse=True)[1]
        else:  # too many cells for one key: sort the coordinate rows themselves
            labels = torch.unique(cells, dim=0, sorted=True, return_inverse=True)[1]
    return labels.to(torch.int32)


def sort_clusters(x: Points, lab: torch.Tensor) -> tuple[Points, torch.Tensor]:
    """Sorts points (one tensor, or a tuple / list of them) by label, so that each cluster is contiguous.

    The order within a cluster is ``torch.sort``'s (not stable; KeOps' too, so that the same inputs give the
    same order as KeOps on the same device).

    Args:
        x: (M, ...) tensor, or a tuple / list of (M, ...) tensors permuted alike.
        lab: (M,) integer tensor of labels (any shape with M elements: it is flattened).

    Returns:
        x sorted (of the same kind: tensor, tuple or list), and the (M,) sorted labels.
    """
    what = "sort_clusters"
    if not (isinstance(lab, torch.Tensor) and _is_int(lab)):
        raise TypeError(f"{what}: lab must be an (M,) integer tensor of cluster labels, got {_desc(lab)}")
    lab = lab.reshape(-1)
    many = isinstance(x, (tuple, list))
    for k, t in enumerate(x if many else [x]):
        name = f"x[{k}]" if many else "x"
        if not (isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == lab.shape[0]):
            raise ValueError(f"{what}: {name} must be an (M, ...) tensor with M = {lab.shape[0]}, got {_desc(t)}")
        if t.device != lab.device:
            raise ValueError(f"{what}: {name} is on {t.device} but lab is on {lab.device}")
    lab_sorted, perm = torch.sort(lab)
    if many:
        return type(x)(t[perm] for t in x), lab_sorted
    return x[perm], lab_sorted


def _ranges(counts: torch.Tensor) -> torch.Tensor:
    """(C, 2) int64 [start, end) of consecutive clusters of the (C,) counts (unchecked)."""
    counts = counts.to(torch.int64)
    ends = torch.cumsum(counts, 0)
    return torch.stack((ends - counts, ends), dim=1)


def _weights(what: str, weights: object, m: int, device: torch.device) -> torch.Tensor:
    """weights, checked to be a floating-point tensor of m elements on device, flattened to (m,)."""
    if not (isinstance(weights, torch.Tensor) and weights.numel() == m and weights.is_floating_point()):
        raise ValueError(f"{what}: weights must be a floating-point tensor of {m} weights, got {_desc(weights)}")
    if weights.device != device:
        raise ValueError(f"{what}: weights is on {weights.device} but x is on {device}")
    return weights.reshape(-1)


def _centroids(x: torch.Tensor, lab: torch.Tensor, total: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """(C, D) sums of w_i x_i per label divided by total (C,), C = len(total) (unchecked): one bincount per
    axis, each cluster summing its points in index order, as KeOps' (the same numbers)."""
    with torch.no_grad():
        terms = x if w is None else x * w[:, None]
        sums = torch.stack([torch.bincount(lab, weights=t, minlength=total.shape[0]) for t in terms.unbind(1)], 1)
        return (sums / total[:, None]).to(x.dtype)


def cluster_ranges(lab: torch.Tensor, Nlab: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[start, end)`` rows of each cluster in points sorted by :func:`sort_clusters`.

    Args:
        lab: (M,) non-negative integer tensor of labels in ``[0, C)``.
        Nlab: optional (C,) tensor, the number of points per label (counted from lab if None).

    Returns:
        (C, 2) int64 tensor: cluster k is ``x_sorted[ranges[k, 0]:ranges[k, 1]]``.

    Example:
        >>> cluster_ranges(torch.tensor([0, 2, 0, 0, 1]))
        tensor([[0, 3], [3, 4], [4, 5]])
    """
    what = "cluster_ranges"
    lab = _labels(what, lab)
    counts = _counts(what, lab, Nlab)
    if counts.is_floating_point() and not bool((counts == counts.round()).all()):
        raise ValueError(f"{what}: Nlab must hold whole counts, got {counts}")
    return _ranges(counts)


def cluster_centroids(
    x: torch.Tensor,
    lab: torch.Tensor,
    Nlab: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    weights_c: torch.Tensor | None = None,
) -> torch.Tensor:
    """The (weighted) barycentre of each cluster: c_k = sum_{lab_i = k} w_i x_i / sum_{lab_i = k} w_i.

    Args:
        x: (M, D) floating-point tensor, the points.
        lab: (M,) non-negative integer tensor of labels in ``[0, C)``.
        Nlab: optional (C,) tensor, points per label (counted if None); the divisor when weights is None.
        weights: optional (M,) tensor (or any shape with M elements) of weights w_i (1 if None).
        weights_c: optional (C,) tensor, the total weight per cluster (summed from weights if None).

    Returns:
        (C, D) tensor of x's dtype and device; an empty cluster (zero count or weight) gets NaN, as in KeOps.
    """
    what = "cluster_centroids"
    x = _points(what, x)
    lab = _labels(what, lab, x.shape[0], x.device)
    counts = _counts(what, lab, Nlab)
    if weights is None:
        return _centroids(x, lab, counts, None)
    w = _weights(what, weights, x.shape[0], x.device)
    if weights_c is None:
        total = torch.bincount(lab, weights=w, minlength=counts.shape[0])
    else:
        flat = weights_c.reshape(-1) if isinstance(weights_c, torch.Tensor) else weights_c
        total = _counts(what, lab, flat, "weights_c")
        if total.shape != counts.shape:
            raise ValueError(f"{what}: weights_c has {total.shape[0]} clusters but Nlab has {counts.shape[0]}")
    return _centroids(x, lab, total, w)


def cluster_ranges_centroids(
    x: torch.Tensor, lab: torch.Tensor, weights: torch.Tensor | None = None, min_weight: float = 1e-9
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`cluster_ranges` and :func:`cluster_centroids` at once, with the clusters' total weights.

    Args:
        x: (M, D) floating-point tensor, the points.
        lab: (M,) non-negative integer tensor of labels in ``[0, C)``.
        weights: optional (M,) floating-point tensor of weights; those <= min_weight count as min_weight.
        min_weight: the floor of the weights (for the barycentres' stability).

    Returns:
        ranges (C, 2) int64 (for points sorted by :func:`sort_clusters`), centroids (C, D) of x's dtype,
        and the (C,) total weight per cluster: float32 counts if weights is None, else the clamped weights'
        sums (bincount's dtype: the weights' for float32 / float64, float64 for 16-bit weights).
    """
    what = "cluster_ranges_centroids"
    x = _points(what, x)
    lab = _labels(what, lab, x.shape[0], x.device)
    counts = torch.bincount(lab).float()
    if weights is None:
        return _ranges(counts), _centroids(x, lab, counts, None), counts
    w = _weights(what, weights, x.shape[0], x.device)
    if not isinstance(min_weight, numbers.Real) or isinstance(min_weight, bool):
        raise TypeError(f"{what}: min_weight must be a float, got {_desc(min_weight)}")
    w = w.masked_fill(w <= min_weight, min_weight)
    total = torch.bincount(lab, weights=w)
    return _ranges(counts), _centroids(x, lab, total, w), total


def _ranges_arg(what: str, name: str, r: object) -> torch.Tensor:
    """r, checked to be a (C, 2) integer tensor of [start, end) pairs."""
    if not (isinstance(r, torch.Tensor) and r.dim() == 2 and r.shape[1] == 2 and _is_int(r)):
        raise TypeError(f"{what}: {name} must be a (C, 2) integer tensor of [start, end) rows, got {_desc(r)}")
    return r


def from_matrix(
    ranges_i: torch.Tensor, ranges_j: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """KeOps' ``ranges`` 6-tuple of a cluster-to-cluster mask: pairs (i, j) in clusters (k, l) interact iff
    ``keep[k, l]``.

    Args:
        ranges_i: (Mc, 2) integer tensor, the rows [start, end) of the Mc clusters of i (see cluster_ranges).
        ranges_j: (Nc, 2) integer tensor, those of the Nc clusters of j.
        keep: (Mc, Nc) bool tensor (integers: nonzero means kept), on ranges_i's device.

    Returns:
        ``(ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)``: for a reduction over j
        (axis=1), the rows ranges_i[k] reduce over the j rows of ``redranges_j[slices_i[k-1]:slices_i[k]]``
        (slices_i[-1] read as 0), which lists ranges_j[l] for the kept l in increasing order; over i
        (axis=0), the same with the roles swapped. ranges_i and ranges_j are returned as given; slices_* are
        int64 cumulative counts of kept blocks, (Mc,) and (Nc,); redranges_* are (number kept, 2) in the
        dtype of the ranges they copy. Pass it as ``ranges=`` of a reduction or set ``K.ranges``.
    """
    what = "from_matrix"
    ranges_i, ranges_j = _ranges_arg(what, "ranges_i", ranges_i), _ranges_arg(what, "ranges_j", ranges_j)
    shape = (ranges_i.shape[0], ranges_j.shape[0])
    if not (isinstance(keep, torch.Tensor) and tuple(keep.shape) == shape):
        raise ValueError(f"{what}: keep must be an {shape} (clusters of i, of j) bool tensor, got {_desc(keep)}")
    if keep.is_floating_point() or keep.is_complex():
        raise TypeError(f"{what}: keep must be a bool tensor, got {_desc(keep)}")
    for name, t in (("ranges_j", ranges_j), ("keep", keep)):
        if t.device != ranges_i.device:
            raise ValueError(f"{what}: {name} is on {t.device} but ranges_i is on {ranges_i.device}")
    keep = keep != 0 if keep.dtype != torch.bool else keep
    kept_l = keep.nonzero()[:, 1]  # j-cluster of each kept pair, row by row (clusters of i in order)
    kept_k = keep.t().nonzero()[:, 1]  # i-cluster of each kept pair, column by column
    slices_i = torch.cumsum(keep.sum(dim=1), 0)
    slices_j = torch.cumsum(keep.sum(dim=0), 0)
    return ranges_i, slices_i, ranges_j[kept_l], ranges_j, slices_j, ranges_i[kept_k]


def swap_axes(ranges: Sequence[torch.Tensor] | None) -> tuple[torch.Tensor, ...] | None:
    """Swaps the i and j halves of a ``ranges`` 6-tuple (the ranges of the transposed reduction).

    Args:
        ranges: None, or ``(ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)``.

    Returns:
        None if ranges is None, else ``(ranges_j, slices_j, redranges_i, ranges_i, slices_i, redranges_j)``.
    """
    if ranges is None:
        return None
    if not (isinstance(ranges, (tuple, list)) and len(ranges) == 6):
        raise TypeError(f"swap_axes: ranges must be None or KeOps' 6-tuple of integer tensors, got {_desc(ranges)}")
    return (*ranges[3:6], *ranges[0:3])
