"""The CPU's distance blocks in C++ (semiring_ops/lazy/distance_blocks.py): squared distances summed directly,
against float64; the GEMM route's completion of a block (the norms added to the GEMM's -2 x.y), against the rule
written in torch: the cells below 1 / GRAM_CANCEL of |x|^2 + |y|^2 (NaN included) summed again from the variables
in float64 to within rounding, every other cell the GEMM's product plus the norms bit for bit. Fresh random shapes
whose column counts straddle the kernels' groups of lanes, with and without weights, with non-contiguous inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.lazy.codegen import GRAM_CANCEL
from semiring_ops.lazy.distance_blocks import complete_distances, squared_distances

pytestmark = pytest.mark.usefixtures("compiled")


# a block's shape, dtype, weights and seed; column counts straddle the kernels' groups of 8 and 16 lanes
BLOCKS = {
    "rows": st.integers(0, 40),
    "cols": st.sampled_from([0, 1, 7, 8, 9, 15, 16, 17, 33, 100]),
    "dim": st.integers(1, 9),
    "dtype": st.sampled_from([torch.float32, torch.float64]),
    "weighted": st.booleans(),
    "seed": st.integers(0, 2**31 - 1),
}


def _exact(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """The squared distances in float64, by broadcasting."""
    return ((x.double()[:, None, :] - y.double()[None, :, :]) ** 2 * (w.double() if w is not None else 1.0)).sum(-1)


def _block(rows: int, cols: int, dim: int, dtype: torch.dtype, seed: int, weighted: bool):
    """A block as gemm_route.block_gram makes it: near-duplicate rows (so that some cells cancel) beside far ones."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.randn(cols, dim, generator=g, dtype=torch.float64) + 3).to(dtype)
    pick = torch.randint(0, max(cols, 1), (rows,), generator=g)
    x = y[pick] if cols else torch.zeros(rows, dim, dtype=dtype)
    x = (x + 1e-3 * torch.randn(rows, dim, generator=g, dtype=torch.float64).to(dtype)).to(dtype)
    x[::3] += 7  # rows with no cancelling cell
    w = (torch.rand(dim, generator=g, dtype=torch.float64) + 0.5).to(dtype) if weighted else None
    ones = w if w is not None else 1.0
    shift = y.mean(0) if cols else torch.zeros(dim, dtype=dtype)
    xs, ys = x - shift, y - shift
    nx, ny = (xs * xs * ones).sum(1), (ys * ys * ones).sum(1)
    product = (xs * ones) @ (-2 * ys).t()  # the GEMM's part, as block_gram gives it
    return product.contiguous(), x, y, nx, ny, w


@settings(max_examples=25, deadline=None)
@given(**BLOCKS)
def test_the_norms_are_added_and_cancelled_cells_summed_again(rows, cols, dim, dtype, weighted, seed):
    values, x, y, nx, ny, w = _block(rows, cols, dim, dtype, seed, weighted)
    if rows and cols:
        values[0, 0] = float("nan")  # NaN fails the comparison: summed again
    total = nx[:, None] + ny[None, :]
    before = values + total
    cancels = ~(before >= total / GRAM_CANCEL)
    # x non-contiguous (a column slice of a wider tensor), as a block of rows of a strided variable is
    x_wide = torch.cat([x, x], 1)
    complete_distances(values, x_wide[:, :dim], y, nx, ny, w)
    exact = _exact(x, y, w)
    assert torch.equal(values[~cancels], before[~cancels])
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(values[cancels].double(), exact[cancels], rtol=tol, atol=tol * 1e-3)
    if rows > 1 and cols:
        assert cancels.any()  # the test's near-duplicates reach the rule


def test_bad_values_are_refused_by_name():
    values = torch.zeros(4, 3, dtype=torch.float32).t()  # not contiguous
    with pytest.raises(ValueError, match="values must be contiguous"):
        complete_distances(values, torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(3), torch.zeros(4), None)
    with pytest.raises(ValueError, match="float32 / float64"):
        complete_distances(
            torch.zeros(2, 2, dtype=torch.int32), *(torch.zeros(2, 1),) * 2, torch.zeros(2), torch.zeros(2), None
        )


@settings(max_examples=25, deadline=None)
@given(**BLOCKS)
def test_squared_distances_summed_directly_match_float64(rows, cols, dim, dtype, weighted, seed):
    """Near-duplicates and far points alike, non-contiguous x, weights: each cell is the formula as written, so its
    error is relative to the distance itself (no cancellation against the norms)."""
    _, x, y, _, _, w = _block(rows, cols, dim, dtype, seed, weighted)
    x_wide = torch.cat([x, x], 1)
    got = squared_distances(x_wide[:, :dim], y, w)
    exact = _exact(x, y, w)
    assert got.shape == (rows, cols) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=0)


def test_squared_distances_refuse_mixed_or_integer_dtypes_and_a_wrong_out():
    with pytest.raises(ValueError, match="float32 / float64 alike"):
        squared_distances(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64), None)
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    for out in (torch.empty(4, 6), torch.empty(5, 4).t(), torch.empty(4, 5, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"out must be contiguous torch.float32 of shape \(4, 5\)"):
            squared_distances(x, y, None, out)
    out = torch.full((4, 5), float("nan"))
    assert squared_distances(x, y, None, out) is out and torch.isfinite(out).all()  # written whole
