"""semiring_ops.lazy.cluster against pykeops.torch.cluster (KeOps 2.3): each helper's outputs (values and dtypes)
on random inputs; grid_cluster beyond KeOps' reach (any D, > 1024 cells per axis) against a brute-force
numbering of the cells; block-sparse reductions built from the helpers against the dense float64 reduction
restricted to the kept cluster pairs (values, argmin, gradients); bad inputs.
"""

from __future__ import annotations

import pytest
import torch

from semiring_ops.lazy import LazyTensor
from semiring_ops.lazy.cluster import (
    cluster_centroids,
    cluster_ranges,
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
    swap_axes,
)


@pytest.fixture(scope="module")
def pk():
    """pykeops.torch.cluster (pure PyTorch: nothing is compiled); the comparisons skip without pykeops."""
    return pytest.importorskip("pykeops.torch.cluster")


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, (a, b)
    assert torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, 0, 0, equal_nan=True)), (a, b)


def _cloud(m: int, d: int, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(m, d, generator=g, dtype=torch.float64) * 3 - 1).to(device=device, dtype=dtype)


# ---------------------------------------------------------------- the helpers against pykeops


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grid_cluster_matches_pykeops(pk, d, dtype):
    x = _cloud(700, d, dtype, seed=d)
    sides = torch.tensor([0.3, 0.11, 0.2][:d], dtype=dtype)
    for size in (0.25, 0.013, sides, sides.double(), torch.tensor(0.07)):
        _same(grid_cluster(x, size), pk.grid_cluster(x, size))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sort_clusters_matches_pykeops(pk, dtype):
    x = _cloud(400, 2, dtype, seed=1)
    lab = grid_cluster(x, 0.3)
    w = torch.rand(400, dtype=dtype)
    for points in (x, (x, w), [x, w, lab]):
        ours, theirs = sort_clusters(points, lab), pk.sort_clusters(points, lab)
        _same(ours[1], theirs[1])
        assert type(ours[0]) is type(theirs[0])
        many = isinstance(points, (tuple, list))
        for a, b in zip(ours[0] if many else [ours[0]], theirs[0] if many else [theirs[0]], strict=True):
            _same(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ranges_and_centroids_match_pykeops(pk, dtype):
    x = _cloud(600, 3, dtype, seed=2)
    lab = grid_cluster(x, 0.7)
    for ours, theirs in zip(cluster_ranges_centroids(x, lab), pk.cluster_ranges_centroids(x, lab), strict=True):
        _same(ours, theirs)
    w = torch.rand(600, dtype=dtype)
    w[::7] = 0.0  # clamped to min_weight
    ours, theirs = cluster_ranges_centroids(x, lab, weights=w), pk.cluster_ranges_centroids(x, lab, weights=w)
    for a, b in zip(ours, theirs, strict=True):
        _same(a, b)
    ours = cluster_ranges_centroids(x, lab, weights=w, min_weight=0.5)
    theirs = pk.cluster_ranges_centroids(x, lab, weights=w, min_weight=0.5)
    for a, b in zip(ours, theirs, strict=True):
        _same(a, b)
    # the single helpers, with their optional precomputed counts / weights
    counts = torch.bincount(lab).float()
    _same(cluster_ranges(lab), pk.cluster_ranges(lab))
    _same(cluster_ranges(lab, counts), pk.cluster_ranges(lab, counts))
    _same(cluster_centroids(x, lab), pk.cluster_centroids(x, lab))
    _same(cluster_centroids(x, lab, counts, weights=w), pk.cluster_centroids(x, lab, counts, weights=w))
    w_c = torch.bincount(lab, weights=w) * 2  # as given, not recomputed
    _same(cluster_centroids(x, lab, counts, w, w_c), pk.cluster_centroids(x, lab, counts, w, w_c))


def test_from_matrix_and_swap_axes_match_pykeops(pk):
    g = torch.Generator().manual_seed(3)
    for mc, nc, p in ((7, 5, 0.4), (6, 9, 0.0), (4, 3, 1.0), (1, 1, 1.0)):
        ranges_i = cluster_ranges(torch.randint(0, mc, (50,), generator=g), torch.full((mc,), 4.0))
        ranges_j = cluster_ranges(torch.randint(0, nc, (50,), generator=g), torch.full((nc,), 3.0))
        keep = torch.rand(mc, nc, generator=g) < p
        ours, theirs = from_matrix(ranges_i, ranges_j, keep), pk.from_matrix(ranges_i, ranges_j, keep)
        for a, b in zip(ours, theirs, strict=True):
            _same(a, b)
        for a, b in zip(swap_axes(ours), pk.swap_axes(theirs), strict=True):
            _same(a, b)
    assert swap_axes(None) is None and pk.swap_axes(None) is None


# ---------------------------------------------------------------- KeOps' documented examples (no pykeops needed)


def test_documented_examples():
    labels = grid_cluster(torch.tensor([[0.0], [0.1], [0.9], [0.05], [0.5]]), 0.2)
    _same(labels, torch.tensor([0, 0, 2, 0, 1], dtype=torch.int32))
    x, lab = torch.tensor([[0.0], [0.5], [1.0], [2.0], [3.0]]), torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    ranges, centroids, weights_c = cluster_ranges_centroids(x, lab)
    _same(ranges, torch.tensor([[0, 2], [2, 5]]))
    torch.testing.assert_close(centroids, torch.tensor([[0.25], [2.0]]))
    _same(weights_c, torch.tensor([2.0, 3.0]))
    w = torch.tensor([1.0, 0.5, 1.0, 1.0, 10.0])
    _, centroids, weights_c = cluster_ranges_centroids(x, lab, weights=w)
    torch.testing.assert_close(centroids, torch.tensor([[1 / 6], [2.75]]))
    _same(weights_c, torch.tensor([1.5, 12.0]))
    r_i, r_j = torch.tensor([[2, 5], [7, 12]]), torch.tensor([[1, 4], [4, 9], [20, 30]])
    keep = torch.tensor([[True, True, False], [False, True, False]])
    ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i = from_matrix(r_i, r_j, keep)
    assert ranges_i is r_i and ranges_j is r_j
    _same(slices_i, torch.tensor([2, 3]))
    _same(redranges_j, torch.tensor([[1, 4], [4, 9], [4, 9]]))
    _same(slices_j, torch.tensor([1, 3, 3]))
    _same(redranges_i, torch.tensor([[2, 5], [2, 5], [7, 12]]))


# ---------------------------------------------------------------- grid_cluster beyond KeOps' reach


def _brute_labels(x: torch.Tensor, size) -> torch.Tensor:
    """Each point's rank among the occupied cells in lexicographic order (Python sets and sorting)."""
    cells = [tuple(c) for c in ((x - x.min(0).values) / size).floor().long().tolist()]
    rank = {c: k for k, c in enumerate(sorted(set(cells)))}
    return torch.tensor([rank[c] for c in cells], dtype=torch.int32)


@pytest.mark.parametrize(
    ("d", "size"),
    [
        (5, 0.4),  # a dense table of the occupied cells
        (2, 1e-4),  # > 1024 cells per axis (KeOps' labels collide there); unique over one int64 key
        (7, 1e-4),  # more cells than one int64 key holds: unique over the cells' coordinate rows
    ],
)
def test_grid_cluster_any_dimension(device, d, size):
    x = _cloud(300, d, torch.float64, seed=d, device=device)
    labels = grid_cluster(x, size)
    assert labels.device == x.device
    _same(labels.cpu(), _brute_labels(x.cpu(), size))


def test_helpers_on_device(device):
    x = _cloud(200, 2, torch.float32, seed=4)
    xd = x.to(device)
    lab = grid_cluster(x, 0.5)
    _same(grid_cluster(xd, 0.5).cpu(), lab)
    for a, b in zip(cluster_ranges_centroids(xd, lab.to(device)), cluster_ranges_centroids(x, lab), strict=True):
        assert a.device == xd.device
        torch.testing.assert_close(a.cpu(), b)
    _, ls = sort_clusters(xd, lab.to(device))
    _same(ls.cpu(), torch.sort(lab).values)
    ranges = cluster_ranges(lab)
    keep = torch.rand(len(ranges), len(ranges)) < 0.5
    on_device = from_matrix(ranges.to(device), ranges.to(device), keep.to(device))
    for a, b in zip(on_device, from_matrix(ranges, ranges, keep), strict=True):
        _same(a.cpu(), b)


# ---------------------------------------------------------------- block-sparse reductions


@pytest.mark.parametrize("keep_kind", ["near", "random", "none", "all"])
def test_block_sparse_reduction_equals_masked_dense(device, keep_kind):
    """K = exp(-|x_i - y_j|^2 / s) with ranges from grid_cluster + cluster_ranges_centroids + from_matrix: its
    reductions equal the dense float64 ones over the pairs (i, j) whose clusters are kept, and nothing else."""
    x, y = _cloud(160, 2, torch.float64, seed=5, device=device), _cloud(120, 2, torch.float64, seed=6, device=device)
    x_lab, y_lab = grid_cluster(x, 0.6), grid_cluster(y, 0.8)
    x_ranges, x_cent, _ = cluster_ranges_centroids(x, x_lab)
    y_ranges, y_cent, _ = cluster_ranges_centroids(y, y_lab)
    (x, x_lab), (y, y_lab) = sort_clusters(x, x_lab), sort_clusters(y, y_lab)
    shape = (len(x_ranges), len(y_ranges))
    g = torch.Generator().manual_seed(7)
    keep = {
        "near": ((x_cent[:, None] - y_cent[None]) ** 2).sum(-1).cpu() < 1.0,
        "random": torch.rand(shape, generator=g) < 0.4,
        "none": torch.zeros(shape, dtype=torch.bool),
        "all": torch.ones(shape, dtype=torch.bool),
    }[keep_kind].to(device)
    if keep_kind in ("near", "random"):
        keep[0] = False  # a cluster of rows with nothing to reduce over
        assert 0 < int(keep.sum()) < keep.numel()
    ranges = from_matrix(x_ranges, y_ranges, keep)
    mask = keep[x_lab.long()][:, y_lab.long()]  # (M, N): the kept pairs of points

    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    b = torch.randn(120, 1, dtype=torch.float64, generator=g).to(device)
    a = torch.randn(160, 1, dtype=torch.float64, generator=g).to(device)
    d2 = ((LazyTensor(xg[:, None]) - LazyTensor(yg[None])) ** 2).sum(-1)
    k = (-d2 / 0.3).exp()
    d2_dense = ((xg[:, None] - yg[None]) ** 2).sum(-1)
    k_dense = torch.exp(-d2_dense / 0.3) * mask

    close = torch.testing.assert_close
    close(k.sum(1, ranges=ranges), k_dense.sum(1, keepdim=True))
    close(k.sum(0, ranges=ranges), k_dense.sum(0)[:, None])
    close(k.sum(1, ranges=tuple(r.int() for r in ranges)), k_dense.sum(1, keepdim=True))  # int32 ranges too
    close(k.T.sum(1, ranges=swap_axes(ranges)), k_dense.sum(0)[:, None])
    k.ranges = ranges  # KeOps' attribute form, used by @ (and swapped by .T)
    out, out_t = k @ b, k.T @ a
    close(out, k_dense @ b)
    close(out_t, k_dense.T @ a)
    grads = torch.autograd.grad((out**2).sum() + (out_t**3).sum(), [xg, yg])
    ref = torch.autograd.grad(((k_dense @ b) ** 2).sum() + ((k_dense.T @ a) ** 3).sum(), [xg, yg])
    close(grads, ref)

    with torch.no_grad():
        value, index = d2.min_argmin(1, ranges=ranges)
        masked = torch.where(mask, d2_dense, torch.inf)
        rows = mask.any(1)
        close(value[:, 0], masked.min(1).values)  # +inf on rows with nothing kept
        _same(index[rows, 0], masked[rows].argmin(1))


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs():
    x = torch.rand(10, 2)
    lab = torch.zeros(10, dtype=torch.int64)
    r = torch.tensor([[0, 10]])
    cases = [
        (lambda: grid_cluster(x.numpy(), 0.1), TypeError, r"grid_cluster: x must be an \(M, D\) floating"),
        (lambda: grid_cluster(torch.rand(10), 0.1), TypeError, r"x must be .* got a tensor of shape \(10,\)"),
        (lambda: grid_cluster(torch.ones(4, 2, dtype=torch.int64), 0.1), TypeError, "floating-point"),
        (lambda: grid_cluster(torch.zeros(3, 0), 0.1), ValueError, "at least one coordinate"),
        (lambda: grid_cluster(x, 0.0), ValueError, "size must be positive"),
        (lambda: grid_cluster(x, -1.0), ValueError, "size must be positive"),
        (lambda: grid_cluster(x, "0.1"), TypeError, "size must be a float"),
        (lambda: grid_cluster(x, torch.ones(3)), ValueError, r"size must be a float or a \(2,\) tensor"),
        (lambda: grid_cluster(torch.tensor([[0.0], [float("nan")]]), 0.1), ValueError, "non-finite"),
        (lambda: grid_cluster(x, 1e-300), ValueError, "too small"),
        (lambda: sort_clusters(x, lab[:5]), ValueError, r"sort_clusters: x must be an \(M, \.\.\.\) tensor with M = 5"),
        (lambda: sort_clusters((x, x[:3]), lab), ValueError, r"x\[1\] must be"),
        (lambda: sort_clusters(x, lab.float()), TypeError, "lab must be an"),
        (lambda: cluster_ranges(lab.float()), TypeError, r"cluster_ranges: lab must be an \(M,\) integer"),
        (lambda: cluster_ranges(lab - 1), ValueError, "non-negative"),
        (lambda: cluster_ranges(lab, torch.tensor([2.5])), ValueError, "whole counts"),
        (lambda: cluster_ranges(lab + 3, torch.ones(2)), ValueError, "label 3 but Nlab has 2 clusters"),
        (lambda: cluster_centroids(x, lab[:4]), ValueError, "lab has 4 labels but x has 10 points"),
        (lambda: cluster_centroids(x, lab, weights=torch.ones(3)), ValueError, "weights must be"),
        (
            lambda: cluster_centroids(x, lab, weights=torch.ones(10), weights_c=torch.ones(2)),
            ValueError,
            "weights_c has 2 clusters",
        ),
        (
            lambda: cluster_ranges_centroids(x, lab, weights=torch.ones(10, dtype=torch.int64)),
            ValueError,
            "floating-point tensor of 10 weights",
        ),
        (lambda: cluster_ranges_centroids(x, lab, weights=torch.ones(10), min_weight="0"), TypeError, "min_weight"),
        (
            lambda: from_matrix(r.float(), r, torch.ones(1, 1, dtype=torch.bool)),
            TypeError,
            r"from_matrix: ranges_i must be a \(C, 2\) integer",
        ),
        (lambda: from_matrix(r, r[0], torch.ones(1, 1, dtype=torch.bool)), TypeError, "ranges_j must be"),
        (lambda: from_matrix(r, r, torch.ones(2, 1, dtype=torch.bool)), ValueError, r"keep must be an \(1, 1\)"),
        (lambda: from_matrix(r, r, torch.ones(1, 1)), TypeError, "keep must be a bool tensor"),
        (lambda: swap_axes((r, r)), TypeError, "6-tuple"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


def test_empty_and_integer_masks():
    _same(grid_cluster(torch.zeros(0, 3), 0.1), torch.zeros(0, dtype=torch.int32))
    r_i, r_j = torch.tensor([[0, 2], [2, 3]]), torch.tensor([[0, 1], [1, 4]])
    as_bool = from_matrix(r_i, r_j, torch.tensor([[True, False], [True, True]]))
    as_int = from_matrix(r_i, r_j, torch.tensor([[1, 0], [1, 1]], dtype=torch.uint8))
    for a, b in zip(as_bool, as_int, strict=True):
        _same(a, b)
