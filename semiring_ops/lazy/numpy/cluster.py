"""Clustering helpers for block-sparse reductions on NumPy arrays: KeOps's ``pykeops.numpy.cluster``.

    from semiring_ops.lazy.numpy.cluster import grid_cluster, cluster_ranges_centroids, sort_clusters, from_matrix

Conversions over semiring_ops.lazy.cluster (the torch helpers): the arrays go in as tensors sharing their memory
and come out as arrays, in the dtypes of ``pykeops.numpy.cluster`` (labels and ranges int64, centroids in the
points' dtype, cluster weights float64). Where KeOps's NumPy helpers and its torch ones differ, these follow
the NumPy ones:

- ``grid_cluster``: the cells are anchored at 0 (cell ``floor(x / size)``), not at the points' minimum;
- centroids and cluster weights are computed in float64 and rounded to the points' dtype once, as NumPy's
  ``bincount`` does; ``cluster_ranges_centroids`` takes no ``min_weight`` (weights are not clamped).

``sort_clusters`` is NumPy's own (np.argsort, as KeOps's): the order within a cluster is part of the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from .. import cluster as _cluster
from .lazy_tensor import _tensor

__all__ = [
    "cluster_centroids",
    "cluster_ranges",
    "cluster_ranges_centroids",
    "from_matrix",
    "grid_cluster",
    "sort_clusters",
    "swap_axes",
]

Points = TypeVar("Points", np.ndarray, tuple, list)


def _desc(x: Any) -> str:
    return f"an array of shape {x.shape}, {x.dtype}" if isinstance(x, np.ndarray) else f"a {type(x).__name__}"


def _t(x: Any, what: str, name: str) -> Any:
    """An array argument as a tensor sharing its memory; None and numbers as they are."""
    if x is None or isinstance(x, (int, float)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what}: {name} must be a NumPy array, got {_desc(x)}")
    return _tensor(x)


def _float64(x: Any, what: str, name: str) -> Any:
    """A floating-point array argument as a float64 tensor (None as None)."""
    if x is None:
        return None
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what}: {name} must be a NumPy array, got {_desc(x)}")
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _a(t: torch.Tensor, dtype: Any) -> np.ndarray:
    return t.numpy().astype(dtype, copy=False)


def grid_cluster(x: np.ndarray, size: float | np.ndarray) -> np.ndarray:
    """Labels the points by the cell of side ``size`` of the grid anchored at 0 that holds them.

    Args:
        x: (M, D) floating-point array, the points.
        size: positive float, or (D,) array, the cells' side lengths.

    Returns:
        (M,) int64 array of labels in [0, C) for the C occupied cells, numbered in the lexicographic order of
        the cells' integer coordinates ``floor(x / size)`` (KeOps's numbering).
    """
    if not (isinstance(x, np.ndarray) and x.ndim == 2 and np.issubdtype(x.dtype, np.floating)):
        raise TypeError(f"grid_cluster: x must be an (M, D) floating-point array, got {_desc(x)}")
    cells = np.floor(x / size)  # integer-valued: the torch helper's grid of side 1 from their minimum is exact
    return _a(_cluster.grid_cluster(torch.from_numpy(cells), 1.0), int)


def sort_clusters(x: Points, lab: np.ndarray) -> tuple[Points, np.ndarray]:
    """The points (an (M, ...) array, or a tuple / list of them) and their labels (M elements) sorted by label, so
    that each cluster is contiguous.

    The order is ``np.argsort(lab.ravel())``'s, as KeOps's NumPy helper: the sort is not stable, and the order
    within a cluster decides which row of the sorted points meets which row of an array drawn afterwards (the
    tutorials' ``b``), so another order gives other numbers (the torch helper's torch.sort orders them otherwise).
    """
    what = "sort_clusters"
    if not (isinstance(lab, np.ndarray) and np.issubdtype(lab.dtype, np.integer)):
        raise TypeError(f"{what}: lab must be an integer array of labels, got {_desc(lab)}")
    perm = np.argsort(lab.ravel())
    many = isinstance(x, (tuple, list))
    for k, a in enumerate(x if many else [x]):
        if not (isinstance(a, np.ndarray) and a.ndim >= 1 and a.shape[0] == perm.shape[0]):
            name = f"x[{k}]" if many else "x"
            raise ValueError(f"{what}: {name} must be an (M, ...) array with M = {perm.shape[0]}, got {_desc(a)}")
    return (type(x)(a[perm] for a in x) if many else x[perm]), lab.ravel()[perm]


def cluster_ranges(lab: np.ndarray, Nlab: np.ndarray | None = None) -> np.ndarray:
    """(C, 2) int64 [start, end) rows of each label's cluster in points sorted by :func:`sort_clusters`, for
    (M,) integer labels in [0, C) (Nlab: optional (C,) counts per label)."""
    what = "cluster_ranges"
    return _a(_cluster.cluster_ranges(_t(lab, what, "lab"), _t(Nlab, what, "Nlab")), int)


def cluster_centroids(
    x: np.ndarray,
    lab: np.ndarray,
    Nlab: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    weights_c: np.ndarray | None = None,
) -> np.ndarray:
    """(C, D) (weighted) barycentres of the clusters of the (M, D) points x with (M,) labels lab, in x's dtype:
    c_k = sum_{lab_i = k} w_i x_i / sum_{lab_i = k} w_i (Nlab: optional (C,) counts; weights: optional (M,)
    w_i, 1 if None; weights_c: optional (C,) total weights)."""
    what = "cluster_centroids"
    got = _cluster.cluster_centroids(
        _float64(x, what, "x"),
        _t(lab, what, "lab"),
        _float64(Nlab, what, "Nlab"),
        _float64(weights, what, "weights"),
        _float64(weights_c, what, "weights_c"),
    )
    return _a(got, x.dtype)


def cluster_ranges_centroids(
    x: np.ndarray, lab: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`cluster_ranges` and :func:`cluster_centroids` of the (M, D) points x with (M,) labels lab (weights:
    optional (M,) positive weights), with the (C,) float64 total weight of each cluster (its number of points
    without weights): ranges (C, 2) int64, centroids (C, D) in x's dtype, weights (C,) float64."""
    what = "cluster_ranges_centroids"
    ranges, centroids, total = _cluster.cluster_ranges_centroids(
        _float64(x, what, "x"), _t(lab, what, "lab"), _float64(weights, what, "weights"), min_weight=-np.inf
    )
    return _a(ranges, int), _a(centroids, x.dtype), _a(total, np.float64)


def from_matrix(
    ranges_i: np.ndarray, ranges_j: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """KeOps's ``ranges`` 6-tuple (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i), int64 arrays,
    of the (Mc, 2) and (Nc, 2) cluster rows ranges_i, ranges_j and the (Mc, Nc) bool mask ``keep`` of the pairs
    of clusters that interact (see semiring_ops.lazy.cluster.from_matrix)."""
    what = "from_matrix"
    got = _cluster.from_matrix(_t(ranges_i, what, "ranges_i"), _t(ranges_j, what, "ranges_j"), _t(keep, what, "keep"))
    return tuple(_a(t, np.int64) for t in got)


def swap_axes(ranges: Sequence[np.ndarray] | None) -> tuple[np.ndarray, ...] | None:
    """The ``ranges`` 6-tuple of the transposed reduction: its i and j halves swapped (None stays None)."""
    return _cluster.swap_axes(ranges)
