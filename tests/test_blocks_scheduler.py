"""The block scheduler (semiring_ops.blocks.scheduler): bands, tiling, triangle modes, the memory, hint and
SM rules, the dispatch order, the condensed layout against scipy, and its errors."""

from __future__ import annotations

import ast
import inspect
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist, squareform

from semiring_ops.blocks import (
    BlockGrid,
    condensed_index,
    condensed_row_start,
    condensed_size,
    plan_blocks,
    scheduler,
    split_bands,
)


def _check_bands(bands: tuple[tuple[int, int], ...], extent: int) -> None:
    """Bands cover [0, extent) in order, once, without gaps; sizes differ by at most one, the longer first."""
    if extent == 0:
        assert bands == ()
        return
    assert bands[0][0] == 0 and bands[-1][1] == extent
    for (_, stop), (start, _) in itertools.pairwise(bands):
        assert stop == start
    sizes = [b - a for a, b in bands]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def _check_order(grid: BlockGrid) -> None:
    """Blocks are listed largest work first (ties in band order), each index its position."""
    keys = [(-b.work, b.row_band, b.col_band) for b in grid.blocks]
    assert keys == sorted(keys)
    assert [b.index for b in grid.blocks] == list(range(len(grid.blocks)))
    for b in grid.blocks:
        assert (b.r0, b.r1) == grid.row_bands[b.row_band] and (b.c0, b.c1) == grid.col_bands[b.col_band]


def _side_mask(n: int, triangle: str, diagonal: bool) -> np.ndarray:
    """The cells (r, c) of an n x n output that a triangle mode computes (numpy's own tril / triu)."""
    ones = np.ones((n, n), dtype=bool)
    if triangle == "lower":
        return np.tril(ones, 0 if diagonal else -1)
    return np.triu(ones, 0 if diagonal else 1)


# bands


@given(st.integers(1, 10**7), st.data())
def test_split_bands_cover_extent_once(extent, data):
    count = data.draw(st.integers(1, min(extent, 5000)))
    bands = split_bands(extent, count)
    assert len(bands) == count
    _check_bands(bands, extent)


@pytest.mark.parametrize(
    ("extent", "count", "expected"),
    [
        (0, 0, ()),
        (1, 1, ((0, 1),)),
        (5, 5, ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))),
        (7, 3, ((0, 3), (3, 5), (5, 7))),
        (9, 3, ((0, 3), (3, 6), (6, 9))),
        (10, 4, ((0, 3), (3, 6), (6, 8), (8, 10))),
    ],
)
def test_split_bands_edges(extent, count, expected):
    assert split_bands(extent, count) == expected


@pytest.mark.parametrize(("extent", "count"), [(5, 6), (5, 0), (0, 1)])
def test_split_bands_refuses_bad_count(extent, count):
    with pytest.raises(ValueError, match="count="):
        split_bands(extent, count)


# full grids


@given(
    m=st.integers(0, 40),
    n=st.integers(0, 40),
    d=st.integers(1, 3),
    budget=st.integers(16 * 3, 40 * 40 * 16 * 3 * 4),
    sm_count=st.integers(1, 8),
    rows_per_sm=st.integers(1, 4),
    blocks_per_gpu=st.integers(1, 40),
)
def test_full_grid_tiles_every_cell_once(m, n, d, budget, sm_count, rows_per_sm, blocks_per_gpu):
    grid = plan_blocks(
        m, n, value_dim=d, elem_bytes=4, max_device_bytes=budget, sm_count=sm_count, rows_per_sm=rows_per_sm,
        blocks_per_gpu=blocks_per_gpu,
    )  # fmt: skip
    empty = m * n == 0  # an empty output has no bands either way
    _check_bands(grid.row_bands, 0 if empty else m)
    _check_bands(grid.col_bands, 0 if empty else n)
    count = np.zeros((m, n), dtype=np.int64)
    for b in grid.blocks:
        count[b.r0 : b.r1, b.c0 : b.c1] += 1
        assert b.work == b.rows * b.cols and not b.on_diagonal
        assert grid.block_output_bytes(b) <= budget // 4
    assert (count == 1).all()
    assert len(grid.blocks) == len(grid.row_bands) * len(grid.col_bands)
    assert grid.covered_cells == grid.output_cells == m * n
    _check_order(grid)


@given(m=st.integers(1, 10**7), n=st.integers(1, 10**7), gib=st.integers(1, 80), sm_count=st.integers(1, 144))
def test_full_grid_tiles_big_outputs(m, n, gib, sm_count):
    grid = plan_blocks(m, n, value_dim=2, elem_bytes=4, free_bytes=gib << 30, sm_count=sm_count)
    _check_bands(grid.row_bands, m)
    _check_bands(grid.col_bands, n)
    pairs = [(b.row_band, b.col_band) for b in grid.blocks]
    assert sorted(pairs) == list(itertools.product(range(len(grid.row_bands)), range(len(grid.col_bands))))
    assert sum(b.rows * b.cols for b in grid.blocks) == m * n == grid.covered_cells
    assert max(grid.block_output_bytes(b) for b in grid.blocks) <= grid.budget_bytes // 4
    _check_order(grid)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 10**6), (10**6, 1), (3, 5000), (5000, 3)])
def test_thin_outputs(m, n):
    grid = plan_blocks(m, n, free_bytes=1 << 30, sm_count=4, rows_per_sm=1)
    _check_bands(grid.row_bands, m)
    _check_bands(grid.col_bands, n)
    assert grid.covered_cells == m * n
    if m <= 3:
        assert len(grid.row_bands) == 1  # a band never splits below the SM floor (4 rows) without need
    if n <= 3:
        assert len(grid.col_bands) == 1
    assert len(grid.blocks) <= 32


@pytest.mark.parametrize(("m", "n", "triangle"), [(0, 0, None), (0, 7, None), (7, 0, None), (0, 0, "lower")])
def test_empty_outputs_have_no_blocks(m, n, triangle):
    grid = plan_blocks(m, n, free_bytes=1 << 30, sm_count=1, triangle=triangle)
    assert grid.blocks == () and grid.row_bands == () and grid.col_bands == ()
    assert grid.covered_cells == grid.output_cells == 0


# triangle modes


@given(
    n=st.integers(0, 40),
    triangle=st.sampled_from(["lower", "upper"]),
    diagonal=st.booleans(),
    budget=st.integers(16, 40 * 40 * 4 * 4),
    blocks_per_gpu=st.integers(1, 40),
)
def test_triangle_covers_each_pair_once(n, triangle, diagonal, budget, blocks_per_gpu):
    grid = plan_blocks(
        n, n, max_device_bytes=budget, sm_count=1, rows_per_sm=1, blocks_per_gpu=blocks_per_gpu,
        triangle=triangle, diagonal=diagonal,
    )  # fmt: skip
    assert grid.row_bands == grid.col_bands
    _check_bands(grid.row_bands, n)
    side = _side_mask(n, triangle, diagonal)
    count = np.zeros((n, n), dtype=np.int64)
    for b in grid.blocks:
        assert b.on_diagonal == (b.row_band == b.col_band)
        cells = np.zeros((n, n), dtype=bool)
        cells[b.r0 : b.r1, b.c0 : b.c1] = True
        if b.on_diagonal:
            cells &= side  # the kernel of a diagonal block writes only its side
        count += cells
        assert b.work == cells.sum() > 0
    assert (count == side).all()  # every cell of the side once, none of the other side
    assert grid.covered_cells == grid.output_cells == side.sum() == condensed_size(n, diagonal)
    k = len(grid.row_bands)
    skipped = 0 if diagonal else sum(1 for a, b in grid.row_bands if b - a == 1)  # 1 x 1 blocks: no pairs
    assert len(grid.blocks) == k * (k + 1) // 2 - skipped
    _check_order(grid)


def test_triangle_big_counts_band_pairs():
    n = 10**6
    grid = plan_blocks(n, n, free_bytes=1 << 30, sm_count=132, triangle="upper")
    k = len(grid.row_bands)
    assert k > 8  # 1 GiB forces many bands
    assert len(grid.blocks) == k * (k + 1) // 2
    assert all(b.row_band <= b.col_band for b in grid.blocks)
    assert grid.covered_cells == n * (n - 1) // 2


def test_triangle_order_is_by_work():
    # bands (3, 2): row-major order would be (0,0) work 3, (1,0) work 6, (1,1) work 1
    grid = plan_blocks(5, 5, max_device_bytes=4 * 4 * 9, sm_count=1, blocks_per_gpu=1, triangle="lower")
    assert grid.row_bands == ((0, 3), (3, 5))
    assert [(b.row_band, b.col_band, b.work, b.on_diagonal) for b in grid.blocks] == [
        (1, 0, 6, False),
        (0, 0, 3, True),
        (1, 1, 1, True),
    ]


def test_full_order_is_by_work():
    # bands (2, 2, 1) both ways: row-major works 4 4 2 4 4 2 2 2 1
    grid = plan_blocks(5, 5, max_device_bytes=4 * 4 * 4, sm_count=1, blocks_per_gpu=1)
    assert grid.row_bands == ((0, 2), (2, 4), (4, 5))
    works = [b.work for b in grid.blocks]
    assert works == [4, 4, 4, 4, 2, 2, 2, 2, 1]
    assert [(b.row_band, b.col_band) for b in grid.blocks[4:8]] == [(0, 2), (1, 2), (2, 0), (2, 1)]


# the memory rule


def test_budget_from_free_and_override():
    assert plan_blocks(4, 4, free_bytes=1000, sm_count=1).budget_bytes == 800
    assert plan_blocks(4, 4, free_bytes=1000, max_device_bytes=500, sm_count=1).budget_bytes == 500
    assert plan_blocks(4, 4, free_bytes=1000, max_device_bytes=900, sm_count=1).budget_bytes == 800
    assert plan_blocks(4, 4, max_device_bytes=900, sm_count=1).budget_bytes == 900


def test_output_rule_boundary():
    # 1000 x 1000 floats; a quarter of 160,000 bytes holds exactly 100 x 100 cells
    kw = dict(sm_count=1, rows_per_sm=1)
    assert len(plan_blocks(1000, 1000, free_bytes=1 << 30, **kw).blocks) == 25  # the hint alone: 5 x 5
    grid = plan_blocks(1000, 1000, max_device_bytes=160_000, **kw)
    assert grid.side_limit == 100 and len(grid.blocks) == 100
    assert max(grid.block_output_bytes(b) for b in grid.blocks) == 160_000 // 4
    grid = plan_blocks(1000, 1000, max_device_bytes=159_999, **kw)  # one byte less: 99 x 99 fits, 100 x 100 not
    assert grid.side_limit == 99 and len(grid.blocks) == 11 * 11
    assert max(grid.block_output_bytes(b) for b in grid.blocks) <= 159_999 // 4


def test_operand_rule():
    # output quarter: 100,000 bytes (158 x 158 floats); operand half: 200,000 bytes = s x 1000 + s x 1000
    grid = plan_blocks(
        1000, 1000, max_device_bytes=400_000, sm_count=1, rows_per_sm=1, operand_row_bytes=1000,
        operand_col_bytes=1000,
    )  # fmt: skip
    assert grid.side_limit == 100 and len(grid.blocks) == 100
    assert max(grid.block_operand_bytes(b) for b in grid.blocks) <= grid.operand_cap_bytes == 200_000
    assert plan_blocks(1000, 1000, max_device_bytes=400_000, sm_count=1, rows_per_sm=1).side_limit == 158


@given(
    m=st.integers(1, 5000),
    n=st.integers(1, 5000),
    d=st.integers(1, 4),
    budget=st.integers(1024, 10**8),
    row_bytes=st.integers(0, 64),
)
def test_side_limit_is_the_largest_that_fits(m, n, d, budget, row_bytes):
    grid = plan_blocks(
        m, n, value_dim=d, max_device_bytes=budget, sm_count=1, rows_per_sm=1, operand_row_bytes=row_bytes,
        operand_col_bytes=row_bytes,
    )  # fmt: skip

    def fits(s):
        h, w = min(s, m), min(s, n)
        return h * w * d * 4 <= budget // 4 and (h + w) * row_bytes <= budget // 2

    assert fits(grid.side_limit)
    assert grid.side_limit == max(m, n) or not fits(grid.side_limit + 1)
    for b in grid.blocks:
        assert b.rows <= grid.side_limit and b.cols <= grid.side_limit
        assert grid.block_output_bytes(b) <= budget // 4
        assert grid.block_operand_bytes(b) <= budget // 2


def test_smaller_budget_forces_more_blocks():
    counts = [
        len(plan_blocks(20_000, 30_000, value_dim=2, max_device_bytes=mb << 20, sm_count=132).blocks)
        for mb in (64, 256, 1024, 8192)
    ]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    assert counts[-1] <= 32  # no memory pressure: the hint


# the hint and the SM floor


@pytest.mark.parametrize(("n_gpus", "bands"), [(1, 5), (2, 8), (4, 11)])
def test_hint_scales_with_gpus(n_gpus, bands):
    # the smallest side with at most 32 * n_gpus blocks: ceil(10000 / s)^2 <= 32, 64, 128
    grid = plan_blocks(10_000, 10_000, free_bytes=80 << 30, sm_count=1, rows_per_sm=1, n_gpus=n_gpus)
    assert len(grid.row_bands) == len(grid.col_bands) == bands
    assert len(grid.blocks) == bands * bands <= 32 * n_gpus


def test_sm_floor():
    kw = dict(free_bytes=80 << 30, sm_count=132, rows_per_sm=8)  # min_side 1056
    grid = plan_blocks(4000, 4000, **kw)
    assert grid.min_side == 1056
    assert grid.hint_side == 800  # the hint alone: 5 bands of 800
    assert grid.row_bands == ((0, 1334), (1334, 2667), (2667, 4000))  # the floor: 4000 // 1056 = 3 bands
    assert len(plan_blocks(1000, 1000, **kw).blocks) == 1  # shorter than the floor: one band
    # memory wins over the floor: 160,000 bytes allow 100 x 100 blocks
    grid = plan_blocks(1000, 1000, max_device_bytes=160_000, sm_count=132, rows_per_sm=8)
    assert len(grid.row_bands) == 10


@given(extent=st.integers(1, 10**6), sm_count=st.integers(1, 200), rows_per_sm=st.integers(1, 64))
def test_bands_meet_the_floor_without_memory_pressure(extent, sm_count, rows_per_sm):
    grid = plan_blocks(extent, extent, free_bytes=80 << 30, sm_count=sm_count, rows_per_sm=rows_per_sm)
    assert grid.side_limit >= min(extent, grid.min_side)  # 80 GiB: memory never binds here
    shortest = min(b - a for a, b in grid.row_bands)
    assert shortest >= min(extent, sm_count * rows_per_sm)


# the condensed layout


@given(n=st.integers(0, 12), d=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_condensed_index_matches_pdist(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d))
    dense = squareform(pdist(x)) if n > 1 else np.zeros((n, n))
    v = np.full(condensed_size(n), np.nan)
    for i, j in itertools.combinations(range(n), 2):
        assert np.isnan(v[condensed_index(i, j, n)])
        v[condensed_index(i, j, n)] = dense[i, j]
    np.testing.assert_array_equal(v, pdist(x))
    if n > 1:
        np.testing.assert_array_equal(squareform(v), dense)


@given(n=st.integers(0, 12), seed=st.integers(0, 2**31 - 1))
def test_condensed_index_with_diagonal(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 2))
    dense = squareform(pdist(x)) if n > 1 else np.zeros((n, n))
    rows, cols = np.triu_indices(n)  # pairs i <= j, row-major, the diagonal first in each row
    positions = [condensed_index(int(i), int(j), n, diagonal=True) for i, j in zip(rows, cols, strict=True)]
    assert positions == list(range(condensed_size(n, diagonal=True)))
    v = np.zeros(condensed_size(n, diagonal=True))
    v[positions] = dense[rows, cols] + 7.0 * (rows == cols)
    diag = [condensed_index(i, i, n, diagonal=True) for i in range(n)]
    np.testing.assert_array_equal(v[diag], np.full(n, 7.0))
    np.testing.assert_array_equal(np.delete(v, diag), pdist(x))


@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_condensed_row_start(n, diagonal):
    first = 0 if diagonal else 1
    starts = [condensed_row_start(i, n, diagonal) for i in range(n + 1)]
    assert starts[0] == 0 and starts[n] == condensed_size(n, diagonal)
    for i in range(n):
        assert starts[i + 1] - starts[i] == n - i - first  # the row's entries
        if i + first < n:
            assert starts[i] == condensed_index(i, i + first, n, diagonal)


def test_condensed_sizes():
    assert [condensed_size(n) for n in range(5)] == [0, 0, 1, 3, 6]
    assert [condensed_size(n, diagonal=True) for n in range(5)] == [0, 1, 3, 6, 10]


# errors


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(m=-1), "m=-1"),
        (dict(n=-3), "n=-3"),
        (dict(m=2.5), "m=2.5"),
        (dict(value_dim=0), "value_dim=0"),
        (dict(elem_bytes=0), "elem_bytes=0"),
        (dict(sm_count=0), "sm_count=0"),
        (dict(n_gpus=0), "n_gpus=0"),
        (dict(blocks_per_gpu=-1), "blocks_per_gpu=-1"),
        (dict(rows_per_sm=0), "rows_per_sm=0"),
        (dict(operand_row_bytes=-1), "operand_row_bytes=-1"),
        (dict(max_device_bytes=0), "max_device_bytes=0"),
        (dict(max_device_bytes=-5), "max_device_bytes=-5"),
        (dict(free_bytes=0, max_device_bytes=None), "free_bytes=0"),
        (dict(free_bytes=None, max_device_bytes=None), "free_bytes or max_device_bytes"),
        (dict(max_device_bytes=15), "max_device_bytes: a budget of 15 bytes is too small"),  # 15 // 4 < 4
        (dict(free_bytes=19, max_device_bytes=None), "free_bytes: a budget of 15 bytes is too small"),
        (dict(max_device_bytes=1000, operand_row_bytes=300, operand_col_bytes=201), "max_device_bytes: a budget"),
        (dict(triangle="both"), "triangle='both'"),
        (dict(triangle="lower", n=9), "triangle='lower' needs a square output, got m=8, n=9"),
        (dict(diagonal=True), "diagonal=True needs a triangle mode"),
    ],
)
def test_plan_errors_name_the_argument(kwargs, name):
    args = dict(m=8, n=8, max_device_bytes=1 << 20, sm_count=4) | kwargs
    with pytest.raises(ValueError, match=name.replace("(", r"\(").replace(".", r"\.")):
        plan_blocks(**args)


def test_budget_that_fits_one_cell_is_accepted():
    grid = plan_blocks(3, 3, max_device_bytes=16, sm_count=1)  # 16 // 4 = one float
    assert len(grid.blocks) == 9 and grid.side_limit == 1


@pytest.mark.parametrize(
    ("args", "name"),
    [((2, 1, 5), "i=2, j=1"), ((1, 1, 5), "i=1, j=1"), ((1, 5, 5), "j=5"), ((-1, 2, 5), "i=-1"), ((0, 1, -2), "n=-2")],
)
def test_condensed_index_errors(args, name):
    with pytest.raises(ValueError, match=name):
        condensed_index(*args)


def test_condensed_index_diagonal_errors():
    assert condensed_index(1, 1, 5, diagonal=True) == 5
    with pytest.raises(ValueError, match="i=2, j=1"):
        condensed_index(2, 1, 5, diagonal=True)
    with pytest.raises(ValueError, match="i=6"):
        condensed_row_start(6, 5)


def test_scheduler_imports_no_torch():
    # planning takes the device's numbers as arguments: the module never asks a device
    tree = ast.parse(inspect.getsource(scheduler))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "torch"]


@settings(deadline=None, max_examples=40)
@given(
    m=st.integers(1, 3000),
    n=st.integers(1, 3000),
    budget=st.integers(2_000, 50_000_000),
    sm=st.integers(1, 40),
)
def test_full_rows_cuts_whole_rows_when_they_fit(m, n, budget, sm):
    grid = plan_blocks(m, n, max_device_bytes=budget, sm_count=sm, rows_per_sm=2, full_rows=True)
    plain = plan_blocks(m, n, max_device_bytes=budget, sm_count=sm, rows_per_sm=2)
    _check_bands(grid.row_bands, m)
    _check_bands(grid.col_bands, n)
    whole = min(m, sm * 2) * n * 4 <= budget // 4
    if not whole:  # a band of whole rows at the SM floor does not fit: rules 1-6 alone
        assert grid.blocks == plain.blocks
        return
    assert grid.col_bands == ((0, n),)
    assert all(b.rows * n * 4 <= budget // 4 for b in grid.blocks)  # rule 1 holds
    assert len(grid.row_bands) <= max(-(-m // max(1, (budget // 4) // (n * 4))), plain.target_blocks, 1)
    assert grid.covered_cells == m * n


def test_full_rows_for_the_h100_run():
    # the benchmark's 150,000 x 150,000 fp32 output on an H100 (80 GB free, 132 SMs): 32 bands of whole rows
    grid = plan_blocks(150_000, 150_000, free_bytes=80 * 10**9, sm_count=132, full_rows=True)
    assert len(grid.blocks) == 32 and grid.col_bands == ((0, 150_000),)
    assert grid.row_bands[0] == (0, 4688) and grid.row_bands[-1] == (145_313, 150_000)
    # a triangle mode keeps its square grid
    tri = plan_blocks(1000, 1000, max_device_bytes=10**6, sm_count=4, triangle="upper", full_rows=True)
    assert tri.col_bands == tri.row_bands
